"""The Cloud Run models' monitoring (components/model/cloud_run_monitoring.py): the Managed Service for
Prometheus sidecar beside each service (its pinned image, the config file it reads, the labels it
writes), Cloud Run's own request metrics, and the SLOs and dashboard that select both; a check of each
on the plan's resources."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Optional

import yaml

from ...components.model.cloud_run_monitoring import (
    CONFIG_DIR,
    CONFIG_FILE,
    INSTANCE_COUNT,
    REQUEST_COUNT,
    REQUEST_LATENCIES,
    RUN_CLUSTER,
    RUN_RESOURCE,
    SIDECAR_IMAGE,
    promql_name,
)
from ..cloud_run_usage import BILLABLE_INSTANCE_TIME, run_queries
from ..plan import Plan, PlannedResource
from .base import Contract
from .monitoring import _metrics_named  # pyright: ignore[reportPrivateUsage]

SIDECAR_AT = "GoogleCloudPlatform/run-gmp-sidecar@1.7.0"
METRICS_LIST = "https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-run"
SERVICE = "gcp:cloudrunv2/service:Service"
SLO = "gcp:monitoring/slo:Slo"
# The keys the sidecar's RunMonitoring structs know (confgenerator/config.go:36-114); it unmarshals
# with yaml.Strict(), so any other key fails the sidecar at start.
KNOWN_KEYS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "spec": {"endpoints", "targetLabels", "limits"},
    "endpoint": {"port", "scheme", "path", "params", "proxyUrl", "interval", "timeout", "metricRelabeling"},
}
TARGET_METADATA = {"instance", "revision", "service", "configuration"}  # config.go:121
# Cloud Run's metrics the monitoring reads, with the metric labels Google's list gives each.
RUN_METRICS: dict[str, set[str]] = {
    REQUEST_COUNT: {"response_code", "response_code_class", "route"},
    REQUEST_LATENCIES: {"response_code", "response_code_class", "route"},
    INSTANCE_COUNT: {"state", "container_name"},
}
CODE_CLASSES = {"1xx", "2xx", "3xx", "4xx", "5xx"}


def _services(plan: Plan) -> dict[str, dict[str, Any]]:
    """Each Cloud Run service's props, by the service's name (Cloud Run's service_name, K_SERVICE)."""
    return {str(r.props["name"]): r.props for r in plan.of_type(SERVICE)}


def _sidecar(props: dict[str, Any]) -> Optional[dict[str, Any]]:
    repository = SIDECAR_IMAGE.rsplit(":", 1)[0]
    return next((c for c in props["template"]["containers"] if str(c.get("image", "")).startswith(repository)), None)


def _config_text(plan: Plan, secret_id: str) -> Optional[str]:
    """The text of the secret the sidecar's config volume names (the version written beside it)."""
    secrets = [r for r in plan.of_type("gcp:secretmanager/secret:Secret") if r.props.get("secretId") == secret_id]
    versions = [v for s in secrets for v in plan.of_type("gcp:secretmanager/secretVersion:SecretVersion")
                if v.props.get("secret") == f"{s.name}-id"]
    return str(versions[0].props.get("secretDataWo") or versions[0].props.get("secretData")) if versions else None


def _config_problems(name: str, text: str, port: Any) -> Iterator[str]:
    doc = yaml.safe_load(text) or {}
    if (doc.get("apiVersion"), doc.get("kind")) != ("monitoring.googleapis.com/v1beta", "RunMonitoring"):
        yield f"{name}: its sidecar's config is no monitoring.googleapis.com/v1beta RunMonitoring"
    spec = doc.get("spec") or {}
    endpoints = spec.get("endpoints") or []
    for where, keys in (("", set(doc)), ("spec", set(spec)), *[("endpoint", set(e)) for e in endpoints]):
        if unknown := sorted(keys - KNOWN_KEYS[where]):
            yield f"{name}: the sidecar's config has {', '.join(unknown)}, which its strict parser refuses"
    if [(str(e.get("port")), e.get("path", "/metrics")) for e in endpoints] != [(str(int(port)), "/metrics")]:
        yield f"{name}: the sidecar's config scrapes {endpoints}, not the server's /metrics on port {int(port)}"
    if extra := set((spec.get("targetLabels") or {}).get("metadata") or []) - TARGET_METADATA:
        yield f"{name}: the sidecar's targetLabels.metadata {sorted(extra)} is not among {sorted(TARGET_METADATA)}"


def sidecar_pinned_and_reads_its_config(plan: Plan) -> list[str]:
    """Every Cloud Run service runs the pinned sidecar, its RunMonitoring at /etc/rungmp/config.yaml (a
    secret volume), a config the sidecar parses, scraping the serving container's /metrics."""
    out: list[str] = []
    for name, props in _services(plan).items():
        sidecar, volumes = _sidecar(props), {v["name"]: v for v in props["template"].get("volumes") or []}
        if sidecar is None or sidecar["image"] != SIDECAR_IMAGE:
            out.append(f"{name}: no Managed Prometheus sidecar at {SIDECAR_IMAGE} (found "
                       f"{sidecar and sidecar['image']})")
            continue
        mount = next((m for m in sidecar.get("volumeMounts") or [] if m["mountPath"] == CONFIG_DIR), None)
        secret = (volumes.get(mount["name"]) or {}).get("secret") or {} if mount else {}
        if CONFIG_FILE not in [i.get("path") for i in secret.get("items") or []]:
            out.append(f"{name}: the sidecar reads {CONFIG_DIR}/{CONFIG_FILE}, which no secret volume puts there: "
                       "it falls back to scraping port 8080")
            continue
        server = next(c for c in props["template"]["containers"] if c.get("ports"))
        text = _config_text(plan, str(secret.get("secret")))
        out += [f"{name}: no secret version holds the sidecar's config"] if text is None \
            else list(_config_problems(name, text, server["ports"]["containerPort"]))
    return out


def _model_services(plan: Plan) -> dict[str, tuple[str, str]]:
    """Per Cloud Run model (the service's vllm-gke-model label): its service's name and region."""
    return {str((p.get("labels") or {}).get("vllm-gke-model")): (name, str(p.get("location")))
            for name, p in _services(plan).items()}


def _run_slos(plan: Plan) -> Iterator[tuple[PlannedResource, Optional[tuple[str, str]], str]]:
    """Each Cloud Run SLO (its service is <...>-run-<model>), the model's service and region, its SLI as text."""
    services = _model_services(plan)
    for slo in plan.of_type(SLO):
        svc = str(slo.props.get("service", ""))
        if "-run-" in svc:
            model = svc.split("-run-", 1)[1]
            yield slo, services.get(model), json.dumps(slo.props["requestBasedSli"]).replace('\\"', '"')


def _dashboard_selectors(plan: Plan) -> list[str]:
    board = plan.platform.observability.run_dashboard_definition if plan.platform.observability else None
    return re.findall(r"\{[^{}]*\}", json.dumps(board or {}).replace('\\"', '"'))


def slos_and_dashboard_select_the_sidecars_series(plan: Plan) -> list[str]:
    """The sidecar writes cluster="__run__", namespace=<the service's name>: each Cloud Run SLO on a
    Managed Prometheus series selects exactly its model's, and the dashboard every service's."""
    out: list[str] = []
    for slo, target, sli in _run_slos(plan):
        if target is None:
            out.append(f"SLO {slo.name}: no Cloud Run service serves its model")
        elif "prometheus_target" in sli and (f'resource.label."cluster"="{RUN_CLUSTER}"' not in sli
                                             or f'resource.label."namespace"="{target[0]}"' not in sli):
            out.append(f"SLO {slo.name} does not select cluster=\"{RUN_CLUSTER}\", namespace=\"{target[0]}\", "
                       "the series the sidecar writes for its service")
    names = "|".join(sorted(_services(plan)))
    for sel in _dashboard_selectors(plan):
        if "cluster=" in sel and (f'cluster="{RUN_CLUSTER}"' not in sel or f'namespace=~"{names}"' not in sel):
            out.append(f"the Cloud Run dashboard selects {sel}, not cluster=\"{RUN_CLUSTER}\", namespace=~\"{names}\"")
    return out


def slos_and_dashboard_read_cloud_runs_metrics(plan: Plan) -> list[str]:
    """Cloud Run's own metrics as Google lists them: on cloud_run_revision, by service_name and
    location, with the labels each has; response_code_class is "2xx".."5xx" (a load balancer's is 200..500)."""
    out: list[str] = []
    for slo, target, sli in _run_slos(plan):
        for metric, labels in _metrics_named(slo.props["requestBasedSli"]).items():
            if not metric.startswith("run.googleapis.com/"):
                continue
            if metric not in RUN_METRICS or labels - RUN_METRICS[metric]:
                out.append(f"SLO {slo.name} reads {metric} by {sorted(labels)}, which Cloud Run does not report")
            if target and f'resource.type="{RUN_RESOURCE}" resource.label."service_name"="{target[0]}" ' \
                          f'resource.label."location"="{target[1]}"' not in sli:
                out.append(f"SLO {slo.name} does not select {RUN_RESOURCE} {target[0]} in {target[1]}")
        classes = re.findall(r'"response_code_class"=(one_of\([^)]*\)|"[^"]*")', sli)
        if bad := {c for group in classes for c in re.findall(r'"([^"]*)"', group)} - CODE_CLASSES:
            out.append(f"SLO {slo.name} counts response_code_class {sorted(bad)}: Cloud Run's are {sorted(CODE_CLASSES)}")
    for sel in _dashboard_selectors(plan):
        if "monitored_resource=" in sel and f'monitored_resource="{RUN_RESOURCE}"' not in sel:
            out.append(f"the Cloud Run dashboard reads {sel}, not Cloud Run's {RUN_RESOURCE}")
    return out


def usage_report_prices_what_cloud_run_bills(plan: Plan) -> list[str]:
    """`vllm-gke report` reads each service's billable_instance_time by its name and prices a second of it
    at one instance's price: right for instance-based billing (billed from start to shutdown)."""
    if not plan.config.cloud_run_models:
        return []
    billed = run_queries(plan.config, "1d")["run_billed"]
    match = re.search(r'service_name=~"([^"]*)"', billed)
    names = set(match.group(1).split("|")) if match else set[str]()
    out: list[str] = []
    for name, props in _services(plan).items():
        server = next(c for c in props["template"]["containers"] if c.get("ports"))
        if name not in names:
            out.append(f"{name}: the usage report does not read its {BILLABLE_INSTANCE_TIME} (it reads {sorted(names)})")
        if (server.get("resources") or {}).get("cpuIdle") is not False:
            out.append(f"{name}: billed per request, not per instance second as the usage report prices it")
    return out


ROWS = (
    Contract("Managed Service for Prometheus sidecar for Cloud Run", "1.7.0",
             "reads its RunMonitoring from /etc/rungmp/config.yaml, else scrapes 0.0.0.0:8080/metrics every 30s; "
             "unmarshals it strictly (unknown keys fail) and requires apiVersion monitoring.googleapis.com/v1beta, "
             "kind RunMonitoring; targetLabels.metadata only of instance, revision, service, configuration",
             f"{SIDECAR_AT}:entrypoint.go:34 (userConfigFile), confgenerator/config.go:36-114 (the config's fields), "
             "121 (allowedTargetMetadata), 136-159 (the default: port 8080, 30s), 187 (yaml.Strict()), 241-250 "
             "(Validate); the image us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/"
             "cloud-run-gmp-sidecar:1.7.0, the repository's newest release tag, whose image runs that entrypoint "
             "(run-gmp-sidecar/Dockerfile.image_with_gcloud.build:33-41, FROM scratch); entrypoint.go and "
             "confgenerator/ are the same files at 1.2.0",
             "each service runs that image beside the server, its config a Secret Manager volume at /etc/rungmp "
             "(config.yaml) scraping the serving port's /metrics every 15s",
             sidecar_pinned_and_reads_its_config),
    Contract("Managed Service for Prometheus sidecar for Cloud Run", "1.7.0",
             "labels every series it writes cluster=\"__run__\", namespace=<K_SERVICE: the Cloud Run service's "
             "name>, job=<the RunMonitoring's name>, instance=<the instance id>:<port>",
             f"{SIDECAR_AT}:confgenerator/config.go:329-344 (the job, cluster \"__run__\" and namespace env.Service "
             "relabelings), confgenerator/util.go:39 (Service from K_SERVICE)",
             "the Cloud Run SLOs on vLLM's histogram select cluster=\"__run__\" and their service's namespace; the "
             "Cloud Run dashboard's sidecar queries select every service by namespace; no GKE query "
             "(cluster=<the cluster>) counts them",
             slos_and_dashboard_select_the_sidecars_series),
    Contract("Cloud Run metrics", "v3",
             "run.googleapis.com/request_count (DELTA, INT64) and request_latencies (DELTA, DISTRIBUTION, ms) on "
             "cloud_run_revision (resource labels service_name, location, ...), by response_code and "
             "response_code_class (\"1xx\" to \"5xx\"); container/instance_count by state; built-in, so they exist "
             "in every project",
             METRICS_LIST,
             "the availability SLO counts request_count of its service and region, 2xx/3xx good, 5xx bad; the "
             f"dashboard charts {promql_name(REQUEST_COUNT)}, request_latencies and instance_count on "
             "monitored_resource cloud_run_revision",
             slos_and_dashboard_read_cloud_runs_metrics),
    Contract("Cloud Run metrics", "v3",
             "run.googleapis.com/container/billable_instance_time (DELTA, DOUBLE, unit s) on cloud_run_revision: the "
             "time the revision's instances were billed, summed over them; under instance-based billing an instance "
             "is billed from its start to its shutdown (https://cloud.google.com/run/docs/configuring/billing-settings)",
             METRICS_LIST,
             "`vllm-gke report` prices each service's increase of it over the period at one instance's price a second "
             "(components/model/cloud_run_capacity.py) and splits it among the tenants by weighted tokens; the "
             "services bill per instance (cpu_idle false)",
             usage_report_prices_what_cloud_run_bills),
)
