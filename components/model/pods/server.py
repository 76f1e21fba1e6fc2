"""The vLLM server's pod in each role of a serving pool: "server" (a replica on one node), and a
multi-host LeaderWorkerSet group's "leader" (serves, as a replica does) and "worker" (runs only
its share of the model: no HTTP, guard, probes or mesh sidecar).

The command line, environment and resources are components/model/vllm_server.py's; the startup
timings, serving_pool.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from ..capacity import hosts_per_replica
from ..disaggregation import kv_transfer_env
from ..disaggregation_cluster import disaggregated_pod, pod_role
from ..k8s_objects import BASE_LABELS, CONTAINER_SECURITY
from ..kv_offload import offload_args, offload_resources, shm_size
from ..node_pools import placement_for
from ..picker_prefix import kv_events_annotations, kv_events_args, kv_events_env
from ..serving_pool import startup_failure_threshold, startup_window_seconds
from ..sleep_mode import swap_env
from ..specs import ModelSpec, NodePoolSpec, ServingPoolSpec
from ..vllm_server import (
    GUARD_CONFIG_ENV,
    HOME,
    HOME_GI,
    NON_ROOT,
    PORT,
    RUNTIME_ENV,
    STARTUP_WINDOW_ENV,
    TMP_GI,
    WARM_MARKER,
    WARM_MARKER_ENV,
    WEIGHTS_MARKERS_ENV,
    container_resources,
    group_args,
    group_env,
    pre_stop_seconds,
    scratch_gi,
    sidecar_config,
    tpu_pod,
    trace_env,
    vllm_args,
    wait_for_weights,
    weights_markers,
)
from ..vllm_versions import VllmRelease
from ..weights_layout import SERVER_SA
from ..weights_mount import WeightsMount

Role = Literal["server", "leader", "worker"]
# On a group's workers instead of the pool's labels (which select leaders: they serve).
GROUP_WORKER_LABEL = "vllm-gke.io/group-worker-of"
# A worker's readiness: its leader's server answers (/metrics: no tenant token, open to scrapers).
LEADER_SERVES = ("import os, urllib.request; urllib.request.urlopen("
                 f"'http://' + os.environ['LWS_LEADER_ADDRESS'] + ':{PORT}/metrics', timeout=4)")
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"


@dataclass(frozen=True)
class ServerPod:
    """What a serving pool's pods are made of."""

    model: ModelSpec
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    image_uri: str
    release: VllmRelease
    # What the in-server guard admits: serving_api.guard_config(tenants, routes, ...).
    guard_config: Mapping[str, Any]
    # How the pods read the weights (the backend's volumes, mounts and annotations).
    weights: WeightsMount
    # The pool's labels (serving_pool.pool_identity) and its Service's selector.
    labels: Mapping[str, str]
    selector: Mapping[str, str]
    service_name: str
    # The termination grace period (serving_pool.grace_seconds).
    grace_seconds: int
    # Seconds a replica takes from start to warm (components/model/cold_start.py): its startup probe
    # allows half as long again.
    load_seconds: float
    # The load balancer's backend timeout: how long a stopping replica finishes what it accepted.
    request_timeout_seconds: int = 600
    # The servers' Kubernetes service account; None: the namespace's default.
    service_account: Optional[str] = SERVER_SA
    # The TTFT SLO's threshold: added to vLLM's TTFT buckets where it is not a bound.
    ttft_slo_seconds: Optional[float] = None
    # Where the servers send traces and the share of tenant requests traced; None: no traces.
    traces_endpoint: Optional[str] = None
    trace_sample_ratio: float = 0.01
    # The cluster's pod range: a multi-host group's leader reaches its workers there outside the mesh.
    pods_cidr: Optional[str] = None
    # The pool's XLA cache directory on its TPU nodes (vllm_server.xla_cache_host_path; a Pulumi
    # output where the namespace is one).
    xla_cache_path: Any = None
    # Publish KV-cache events for the pool's picker (precise prefix scoring, picker_prefix.py).
    kv_events: bool = False
    # models[].disaggregation: the other role's node pool (NIXL's transport needs both).
    kv_peer: Optional[NodePoolSpec] = None

    @property
    def hosts(self) -> int:
        return hosts_per_replica(self.model, self.node_pool)


def server_pod(a: ServerPod) -> dict[str, Any]:
    """The pod template of a replica on one node."""
    return _pod(a, "server")


def leader_pod(a: ServerPod) -> dict[str, Any]:
    """A group's leader: a replica's pod whose sidecar leaves the group's own traffic alone."""
    template = _pod(a, "leader")
    # The group's own traffic (torch.distributed / NCCL, or Ray) goes pod to pod on ports the mesh
    # cannot list: the leader's sidecar takes only the serving port inbound and leaves the pod
    # range outbound; workers have no sidecar. The group's NetworkPolicy admits only its own pods there.
    annotations = template["metadata"]["annotations"]
    annotations["traffic.sidecar.istio.io/includeInboundPorts"] = str(PORT)
    if a.pods_cidr:
        annotations["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = a.pods_cidr
    return template


def worker_pod(a: ServerPod) -> dict[str, Any]:
    """A group's worker: its share of the model, outside the mesh, ready while its leader serves."""
    template = _pod(a, "worker")
    template["metadata"]["annotations"] = {"sidecar.istio.io/inject": "false", SAFE_TO_EVICT: "false",
                                           **a.weights.annotations}
    # Not the pool's model/pool labels: the Service, PDB and scrape select leaders only.
    template["metadata"]["labels"] = {**BASE_LABELS, GROUP_WORKER_LABEL: a.service_name}
    container = template["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != GUARD_CONFIG_ENV]
    for key in ("startupProbe", "readinessProbe", "livenessProbe", "ports"):
        container.pop(key, None)
    # Ready while its leader serves: a recreated group's workers are not counted available (by the
    # PodDisruptionBudget) before the group can answer. No liveness probe: a restart recreates the
    # whole group, and the leader's own probes already watch it.
    container["readinessProbe"] = {"exec": {"command": ["python3", "-c", LEADER_SERVES]},
                                   "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    return template


def _pod(a: ServerPod, role: Role) -> dict[str, Any]:
    placement = placement_for(a.node_pool)
    template: dict[str, Any] = {
        "metadata": {"labels": {**BASE_LABELS, **a.labels},
                     "annotations": {
                         **sidecar_config(),
                         # A warm replica is minutes of weight loading: the cluster
                         # autoscaler must not evict it to consolidate nodes.
                         SAFE_TO_EVICT: "false",
                         **a.weights.annotations,
                         # The events' ports left to the NetworkPolicy (workers publish none).
                         **(kv_events_annotations() if a.kv_events and role != "worker" else {})}},
        "spec": {
            # Its own identity: the weights bucket and the limit store grant to it
            # alone (MeshNamespace creates it), not to the namespace's default.
            **({"serviceAccountName": a.service_account} if a.service_account else {}),
            "terminationGracePeriodSeconds": a.grace_seconds,
            # The server calls no Kubernetes API: no token to steal.
            "automountServiceAccountToken": False,
            "nodeSelector": dict(placement.node_selector),
            "tolerations": [dict(t) for t in placement.tolerations],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": dict(a.selector)}}}]}},
            "securityContext": {**NON_ROOT, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": _init_containers(a),
            "containers": [_vllm_container(a, role)],
            "volumes": _volumes(a),
        },
    }
    if a.node_pool.is_tpu:  # root for the chips, the node's XLA cache, Ray's health checks
        tpu_pod(template, a.hosts, a.xla_cache_path)
    if (pd := pod_role(a.model, a.pool)) is not None:  # models[].disaggregation: the pool's role in P/D
        template = disaggregated_pod(template, pd, kv_transfer_env(a.model, a.node_pool, a.kv_peer), worker=role == "worker")
    return template


def _init_containers(a: ServerPod) -> list[dict[str, Any]]:
    """Reading a bucket mount needs the network: an init container would read it before the mesh
    sidecar serves whenever the sidecar is a classic one (managed Cloud Service Mesh lists no
    nativeSidecar annotation) and Istio CNI captures the pod's traffic from the start, so the FUSE
    sidecar's calls go nowhere and the pod never starts. The entrypoint waits instead, after the
    proxy (holdApplicationUntilProxyStarts)."""
    if a.weights.through_fuse:
        return []
    return [{
        "name": "wait-for-weights",
        "image": a.image_uri,
        "command": ["/bin/sh", "-c", wait_for_weights(a.model)],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                      "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [dict(m) for m in a.weights.mounts],
    }]


def _vllm_container(a: ServerPod, role: Role) -> dict[str, Any]:
    # A replica on one node takes its devices (one MIG slice is one nvidia.com/gpu; parallelism
    # needs that many whole GPUs or TPU chips); across hosts each pod takes its node's.
    pod_devices = min(a.model.devices_per_replica, a.node_pool.slices_per_node)
    # The engine that serves publishes its cache's events (a group's leader, not its workers).
    events = kv_events_args(a.model.name) if a.kv_events and role != "worker" else []
    return {
        "name": "vllm",
        "image": a.image_uri,
        "command": ["python3", "/opt/vllm-gke/serve.py"],
        "args": [*vllm_args(a.model, a.pool, a.release, a.request_timeout_seconds, a.ttft_slo_seconds,
                            a.traces_endpoint), *group_args(a.hosts, a.release, role), *events,
                 *offload_args(a.model, a.node_pool)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [*group_env(a.hosts, a.release, role), *_env(a), *(kv_events_env() if events else [])],
        # With models[].kvOffload, its pinned host buffer too (components/model/kv_offload.py).
        "resources": offload_resources(container_resources(a.node_pool, pod_devices, scratch_gi(
            a.model, a.weights.through_fuse)), a.model, a.node_pool),
        "securityContext": CONTAINER_SECURITY,
        # Model load plus warm-up can take many minutes: allow 30, or half as long again as the
        # plan's estimate where that is more (a 405B from a share), or the kubelet restarts a
        # replica that was still loading.
        "startupProbe": {"exec": {"command": ["test", "-f", WARM_MARKER]},
                         "periodSeconds": 10,
                         "failureThreshold": startup_failure_threshold(a.load_seconds)},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"},
                          "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 6},
        # Let the load balancer drop the endpoint before vLLM stops.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(pre_stop_seconds(a.node_pool))]}}},
        "volumeMounts": [*(dict(m) for m in a.weights.mounts), {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME}],
    }


def _env(a: ServerPod) -> list[dict[str, Any]]:
    # Through FUSE the entrypoint waits for the weights' completion markers itself.
    wait = [{"name": WEIGHTS_MARKERS_ENV, "value": ":".join(weights_markers(a.model))}] if a.weights.through_fuse else []
    return [
        *RUNTIME_ENV,
        *wait,
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": WARM_MARKER_ENV, "value": WARM_MARKER},
        {"name": STARTUP_WINDOW_ENV, "value": str(startup_window_seconds(a.load_seconds))},
        {"name": GUARD_CONFIG_ENV, "value": json.dumps(dict(a.guard_config), sort_keys=True)},
        *(trace_env(a.trace_sample_ratio, a.service_name) if a.traces_endpoint else []),
        *swap_env(a.model),  # models[].sleepMode: the lease's node and holder
    ]


def _volumes(a: ServerPod) -> list[dict[str, Any]]:
    # A host KV tier (models[].kvOffload) lives in /dev/shm: vLLM checks it all fits there.
    shm = shm_size(16 if a.model.devices_per_replica > 1 else 2, a.model, a.node_pool)
    return [
        *(dict(v) for v in a.weights.volumes),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        # Compile caches (torch.compile, Triton, FlashInfer JIT) and scratch.
        {"name": "tmp", "emptyDir": {"sizeLimit": f"{TMP_GI}Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": f"{HOME_GI}Gi"}},
    ]
