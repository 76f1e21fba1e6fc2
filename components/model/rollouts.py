"""Progressive delivery with Flagger v1.44.0: which serving pools roll out as canaries, what each
canary costs, and its Canary and the gates' MetricTemplates as data (Flagger's field names).

A Flagger pool is declared as its *target* Deployment (`<service>`, the release under test) and a
ScaledObject; Flagger copies it to `<service>-primary` (which serves), owns the Services `<service>`,
`<service>-primary` and `<service>-canary`, and the pool's HTTPRoute (named `<service>`, one rule
holding the pool's matches, its backends the two Services at the step's weights). What Flagger does
and reads is cited from its source in infra/contracts/flagger.py.

Which pools: one node a replica (Flagger targets Deployments, not LeaderWorkerSets), a floor of at
least one (at zero there is no traffic to judge, and the pool's standby shares its Service), routed
by length (a weighted split needs two Services; behind the endpoint picker the backend is one
InferencePool). The others roll in place, and the plan says so.

The gates compare the canary's series with the primary's over the same window: the PodMonitoring
copies the pod's `vllm-gke.io/workload` label (the Deployment's name, which Flagger suffixes with
-primary on the primary's pods) onto every series the pod exports, vLLM's and the guard's alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

from .cold_start import NODE_PROVISION_S
from .gateway_routes import LENGTH_HINT_HEADER, at_least_regex
from .k8s_objects import WORKLOAD_LABEL as WORKLOAD_LABEL  # re-exported: what Flagger is told to rewrite
from .serving_api import VERIFIED_HEADERS
from .specs import ModelSpec, MonitoringSpec, RolloutSpec

FLAGGER_VERSION = "1.44.0"
FLAGGER_API = "flagger.app/v1beta1"
FLAGGER_NAMESPACE = "flagger-system"
# The series label the PodMonitoring copies WORKLOAD_LABEL to (serving_pool.pod_monitoring_spec).
WORKLOAD_SERIES_LABEL = "workload"
GATEWAY_PROVIDER = "gatewayapi:v1"
# The shortest window a gate reads.
GATE_WINDOW_MIN_S = 300
# KEDA trigger names, which Flagger's primaryScalerQueries are keyed by.
QUEUE_TRIGGER, KEEP_TRIGGER = "queue", "keep"
Mode = Literal["canary", "in-place"]


@dataclass(frozen=True)
class RolloutPlan:
    """How one serving pool takes a change."""

    mode: Mode
    # Why it rolls in place, or what its canary gave up to fit (empty: a full canary).
    note: str = ""
    # The canary's replicas while analysed (its ScaledObject's floor and ceiling both).
    canary_replicas: int = 0
    # The primary's ceiling while it serves (the pool's, less what a canary borrows).
    primary_max: int = 0
    # The canary's largest share before promotion, percent.
    max_weight: int = 0
    # Flagger's deadline for a replica to become ready (the cold start, with margin).
    progress_deadline_seconds: int = 0
    # From the first step to promotion.
    analysis_seconds: int = 0
    # From the change to the canary's first replica serving: a node, then its load (it holds its
    # devices all that time too).
    ready_seconds: int = 0
    # The primary's promotion at its ceiling, a replica at a time, while the canary still serves
    # at its largest share (Flagger scales it to 0 only once the primary is ready: scheduler.go:294-312,
    # 381-405).
    promotion_seconds: int = 0
    # Percent the canary gains a step: the stack's, or less where its largest share is under one step.
    step_weight: int = 0

    @property
    def is_canary(self) -> bool:
        return self.mode == "canary"


def in_place_reason(rollouts: RolloutSpec, model: ModelSpec, which: str, hosts: int) -> str:
    """Why a pool cannot run a Flagger canary ('' where it can)."""
    if not rollouts.enabled:
        return "rollouts are off (rollouts.enabled)"
    if model.canary is not None:
        return "a manual canary split (models[].canary) holds its route"
    if hosts > 1:
        return (f"a replica spans {hosts} hosts (a LeaderWorkerSet, which Flagger does not target): whole groups "
                "are replaced in place")
    if model.routing != "length":
        return ("behind the endpoint picker its backend is an InferencePool, and Flagger v1.44.0's Gateway API "
                "router writes only Service backends")
    if getattr(model, which).min_replicas == 0:
        return "it may scale to zero: no traffic to judge there, and its standby shares the pool's Service"
    return ""


def canary_need(max_replicas: int, max_weight: int) -> int:
    """Replicas the canary needs to carry its largest share of the pool at its ceiling."""
    return max(1, math.ceil(max_replicas * max_weight / 100))


def rollout_plan(rollouts: RolloutSpec, model: ModelSpec, which: str, hosts: int, room: int,
                 load_seconds: float, in_place_promotion: bool = False) -> RolloutPlan:
    """`room`: the canary replicas that fit on the node pool beside every pool at its ceiling.
    Where the canary's full need does not fit, it takes what does and its largest share shrinks to
    what that carries; with no room at all it borrows one replica of the primary's ceiling (the pool
    then serves at most max-1 until room is made) unless that is below its floor; else it rolls in
    place. `in_place_promotion`: the pool's rolling update replaces replicas in place somewhere up to
    its ceiling (capacity.surge_room), which the primary's promotion does too."""
    reason = in_place_reason(rollouts, model, which, hosts)
    pool = getattr(model, which)
    if reason:
        return RolloutPlan("in-place", reason, primary_max=pool.max_replicas)
    # A canary replica may need a node first (the autoscaler's provisioning) and then its load (the
    # weights, the engine, a TPU's XLA compile): Flagger rolls back a canary not ready by then.
    deadline = int(1.5 * (NODE_PROVISION_S + load_seconds)) + 300
    need = canary_need(pool.max_replicas, rollouts.max_weight)
    canary, primary_max, weight, note = need, pool.max_replicas, rollouts.max_weight, ""
    if room < need and room >= 1:
        canary = room
        weight = room * 100 // pool.max_replicas
        note = f"room for {room} canary replica(s) of the {need} its {rollouts.max_weight}% needs"
    elif room < 1 and pool.max_replicas - 1 >= max(1, pool.min_replicas):
        canary, primary_max = 1, pool.max_replicas - 1
        weight = 100 // pool.max_replicas
        note = (f"no room for a canary beside the pool at its ceiling: the primary's ceiling is {primary_max} of "
                f"{pool.max_replicas}, its last replica's devices kept for the canary")
    elif room < 1:
        why = (f"its floor is its ceiling ({pool.max_replicas}): a canary would take a replica of the floor"
               if pool.max_replicas > 1 else f"beside its one replica (maxReplicas {pool.max_replicas})")
        return RolloutPlan("in-place", f"no room on its node pool for a canary {why}; add nodes (maxNodes)",
                           primary_max=pool.max_replicas)
    weight, note = _promotion_weight(rollouts, weight, canary, primary_max, in_place_promotion, note)
    step = min(rollouts.step_weight, weight)
    return RolloutPlan("canary", note, canary, primary_max, weight, deadline,
                       (weight // step + 1) * rollouts.interval_seconds, int(NODE_PROVISION_S + load_seconds),
                       step_weight=step)


def _promotion_weight(rollouts: RolloutSpec, weight: int, canary: int, primary_max: int, in_place: bool,
                      note: str) -> tuple[int, str]:
    """The canary's largest share: a multiple of the step (Flagger adds stepWeight without clamping
    to maxWeight: scheduler.go runCanary), at least one step. Where the primary's promotion replaces
    replicas in place (no room to surge), the canary carries all of it (100%) while the primary
    reloads, if its replicas can; else the note says the promotion dips."""
    step = rollouts.step_weight
    # Under one step, a single step of what the room carries (the Canary's own stepWeight).
    weight = weight // step * step if weight >= step else max(1, weight)
    if in_place and canary >= primary_max:
        return 100, (f"{note}; " if note else "") + "the primary is replaced in place at promotion: the canary " \
            "carries all traffic (100%) while it reloads"
    if in_place:
        note = (f"{note}; " if note else "") + ("the primary is replaced in place at promotion: capacity dips by "
                                               "a replica while each reloads")
    if note and weight != rollouts.max_weight:
        note += f"; promoted at {weight}%"
    return weight, note


def canary_dollars(plan: RolloutPlan, replica_usd_per_hour: float) -> float:
    """What one rollout's canary costs at most: at its ceiling from its node and load, through the
    analysis, until the primary's promotion is done."""
    seconds = plan.ready_seconds + plan.analysis_seconds + plan.promotion_seconds
    return plan.canary_replicas * replica_usd_per_hour * seconds / 3600


def pool_matches(which: str, path_prefix: str, long_request_bytes: int) -> list[dict[str, Any]]:
    """The pool's share of the model's length route as Flagger's service.match (Istio's
    HTTPMatchRequest, which Flagger maps to the HTTPRoute's matches): the long pool's two header
    matches outrank the short pool's path-only match across routes (Gateway API precedence)."""
    uri = {"prefix": f"/{path_prefix}/v1"}
    if which == "short":
        return [{"uri": uri}]
    return [{"uri": uri, "headers": {"content-length": {"regex": at_least_regex(long_request_bytes)}}},
            {"uri": uri, "headers": {LENGTH_HINT_HEADER: {"exact": "long"}}}]


@dataclass(frozen=True)
class Gate:
    """One analysis metric: its MetricTemplate's name and query, and the bound the canary keeps."""

    name: str
    query: str
    max: float


def _selector(workload: str, cluster: str = "") -> str:
    where = f'cluster="{cluster}",' if cluster else ""
    return f'{where}namespace="{{{{ namespace }}}}",{WORKLOAD_SERIES_LABEL}="{workload}"'


def _quantile(q: float, histogram: str, workload: str, window: str, cluster: str) -> str:
    return (f"histogram_quantile({q:g}, sum by (le) (rate({histogram}_bucket{{{_selector(workload, cluster)}}}"
            f"[{window}])))")


def _share(outcomes: str, of: str, workload: str, window: str, cluster: str) -> str:
    """The share of the guard's tenant requests whose outcome matches `outcomes` among those matching `of`."""
    series = f"vllm_gke_tenant_requests_total{{{_selector(workload, cluster)}"
    return (f'(sum(rate({series},outcome=~"{outcomes}"}}[{window}])) / sum(rate({series},outcome=~"{of}"}}'
            f"[{window}])))")


def gates(rollouts: RolloutSpec, monitoring: MonitoringSpec, cluster: str = "") -> list[Gate]:
    """The canary's gates, each against the primary's series over the same window ({{ target }} is
    the target Deployment; Flagger renders it, {{ namespace }} and {{ interval }}), on the stack's
    cluster's series (`cluster`: several clusters may write to one project's Managed Prometheus)."""
    g, canary, primary, window = rollouts.gates, "{{ target }}", "{{ target }}-primary", "{{ interval }}"
    slo_q = monitoring.slos.ttft
    ttft, itl = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"

    def ratio(q: float, histogram: str) -> str:
        return (f"{_quantile(q, histogram, canary, window, cluster)} / "
                f"{_quantile(q, histogram, primary, window, cluster)}")

    def excess(outcomes: str, of: str) -> str:
        return f"{_share(outcomes, of, canary, window, cluster)} - {_share(outcomes, of, primary, window, cluster)}"

    error_share = g.error_share if g.error_share is not None else round(1 - monitoring.slos.availability, 6)
    return [
        Gate("vllm-ttft-p99-ratio", ratio(0.99, ttft), g.ttft_ratio),
        Gate(f"vllm-ttft-p{_pct(slo_q)}-ratio", ratio(slo_q, ttft), g.ttft_ratio),
        Gate(f"vllm-ttft-p{_pct(slo_q)}-seconds", _quantile(slo_q, ttft, canary, window, cluster),
             g.ttft_seconds if g.ttft_seconds is not None else monitoring.ttft_slo_seconds),
        # Server errors (a 5xx or no answer) among the requests the service answered or failed.
        Gate("vllm-error-share-excess", excess("error", "ok|error"), error_share),
        # Refusals (a 4xx: a lost adapter, a shorter context) among all requests the guard admitted
        # or refused: a change that turns requests away fails here, not only one that errs.
        Gate("vllm-refused-share-excess", excess("refused", "ok|error|refused"), g.refused_share),
        Gate("vllm-itl-p99-ratio", ratio(0.99, itl), g.itl_ratio),
    ]


def _pct(q: float) -> str:
    """0.95 -> '95', 0.995 -> '99-5' (a name's characters)."""
    return f"{q * 100:g}".replace(".", "-")


def metric_template(gate: Gate, address: str) -> dict[str, Any]:
    """A gate's MetricTemplate spec: Prometheus' query API at `address` (the in-cluster GMP frontend)."""
    return {"provider": {"type": "prometheus", "address": address}, "query": gate.query}


@dataclass(frozen=True)
class FlaggerPool:
    """What a Flagger pool's Canary needs beside the pool itself: its share of the model's route,
    the stack's rollout settings and SLOs, and the load test's webhooks."""

    plan: RolloutPlan
    rollouts: RolloutSpec
    monitoring: MonitoringSpec
    path_prefix: str
    long_request_bytes: int
    # The Gateway's serving listener (its HTTPS one where TLS is on) and hostname.
    listener: str
    hostname: Optional[str] = None
    webhooks: tuple[dict[str, Any], ...] = ()


def canary_spec(service: str, which: str, min_replicas: int, pool: FlaggerPool, gateway_namespace: str,
                primary_queries: dict[str, str], port: int = 8000) -> dict[str, Any]:
    """The pool's Canary: Flagger copies Deployment `service` to `service`-primary, whose KEDA
    ScaledObject keeps the pool's floor and the plan's ceiling, and routes `which`'s matches."""
    rollouts = pool.rollouts
    step = pool.plan.step_weight or rollouts.step_weight
    # Each gate reads at least 5 minutes (two intervals where longer): vLLM's histogram buckets are
    # coarse (0.25, 0.5, 0.75, 1, 2.5 s for TTFT), and a quantile of a few dozen requests jumps.
    window = f"{max(2 * rollouts.interval_seconds, GATE_WINDOW_MIN_S)}s"
    metrics = [{"name": g.name, "templateRef": {"name": g.name, "namespace": FLAGGER_NAMESPACE},
                "thresholdRange": {"max": g.max}, "interval": window} for g in gates(rollouts, pool.monitoring)]
    route: dict[str, Any] = {
        "port": port, "targetPort": port, "portName": "http", "appProtocol": "http",
        "gatewayRefs": [{"name": "vllm", "namespace": gateway_namespace, "sectionName": pool.listener}],
        "match": pool_matches(which, pool.path_prefix, pool.long_request_bytes),
        # The tenant is the issuer and subject Istio verified: a client's own copy never gets through.
        "headers": {"request": {"remove": list(VERIFIED_HEADERS)}},
        **({"hosts": [pool.hostname]} if pool.hostname else {}),
    }
    return {
        "provider": GATEWAY_PROVIDER,
        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": service},
        "autoscalerRef": {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": service,
                          "primaryScalerQueries": primary_queries,
                          "primaryScalerReplicas": {"minReplicas": min_replicas, "maxReplicas": pool.plan.primary_max}},
        "progressDeadlineSeconds": pool.plan.progress_deadline_seconds,
        # Deleted (rollouts turned off), Flagger's finalizer first brings the target back to serve.
        "revertOnDeletion": True,
        "service": route,
        # Fewer failed checks than steps: Flagger never lowers the count, and promotes after `steps`
        # passed checks, so a canary passing and failing by turns would otherwise be promoted.
        "analysis": {"interval": f"{rollouts.interval_seconds}s",
                     "threshold": min(rollouts.failed_checks, max(1, pool.plan.max_weight // step - 1)),
                     "stepWeight": step, "maxWeight": pool.plan.max_weight,
                     "metrics": metrics, **({"webhooks": list(pool.webhooks)} if pool.webhooks else {})},
    }
