"""VllmService: one serving pool (short or long requests) of one model.

Declares the Deployment running vLLM's OpenAI server from the pinned image, its Service,
a PodDisruptionBudget, a KEDA ScaledObject on queue depth (vllm:num_requests_waiting, read from
Managed Prometheus) and a PodMonitoring for scraping.

Every pool is scaled by KEDA, whatever its floor: one autoscaling path, one external metrics
server (KEDA's), and a floor raised from 0 is a ScaledObject update that KEDA's operator acts on
at once (it scales a target below minReplicaCount up to it; an HPA never scales from zero).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from . import gcs_weights
from .gpu_cluster import placement_for
from .k8s_meta import (
    BASE_LABELS,
    CONTAINER_SECURITY,
    MODEL_LABEL,
    POOL_LABEL,
    TENANT_LABEL,
    api_body,
    custom_resource,
    meta,
)
from .options import child_opts
from .specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec
from .vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .weights_layout import MOUNT_PATH, SERVER_SA, SERVER_UID, adapter_copies, model_dir, ready_marker, served_files_gb

PORT = 8000
WARM_MARKER = "/tmp/vllm-gke-warm"
# How long a stopping replica keeps serving before vLLM gets SIGTERM: the load balancer takes the
# endpoint out of its NEG meanwhile, so no new request arrives once vLLM starts to drain.
PRE_STOP_S = 20
# The platform's own variables: not VLLM_*, which vLLM validates as its own and warns (or, with
# --fail-on-environ-validation, fails) on.
GUARD_CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
WARM_MARKER_ENV = "GKE_LLM_WARM_MARKER"
GUARD_MIDDLEWARE = "vllm_gke_guard.GuardMiddleware"
WAITING_FOR_WEIGHTS = (
    'until [ -f "{marker}" ]; do echo "waiting for weights at {marker}"; sleep 15; done'
)


# Bucket-backed weights: the markers the entrypoint (images/serve.py) waits for before vLLM starts.
WEIGHTS_MARKERS_ENV = "GKE_LLM_WEIGHTS_MARKERS"


def weights_markers(model: ModelSpec) -> list[str]:
    return [ready_marker(model), *(c.marker for c in adapter_copies(model))]


def wait_for_weights(model: ModelSpec) -> str:
    """The init container's script: every marker (model, then adapters) present. The paths are made
    of validated names and git revisions only ([A-Za-z0-9._/-]), so quoting them is enough."""
    return "; ".join(WAITING_FOR_WEIGHTS.format(marker=m) for m in weights_markers(model))

PoolName = Literal["short", "long"]
# Carried by vLLM pods only: a pool's standby shares its model and pool labels (so the Service
# selects it) but not this one.
SERVER_LABELS = {"app.kubernetes.io/name": "vllm"}
# GPU replicas are slow to start and costly to churn: scale up fast, down slowly.
SCALE_BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
    "scaleDown": {"stabilizationWindowSeconds": 600, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
}
# The server runs as this unprivileged user; HOME and the caches live on emptyDirs because the
# root filesystem is read-only. USER is set too: torch's compile cache calls getpass.getuser(),
# which fails for a UID with no passwd entry.
HOME = "/home/vllm"
NON_ROOT = {"runAsNonRoot": True, "runAsUser": SERVER_UID, "runAsGroup": SERVER_UID}
RUNTIME_ENV = ({"name": "HOME", "value": HOME}, {"name": "USER", "value": "vllm"},
               {"name": "XDG_CACHE_HOME", "value": f"{HOME}/.cache"})


def service_name_of(model: str, pool_name: str, canary: bool = False) -> str:
    """The pool's Service, Deployment and autoscaler name."""
    return f"{model}-canary-{pool_name}" if canary else f"{model}-{pool_name}"


def disruption_budget(pool: ServingPoolSpec) -> dict[str, Any]:
    """Never let a voluntary disruption (node drain, upgrade, autoscaler consolidation) take the
    last serving replica: with one replica that means no eviction at all until GKE's drain
    timeout, so upgrades happen in the maintenance window; with more, one at a time. A pool that
    may scale to zero accepts going to zero."""
    return {"minAvailable": 1} if pool.min_replicas == 1 else {"maxUnavailable": 1}


@dataclass(frozen=True)
class KedaScaling:
    """Where KEDA reads the pool's load: Managed Prometheus of `project`, as the
    ClusterTriggerAuthentication `auth` allows (Keda.auth_name)."""

    project: str
    auth: pulumi.Input[str]
    # For a pool that may go to zero: its standby's name prefix, whose request count wakes it.
    standby: str = ""


def scaled_object(name: str, namespace: str, pool: ServingPoolSpec, target: KedaScaling, query_url: str) -> dict[str, Any]:
    """KEDA's ScaledObject for a pool, KEDA taking the largest trigger: requests waiting per
    replica over queueDepthTarget (scales out, as an HPA on queue depth would) and requests
    running (keeps a replica while it works, so an empty queue alone never takes the last one). A
    pool that may go to zero has a third: requests its standby answered (wakes it: at zero there
    is no vLLM metric)."""
    selector = f'namespace="{namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
    auth = {"name": target.auth, "kind": "ClusterTriggerAuthentication"}

    def prometheus(query: str, threshold: int) -> dict[str, Any]:
        return {"type": "prometheus", "authenticationRef": auth, "metadata": {
            "serverAddress": query_url, "query": query, "threshold": str(threshold), "activationThreshold": "0"}}

    queue = prometheus(f"sum(vllm:num_requests_waiting{{{selector}}})", pool.queue_depth_target)
    # Keep: while anything runs, one replica (the threshold never asks for more). On every pool,
    # so KEDA's record of when the pool was last active is current the day it is switched to zero.
    keep = prometheus(f"clamp_max(sum(vllm:num_requests_running{{{selector}}}), 1)", 1)
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": pool.min_replicas, "maxReplicaCount": pool.max_replicas,
        "pollingInterval": 15,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": SCALE_BEHAVIOR}},
        "triggers": [queue, keep],
    }
    if pool.min_replicas == 0:
        if not target.standby:
            raise ValueError(f"{name}: a pool that may scale to zero needs its standby's name to wake it")
        standby = f'namespace="{namespace}",pod=~"{target.standby}-[a-z0-9]+-[a-z0-9]+"'
        spec["cooldownPeriod"] = pool.cooldown_seconds
        # A pool switched to minReplicas 0 that was never active would go at KEDA's first poll.
        spec["initialCooldownPeriod"] = pool.cooldown_seconds
        spec["triggers"] = [
            # Wake: any request the standby answered in the last two minutes asks for one replica.
            prometheus(f"clamp_max(sum(increase(vllm_gke_standby_requests_total{{{standby}}}[2m])), 1)", 1),
            queue, keep,
        ]
    return spec


def drain_seconds(request_timeout_seconds: int) -> int:
    """How long a stopping replica may still be answering a request it accepted: the preStop
    window plus the longest request the load balancer lets run (its backend timeout)."""
    return PRE_STOP_S + request_timeout_seconds


def sidecar_config() -> dict[str, str]:
    """Pod annotations that keep the Istio sidecar up while vLLM finishes what it accepted. As a
    native sidecar (an init container that Kubernetes stops only after vLLM has exited; its
    injected preStop starts the drain and its listeners keep accepting) it outlives vLLM by
    construction. As a classic one, pilot-agent's default would exit 5 s after SIGTERM; with
    EXIT_ON_ZERO_ACTIVE_CONNECTIONS it exits once no connection is open, bounded by the grace
    period (istio 1.24.6/1.30.3 pkg/envoy/agent.go:152-230)."""
    proxy = {"holdApplicationUntilProxyStarts": True, "proxyMetadata": {"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true"}}
    return {"proxy.istio.io/config": json.dumps(proxy, sort_keys=True), "sidecar.istio.io/nativeSidecar": "true"}


def vllm_args(model: ModelSpec, pool: ServingPoolSpec, rel: Optional[VllmRelease] = None,
              request_timeout_seconds: int = 600) -> list[str]:
    """Flags for `vllm serve` of release `rel` (default the newest supported), following GKE's vLLM
    serving guides."""
    rel = rel or release(DEFAULT_VLLM_VERSION)
    args = [
        model_dir(model),
        "--served-model-name", model.name,
        "--host", "0.0.0.0", "--port", str(PORT),
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        "--max-model-len", str(model.pool_max_model_len(pool)),
        "--max-num-seqs", str(pool.max_num_seqs),
        "--gpu-memory-utilization", f"{model.gpu_memory_utilization:g}",
        "--enable-prefix-caching" if model.enable_prefix_caching else rel.disable_prefix_caching,
        # Explicit either way: releases differ in their defaults and in the off switch's name.
        "--enable-chunked-prefill" if model.enable_chunked_prefill else rel.disable_chunked_prefill,
    ]
    if pool.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(pool.max_num_batched_tokens)]
    if model.dtype in ("bfloat16", "float16"):
        args += ["--dtype", model.dtype]
    else:
        args += ["--quantization", "compressed-tensors" if model.dtype == "int8" else model.dtype]
    if model.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", model.kv_cache_dtype]
    if model.adapters:
        # Loaded at start from the share (never from the hub); clients pick one with `model`.
        args += ["--enable-lora", "--max-loras", str(model.lora_slots), "--max-lora-rank", str(model.max_lora_rank),
                 "--max-cpu-loras", str(max(model.lora_slots, len(model.adapters))),
                 "--lora-modules", *(f"{a.name}={c.directory}" for a, c in zip(model.adapters, adapter_copies(model)))]
    if rel.shutdown_timeout_flag:
        # On SIGTERM the engine keeps generating what it accepted for up to this long, streams
        # included, instead of aborting it (0.34's default of 0).
        args += [rel.shutdown_timeout_flag, str(request_timeout_seconds)]
    args += ["--middleware", GUARD_MIDDLEWARE]
    return args + list(model.extra_args)


# The node-disk emptyDirs a server writes - compile caches and scratch (/tmp) and its home - at
# most (their sizeLimits), and what they typically hold (the request).
TMP_GI, HOME_GI = 8, 16
SCRATCH_REQUEST_GI = 4


def scratch_gi(model: ModelSpec, bucket_cache: bool) -> int:
    """Node disk to request for one replica: its compile caches, plus, on the bucket backend,
    Cloud Storage FUSE's file cache (an emptyDir sized to the model and its adapters, which the
    sidecar fills with the whole model on the first read)."""
    return SCRATCH_REQUEST_GI + (gcs_weights.cache_gi(served_files_gb(model)) if bucket_cache else 0)


def container_resources(node_pool: NodePoolSpec, gpus: int, scratch: int = 0) -> dict[str, dict[str, str]]:
    """A pod's share of the node's CPU and RAM, in proportion to the GPU units it takes, and the
    node disk its emptyDirs may fill (`scratch` GiB): requested, so the scheduler never packs more
    replicas on a node than its boot disk holds (the kubelet would evict them under DiskPressure)."""
    machine = node_pool.machine
    units = node_pool.slices_per_node
    cpu = max(1, math.floor((machine.vcpus - 2) / units)) * gpus
    memory = max(8, math.floor((machine.memory_gb * 0.85 - 4) / units)) * gpus
    # requests == limits: Guaranteed QoS, so the kubelet never evicts a loaded model first.
    res = {"cpu": str(cpu), "memory": f"{memory}Gi", "nvidia.com/gpu": str(gpus)}
    requests = {**res, **({"ephemeral-storage": f"{scratch}Gi"} if scratch else {})}
    return {"requests": requests, "limits": dict(res)}


@dataclass
class VllmServiceArgs:
    model: ModelSpec
    pool_name: PoolName
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    namespace: pulumi.Input[str]
    image: ImageRef
    claim_name: pulumi.Input[str]
    provider: k8s.Provider
    # What the in-server guard admits: serving_api.guard_config(tenants, routes, ...). Required: a
    # guard without tenants refuses every request.
    guard_config: Mapping[str, Any]
    # Per-issuer max_tokens caps and rate limits the in-server guard enforces.
    tenant: Optional[str] = None
    release: VllmRelease = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION))
    # A canary of another revision runs as its own pool beside the stable one.
    canary: bool = False
    # The weights as a pod volume named "weights" instead of `claim_name`'s claim (ModelStore's
    # bucket backend), with the pod annotations its CSI driver needs.
    weights_volume: Optional[Mapping[str, Any]] = None
    weights_annotations: Mapping[str, str] = field(default_factory=dict[str, str])
    # Or one read-only claim per weight set, mounted at its directory (ModelStore's Hyperdisk ML
    # backend: a populated disk per model revision and per adapter).
    weights_claims: Mapping[str, pulumi.Input[str]] = field(default_factory=dict[str, pulumi.Input[str]])
    # KEDA scales every pool (Keda installed; for minReplicas 0, with the standby's name).
    scaling: Optional[KedaScaling] = None
    # The load balancer's backend timeout (GatewaySpec.request_timeout_seconds): how long a
    # stopping replica keeps finishing the requests it accepted.
    request_timeout_seconds: int = 600
    # The servers' Kubernetes service account (MeshNamespace service_accounts creates it); None:
    # the namespace's default.
    service_account: Optional[str] = SERVER_SA


class VllmService(pulumi.ComponentResource):
    deployment: k8s.apps.v1.Deployment
    service: k8s.core.v1.Service
    service_name: str

    def __init__(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if "issuers" not in (args.guard_config or {}):
            raise ValueError(f"VllmService {name}: guard_config has no issuers, so the guard would refuse every "
                             "request; build it with serving_api.guard_config(tenants, tenant_routes(), ...)")
        super().__init__("vllm-gke:index:VllmService", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        model, pool = args.model, args.pool
        # A canary's pool label differs, so the stable Service never selects canary pods (and the
        # stable Deployment's immutable selector stays as it was).
        pool_label = f"{args.pool_name}-canary" if args.canary else args.pool_name
        self.service_name = service_name_of(model.name, args.pool_name, args.canary)
        labels = {MODEL_LABEL: model.name, POOL_LABEL: pool_label, **SERVER_LABELS,
                  "vllm-gke.io/revision": model.revision.replace("/", "-")[:63].rstrip("-._")}
        if args.tenant:
            labels[TENANT_LABEL] = args.tenant
        selector = {MODEL_LABEL: model.name, POOL_LABEL: pool_label}
        placement = placement_for(args.node_pool)
        # One MIG slice is one nvidia.com/gpu; tensor parallelism needs that many whole GPUs.
        gpus = model.tensor_parallel_size
        shm = "16Gi" if gpus > 1 else "2Gi"
        weights_mounts: list[dict[str, Any]] = [{"name": "weights", "mountPath": MOUNT_PATH, "readOnly": True}]
        weights_volumes: list[Any] = [
            {"name": "weights", "persistentVolumeClaim": {"claimName": args.claim_name, "readOnly": True}}]
        if args.weights_claims:
            ordered = sorted(args.weights_claims.items())
            weights_mounts = [{"name": f"weights-{i}", "mountPath": d, "readOnly": True}
                              for i, (d, _) in enumerate(ordered)]
            weights_volumes = [{"name": f"weights-{i}", "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
                               for i, (_, c) in enumerate(ordered)]
        elif args.weights_volume is not None:
            # The bucket mount, and its file cache sized for this model and its adapters.
            weights_volumes = [gcs_weights.with_cache_limit(args.weights_volume, served_files_gb(model)),
                               gcs_weights.cache_volume(served_files_gb(model))]
        # Reading a bucket mount needs the network: an init container would read it before the
        # mesh sidecar serves whenever the sidecar is a classic one (managed Cloud Service Mesh
        # lists no nativeSidecar annotation) and Istio CNI captures the pod's traffic from the
        # start, so the FUSE sidecar's calls go nowhere and the pod never starts. The entrypoint
        # waits instead, after the proxy (holdApplicationUntilProxyStarts).
        fuse = args.weights_volume is not None and not args.weights_claims
        init_containers = [] if fuse else [{
            "name": "wait-for-weights",
            "image": args.image.uri,
            "command": ["/bin/sh", "-c", wait_for_weights(model)],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                          "limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": weights_mounts,
        }]
        wait_env = [{"name": WEIGHTS_MARKERS_ENV, "value": ":".join(weights_markers(model))}] if fuse else []

        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy",
            metadata={**meta(self.service_name, labels=labels), "namespace": args.namespace},
            spec=api_body({
                # KEDA owns the count. A pool that may go to zero starts there (the first `pulumi up`
                # pays no cold start, and KEDA wakes it on the first request); the others start at
                # one and KEDA raises them to their floor. ignore_changes below: later updates
                # never set it back.
                **({"replicas": 0} if pool.min_replicas == 0 else {}),
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {
                    "metadata": {"labels": {**BASE_LABELS, **labels},
                                 "annotations": {
                                     **sidecar_config(),
                                     # A warm replica is minutes of weight loading: the cluster
                                     # autoscaler must not evict it to consolidate nodes.
                                     "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                                     **args.weights_annotations}},
                    "spec": {
                        # Its own identity: the weights bucket and the limit store grant to it
                        # alone (MeshNamespace creates it), not to the namespace's default.
                        **({"serviceAccountName": args.service_account} if args.service_account else {}),
                        # preStop, then vLLM finishing what it accepted, then its own teardown.
                        "terminationGracePeriodSeconds": drain_seconds(args.request_timeout_seconds) + 30,
                        # The server calls no Kubernetes API: no token to steal.
                        "automountServiceAccountToken": False,
                        "nodeSelector": dict(placement.node_selector),
                        "tolerations": [dict(t) for t in placement.tolerations],
                        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                "labelSelector": {"matchLabels": selector}}}]}},
                        "securityContext": {**NON_ROOT, "seccompProfile": {"type": "RuntimeDefault"}},
                        "initContainers": init_containers,
                        "containers": [{
                            "name": "vllm",
                            "image": args.image.uri,
                            "command": ["python3", "/opt/vllm-gke/serve.py"],
                            "args": vllm_args(model, pool, args.release, args.request_timeout_seconds),
                            "ports": [{"name": "http", "containerPort": PORT}],
                            "env": [
                                *RUNTIME_ENV,
                                *wait_env,
                                {"name": "HF_HUB_OFFLINE", "value": "1"},
                                {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                                {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
                                {"name": WARM_MARKER_ENV, "value": WARM_MARKER},
                                {"name": GUARD_CONFIG_ENV,
                                 "value": json.dumps(dict(args.guard_config), sort_keys=True)},
                            ],
                            "resources": container_resources(
                                args.node_pool, gpus, scratch_gi(model, args.weights_volume is not None)),
                            "securityContext": CONTAINER_SECURITY,
                            # Model load plus warm-up can take many minutes: allow up to 30.
                            "startupProbe": {"exec": {"command": ["test", "-f", WARM_MARKER]},
                                             "periodSeconds": 10, "failureThreshold": 180},
                            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                                               "periodSeconds": 5, "timeoutSeconds": 3,
                                               "failureThreshold": 3},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": "http"},
                                              "periodSeconds": 15, "timeoutSeconds": 5,
                                              "failureThreshold": 6},
                            # Let the load balancer drop the endpoint before vLLM stops.
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
                            "volumeMounts": [*weights_mounts, {"name": "dshm", "mountPath": "/dev/shm"},
                                             {"name": "tmp", "mountPath": "/tmp"},
                                             {"name": "home", "mountPath": HOME}],
                        }],
                        "volumes": [
                            *weights_volumes,
                            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
                            # Compile caches (torch.compile, Triton, FlashInfer JIT) and scratch.
                            {"name": "tmp", "emptyDir": {"sizeLimit": f"{TMP_GI}Gi"}},
                            {"name": "home", "emptyDir": {"sizeLimit": f"{HOME_GI}Gi"}},
                        ],
                    },
                },
            }),
            opts=child_opts(self, opts, provider=args.provider,
                            # A first rollout waits for the weights to load: allow for it.
                            custom_timeouts=pulumi.CustomTimeouts(create="45m", update="45m"),
                            # With server-side apply, pulumi-kubernetes drops an ignored field that
                            # another manager (KEDA, through the scale subresource) owns, so an
                            # update neither conflicts nor resets the count (pulumi-kubernetes#2566).
                            ignore_changes=["spec.replicas"]))

        self.service = k8s.core.v1.Service(
            f"{name}-svc",
            # A pool that may go to zero shares its Service with a standby that is never ready
            # while the pool serves: Pulumi's wait for a Service with no unready address would
            # fail every update then.
            metadata={**meta(self.service_name, labels=labels,
                             annotations={"pulumi.com/skipAwait": "true"} if pool.min_replicas == 0 else None),
                      "namespace": args.namespace},
            spec=api_body({"type": "ClusterIP", "selector": selector,
                           "ports": [{"name": "http", "port": PORT, "targetPort": "http", "appProtocol": "http"}]}),
            opts=k8s_opts)

        self.pdb = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata={**meta(self.service_name, labels=labels), "namespace": args.namespace},
            # vLLM pods only: the standby is never Ready while the pool serves, and counted here it
            # would leave no disruption allowed, blocking every node drain and upgrade.
            spec=api_body({**disruption_budget(pool), "selector": {"matchLabels": {**selector, **SERVER_LABELS}}}),
            opts=k8s_opts)

        if args.scaling is None:
            raise ValueError(f"{model.name} {args.pool_name} pool: scaling (KEDA) is required")
        from .keda import gmp_query_url

        scaling = args.scaling
        self.autoscaler = custom_resource(
            f"{name}-scaledobject", "keda.sh/v1alpha1", "ScaledObject",
            {**meta(self.service_name, labels=labels), "namespace": args.namespace},
            pulumi.Output.from_input(args.namespace).apply(lambda ns: scaled_object(
                self.service_name, ns, pool, scaling, gmp_query_url(scaling.project))),
            child_opts(self, opts, provider=args.provider, depends_on=[self.deployment]))

        custom_resource(
            f"{name}-podmonitoring", "monitoring.googleapis.com/v1", "PodMonitoring",
            {**meta(self.service_name, labels=labels), "namespace": args.namespace},
            {"selector": {"matchLabels": selector},
             "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]},
            k8s_opts)

        self.register_outputs({"serviceName": self.service_name, "deployment": self.deployment.metadata.name})
