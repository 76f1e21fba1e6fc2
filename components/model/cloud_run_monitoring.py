"""The monitoring of the Cloud Run models, as plain values: the Managed Service for Prometheus sidecar
that scrapes each instance's server (vLLM's own series and the guard's tenant meters on its /metrics),
its RunMonitoring config, the dashboard's charts of Cloud Run's request metrics, and the SLOs (burn-rate
alerts come with them: components/service_levels.py).

Where the series land (GoogleCloudPlatform/run-gmp-sidecar@1.7.0:confgenerator/config.go:329-344): a
sidecar writes prometheus_target series with cluster="__run__", namespace=<the Cloud Run service's
name>, job=<the RunMonitoring's name>, and location=<the region>; so no GKE query (cluster="<the
cluster>") counts them, and these select them by service instead. Cloud Run's own metrics
(run.googleapis.com/..., resource cloud_run_revision) exist in every project from the start.
Every fact relied on is a row of infra/contracts/cloud_run_monitoring.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .cloud_run import service_name
from .monitoring import FALLBACKS_METRIC, AlertPolicy
from .monitoring import _policy as policy  # pyright: ignore[reportPrivateUsage]
from .service_levels import TTFT_METRIC, Objective, budget_tiles, service_id, ttft_bound
from .specs import MonitoringSpec

if TYPE_CHECKING:
    from .stack_config import StackConfig

# The sidecar's image, pinned to the repository's newest release tag, 1.7.0 (its base FROM scratch:
# run-gmp-sidecar@1.7.0 run-gmp-sidecar/Dockerfile.image_with_gcloud.build:33, its entrypoint :41). The
# config path, liveness port and labels relied on here are unchanged since 1.2.0 (entrypoint.go,
# confgenerator/config.go and util.go are the same files at both tags). Google's guide:
# https://cloud.google.com/run/docs/monitoring-managed-prometheus-sidecar
SIDECAR_IMAGE = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar:1.7.0"
SIDECAR_NAME = "gmp-collector"
# The sidecar reads its RunMonitoring from this file (entrypoint.go:34, userConfigFile); without it, it
# scrapes port 8080, where the server does not listen. A Secret Manager volume puts it there.
CONFIG_DIR = "/etc/rungmp"
CONFIG_FILE = "config.yaml"
CONFIG_VOLUME = "rungmp-config"
# Its own liveness endpoint (entrypoint.go:38-39, livenessProbePort, livenessProbePath).
LIVENESS_PORT = 13133
# What the sidecar labels every series with (confgenerator/config.go:338, 342 at 1.7.0).
RUN_CLUSTER = "__run__"
# The scrape interval: the GKE pods' (serving_pool.pod_monitoring_spec), the sidecar's default is 30s.
SCRAPE_INTERVAL = "15s"
# A small share of the instance beside the server (the sidecar's sample sets none: 1 vCPU, 512 MiB
# are Cloud Run's defaults for a container).
SIDECAR_LIMITS = {"cpu": "1", "memory": "512Mi"}

# Cloud Run's built-in metrics, resource cloud_run_revision
# (https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-run).
RUN_RESOURCE = "cloud_run_revision"
REQUEST_COUNT = "run.googleapis.com/request_count"
REQUEST_LATENCIES = "run.googleapis.com/request_latencies"
INSTANCE_COUNT = "run.googleapis.com/container/instance_count"


def promql_name(metric_type: str) -> str:
    """A Cloud Monitoring metric as PromQL names it: the domain's dots and the path's slashes as
    underscores, a colon between them (run.googleapis.com/request_count: run_googleapis_com:request_count)."""
    domain, _, path = metric_type.partition("/")
    return f"{domain.replace('.', '_')}:{path.replace('/', '_')}"


@dataclass(frozen=True)
class CloudRunTarget:
    """One Cloud Run model as its metrics name it: the service (Cloud Run's service_name, and the
    sidecar's namespace) and its region."""

    model: str
    service: str
    region: str
    # It keeps minInstances above 0: some instance should always report.
    always_on: bool = False


def run_targets(cfg: "StackConfig") -> list[CloudRunTarget]:
    return [CloudRunTarget(m.name, service_name(m), cfg.cloud_run_region(m), m.min_instances > 0)
            for m in cfg.cloud_run_models]


def run_monitoring(port: int) -> dict[str, Any]:
    """The sidecar's RunMonitoring: the server's /metrics (vLLM's and the guard's series, one
    registry) on its serving port, every SCRAPE_INTERVAL; each series labelled with the instance,
    revision and service (confgenerator/config.go allowedTargetMetadata, less the configuration)."""
    return {"apiVersion": "monitoring.googleapis.com/v1beta", "kind": "RunMonitoring",
            "metadata": {"name": "vllm"},
            "spec": {"endpoints": [{"port": str(port), "path": "/metrics", "interval": SCRAPE_INTERVAL}],
                     "targetLabels": {"metadata": ["instance", "revision", "service"]}}}


def run_monitoring_text(port: int) -> str:
    """The config file's text: JSON, which the sidecar's YAML parser reads (YAML's flow style)."""
    return json.dumps(run_monitoring(port), indent=1, sort_keys=True) + "\n"


def config_digest(text: str) -> str:
    """Names the secret version's content: a changed config is a new version (and revision)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gmp_sidecar(server: str) -> dict[str, Any]:
    """The sidecar container, in the provider's input names (cloudrunv2 ServiceTemplateContainerArgs):
    started after the server (depends_ons), its config from CONFIG_VOLUME (config_volume)."""
    return {
        "name": SIDECAR_NAME, "image": SIDECAR_IMAGE, "depends_ons": [server],
        "volume_mounts": [{"name": CONFIG_VOLUME, "mount_path": CONFIG_DIR}],
        "liveness_probe": {"http_get": {"path": "/liveness", "port": LIVENESS_PORT},
                           "timeout_seconds": 30, "period_seconds": 30},
        "resources": {"limits": dict(SIDECAR_LIMITS)},
    }


def config_volume(secret: Any, version: Any) -> dict[str, Any]:
    """The RunMonitoring as CONFIG_FILE in CONFIG_DIR: a Secret Manager volume (Google's guide's way)
    at a pinned version, so a new config rolls a new revision."""
    return {"name": CONFIG_VOLUME, "secret": {"secret": secret, "items": [{"version": version, "path": CONFIG_FILE}]}}


# --- the dashboard ------------------------------------------------------------------------

def _services(targets: Sequence[CloudRunTarget]) -> str:
    return "|".join(t.service for t in targets)


def _run(targets: Sequence[CloudRunTarget], extra: str = "") -> str:
    return f'{{monitored_resource="{RUN_RESOURCE}",service_name=~"{_services(targets)}"{extra}}}'


def _gmp(targets: Sequence[CloudRunTarget], extra: str = "") -> str:
    return f'{{cluster="{RUN_CLUSTER}",namespace=~"{_services(targets)}"{extra}}}'


# The guard's own error answers, by status code (images/vllm_gke_guard/metrics.py GUARD_REFUSALS): every
# 429 it answers (rate limits, shedding, a fallback refusing) whether or not a tenant's meter counted it.
GUARD_REFUSALS_METRIC = "vllm_gke_guard_refusals_total"
# What the alert allows beyond the guards' 429s before it pages: Cloud Run's count (a 60s sample) and the
# sidecar's (a SCRAPE_INTERVAL scrape) cover slightly different windows, so a changing rate leaves a residue.
REFUSALS_SHARE, REFUSALS_FLOOR_PER_S = 0.05, 1 / 60


def _run429(targets: Sequence[CloudRunTarget]) -> str:
    code = ',response_code="429"'
    return f"sum by (service_name) (rate({promql_name(REQUEST_COUNT)}{_run(targets, code)}[5m]))"


def run_refusals(targets: Sequence[CloudRunTarget]) -> str:
    """Per service, the 429s/s Cloud Run answered beyond the 429s its guards answered (each counted by status
    code, rate limits and shedding alike): the requests Cloud Run itself refused, no instance being free (at
    maxInstances, or while one starts). Where no guard reports (no instance up), every 429 is Cloud Run's."""
    run429, code = _run429(targets), ',code="429"'
    guard = ("sum by (service_name) (label_replace(rate("
             f'{GUARD_REFUSALS_METRIC}{_gmp(targets, code)}[5m]), "service_name", "$1", "namespace", "(.*)"))')
    return f"(({run429}) - on (service_name) ({guard})) or ({run429})"


def run_refusals_alert(targets: Sequence[CloudRunTarget]) -> str:
    """run_refusals beyond a margin: REFUSALS_SHARE of Cloud Run's 429s and REFUSALS_FLOOR_PER_S."""
    return (f"({run_refusals(targets)}) > on (service_name) "
            f"({REFUSALS_SHARE:g} * ({_run429(targets)}) + {REFUSALS_FLOOR_PER_S:.6g})")


def run_panels(targets: Sequence[CloudRunTarget]) -> list[tuple[str, str]]:
    """Cloud Run's view of the models (every request, those no instance served included) and, from
    the sidecar, vLLM's and the guard's. By response code, not class: Cloud Run's own 429 (no instance
    free) is a 4xx as the guard's are."""
    run, gmp = _run(targets), _gmp(targets)
    latency = promql_name(REQUEST_LATENCIES)
    return [
        ("Cloud Run requests/s by response code",
         f"sum by (service_name, response_code) (rate({promql_name(REQUEST_COUNT)}{run}[5m]))"),
        ("Cloud Run 429s/s beyond the guards' (those no instance was free for)",
         run_refusals(targets)),
        ("Cloud Run request latency p95 (ms, whole response)",
         f"histogram_quantile(0.95, sum by (le, service_name) (rate({latency}_bucket{run}[5m])))"),
        ("Cloud Run instances by state", f"sum by (service_name, state) ({promql_name(INSTANCE_COUNT)}{run})"),
        ("Time to first token p95 (s), vLLM on Cloud Run",
         f"histogram_quantile(0.95, sum by (le, namespace) (rate(vllm:time_to_first_token_seconds_bucket{gmp}[5m])))"),
        ("Requests waiting in vLLM on Cloud Run", f"sum by (namespace) (vllm:num_requests_waiting{gmp})"),
        ("KV-cache usage, vLLM on Cloud Run", f"max by (namespace, instance) (vllm:kv_cache_usage_perc{gmp})"),
        ("Tenant requests/s by outcome, on Cloud Run",
         f"sum by (tenant, model, outcome) (rate(vllm_gke_tenant_requests_total{gmp}[5m]))"),
        ("Tenant generated tokens/s, on Cloud Run",
         f"sum by (tenant, model) (rate(vllm_gke_tenant_generation_tokens_total{gmp}[5m]))"),
    ]


def run_dashboard_json(title: str, targets: Sequence[CloudRunTarget],
                       budgets: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """A Mosaic layout as the stack's dashboard's (two line charts a row), then each Cloud Run SLO's
    error budget remaining (`budgets`: title and SLO resource name)."""
    queries = [(name, {"prometheusQuery": q}) for name, q in run_panels(targets)]
    tiles = [{"xPos": (i % 2) * 24, "yPos": (i // 2) * 16, "width": 24, "height": 16,
              "widget": {"title": name, "xyChart": {"chartOptions": {"mode": "COLOR"}, "dataSets": [
                  {"plotType": "LINE", "targetAxis": "Y1", "timeSeriesQuery": query}]}}}
             for i, (name, query) in enumerate([*queries, *budget_tiles(budgets)])]
    return {"displayName": title, "mosaicLayout": {"columns": 48, "tiles": tiles}}


# --- the SLOs -----------------------------------------------------------------------------

def run_availability_sli(target: CloudRunTarget) -> dict[str, Any]:
    """Answered (2xx, 3xx) against failed (5xx), as Cloud Run counts the requests that reached the
    service: an instance that failed to start or died mid-request is counted, which the guard never
    sees. A 4xx is neither: not the tenant's, and not Cloud Run's own 429 when no instance is free
    (at maxInstances, or while one starts), which a filter cannot tell from the guard's 429s; the
    alert on run_refusals pages for those instead, and the dashboard charts them."""
    base = (f'metric.type="{REQUEST_COUNT}" resource.type="{RUN_RESOURCE}" '
            f'resource.label."service_name"="{target.service}" resource.label."location"="{target.region}"')
    code = 'metric.label."response_code_class"'
    return {"good_total_ratio": {"good_service_filter": f'{base} {code}=one_of("2xx","3xx")',
                                 "bad_service_filter": f'{base} {code}="5xx"'}}


def run_ttft_sli(target: CloudRunTarget, seconds: float, exact: bool = False) -> dict[str, Any]:
    """vLLM's time-to-first-token histogram, as the sidecar writes it for this service."""
    flt = (f'metric.type="{TTFT_METRIC}" resource.type="prometheus_target" '
           f'resource.label."cluster"="{RUN_CLUSTER}" resource.label."namespace"="{target.service}" '
           f'metric.label."model_name"="{target.model}"')
    return {"distribution_cut": {"distribution_filter": flt, "range": {"min": 0, "max": ttft_bound(seconds, exact)}}}


# What each Cloud Run SLO's title carries after the model's name (the dashboards sort by it).
RUN_TITLE = "(Cloud Run):"


def run_objectives(cluster: str, spec: MonitoringSpec, targets: Sequence[CloudRunTarget],
                   exact_ttft: bool = False) -> list[Objective]:
    """Per Cloud Run model, a service of its own (kind `run`) with the GKE models' two goals:
    requests answered, first tokens in time."""
    slos, out = spec.slos, list[Objective]()
    for t in targets:
        svc = service_id(cluster, "run", t.model)
        bound = ttft_bound(spec.ttft_slo_seconds, exact_ttft)
        out.append(Objective(svc, "availability", f"{t.model} {RUN_TITLE} {slos.availability:.2%} of requests answered",
                             slos.availability, run_availability_sli(t)))
        out.append(Objective(svc, "ttft", f"{t.model} {RUN_TITLE} {slos.ttft:.2%} of first tokens within {bound:g}s",
                             slos.ttft, run_ttft_sli(t, spec.ttft_slo_seconds, exact_ttft)))
    return out


# --- the alerts ---------------------------------------------------------------------------

def run_alert_policies(targets: Sequence[CloudRunTarget], limit_store: bool = False) -> list[AlertPolicy]:
    """The Cloud Run models' threshold alerts, beside the GKE ones (which select cluster=<the cluster>, so
    never see the sidecar's cluster="__run__" series): Cloud Run refusing requests itself, the guards
    limiting per instance without the shared store, an always-on model with no instance reporting."""
    if not targets:
        return []
    store = [policy(
        "Shared limit store unreachable from Cloud Run",
        f"sum by (namespace) (rate({FALLBACKS_METRIC}{_gmp(targets)}[5m])) > 0", 300,
        "For 5 minutes guards on Cloud Run could not reach the shared limit store and limited tenants per "
        "instance: a tenant may get up to its limit on every instance. Check the store's internal load balancer "
        "from the Cloud Run egress subnet (cloudRun.egressSubnetCidr) and the Redis ACL user of the Cloud Run guards.",
        "ERROR")] if limit_store else []
    refused = policy(
        "Cloud Run refuses requests: no instance free", run_refusals_alert(targets), 300,
        "For 5 minutes Cloud Run answered more 429s than the guards answered (beyond a margin of "
        f"{REFUSALS_SHARE:.0%} and one a minute): Cloud Run refused them itself, no instance being free "
        "(maxInstances reached, or new instances not started in time). They never reach the availability SLO "
        "(a 4xx is not counted). Raise cloudRun.models[].maxInstances (within the project's GPU quota) or "
        "minInstances, or move the model to a GKE node pool.", "ERROR")
    silent = [policy(
        f"No Cloud Run instance of {t.model} reports",
        f'absent(vllm:num_requests_running{{cluster="{RUN_CLUSTER}",namespace="{t.service}"}})', 600,
        f"For 10 minutes no instance of {t.model}'s Cloud Run service {t.service} exported metrics, though it keeps "
        "minInstances above 0: its metrics sidecar or its server is down, and its TTFT SLO sees nothing. Check the "
        "service's revisions and logs (the startup probe, the weights volume).", "CRITICAL")
        for t in targets if t.always_on]
    return [*store, refused, *silent]
