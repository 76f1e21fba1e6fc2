"""TenantAuth, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..mesh_namespace import TrustedSources
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import TenantSpec as TenantModel
from ..options import child_opts
from ..tenant_auth import TenantAuth as _TenantAuth
from ..tenant_auth import TenantAuthArgs
from .convert import Problems, kubernetes_provider
from .types import ClusterSpec, TenantSpec


class TenantAuthInputs(TypedDict):
    """Inputs of TenantAuth."""

    tenant: TenantSpec
    """The tenant: issuer, audiences, models, caps."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    serving_namespace: pulumi.Input[str]
    """The namespace of the shared models."""
    shared_models: list[str]
    """The shared models the tenant may call (its dedicated ones excluded)."""
    cluster: ClusterSpec
    """The cluster's settings, as given to GpuCluster: its proxy-only subnet (with Google's ranges) may
    health-check the servers and its pod and node ranges scrape their metrics (KEDA scales on them)."""
    picker_models: NotRequired[list[str]]
    """Those of sharedModels behind the endpoint picker (routing: inference-gateway): the tenant's
    requests to them must carry its own objective."""


class TenantAuth(pulumi.ComponentResource):
    """A tenant's mesh namespace (default deny), RequestAuthentication for its issuer and an
    AuthorizationPolicy per model it may call, on the guard's routes only."""

    namespace: pulumi.Output[str]
    """The tenant's namespace, tenant-<name>."""
    issuer: pulumi.Output[str]
    """The issuer whose tokens identify the tenant."""

    def __init__(self, name: str, args: TenantAuthInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:TenantAuth", name, {}, opts)
        problems = Problems("TenantAuth")
        tenant = problems.spec(TenantModel, args.get("tenant"), "tenant")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        shared = list(args.get("shared_models") or [])
        for model in sorted({m for m in shared if shared.count(m) > 1}):
            problems.add("sharedModels", f"'{model}' is listed more than once")
        for model in args.get("picker_models") or []:
            if model not in shared:
                problems.add("pickerModels", f"'{model}' is not in sharedModels; list the shared models behind the "
                             "endpoint picker")
        problems.raise_any()
        sources = TrustedSources.for_cluster(cluster.proxy_only_cidr, cluster.pods_cidr, cluster.subnet_cidr)
        inner = _TenantAuth(name, TenantAuthArgs(
            tenant=tenant, provider=kubernetes_provider(name, args["kubeconfig"], self),
            serving_namespace=args["serving_namespace"], shared_models=list(args.get("shared_models") or []),
            # A dedicated tenant's namespace holds its servers' service accounts (TenantAuthArgs' default).
            sources=sources, picker_models=list(args.get("picker_models") or [])), opts=child_opts(self, opts))
        self.namespace = inner.namespace.name
        self.issuer = pulumi.Output.from_input(tenant.jwt.issuer)
        self.register_outputs({"namespace": self.namespace, "issuer": self.issuer})
