"""How KEDA scales a serving pool: the ScaledObject's triggers (queue depth, work in flight, and the
wake-up of a pool at zero: its standby's requests, or behind a picker that queues, the picker's
queue) and the pace of scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .specs import ServingPoolSpec

# GPU replicas are slow to start and costly to churn: scale up fast, down slowly.
SCALE_BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
    "scaleDown": {"stabilizationWindowSeconds": 600, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
}


@dataclass(frozen=True)
class KedaScaling:
    """Where KEDA reads the pool's load: Managed Prometheus of `project`, as the
    ClusterTriggerAuthentication `auth` allows (Keda.auth_name)."""

    project: str
    # The ClusterTriggerAuthentication's name (a string, or a Pulumi output of one).
    auth: Any
    # For a pool that may go to zero: its standby's name prefix, whose request count wakes it...
    standby: str = ""
    # ...or, behind a picker that queues (picker_wake.py), its InferencePool's name: the picker's
    # queue for it wakes it.
    picker_pool: str = ""


def scaled_object(name: str, namespace: str, pool: ServingPoolSpec, target: KedaScaling, query_url: str,
                  group: Optional[str] = None, canary_max: int = 0) -> dict[str, Any]:
    """KEDA's ScaledObject for a pool, KEDA taking the largest trigger: requests waiting per
    replica over queueDepthTarget (scales out, as an HPA on queue depth would) and requests
    running (keeps a replica while it works, so an empty queue alone never takes the last one). A
    pool that may go to zero has a third that wakes it (at zero there is no vLLM metric): requests
    its standby answered, or behind a picker that queues, the picker's queue."""
    # A Deployment's pods are <name>-<hash>-<id>; a LeaderWorkerSet's leaders <group>-<index> (its
    # workers, <group>-<index>-<n>, export no vLLM metric), and it scales groups.
    selector = (f'namespace="{namespace}",pod=~"{group}-[0-9]+"' if group else pods_of(name, namespace))
    auth = {"name": target.auth, "kind": "ClusterTriggerAuthentication"}

    def prometheus(trigger: str, query: str, threshold: int) -> dict[str, Any]:
        # Named: Flagger's primaryScalerQueries replace a trigger's query by its name.
        return {"type": "prometheus", "name": trigger, "authenticationRef": auth, "metadata": {
            "serverAddress": query_url, "query": query, "threshold": str(threshold), "activationThreshold": "0"}}

    queue = prometheus("queue", queue_query(selector), pool.queue_depth_target)
    # Keep: while anything runs, one replica (the threshold never asks for more). On every pool,
    # so KEDA's record of when the pool was last active is current the day it is switched to zero.
    keep = prometheus("keep", keep_query(selector), 1)
    # A Flagger pool's own ScaledObject scales its canary, paused at 0 between rollouts: at the
    # canary's ceiling throughout the analysis, so its replicas carry no more than the primary's at the
    # largest share (the weight moves a step a minute; a replica added on a queue takes a cold start).
    low, high = (canary_max, canary_max) if canary_max else (pool.min_replicas, pool.max_replicas)
    spec: dict[str, Any] = {
        "scaleTargetRef": ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": group}
                           if group else {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}),
        "minReplicaCount": low, "maxReplicaCount": high,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": SCALE_BEHAVIOR}},
        "triggers": [queue, keep],
    }
    if pool.min_replicas == 0:
        # KEDA polls itself only to wake from (and go to) zero; above it the HPA reads the metrics, and
        # its webhook warns that the setting is irrelevant (kedacore/keda v2.20.2
        # apis/keda/v1alpha1/scaledobject_webhook.go:336-346).
        spec["pollingInterval"] = 15
        spec["cooldownPeriod"] = pool.cooldown_seconds
        # A pool switched to minReplicas 0 that was never active would go at KEDA's first poll.
        spec["initialCooldownPeriod"] = pool.cooldown_seconds
        spec["triggers"] = [prometheus("wake", wake_query(name, namespace, target), 1), queue, keep]
    return spec


def wake_query(name: str, namespace: str, target: KedaScaling) -> str:
    """1 while a pool at zero is asked for, else 0: threshold 1 with activation 0, so one request
    wakes it and the trigger never asks for more than one replica."""
    if target.picker_pool:
        return picker_wake_query(namespace, target.picker_pool)
    if not target.standby:
        raise ValueError(f"{name}: a pool that may scale to zero needs its standby's or picker's name to wake it")
    standby = f'namespace="{namespace}",pod=~"{target.standby}-[a-z0-9]+-[a-z0-9]+"'
    # Any request the standby answered in the last two minutes, or a wake still under way (a replica
    # loading: no vLLM metric yet, and the clients may have stopped retrying) so KEDA never cools down
    # mid-load. Each side 0 when it has no series (a standby just restarted): an empty side would
    # empty the sum, which KEDA reads as 0.
    return (f"clamp_max((sum(increase(vllm_gke_standby_requests_total{{{standby}}}[2m])) or vector(0)) + "
            f"(sum(vllm_gke_standby_waking{{{standby}}}) or vector(0)), 1)")


# llm-d-router v0.10.0's flow-control series (subsystem llm_d_epp: pkg/epp/metrics/llm_d_router_metrics.go:28).
# The requests inside its queue, by fairness_id, priority, inference_pool, model_name and
# target_model_name (:356-362; raised and lowered around the wait: flowcontrol/controller/controller.go:244-251).
PICKER_QUEUE_METRIC = "llm_d_epp_flow_control_queue_size"
# Each request's final queue outcome, by outcome, priority and inference_pool (:402-408; controller.go:313).
PICKER_OUTCOMES_METRIC = "llm_d_epp_flow_control_requests_total"
# How far back a counter's series must have no sample to count as born: a wake misfires only after
# a scrape gap longer than this.
BORN_WITHIN = "1h"


def picker_wake_query(namespace: str, pool: str) -> str:
    """Requests the picker holds for the pool, summed over its replicas (only the leader queues), or
    one it let go in the last two minutes without dispatching it: a burst that expired between two
    polls still wakes the pool. inference_pool is the picker's --pool-name (cmd/epp/runner/runner.go:992,
    requestcontrol/admission.go:173); namespace, the picker's as Managed Prometheus labels its series.

    At zero every outcome but Dispatched is such a request: an expired one is counted EvictedTTL (the
    queue's outcome; 503 rejected-no-endpoints is only its answer: admission.go:184-190,260-263), one
    refused by a full queue RejectedNoEndpoints (flowcontrol/controller/internal/processor.go:311-321), one whose client gave up
    EvictedContextCancelled. A counter's series appears at its first increment, where increase()
    sees no rise; so a series born in the last two minutes counts whole. Born, not merely back: one
    with any sample in the hour before counts nothing whole, so a scrape gap (a collector outage, a
    stalled picker) does not wake the pool with the counter's old total; only a gap over an hour
    can. Each side 0 when it has no series (none yet, or a picker restarted)."""
    queued = f'{PICKER_QUEUE_METRIC}{{namespace="{namespace}",inference_pool="{pool}"}}'
    dropped = f'{PICKER_OUTCOMES_METRIC}{{namespace="{namespace}",inference_pool="{pool}",outcome!="Dispatched"}}'
    return (f"clamp_max((sum({queued}) or vector(0)) + (sum(increase({dropped}[2m])) or vector(0)) + "
            f"(sum({dropped} unless count_over_time({dropped}[{BORN_WITHIN}] offset 2m)) or vector(0)), 1)")


def pods_of(deployment: str, namespace: str) -> str:
    """A Deployment's pods (<name>-<hash>-<id>) as a series selector: <name>-primary's are not its."""
    return f'namespace="{namespace}",pod=~"{deployment}-[a-z0-9]+-[a-z0-9]+"'


def queue_query(selector: str) -> str:
    return f"sum(vllm:num_requests_waiting{{{selector}}})"


def keep_query(selector: str) -> str:
    return f"clamp_max(sum(vllm:num_requests_running{{{selector}}}), 1)"


def primary_queries(name: str, namespace: str) -> dict[str, str]:
    """The triggers' queries for a Flagger pool's primary (<name>-primary's pods), by trigger name
    (Flagger's own rewrite of the target's name in a query is a best effort it warns about)."""
    selector = pods_of(f"{name}-primary", namespace)
    return {"queue": queue_query(selector), "keep": keep_query(selector)}


def primary_scaled_object(target: dict[str, Any], primary: str, min_replicas: int, max_replicas: int,
                          queries: dict[str, str]) -> dict[str, Any]:
    """The primary's ScaledObject exactly as Flagger v1.44.0 computes it from the target's
    (pkg/canary/scaled_object_reconciler.go reconcilePrimaryScaler:38-90: the target's spec, its
    scaleTargetRef named <target>-primary, min and max from primaryScalerReplicas, each named
    trigger's query from primaryScalerQueries). Declared by the plan, so a change of the pool's
    scaling reaches the primary at `pulumi up`: Flagger creates it only where missing and rewrites it
    only at promotion (:100-122, init), to these same values."""
    spec = {k: v for k, v in target.items() if k in (
        "pollingInterval", "cooldownPeriod", "advanced", "triggers", "fallback", "idleReplicaCount")}
    spec["scaleTargetRef"] = {**target["scaleTargetRef"], "name": primary}
    spec["minReplicaCount"], spec["maxReplicaCount"] = min_replicas, max_replicas
    spec["triggers"] = [{**t, "metadata": {**t["metadata"], "query": queries[t["name"]]}} if t.get("name") in queries
                        else t for t in target["triggers"]]
    return spec
