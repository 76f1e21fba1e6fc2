"""VllmService, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..keda import GMP_AUTH
from ..limit_store import PORT as LIMITS_PORT
from ..limit_store import host as limit_store_host
from ..model.cold_start import package_cold_start_seconds
from ..model.k8s_objects import service_name_of
from ..model.keda_scaling import KedaScaling
from ..model.pods.standby import standby_name
from ..model.serving_api import pool_guard_config
from ..model.serving_pool import check_callers
from ..model.sleep_mode import package_lease_seconds, package_problems, swap_guard_config
from ..model.specs import ImageRef as ImageModel
from ..model.specs import ModelSpec as ModelModel
from ..model.specs import MonitoringSpec
from ..model.specs import NodePoolSpec as NodePoolModel
from ..model.specs import TenantSpec as TenantModel
from ..model.vllm_versions import (
    DEFAULT_TPU_VLLM_VERSION,
    DEFAULT_VLLM_VERSION,
    RELEASES,
    TPU_RELEASES,
    VllmRelease,
)
from ..model.weights_layout import SERVER_SA
from ..model.weights_mount import claim_mount
from ..vllm_service import PoolName as PoolNameLiteral
from ..vllm_service import VllmService as _VllmService
from ..vllm_service import VllmServiceArgs, VllmServiceConfigError
from .convert import Problems, kubernetes_provider, plain
from .facade import LATER, Facade
from .types import ImageRef, ModelSpec, NodePoolSpec, TenantSpec


class PoolName(str, Enum):
    """Which of a model's serving pools."""

    SHORT = "short"
    LONG = "long"


POOL_NAMES = tuple(p.value for p in PoolName)


class VllmServiceInputs(TypedDict):
    """Inputs of VllmService."""

    model: ModelSpec
    """The model this pool serves."""
    pool_name: PoolName
    """Which of the model's pools: short (or the one pool behind the endpoint picker) or long."""
    node_pool: NodePoolSpec
    """The node pool the replicas run on (as given to GpuCluster)."""
    namespace: pulumi.Input[str]
    """The (mesh) namespace of the replicas: MeshNamespace.name, or, for a tenant's dedicated replicas,
    TenantAuth.namespace of a tenant with `dedicated` (both hold the service account they run as)."""
    image: ImageRef
    """The server image."""
    claim_name: pulumi.Input[str]
    """The read-only weights claim in that namespace (ModelStore.claimName)."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    project: str
    """The Google Cloud project whose Managed Prometheus KEDA reads the pool's queue depth from
    (KEDA, chart 2.20.2 with its ClusterTriggerAuthentication, must be installed in the cluster)."""
    tenants: list[TenantSpec]
    """The tenants allowed to call it: their caps and rate limits go to the in-server guard."""
    tenant: NotRequired[str]
    """The tenant owning dedicated replicas, if any."""
    keda_auth: NotRequired[pulumi.Input[str]]
    """The ClusterTriggerAuthentication KEDA queries Managed Prometheus with (default gmp-workload-identity)."""
    vllm_version: NotRequired[str]
    """The vLLM release the image is built on (default the newest supported); on a TPU node pool, the vLLM
    TPU release (default the newest supported TPU build)."""
    pods_cidr: NotRequired[str]
    """The cluster's pod range: required for a model whose replica spans hosts (its group's leader reaches
    its workers there outside the mesh)."""
    canary: NotRequired[bool]
    """Serve the model's canary revision (model.canary) as a separate pool, labelled and named as a canary."""
    global_limits: NotRequired[bool]
    """Count the tenants' rate limits across all replicas in the cluster's LimitStore (declare one, with
    this namespace among its clients; give it to dependsOn). Default false: per replica."""
    cold_start_seconds: NotRequired[int]
    """Seconds a replica takes from its node ready to serving (the weights, the engine and, on TPU, the XLA
    compile): the startup probe allows half as long again (30 minutes at least), and with minReplicas 0
    the standby tells callers to wait this long plus a node's start (300 s), as the stack program's
    standbys do. Default 900 on GPUs; on a TPU pool 900 plus the XLA compile estimate for the model
    (and, across hosts, 600 for the Ray joins), as components/model/cold_start.py estimates it (the plan
    estimates the whole for a stack)."""
    request_timeout_seconds: NotRequired[int]
    """The load balancer's timeout for one request (the Gateway's gateway.requestTimeoutSeconds, default 600):
    a stopping replica finishes requests that long before it exits."""


class VllmService(_VllmService, Facade):
    """One serving pool of one model: vLLM Deployment (a LeaderWorkerSet where a replica spans hosts:
    LeaderWorkerSet v0.10.0 must be installed) behind the tenant guard, Service,
    PodDisruptionBudget, KEDA ScaledObject on queue depth and PodMonitoring; with minReplicas 0, the
    standby that answers at zero and wakes the pool."""

    service_name: str
    """The Service's name (a Gateway route target)."""
    deployment_name: pulumi.Output[str]
    """The Deployment's name."""

    def __init__(self, name: str, args: VllmServiceInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("VllmService")
        read = _read(problems, args)
        service_args = None
        if read is not None:
            try:
                service_args = _service_args(read, args)
            except VllmServiceConfigError as exc:  # the component's own checks, with ours in one report
                for issue in exc.issues:
                    problems.add(issue.key, issue.problem)
        problems.raise_any()
        assert service_args is not None
        self.inputs, self.args = args, service_args
        super().__init__(name, service_args, opts)
        self.deployment_name = (self.deployment.metadata.name if self.deployment
                                else pulumi.Output.from_input(self.group_name or ""))

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)


@dataclass(frozen=True)
class _Read:
    model: ModelModel  # the served one: the canary's for a canary pool
    pool_name: PoolNameLiteral
    node_pool: NodePoolModel
    image: ImageModel
    tenants: list[TenantModel]
    release: VllmRelease


def _read(problems: Problems, args: VllmServiceInputs) -> Optional[_Read]:
    """The inputs as specs; None where one is missing or unusable (reported)."""
    model = problems.spec(ModelModel, args.get("model"), "model")
    node_pool = problems.spec(NodePoolModel, args.get("node_pool"), "node_pool")
    image = problems.spec(ImageModel, args.get("image"), "image")
    tenants = problems.specs(TenantModel, args.get("tenants"), "tenants")
    if not args.get("tenants"):
        problems.add("tenants", "none given, so the guard would refuse every request; list the tenants that "
                     "may call this model")
    pool_name = plain(args.get("pool_name"))
    if pool_name not in POOL_NAMES:
        problems.add("poolName", f"'{pool_name}' must be short or long")
    tpu = node_pool is not None and node_pool.is_tpu
    releases = TPU_RELEASES if tpu else RELEASES
    version = args.get("vllm_version") or (DEFAULT_TPU_VLLM_VERSION if tpu else DEFAULT_VLLM_VERSION)
    if version not in releases:
        problems.add("vllmVersion", f"{'vLLM TPU' if tpu else 'vLLM'} {version} is not supported; use one of "
                     f"{', '.join(releases)}")
    if not args.get("project"):
        problems.add("project", "the Google Cloud project whose Managed Prometheus KEDA reads is required")
    if model is not None and model.fallback is not None:
        problems.add("model.fallback", "a lone VllmService reaches no other model's pools and keeps no tenant's token "
                     "for them: set the fallback on a ServingPlatform's models, or remove it")
    served = model.canary_model() if model is not None and args.get("canary") else model
    if model is not None and served is None:
        problems.add("canary", "true needs model.canary (the revision and weight to try)")
    if served is None or node_pool is None or image is None or pool_name not in POOL_NAMES or version not in releases:
        return None
    check_callers(problems.add, served, node_pool, tenants, args.get("tenant"), bool(args.get("global_limits")))
    for key, problem in package_problems(served, node_pool, bool(args.get("global_limits"))):
        problems.add(key, problem)
    return _Read(served, pool_name, node_pool, image, tenants, releases[version])


def _service_args(read: _Read, args: VllmServiceInputs) -> VllmServiceArgs:
    """The component's args (it checks them: VllmServiceConfigError); the provider comes in prepare."""
    model, pool_name, canary = read.model, read.pool_name, bool(args.get("canary"))
    pool = getattr(model, pool_name)
    return VllmServiceArgs(
        model=model, pool_name=pool_name, pool=pool, node_pool=read.node_pool,
        namespace=args["namespace"], image=read.image, weights=claim_mount(args["claim_name"]), provider=LATER,
        # Tenants of negative priority are shed over the stack default's queue-time objective.
        guard_config={**pool_guard_config(read.tenants, model, read.release, (limit_store_host(), LIMITS_PORT)
                                          if args.get("global_limits") else None,
                                          MonitoringSpec().queue_latency_slo_seconds,
                                          dedicated=bool(args.get("tenant"))),
                      **_swap(model, read.node_pool)},  # models[].sleepMode: the guard swaps its engine
        tenant=args.get("tenant"),
        release=read.release, canary=canary,
        scaling=KedaScaling(args.get("project", ""), args.get("keda_auth") or GMP_AUTH,
                            standby_name(service_name_of(model.name, pool_name, canary)) if pool.min_replicas == 0 else ""),
        # vllm-server: MeshNamespace (and TenantAuth, for a dedicated tenant) makes it, and the
        # LimitStore admits it.
        service_account=SERVER_SA, request_timeout_seconds=int(args.get("request_timeout_seconds") or 600),
        pods_cidr=args.get("pods_cidr"),
        load_seconds=float(args.get("cold_start_seconds") or package_cold_start_seconds(model, read.node_pool)))


def _swap(model: ModelModel, node_pool: NodePoolModel) -> dict[str, Any]:
    """The guard's swap config, its lease the node pool's (every service on the pool the same one)."""
    if model.sleep_mode is None:
        return {}
    return swap_guard_config(model, package_lease_seconds(node_pool))
