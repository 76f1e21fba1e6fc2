"""Cloud Monitoring: what the SLO API accepts on a new project, and the load balancer's own count."""

from __future__ import annotations

import json
import re

from ...components.model.service_levels import LB_REQUESTS, TTFT_METRIC
from ...components.model.vllm_versions import TTFT_BUCKETS, release
from ...components.slo_metrics import GMP
from ..plan import Plan
from .base import Contract, _flag, _vllm_containers


def _metrics_named(sli: dict) -> dict[str, set[str]]:
    """Each metric type an SLI's filters name, with the metric labels they name."""
    out: dict[str, set[str]] = {}
    for flt in re.findall(r'"((?:[^"\\]|\\.)*metric\.type=(?:[^"\\]|\\.)*)"', json.dumps(sli)):
        flt = flt.replace('\\"', '"')
        for kind in re.findall(r'metric\.type="([^"]+)"', flt):
            out.setdefault(kind, set()).update(re.findall(r'metric\.label\."([^"]+)"', flt))
    return out


def slos_wait_for_their_metrics(plan: Plan) -> list[str]:
    slos = plan.of_type("gcp:monitoring/slo:Slo")
    if not slos:
        return []
    seeds = [r for r in plan.kubernetes() if r.props.get("kind") == "ConfigMap" and "seed.json" in r.props.get("data", {})]
    jobs = [r for r in plan.kubernetes() if r.props.get("kind") == "Job" and r.props["metadata"]["name"] == "slo-metrics"]
    seeded: dict[str, str] = {m["type"]: m["text"] for s in seeds
                              for m in json.loads(s.props["data"]["seed.json"])["metrics"]}
    out = []
    for slo in slos:
        for metric, labels in _metrics_named(slo.props["requestBasedSli"]).items():
            if not metric.startswith(GMP):
                continue
            if metric not in seeded or not jobs or not any(plan.waits_for(slo, j) for j in jobs):
                out.append(f"SLO {slo.name} reads {metric}, which nothing makes known before it: on a new project "
                           "the SLO API refuses it")
            elif missing := sorted(k for k in labels if f'{k}="' not in seeded[metric]):
                out.append(f"SLO {slo.name}: the seeded {metric} has no label {', '.join(missing)} its filter names")
    return out


def _finite_les(text: str) -> list[float]:
    return [float(le) for le in re.findall(r'_bucket\{[^}]*le="([^"]+)"', text) if le != "+Inf"]


def seeded_histograms_have_the_servers_buckets(plan: Plan) -> list[str]:
    """A seeded histogram has finite buckets (Managed Prometheus drops one without), and the TTFT
    histogram's are the ones every server exports, objective included."""
    flag = release(plan.config.vllm_version).histogram_buckets_flag
    served = {name: (json.loads(v).get("time_to_first_token") if flag and (v := _flag(c["args"], flag)) else None)
              or list(TTFT_BUCKETS) for name, c in _vllm_containers(plan)}
    out = []
    for cm in (r for r in plan.kubernetes() if r.props.get("kind") == "ConfigMap" and "seed.json" in r.props["data"]):
        for m in json.loads(cm.props["data"]["seed.json"])["metrics"]:
            if not m["type"].endswith("/histogram"):
                continue
            les = _finite_les(m["text"])
            if not les:
                out.append(f"the seeded {m['type']} has no finite bucket: Managed Prometheus drops it "
                           "(zero-buckets-bounds) and its descriptor is never created")
            elif m["type"] == TTFT_METRIC:
                out += [f"the seeded {m['type']} has buckets {les}, {name} exports {bounds}"
                        for name, bounds in served.items() if les != [float(b) for b in bounds]]
    return out


def gateway_slo_reads_its_load_balancer(plan: Plan) -> list[str]:
    gateways = [r.props for r in plan.kubernetes() if r.props.get("kind") == "Gateway"]
    out = []
    for slo in plan.of_type("gcp:monitoring/slo:Slo"):
        if not slo.props.get("service", "").endswith("-gateway-lb"):
            continue
        named = _metrics_named(slo.props["requestBasedSli"])
        for gw in gateways:
            metric, resource, _ = LB_REQUESTS[gw["spec"]["gatewayClassName"]]
            if set(named) != {metric} or f'resource.type=\\"{resource}\\"' not in json.dumps(slo.props):
                out.append(f"SLO {slo.name} reads {sorted(named)}, not {metric} on {resource}, which a "
                           f"{gw['spec']['gatewayClassName']} gateway's load balancer reports")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Monitoring SLO API and Managed Service for Prometheus", "v3",
             "refuses an SLO whose filter names a metric with no descriptor ('The metric referenced by the provided "
             "filter is unknown'); a user-defined metric type is custom.googleapis.com or external.googleapis.com, so "
             "a prometheus.googleapis.com descriptor cannot be created through the API: Managed Prometheus creates it "
             "when it first ingests the metric",
             "https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.metricDescriptors (MetricDescriptor.type: "
             "user-defined types are custom.googleapis.com or external.googleapis.com); "
             "https://cloud.google.com/stackdriver/docs/solutions/slo-monitoring/sli-metrics/prometheus (SLIs on "
             "prometheus.googleapis.com/NAME/KIND); the refusal as seen: GoogleCloudPlatform/cloud-ops-sandbox#896",
             "a Job serves every Managed Prometheus metric the SLO filters name, with their label keys, at zero, scraped "
             "by its PodMonitoring, and succeeds once each descriptor exists; every such SLO depends on it",
             slos_wait_for_their_metrics),
    Contract("Google Cloud Managed Service for Prometheus", "v0.12.0",
             "a Prometheus histogram becomes a Cloud Monitoring distribution whose bounds are its finite `le` "
             "values (+Inf is the overflow bucket); one with no finite bound is dropped before it is sent "
             "(counted as zero-buckets-bounds), so it never creates its metric descriptor",
             "GoogleCloudPlatform/prometheus-engine@v0.12.0:pkg/export/transform.go:306-311 (the +Inf bucket adds "
             "no bound), 332-335 (`if len(bounds) == 0 { ...\"zero-buckets-bounds\"...; return nil, nil }`)",
             "the seeding Job serves each histogram with a bucket per finite bound the servers export (vLLM's TTFT "
             "bounds, plus the objective where --custom-histogram-buckets adds it) and +Inf, `le` written as "
             "prometheus_client writes it",
             seeded_histograms_have_the_servers_buckets),
    Contract("Cloud Load Balancing metrics", "v3",
             "an Application Load Balancer counts every request it answers, by response_code_class (200, 300, 400, 500, "
             "0 for none): https/internal/request_count on internal_http_lb_rule (regional internal), "
             "https/external/regional/request_count on http_external_regional_lb_rule, https/request_count on "
             "https_lb_rule (global external); built-in, so the descriptors exist in every project",
             "https://cloud.google.com/monitoring/api/metrics_gcp_i_o (loadbalancing.googleapis.com)",
             "the gateway's availability SLO reads the count of its class's load balancer: 2xx/3xx good, 5xx bad",
             gateway_slo_reads_its_load_balancer),
)
