"""VllmService: one serving pool (short or long requests) of one model.

Declares the Deployment running vLLM's OpenAI server from the pinned image (its command line,
environment and resources: components/vllm_server.py), its Service, a PodDisruptionBudget, a KEDA
ScaledObject on queue depth (vllm:num_requests_waiting, read from Managed Prometheus;
components/keda_scaling.py) and a PodMonitoring for scraping.

Every pool is scaled by KEDA, whatever its floor: one autoscaling path, one external metrics
server (KEDA's), and a floor raised from 0 is a ScaledObject update that KEDA's operator acts on
at once (it scales a target below minReplicaCount up to it; an HPA never scales from zero).
"""

from __future__ import annotations

import json
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
from .keda_scaling import KedaScaling, scaled_object
from .options import child_opts
from .specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec
from .vllm_server import (
    GUARD_CONFIG_ENV,
    HOME,
    HOME_GI,
    NON_ROOT,
    PORT,
    PRE_STOP_S,
    RUNTIME_ENV,
    TMP_GI,
    WARM_MARKER,
    WARM_MARKER_ENV,
    WEIGHTS_MARKERS_ENV,
    container_resources,
    drain_seconds,
    scratch_gi,
    sidecar_config,
    trace_env,
    vllm_args,
    wait_for_weights,
    weights_markers,
)
from .vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .weights_layout import MOUNT_PATH, SERVER_SA, served_files_gb

PoolName = Literal["short", "long"]
# Carried by vLLM pods only: a pool's standby shares its model and pool labels (so the Service
# selects it) but not this one.
SERVER_LABELS = {"app.kubernetes.io/name": "vllm"}


def service_name_of(model: str, pool_name: str, canary: bool = False) -> str:
    """The pool's Service, Deployment and autoscaler name."""
    return f"{model}-canary-{pool_name}" if canary else f"{model}-{pool_name}"


def disruption_budget(pool: ServingPoolSpec) -> dict[str, Any]:
    """Never let a voluntary disruption (node drain, upgrade, autoscaler consolidation) take the
    last serving replica: with one replica that means no eviction at all until GKE's drain
    timeout, so upgrades happen in the maintenance window; with more, one at a time. A pool that
    may scale to zero accepts going to zero."""
    return {"minAvailable": 1} if pool.min_replicas == 1 else {"maxUnavailable": 1}


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
    # The TTFT SLO's threshold (monitoring.ttftSloSeconds, where SLOs are kept): added to vLLM's
    # TTFT buckets where it is not a bound, so the SLO counts exactly.
    ttft_slo_seconds: Optional[float] = None
    # Where the servers send traces (TraceCollector.endpoint) and the share of tenant requests
    # traced; None: no traces.
    traces_endpoint: Optional[str] = None
    trace_sample_ratio: float = 0.01


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
                            "args": vllm_args(model, pool, args.release, args.request_timeout_seconds,
                                             args.ttft_slo_seconds, args.traces_endpoint),
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
                                *(trace_env(args.trace_sample_ratio, self.service_name)
                                  if args.traces_endpoint else []),
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
