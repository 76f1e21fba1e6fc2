"""Changes that roll back by themselves: in prod each serving pool is a Flagger Canary's target, and a
Canary's gates hold it to the stack's SLOs and can fail it before it is promoted.

What Flagger v1.44.0 does with a Canary (pkg/controller/scheduler.go, pkg/apis/flagger/v1beta1/canary.go
at that tag): a failed check only adds to status.failedChecks, which nothing lowers until the rollout
ends, and the canary is rolled back once it reaches analysis.threshold (1 where unset); each passed
check moves the canary a step (stepWeight, or the next of stepWeights) until maxWeight (100 where
unset), and the next passed check promotes it; a Canary without an analysis, or with skipAnalysis,
is promoted at once.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Optional, Sequence

from ..components.model.k8s_objects import MODEL_LABEL, POOL_LABEL
from .base import (
    SERVING_KINDS,
    Finding,
    Resource,
    kube,
    meta,
    namespace_of,
    selects,
    template_labels,
    vllm_servers,
    where,
)
from .gate_queries import CANARY, TENANT_REQUESTS, TTFT_BUCKETS, canary_error_share, ttft_quantile

CLUSTER = "gcp:container/cluster:Cluster"
SLO = "gcp:monitoring/slo:Slo"
# Floating point: 1 - 0.995 is 0.0050000000000000044, and a gate of 0.005 is not looser than it.
SLACK = 1e-9


def environment(resources: Sequence[Resource]) -> Optional[str]:
    """The stack's environment, as its cluster's resource labels carry it (components/platform.py);
    None where the plan declares no cluster (a program's own finer components)."""
    for r in resources:
        if r.type == CLUSTER:
            return (r.props.get("resourceLabels") or {}).get("environment")
    return None


def canary_targets(resources: Sequence[Resource]) -> set[tuple[str, str, str]]:
    """(namespace, kind, name) of every workload a Flagger Canary's spec.targetRef names."""
    out: set[tuple[str, str, str]] = set()
    for c in kube(resources, "Canary"):
        ref = (c.props.get("spec") or {}).get("targetRef") or {}
        out.add((namespace_of(c), ref.get("kind", "Deployment"), ref.get("name", "")))
    return out


def _picker_pool(resources: Sequence[Resource], ns: str, labels: Mapping[str, Any]) -> Optional[str]:
    """The InferencePool whose selector takes this workload's pods, if any."""
    for pool in kube(resources, "InferencePool"):
        selector = (pool.props.get("spec") or {}).get("selector") or {}
        if namespace_of(pool) == ns and selects(selector.get("matchLabels", selector), labels):
            return meta(pool).get("name")
    return None


def _scaled_object(resources: Sequence[Resource], r: Resource) -> Mapping[str, Any]:
    for so in kube(resources, "ScaledObject"):
        spec = so.props.get("spec") or {}
        if namespace_of(so) == namespace_of(r) and (spec.get("scaleTargetRef") or {}).get("name") == meta(r).get("name"):
            return spec
    return {}


def manual_canary(resources: Sequence[Resource], r: Resource) -> bool:
    """A pool of a model split by hand (models[].canary): the canary's own pool, or the one beside it."""
    labels, ns = template_labels(r), namespace_of(r)
    pool = str(labels.get(POOL_LABEL, ""))
    return pool.endswith("-canary") or any(
        template_labels(w).get(MODEL_LABEL) == labels.get(MODEL_LABEL)
        and template_labels(w).get(POOL_LABEL) == f"{pool}-canary"
        for w, _pod, _c in vllm_servers(resources) if namespace_of(w) == ns)


def in_place_why(resources: Sequence[Resource], r: Resource) -> str:
    """Why a pool cannot be a canary, read from the plan in the model layer's order
    (components/model/rollouts.py in_place_reason); '' where nothing in the plan stops one (room on
    the node pool is the config's: the plan's rollouts table says it)."""
    if r.props.get("kind") == "LeaderWorkerSet":
        return "a replica spans hosts (a LeaderWorkerSet, which Flagger does not target): whole groups are replaced in place"
    if (picker := _picker_pool(resources, namespace_of(r), template_labels(r))) is not None:
        return (f"behind the endpoint picker its backend is an InferencePool ({picker}), and Flagger v1.44.0's "
                "Gateway API router writes only Service backends")
    scaled = _scaled_object(resources, r)
    if scaled and scaled.get("minReplicaCount", 0) == 0:  # KEDA's default floor is zero
        return "it may scale to zero: no traffic to judge there, and its standby shares the pool's Service"
    return ""


def prod_rollouts_gated(resources: Sequence[Resource]) -> Iterator[Finding]:
    """In prod, every vLLM server Deployment or LeaderWorkerSet is a Flagger Canary's target, so a
    change to it (a vLLM release or image, a model revision, flags, adapters) rolls out by steps held
    to the SLOs and rolls back by itself; a pool that cannot be one is named with the reason."""
    if environment(resources) != "prod":
        return
    targets, seen = canary_targets(resources), set[tuple[str, str, str]]()
    for r, _pod, _c in vllm_servers(resources):
        key = (namespace_of(r), str(r.props.get("kind")), str(meta(r).get("name", "")))
        if key[1] not in SERVING_KINDS or key in targets or key in seen:
            continue
        seen.add(key)
        labels = template_labels(r)
        pool = f"{labels.get(MODEL_LABEL, key[2])} {labels.get(POOL_LABEL, '')}".strip()
        head = f"{where(r)} ({pool}) serves in prod with no rollback gate"
        if why := in_place_why(resources, r):
            yield r, (f"{head}: it rolls in place because {why}; a change reaches all its replicas ungated by the "
                      "SLOs and does not roll back by itself")
        elif manual_canary(resources, r):
            yield r, (f"{head}: a manual canary split (models[].canary) is set by hand and nothing rolls it back; "
                      "set vllm-gke:rollouts.enabled, then the model's revision to the new one without canary")
        elif targets:
            yield r, (f"{head} (no Flagger Canary targets it, though other pools' do): a change reaches all its "
                      "replicas ungated by the SLOs; `vllm-gke plan`'s rollouts table says why it rolls in place (a "
                      "pool of one replica with no room for a canary beside it: raise its node pool's maxNodes)")
        else:
            yield r, (f"{head} (no Flagger Canary targets it): a change reaches all its replicas ungated by the SLOs; "
                      "set vllm-gke:rollouts.enabled")


def _slos(resources: Sequence[Resource], model: Optional[str]) -> list[Mapping[str, Any]]:
    """The SLOs of the canary's model (its Cloud Monitoring service, vllm-<cluster>-model-<model>),
    else every SLO the plan declares (the strictest then binds)."""
    slos = [r.props for r in resources if r.type == SLO]
    mine = [s for s in slos if model and str(s.get("service", "")).endswith(f"-model-{model}")]
    return mine or slos


def _ttft_cut(slo: Mapping[str, Any]) -> Optional[tuple[float, float]]:
    """(seconds, goal) of a time-to-first-token SLO: the share of first tokens within the cut."""
    cut = ((slo.get("requestBasedSli") or {}).get("distributionCut") or {})
    if "time_to_first_token" not in str(cut.get("distributionFilter", "")):
        return None
    return float((cut.get("range") or {}).get("max", math.inf)), float(slo.get("goal", 0))


def _error_budget(slo: Mapping[str, Any]) -> Optional[float]:
    """An availability SLO's error budget (1 - goal)."""
    ratio = (slo.get("requestBasedSli") or {}).get("goodTotalRatio")
    return 1 - float(slo.get("goal", 1)) if ratio else None


def analysis_steps(analysis: Mapping[str, Any]) -> int:
    """Passed checks from the first step to promotion, as Flagger counts them (scheduler.go maxWeight,
    nextStepWeight): iterations for an A/B test; else steps of stepWeight up to maxWeight (the last
    of stepWeights where given, 100 where neither is), or one per stepWeights entry."""
    if analysis.get("iterations"):
        return int(analysis["iterations"])
    weights = [int(w) for w in analysis.get("stepWeights") or []]
    top = min(100, weights[-1]) if weights else int(analysis.get("maxWeight") or 100)
    step = int(analysis.get("stepWeight") or 0)
    return math.ceil(top / step) if step > 0 else len(weights)


def _template_query(resources: Sequence[Resource], c: Resource, m: Mapping[str, Any]) -> str:
    """The query a metric runs: its MetricTemplate's (templateRef's namespace, else the Canary's), '' where
    the plan declares none."""
    ref = m.get("templateRef") or {}
    ns = ref.get("namespace") or namespace_of(c)
    for t in kube(resources, "MetricTemplate"):
        if namespace_of(t) == ns and meta(t).get("name") == ref.get("name"):
            return str((t.props.get("spec") or {}).get("query", ""))
    return ""


def _ttft_gate(c: Resource, m: Mapping[str, Any], q: float, cuts: list[tuple[float, float]]) -> str:
    """Why a gate on the canary's TTFT at quantile q is looser than the TTFT SLOs ('' where it holds them)."""
    seconds, goal = min(s for s, _g in cuts), max(g for _s, g in cuts)
    bound, fixes = float(m["thresholdRange"]["max"]), list[str]()
    if bound > seconds + SLACK:
        fixes.append(f"set vllm-gke:rollouts.gates.ttftSeconds at most {seconds:g}, or unset (monitoring.ttftSloSeconds)")
    if q < goal - SLACK:
        fixes.append(f"its MetricTemplate reads p{100 * q:g} (histogram_quantile's first argument): read the SLO's "
                     f"p{100 * goal:g} or above")
    return (f"{where(c)} gate {m.get('name')} lets a canary's p{100 * q:g} time to first token reach {bound:g}s, "
            f"looser than the SLO ({goal:.2%} of first tokens within {seconds:g}s): {'; '.join(fixes)}") if fixes else ""


def _error_gate(c: Resource, m: Mapping[str, Any], budget: float) -> str:
    """Why a gate on the canary's error share is looser than the availability SLOs ('' where it holds them)."""
    bound = float(m["thresholdRange"]["max"])
    return (f"{where(c)} gate {m.get('name')} lets a canary fail {bound:.4g} of its requests more than the primary, "
            f"above the availability SLO's error budget ({budget:.4g}): set vllm-gke:rollouts.gates.errorShare at most "
            f"{budget:.4g}, or unset (the budget)") if bound > budget + SLACK else ""


def _missing(c: Resource, cuts: list[tuple[float, float]], budgets: list[float], ttft: bool, errors: bool) -> Iterator[str]:
    if cuts and not ttft:
        seconds, goal = min(s for s, _g in cuts), max(g for _s, g in cuts)
        yield (f"{where(c)} has no gate on the canary's own time to first token at the SLO's percentile (p{100 * goal:g} "
               f"within {seconds:g}s): gates against the primary pass a canary as slow as its primary, however slow; add "
               f"one whose MetricTemplate's query is histogram_quantile({goal:g}, ...) of the `{CANARY}` workload's "
               f"{TTFT_BUCKETS} alone, its thresholdRange.max at most {seconds:g} (the stack's vllm-ttft-p*-seconds)")
    if budgets and not errors:
        yield (f"{where(c)} has no gate on the canary's share of server errors: one failing more than the availability "
               f"SLO's error budget ({min(budgets):.4g}) is promoted; add one whose MetricTemplate's query leads with "
               f"the `{CANARY}` workload's error outcomes of {TENANT_REQUESTS} over its ok and error ones, its "
               f"thresholdRange.max at most {min(budgets):.4g} (the stack's vllm-error-share-excess)")


def _looser_than_slos(resources: Sequence[Resource], c: Resource, metrics: list[Mapping[str, Any]],
                      slos: list[Mapping[str, Any]]) -> Iterator[str]:
    """Each gate with no max bound; and, where the plan has SLOs, a Canary none of whose gates (read from
    their templates' queries) holds the canary's TTFT, or its error share, to them: each such gate
    looser than the SLO, or the gate missing. A gate beside one that holds is only more to pass."""
    cuts = [cut for s in slos if (cut := _ttft_cut(s)) is not None]
    budgets = [b for s in slos if (b := _error_budget(s)) is not None]
    # Per SLO kind, why each gate on it is looser ('': it holds; None: it has no max, said already).
    ttft, errors = list[Optional[str]](), list[Optional[str]]()
    for m in metrics:
        unbounded = m["thresholdRange"].get("max") is None
        if unbounded:
            yield (f"{where(c)} gate {m.get('name')} has no max bound: a canary whose value grows passes it (the "
                   "stack's gates are latencies, ratios and shares, where higher is worse); set thresholdRange.max")
        query = _template_query(resources, c, m)
        if cuts and (q := ttft_quantile(query)) is not None:
            ttft.append(None if unbounded else _ttft_gate(c, m, q, cuts))
        if budgets and canary_error_share(query):
            errors.append(None if unbounded else _error_gate(c, m, min(budgets)))
    for found in (ttft, errors):
        if "" not in found:
            yield from (why for why in found if why)
    yield from _missing(c, cuts, budgets, bool(ttft), bool(errors))


def rollout_gates_hold_slos(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A Canary's gates can fail and are no looser than the SLOs they guard, each judged by what its
    MetricTemplate's query reads (its name is only a name): every gate has a max bound; where the plan
    has SLOs, a gate on the canary's own TTFT at the SLO's percentile or above, within its seconds, and
    one on the canary's error share within the availability SLO's budget; and it fails before it is
    promoted: a threshold of failed checks above its steps lets a canary failing every other check through."""
    for c in kube(resources, "Canary"):
        spec = c.props.get("spec") or {}
        analysis = spec.get("analysis") or spec.get("canaryAnalysis")
        if spec.get("skipAnalysis") or not analysis:
            yield c, f"{where(c)} skips its analysis: Flagger promotes every change at once, with no gate"
            continue
        metrics = [m for m in analysis.get("metrics") or [] if m.get("thresholdRange")]
        if not metrics:
            yield c, (f"{where(c)} has no metric with a thresholdRange: Flagger promotes it on its pods' readiness "
                      "alone, whatever its latency or errors")
        slos = _slos(resources, meta(c).get("labels", {}).get(MODEL_LABEL)) if metrics else []
        for message in _looser_than_slos(resources, c, metrics, slos):
            yield c, message
        threshold, steps = max(1, int(analysis.get("threshold") or 1)), analysis_steps(analysis)
        if steps and threshold > steps:
            yield c, (f"{where(c)} is rolled back after {threshold} failed checks but promoted after {steps} passed "
                      "ones: a canary failing every other check is promoted before it reaches the threshold; set "
                      f"vllm-gke:rollouts.failedChecks at most {steps}")
