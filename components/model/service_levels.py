"""ServiceLevels: SLOs as code, and the burn-rate alerts that page on them.

A Cloud Monitoring custom service per model, per tenant and for the gateway, and on each its SLOs
over a rolling window (monitoring.slos); those on Managed Prometheus metrics wait until Cloud
Monitoring knows the metrics (components/slo_metrics.py: on a new project it would refuse them):
  - availability, per model and per tenant: the share of valid requests answered without a server
    error. The signal is the guard's count of each admitted tenant request by outcome
    (images/vllm_gke_guard/usage.py), which carries the tenant; a request the tenant got wrong (a
    4xx: over its cap, an unknown model) is not a valid one, nor is a request shed for overload
    (a 429 to a tenant of negative priority: the priorities working as configured, which an
    alert of its own reports at WARNING, components/observability.py, rather than a page);
  - availability at the load balancer, per cluster: the share of the requests the GKE Gateway's
    load balancer answered with a 2xx or 3xx of those it answered with a 2xx, 3xx or 5xx (a 4xx is
    the client's, a shed 429 included), from the load balancer's own request count. It sees what
    the guard cannot: a replica killed before it answered (OOM, a spot node taken back: a 502), a
    route with no ready backend, a pool at zero answering 503 while it wakes (a bad event: a wake
    under traffic burns the budget). A stream cut mid-response had its 200 sent already: the load
    balancer counts it good (backend_connection_closed_after_partial_response_sent). Its metric is a built-in one
    (loadbalancing.googleapis.com), so its descriptor exists in every project from the start. It
    counts every load balancer of the gateway's class in the project (and region): the load
    balancer's resources are named by the GKE Gateway controller, undocumented and truncated, so
    no filter picks one gateway's or one model's out; each stack owns its project;
  - time to first token, per model: the share of requests whose first token came within
    monitoring.ttftSloSeconds, from vLLM's own histogram (vllm:time_to_first_token_seconds, which
    has no tenant). Cloud Monitoring cuts a distribution at its bucket bounds: where the release
    takes --custom-histogram-buckets (0.34) the servers add the threshold to their TTFT buckets
    and the cut is exact; otherwise it is the largest default bound at or under the threshold.

Alerts are the SRE workbook's multi-window, multi-burn-rate ones (chapter 5, "Alerting on SLOs",
table 5-8): page when 2% of the window's error budget burns in an hour (14.4 for 30 days) or 5% in
six (6), each confirmed by a short window (a twelfth of it), so an alert resets soon after the
burn stops. The workbook's ticket is 10% in three days, a burn rate of 1: any burn faster than the
budget affords. Cloud Monitoring evaluates a burn rate over 24 hours at most ("Alerting on your
burn rate": a lookback is at most the compliance period, and none over 24 hours can alert), so the
ticket keeps the workbook's rate, 1, over the longest lookback there is, a day (two hours
confirming): a steady burn at twice the affordable rate, which spends the budget in half the
window, opens a ticket. (A ticket at 10% in a day would be a rate of 3 and let that burn pass.)
The paging rates scale with the window and are never under 1. A goal whose budget cannot burn as
fast as the fast page (the largest burn rate is 1/(1 - goal)) is refused by the config's checks:
that alert could never fire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .specs import MonitoringSpec
from .vllm_versions import TTFT_BUCKETS, ttft_buckets_with

# Managed Prometheus keeps a metric's name (colons included) under this prefix, with its kind.
GMP = "prometheus.googleapis.com"
# The guard's per-tenant request count (images/vllm_gke_guard/metrics.py TENANT_REQUESTS).
REQUESTS_METRIC = f"{GMP}/vllm_gke_tenant_requests_total/counter"
TTFT_METRIC = f"{GMP}/vllm:time_to_first_token_seconds/histogram"
# Shed requests are neither (see above): deliberate shedding must not page as lost availability.
VALID = ("ok", "error")
BAD = ("error",)


# Per gateway class: the load balancer's request count and its monitored resource
# (https://cloud.google.com/monitoring/api/metrics_gcp_i_o, loadbalancing), and whether it is regional.
LB_REQUESTS: dict[str, tuple[str, str, bool]] = {
    "gke-l7-rilb": ("loadbalancing.googleapis.com/https/internal/request_count", "internal_http_lb_rule", True),
    "gke-l7-regional-external-managed": ("loadbalancing.googleapis.com/https/external/regional/request_count",
                                         "http_external_regional_lb_rule", True),
    "gke-l7-global-external-managed": ("loadbalancing.googleapis.com/https/request_count", "https_lb_rule", False),
}


@dataclass(frozen=True)
class BurnWindow:
    """One alert: over `long_s` seconds, confirmed over `short_s`, a burn that spends
    `budget_share` of the window's budget (a page), or a fixed `burn_rate` (the ticket)."""

    name: str
    budget_share: Optional[float]
    long_s: int
    short_s: int
    severity: str
    burn_rate: Optional[float] = None

    def rate(self, window_days: int) -> float:
        """The burn rate over which it alerts (at least 1)."""
        if self.burn_rate is not None:
            return self.burn_rate
        assert self.budget_share is not None
        return max(1.0, round(self.budget_share * window_days * 86400 / self.long_s, 2))

    def share(self, window_days: int) -> float:
        """The share of the window's budget a burn at its rate spends in `long_s`."""
        return self.rate(window_days) * self.long_s / (window_days * 86400)


# The workbook's table 5-8, for any window; its ticket over the longest lookback Cloud Monitoring has.
BURN_WINDOWS = (
    BurnWindow("fast burn", 0.02, 3600, 300, "CRITICAL"),
    BurnWindow("sustained burn", 0.05, 6 * 3600, 1800, "ERROR"),
    BurnWindow("slow burn", None, 86400, 2 * 3600, "WARNING", burn_rate=1.0),
)


def max_burn_rate(goal: float) -> float:
    """The fastest a budget can burn: every request bad."""
    return 1 / (1 - goal)


def ttft_bound(seconds: float, exact: bool = False) -> float:
    """Where the SLO cuts the histogram: at `seconds` where the servers add it to their buckets
    (`exact`: the release's --custom-histogram-buckets), else the largest of vLLM's default bounds
    at or under it (the smallest bound if none)."""
    if exact:
        return seconds
    return max((b for b in TTFT_BUCKETS if b <= seconds + 1e-9), default=TTFT_BUCKETS[0])


def ttft_buckets(seconds: float, exact: bool = False) -> list[float]:
    """The TTFT histogram's finite bounds as the servers export them: vLLM's defaults, with the
    objective added where they take --custom-histogram-buckets (`exact`, components/model/vllm_server.py)."""
    return (ttft_buckets_with(seconds) if exact else None) or list(TTFT_BUCKETS)


def _labels(cluster: str, **labels: str) -> str:
    return " ".join([f'resource.type="prometheus_target" resource.label."cluster"="{cluster}"',
                     *(f'metric.label."{k}"="{v}"' for k, v in labels.items())])


def _one_of(values: Sequence[str]) -> str:
    return "one_of(" + ",".join(f'"{v}"' for v in values) + ")"


def availability_sli(cluster: str, **labels: str) -> dict[str, Any]:
    """Bad (server errors) over valid requests (answered or failed), per the guard's count."""
    base = f'metric.type="{REQUESTS_METRIC}" {_labels(cluster, **labels)}'
    return {"good_total_ratio": {"bad_service_filter": f'{base} metric.label."outcome"={_one_of(BAD)}',
                                 "total_service_filter": f'{base} metric.label."outcome"={_one_of(VALID)}'}}


def gateway_sli(gateway_class: str, region: str) -> dict[str, Any]:
    """Answered (2xx, 3xx) against failed (5xx) at the load balancer; a 4xx (the client's, a shed
    429 among them) and class 0 (no answer sent) are neither."""
    metric, resource, regional = LB_REQUESTS[gateway_class]
    base = f'metric.type="{metric}" resource.type="{resource}"' + \
        (f' resource.label."region"="{region}"' if regional else ' metric.label."load_balancing_scheme"="EXTERNAL_MANAGED"')
    code = 'metric.label."response_code_class"'
    return {"good_total_ratio": {"good_service_filter": f"{base} {code}>=200 {code}<400",
                                 "bad_service_filter": f"{base} {code}>=500"}}


def ttft_sli(cluster: str, model: str, seconds: float, exact: bool = False) -> dict[str, Any]:
    """Requests whose first token came within the bound, per vLLM's histogram."""
    return {"distribution_cut": {
        "distribution_filter": f'metric.type="{TTFT_METRIC}" {_labels(cluster, model_name=model)}',
        "range": {"min": 0, "max": ttft_bound(seconds, exact)}}}


@dataclass(frozen=True)
class Objective:
    """One SLO as gcp.monitoring.Slo keyword arguments, and the service it belongs to."""

    service: str
    slo_id: str
    display_name: str
    goal: float
    sli: dict[str, Any]

    def slo_args(self, window_days: int) -> dict[str, Any]:
        return {"slo_id": self.slo_id, "display_name": self.display_name, "goal": self.goal,
                "rolling_period_days": window_days, "request_based_sli": self.sli}


def service_id(cluster: str, kind: str, name: str) -> str:
    """A service's ID: unique in the project, so the cluster's name is in it."""
    return f"vllm-{cluster}-{kind}-{name}"


def objectives(cluster: str, spec: MonitoringSpec, models: Sequence[str], tenants: Sequence[str],
               exact_ttft: bool = False, gateway_class: Optional[str] = None,
               region: str = "") -> list[Objective]:
    slos = spec.slos
    out: list[Objective] = []
    if gateway_class and models:
        out.append(Objective(service_id(cluster, "gateway", "lb"), "availability",
                             f"gateway: {slos.availability:.2%} of requests answered at the load balancer",
                             slos.availability, gateway_sli(gateway_class, region)))
    for model in models:
        svc = service_id(cluster, "model", model)
        out.append(Objective(svc, "availability", f"{model}: {slos.availability:.2%} of requests answered",
                             slos.availability, availability_sli(cluster, model=model)))
        bound = ttft_bound(spec.ttft_slo_seconds, exact_ttft)
        out.append(Objective(svc, "ttft", f"{model}: {slos.ttft:.2%} of first tokens within {bound:g}s",
                             slos.ttft, ttft_sli(cluster, model, spec.ttft_slo_seconds, exact_ttft)))
    for tenant in tenants:
        out.append(Objective(service_id(cluster, "tenant", tenant), "availability",
                             f"tenant {tenant}: {slos.availability:.2%} of requests answered", slos.availability,
                             availability_sli(cluster, tenant=tenant)))
    return out


def burn_rate_policy(objective: Objective, slo_name: str, window: BurnWindow, window_days: int) -> dict[str, Any]:
    """An alert policy (gcp.monitoring.AlertPolicy keyword arguments) on one SLO's burn rate over
    the long and the short window together."""
    rate = window.rate(window_days)

    def over(seconds: int) -> dict[str, Any]:
        return {"display_name": f"burn rate over {rate:g} in {seconds // 60} min",
                "condition_threshold": {"filter": f'select_slo_burn_rate("{slo_name}", "{seconds}s")',
                                        "comparison": "COMPARISON_GT", "threshold_value": rate, "duration": "0s"}}

    return {
        "display_name": f"SLO {window.name}: {objective.display_name}",
        "combiner": "AND",
        "severity": window.severity,
        "documentation": {"mime_type": "text/markdown", "content": (
            f"{objective.display_name} ({objective.service}/{objective.slo_id}) is burning its "
            f"{window_days}-day error budget {rate:g} times as fast as it can afford: at this pace "
            f"{window.share(window_days):.1%} of the budget goes in {window.long_s // 3600} h. Check the dashboard's "
            "error budget tiles, the pool's queue and its replicas.")},
        "conditions": [over(window.long_s), over(window.short_s)],
    }


def budget_tiles(names: Sequence[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """Dashboard tiles: each SLO's error budget remaining (a fraction of the window's), by name."""
    return [(f"Error budget remaining: {title}", {"timeSeriesFilter": {
        "filter": f'select_slo_budget_fraction("{slo_name}")'}}) for title, slo_name in names]
