"""VllmService, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from enum import Enum
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..keda import GMP_AUTH
from ..limit_store import PORT as LIMITS_PORT
from ..limit_store import host as limit_store_host
from ..model.capacity import hosts_per_replica
from ..model.cold_start import package_cold_start_seconds
from ..model.config_rules import (
    check_extra_args,
    check_fit,
    check_image_tag,
    check_pool_lengths,
    check_tenant_cap,
    check_tenant_limits,
)
from ..model.k8s_objects import MODEL_LABEL, POOL_LABEL, TENANT_LABEL, service_name_of
from ..model.keda_scaling import KedaScaling
from ..model.mesh_identity import STANDBY_SA
from ..model.serving_api import pool_guard_config
from ..model.specs import ImageRef as ImageModel
from ..model.specs import ModelSpec as ModelModel
from ..model.specs import MonitoringSpec, item_key
from ..model.specs import NodePoolSpec as NodePoolModel
from ..model.specs import TenantSpec as TenantModel
from ..model.vllm_versions import DEFAULT_TPU_VLLM_VERSION, DEFAULT_VLLM_VERSION, RELEASES, TPU_RELEASES
from ..model.weights_layout import SERVER_SA
from ..model.weights_mount import claim_mount
from ..options import child_opts
from ..standby import Standby, StandbyArgs
from ..vllm_service import SERVER_LABELS, VllmServiceArgs
from ..vllm_service import VllmService as _VllmService
from .convert import Problems, kubernetes_provider, plain
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
    compile): the startup probe allows half as long again (30 minutes at least), and with minReplicas 0 the standby tells callers
    to wait this long. Default 900 on GPUs; on a TPU pool 900 plus the XLA compile estimate for the model
    (and, across hosts, 600 for the Ray joins), as components/model/cold_start.py estimates it (the plan
    estimates the whole for a stack)."""
    request_timeout_seconds: NotRequired[int]
    """The load balancer's timeout for one request (the Gateway's gateway.requestTimeoutSeconds, default 600):
    a stopping replica finishes requests that long before it exits."""


class VllmService(pulumi.ComponentResource):
    """One serving pool of one model: vLLM Deployment (a LeaderWorkerSet where a replica spans hosts:
    LeaderWorkerSet v0.10.0 must be installed) behind the tenant guard, Service,
    PodDisruptionBudget, KEDA ScaledObject on queue depth and PodMonitoring; with minReplicas 0, the
    standby that answers at zero and wakes the pool."""

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
        tpu = node_pool is not None and node_pool.is_tpu
        releases = TPU_RELEASES if tpu else RELEASES
        version = args.get("vllm_version") or (DEFAULT_TPU_VLLM_VERSION if tpu else DEFAULT_VLLM_VERSION)
        if version not in releases:
            problems.add("vllmVersion", f"{'vLLM TPU' if tpu else 'vLLM'} {version} is not supported; use one of "
                         f"{', '.join(releases)}")
        if not args.get("project"):
            problems.add("project", "the Google Cloud project whose Managed Prometheus KEDA reads is required")
        canary = bool(args.get("canary"))
        owner_name = args.get("tenant")
        owner = next((t for t in tenants if t.name == owner_name), None)
        # Only when every tenant read cleanly (a bad entry is reported on its own).
        if owner_name and owner is None and args.get("tenants") and len(tenants) == len(args.get("tenants") or []):
            problems.add("tenant", f"'{owner_name}' is not among tenants: the owner of dedicated replicas must be "
                         "one of the tenants that may call them")
        elif owner is not None and model is not None and (
                owner.dedicated is None or model.name not in owner.dedicated.models):
            # Its namespace holds the server's service account only for a tenant with dedicated models.
            problems.add("tenant", f"'{owner_name}' has no dedicated copy of '{model.name}': list it under the "
                         "tenant's dedicated.models (TenantAuth then makes the namespace's server account), or "
                         "leave tenant out for shared replicas")
        if model is not None and pool_name in POOL_NAMES:
            if canary and model.canary_model() is None:
                problems.add("canary", "true needs model.canary (the revision and weight to try)")
            if pool_name not in model.pool_names:
                problems.add("poolName", f"'{pool_name}': model '{model.name}' has routing {model.routing}, whose one "
                             "pool is short (behind the endpoint picker); nothing would route to a long pool")
            # The stack config's own checks, as it runs them on this model, its node pool and callers.
            served = (model.canary_model() or model) if canary else model
            check_pool_lengths(problems.add, "model", served)
            if node_pool is not None:
                # A tenant's dedicated copy runs on the tenant's own pool, not the model's.
                dedicated = owner.dedicated if owner is not None else None
                wanted, key = ((dedicated.node_pool, f"tenants[{owner.name}].dedicated.nodePool")
                               if owner is not None and dedicated is not None else (model.node_pool, "model.nodePool"))
                if wanted != node_pool.name:
                    problems.add(key, f"'{wanted}' is not nodePool.name '{node_pool.name}': "
                                 "give the node pool it names")
                check_fit(problems.add, "model", served, node_pool)
                if hosts_per_replica(served, node_pool) > 1 and not args.get("pods_cidr"):
                    problems.add("podsCidr", "model spans hosts: give the cluster's pod range (cluster.podsCidr), "
                                 "where its group's leader reaches its workers outside the mesh")
            if version in releases:
                check_extra_args(problems.add, "model.extraArgs", served, version, tpu=tpu)
            for i, tenant in enumerate(tenants):
                key = item_key("tenants", tenants, i)
                check_tenant_cap(problems.add, key, tenant, served)
                check_tenant_limits(problems.add, key, tenant, bool(args.get("global_limits")), "globalLimits")
        if image is not None and version in releases:
            check_image_tag(problems.add, "image.tag", image, version, "vllmVersion", tpu=tpu)
        timeout = int(args.get("request_timeout_seconds") or 600)
        if not 30 <= timeout <= 3600:
            problems.add("requestTimeoutSeconds", f"must be 30-3600 (as gateway.requestTimeoutSeconds), not {timeout}")
        problems.raise_any()
        rel = releases[version]
        project = args["project"]
        if canary:
            model = model.canary_model()
            assert model is not None  # canary without model.canary: a problem raised above
        provider = kubernetes_provider(name, args["kubeconfig"], self)
        to_zero = getattr(model, pool_name).min_replicas == 0
        load_seconds = float(args.get("cold_start_seconds") or package_cold_start_seconds(model, node_pool))
        standby_name = f"{service_name_of(model.name, pool_name, canary)}-standby" if to_zero else ""
        inner = _VllmService(name, VllmServiceArgs(
            model=model, pool_name=pool_name, pool=getattr(model, pool_name), node_pool=node_pool,
            namespace=args["namespace"], image=image, weights=claim_mount(args["claim_name"]),
            provider=provider,
            # Tenants of negative priority are shed over the stack default's queue-time objective.
            guard_config=pool_guard_config(tenants, model, rel, (limit_store_host(), LIMITS_PORT)
                                           if args.get("global_limits") else None,
                                           MonitoringSpec().queue_latency_slo_seconds,
                                           dedicated=bool(args.get("tenant"))), tenant=args.get("tenant"),
            release=rel, canary=canary, scaling=KedaScaling(project, args.get("keda_auth") or GMP_AUTH, standby_name),
            # vllm-server: MeshNamespace (and TenantAuth, for a dedicated tenant) makes it, and the
            # LimitStore admits it.
            service_account=SERVER_SA, request_timeout_seconds=timeout, pods_cidr=args.get("pods_cidr"),
            load_seconds=load_seconds),
            opts=child_opts(self, opts))
        if to_zero:
            # At zero the standby answers (503, Retry-After) and its request count wakes the pool.
            tenant = args.get("tenant")
            # Named after this component (unique among the program's resources), not the pool's
            # Service: a shared and a dedicated copy of one model share the Service name.
            Standby(f"{name}-standby", StandbyArgs(
                service_name=inner.service_name, model=model.name, namespace=args["namespace"],
                pool_selector={MODEL_LABEL: model.name, POOL_LABEL: f"{pool_name}-canary" if canary else pool_name},
                vllm_only_labels=SERVER_LABELS, provider=provider, policy_labels={TENANT_LABEL: tenant} if tenant else {},
                expected_seconds=int(load_seconds), service_account=STANDBY_SA),
                opts=child_opts(self, opts))
        self.service_name = pulumi.Output.from_input(inner.service_name)
        self.deployment_name = (inner.deployment.metadata.name if inner.deployment
                                else pulumi.Output.from_input(inner.group_name or ""))
        self.register_outputs({"serviceName": self.service_name, "deploymentName": self.deployment_name})
