"""A serving pool of one model, as numbers and Kubernetes bodies: its names and labels, its
startup and rollout timings, its workload (a Deployment, or a LeaderWorkerSet of multi-host
groups), Service, PodDisruptionBudget and scrape, and the checks of what it is asked to serve.

components/vllm_service.py declares these; the pods themselves are components/model/pods/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .capacity import hosts_per_replica, rollout_strategy
from .cold_start import NODE_PROVISION_S, rollout_seconds
from .config_rules import (
    check_extra_args,
    check_fit,
    check_image_tag,
    check_pool_lengths,
    check_tenant_cap,
    check_tenant_limits,
)
from .config_rules.base import Add
from .k8s_objects import MODEL_LABEL, POOL_LABEL, REVISION_LABEL, TENANT_LABEL, WORKLOAD_LABEL, service_name_of
from .specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec, TenantSpec, item_key
from .vllm_server import PORT, drain_seconds
from .vllm_versions import VllmRelease

# Carried by vLLM pods only: a pool's standby shares its model and pool labels (so the Service
# selects it) but not this one.
SERVER_LABELS = {"app.kubernetes.io/name": "vllm"}

# LeaderWorkerSet v0.10.0 (kubernetes-sigs/lws; components/leader_worker_set.py installs it).
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# A multi-host TPU slice is a node pool of its own: one group to a slice, all of it (lws v0.10.0
# api/leaderworkerset/v1/leaderworkerset_types.go:29). A GPU group's pods each take a whole node by
# their GPU request.
EXCLUSIVE_TOPOLOGY = {"leaderworkerset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}


@dataclass(frozen=True)
class PoolIdentity:
    """What names and selects a pool's objects."""

    service_name: str
    # On every object and vLLM pod of the pool.
    labels: Mapping[str, str]
    # The Service's: the pool's vLLM pods and its standby.
    selector: Mapping[str, str]
    # More labels the pool's pods carry that its mesh policies select on (a dedicated pool's tenant).
    policy_labels: Mapping[str, str]


def pool_identity(model: ModelSpec, pool_name: str, canary: bool = False, tenant: Optional[str] = None) -> PoolIdentity:
    # A canary's pool label differs, so the stable Service never selects canary pods (and the
    # stable Deployment's immutable selector stays as it was).
    pool_label = f"{pool_name}-canary" if canary else pool_name
    policy = {TENANT_LABEL: tenant} if tenant else {}
    labels = {MODEL_LABEL: model.name, POOL_LABEL: pool_label, **SERVER_LABELS,
              REVISION_LABEL: model.revision.replace("/", "-")[:63].rstrip("-._"), **policy}
    return PoolIdentity(service_name_of(model.name, pool_name, canary), labels,
                        {MODEL_LABEL: model.name, POOL_LABEL: pool_label}, policy)


def grace_seconds(request_timeout_seconds: int) -> int:
    """A replica's termination grace period: preStop, then vLLM finishing what it accepted, then
    its own teardown."""
    return drain_seconds(request_timeout_seconds) + 30


def startup_failure_threshold(load_seconds: float) -> int:
    """Startup probe periods (10 s each) before the kubelet gives up on a replica: 30 minutes at
    least, 1.5x the estimated load and warm-up where that is longer."""
    return max(180, math.ceil(1.5 * load_seconds / 10))


def startup_window_seconds(load_seconds: float) -> int:
    """The startup probe's window (periods of 10 s): the entrypoint waits for vLLM that long too."""
    return 10 * startup_failure_threshold(load_seconds)


def disruption_budget() -> dict[str, Any]:
    """One replica (or, for a multi-host group, one pod and so its group) down at a time, never
    none: a budget that allows no disruption holds every drain of its node (node upgrades, repairs,
    autoscaler consolidation) until GKE's one-hour limit forces it, and the replica goes all the
    same. So a pool at one replica is taken down by a drain and reloads elsewhere (the plan says so
    and how long); with more, the next eviction waits until the replacement is Ready. A group's
    pods are Ready only while their leader serves, so a reloading group counts as down."""
    return {"maxUnavailable": 1}


def progress_deadline_seconds(load_seconds: float, grace_seconds: int = 0, behind_seconds: float = 0) -> int:
    """A rollout's progress deadline: a node to come up (cold_start.NODE_PROVISION_S), the old
    replica's grace period where one is taken first, and the new replica's startup probe budget,
    so only a replica the kubelet gives up on fails it; `behind_seconds` more where the step may
    wait behind other pools' rollouts on a full node pool (a device it freed taken by their pods)."""
    return int(NODE_PROVISION_S + grace_seconds + behind_seconds) + startup_window_seconds(load_seconds)


def group_can_surge(pool: ServingPoolSpec, hosts: int, node_pool: NodePoolSpec) -> bool:
    """The node pool reaches the hosts of one group more than the pool's most (its own maxNodes,
    and an on-demand twin's). A multi-host TPU slice pool is one slice: never (its twin holds the
    second slice only while the group runs on spot)."""
    if node_pool.is_tpu and hosts > 1:
        return False  # the surge slice would be the twin's only if the group runs on spot: not known
    reach = node_pool.max_nodes * (2 if node_pool.has_fallback_pool else 1)
    return reach >= (pool.max_replicas + 1) * hosts


@dataclass(frozen=True)
class Rollout:
    """How a pool's replicas are replaced, and how long that may take."""

    rolling: Mapping[str, int | str]
    progress_deadline_seconds: int
    # Pulumi's wait for the workload, minutes.
    create_minutes: int
    update_minutes: int

    @property
    def surge(self) -> bool:
        """A new replica before an old one goes (else one is replaced in place)."""
        return self.rolling["maxUnavailable"] == 0


def rollout(pool: ServingPoolSpec, node_pool: NodePoolSpec, hosts: int, load_seconds: float, grace: int,
            rolling: Optional[Mapping[str, int | str]] = None, wait_behind_seconds: float = 0.0) -> Rollout:
    """The rolling update (`rolling`, capacity.rollout_strategy; None: from this pool's own room on
    the node pool), the progress deadline, and Pulumi's wait: one replica's load on create (KEDA
    raises the count later), and at the ceiling a rollout one replica at a time on update; the
    default 45 min fails a 70B pool of two replicas or more while its rollout still goes well."""
    rolling = rolling or rollout_strategy(None if group_can_surge(pool, hosts, node_pool) else 1)
    in_place = rolling["maxUnavailable"] != 0
    behind = wait_behind_seconds if in_place else 0.0
    update_s = rollout_seconds(pool.max_replicas, load_seconds, grace) + behind + 600
    return Rollout(rolling, progress_deadline_seconds(load_seconds, grace if in_place else 0, behind),
                   create_minutes=math.ceil((NODE_PROVISION_S + load_seconds + 600) / 60),
                   update_minutes=math.ceil(update_s / 60))


def deployment_spec(pool: ServingPoolSpec, selector: Mapping[str, str], plan: Rollout,
                    template: Mapping[str, Any], start_at_zero: bool = False) -> dict[str, Any]:
    """`start_at_zero`: a Flagger target, whose replicas run only while a canary is analysed (Flagger
    copies it to the primary, which serves)."""
    return {
        # KEDA owns the count. A pool that may go to zero starts there (the first `pulumi up`
        # pays no cold start, and KEDA wakes it on the first request); the others start at
        # one and KEDA raises them to their floor. The component ignores changes to it: later
        # updates never set it back.
        **({"replicas": 0} if pool.min_replicas == 0 or start_at_zero else {}),
        "selector": {"matchLabels": dict(selector)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(plan.rolling)},
        # Progress is a new replica Ready: allow for its node and its load, or the
        # controller reports the rollout failed (and `pulumi up` with it) mid-load.
        "progressDeadlineSeconds": plan.progress_deadline_seconds,
        "template": template,
    }


def leader_worker_set(pool: ServingPoolSpec, hosts: int, leader: dict[str, Any],
                      worker: dict[str, Any], surge: bool = True) -> dict[str, Any]:
    """A pool of multi-host replicas: each group a leader (the API server, the guard, rank 0) and
    hosts-1 workers. A failed pod recreates its group (a torch.distributed or Ray world cannot take
    a member back); groups start together (the leader's engine waits for its workers). A rollout
    adds a new group before it takes an old one (maxSurge 1, maxUnavailable 0), as the Deployments
    do, where the node pool has the hosts for one more group (`surge`); else it replaces a group in
    place (maxSurge 0, maxUnavailable 1: that group's capacity is gone until its successor loads),
    since a surge group with no nodes to land on would hold the rollout forever. KEDA owns
    `replicas` (the scale subresource counts groups)."""
    rolling = {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    return {
        **({"replicas": 0} if pool.min_replicas == 0 else {}),
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling},
        "leaderWorkerTemplate": {"size": hosts, "restartPolicy": "RecreateGroupOnPodRestart",
                                 "leaderTemplate": leader, "workerTemplate": worker},
    }


def group_network_policy(group: str) -> dict[str, Any]:
    """A group's pods talk among themselves on any port (outside the mesh: torch.distributed, NCCL,
    Ray); from elsewhere only the serving port and the leader's sidecar ports are open."""
    members = {"podSelector": {"matchLabels": {LWS_NAME_LABEL: group}}}
    return {"podSelector": {"matchLabels": {LWS_NAME_LABEL: group}}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [members]},
                        {"ports": [{"protocol": "TCP", "port": p} for p in (PORT, 15006, 15020, 15021, 15090)]}]}


def service_spec(selector: Mapping[str, str]) -> dict[str, Any]:
    return {"type": "ClusterIP", "selector": dict(selector),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "appProtocol": "http"}]}


def budget_spec(selector: Mapping[str, str], group: Optional[str] = None) -> dict[str, Any]:
    """vLLM pods only: the standby is never Ready while the pool serves, and counted here it would
    leave no disruption allowed, blocking every node drain and upgrade. A group: every pod of it
    (one evicted takes its whole group down)."""
    return {**disruption_budget(), "selector": {"matchLabels": (
        {LWS_NAME_LABEL: group} if group else {**selector, **SERVER_LABELS})}}


def pod_monitoring_spec(selector: Mapping[str, str]) -> dict[str, Any]:
    """Every series a server exports (vLLM's and the guard's) carries its Deployment (the `workload`
    a Flagger pool's gates compare: <service> or <service>-primary) and its model revision."""
    return {"selector": {"matchLabels": dict(selector)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
            "targetLabels": {"fromPod": [{"from": WORKLOAD_LABEL, "to": "workload"},
                                         {"from": REVISION_LABEL, "to": "revision"}]}}


def check_pool(add: Add, model: ModelSpec, pool_name: str, node_pool: NodePoolSpec, image: ImageRef,
               release: VllmRelease, pods_cidr: Optional[str], request_timeout_seconds: int) -> None:
    """The stack config's own checks, as it runs them on one pool of a model (the canary's, for a
    canary pool) on its node pool, keyed as the package spells its inputs."""
    if pool_name not in model.pool_names and not (pool_name == "prefill" and model.disaggregation is not None):
        add("poolName", f"'{pool_name}': model '{model.name}' has routing {model.routing}, whose one "
            "pool is short (behind the endpoint picker); nothing would route to a long pool")
    check_pool_lengths(add, "model", model)
    check_fit(add, "model", model, node_pool)
    if hosts_per_replica(model, node_pool) > 1 and not pods_cidr:
        add("podsCidr", "model spans hosts: give the cluster's pod range (cluster.podsCidr), "
            "where its group's leader reaches its workers outside the mesh")
    tpu = release.platform == "tpu"
    check_extra_args(add, "model.extraArgs", model, release.version, tpu=tpu)
    check_image_tag(add, "image.tag", image, release.version, "vllmVersion", tpu=tpu)
    if not 30 <= request_timeout_seconds <= 3600:
        add("requestTimeoutSeconds", f"must be 30-3600 (as gateway.requestTimeoutSeconds), not {request_timeout_seconds}")


def check_callers(add: Add, model: ModelSpec, node_pool: NodePoolSpec, callers: Sequence[TenantSpec],
                  owner: Optional[str], global_limits: bool) -> None:
    """The tenants a pool serves, as the stack config checks them on this model: the owner of a
    dedicated copy among them, with the model listed as its own, on the node pool it names (a
    shared pool: the model's); each one's max_tokens cap and rate limits."""
    spec = next((t for t in callers if t.name == owner), None)
    if owner and spec is None and callers:
        add("tenant", f"'{owner}' is not among tenants: the owner of dedicated replicas must be "
            "one of the tenants that may call them")
    elif spec is not None and (spec.dedicated is None or model.name not in spec.dedicated.models):
        # Its namespace holds the server's service account only for a tenant with dedicated models.
        add("tenant", f"'{owner}' has no dedicated copy of '{model.name}': list it under the "
            "tenant's dedicated.models (TenantAuth then makes the namespace's server account), or "
            "leave tenant out for shared replicas")
    # A tenant's dedicated copy runs on the tenant's own pool, not the model's.
    dedicated = spec.dedicated if spec is not None else None
    wanted, key = ((dedicated.node_pool, f"tenants[{owner}].dedicated.nodePool")
                   if dedicated is not None else (model.node_pool, "model.nodePool"))
    if wanted != node_pool.name:
        add(key, f"'{wanted}' is not nodePool.name '{node_pool.name}': give the node pool it names")
    for i, tenant in enumerate(callers):
        key = item_key("tenants", callers, i)
        check_tenant_cap(add, key, tenant, model)
        check_tenant_limits(add, key, tenant, global_limits, "globalLimits")
