"""VllmService, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from enum import Enum
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from vllm_gke.components.options import child_opts
from vllm_gke.components.config_rules import check_extra_args, check_fit
from vllm_gke.components.provider.convert import Problems, kubernetes_provider, plain
from vllm_gke.components.keda import GMP_AUTH
from vllm_gke.components.provider.types import ImageRef, ModelSpec, NodePoolSpec, TenantSpec
from vllm_gke.components.limit_store import PORT as LIMITS_PORT
from vllm_gke.components.limit_store import host as limit_store_host
from vllm_gke.components.model_store import SERVER_SA
from vllm_gke.components.serving_api import pool_guard_config
from vllm_gke.components.specs import ImageRef as ImageModel
from vllm_gke.components.specs import ModelSpec as ModelModel
from vllm_gke.components.specs import NodePoolSpec as NodePoolModel
from vllm_gke.components.specs import TenantSpec as TenantModel
from vllm_gke.components.vllm_service import VllmService as _VllmService
from vllm_gke.components.vllm_service import KedaScaling, VllmServiceArgs
from vllm_gke.components.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES


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
    """The (mesh) namespace of the replicas: MeshNamespace.name, or TenantAuth.namespace for a tenant's
    dedicated replicas (both hold the service account the replicas run as)."""
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
    """The vLLM release the image is built on (default the newest supported)."""
    canary: NotRequired[bool]
    """Serve the model's canary revision (model.canary) as a separate pool, labelled and named as a canary."""
    global_limits: NotRequired[bool]
    """Count the tenants' rate limits across all replicas in the cluster's LimitStore (declare one, with
    this namespace among its clients; give it to dependsOn). Default false: per replica."""


class VllmService(pulumi.ComponentResource):
    """One serving pool of one model: vLLM Deployment behind the tenant guard, Service,
    PodDisruptionBudget, KEDA ScaledObject on queue depth and PodMonitoring."""

    service_name: pulumi.Output[str]
    """The Service's name (a Gateway route target)."""
    deployment_name: pulumi.Output[str]
    """The Deployment's name."""

    def __init__(self, name: str, args: VllmServiceInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:VllmService", name, {}, opts)
        problems = Problems("VllmService")
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
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        if not args.get("project"):
            problems.add("project", "the Google Cloud project whose Managed Prometheus KEDA reads is required")
        canary = bool(args.get("canary"))
        if model is not None and pool_name in POOL_NAMES:
            if getattr(model, pool_name).min_replicas == 0:
                problems.add(f"model.{pool_name}.minReplicas", "0 needs the standby the stack program declares to "
                             "answer and wake the pool; use 1 or more through the component package")
            if canary and model.canary_model() is None:
                problems.add("canary", "true needs model.canary (the revision and weight to try)")
            if node_pool is not None:
                # The stack config's own checks: the model on this node pool, its extra vLLM flags.
                served = (model.canary_model() or model) if canary else model
                check_fit(problems.add, "model", served, node_pool)
                if version in RELEASES:
                    check_extra_args(problems.add, "model.extraArgs", served, version)
        problems.raise_any()
        rel = RELEASES[version]
        project = args["project"]
        if canary:
            model = model.canary_model()
        inner = _VllmService(name, VllmServiceArgs(
            model=model, pool_name=pool_name, pool=getattr(model, pool_name), node_pool=node_pool,
            namespace=args["namespace"], image=image, claim_name=args["claim_name"],
            provider=kubernetes_provider(name, args["kubeconfig"], self),
            guard_config=pool_guard_config(tenants, model, rel, (limit_store_host(), LIMITS_PORT)
                                           if args.get("global_limits") else None), tenant=args.get("tenant"),
            release=rel, canary=canary, scaling=KedaScaling(project, args.get("keda_auth") or GMP_AUTH),
            # vllm-server: MeshNamespace (and TenantAuth, for a dedicated tenant) makes it, and the
            # LimitStore admits it.
            service_account=SERVER_SA),
            opts=child_opts(self, opts))
        self.service_name = pulumi.Output.from_input(inner.service_name)
        self.deployment_name = inner.deployment.metadata.name
        self.register_outputs({"serviceName": self.service_name, "deploymentName": self.deployment_name})
