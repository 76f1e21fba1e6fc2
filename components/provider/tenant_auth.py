"""TenantAuth, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..mesh_namespace import TrustedSources
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import TenantSpec as TenantModel
from ..tenant_auth import TenantAuth as _TenantAuth
from ..tenant_auth import TenantAuthArgs
from .convert import Problems, kubernetes_provider, named_inputs
from .facade import LATER, Facade
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


class TenantAuth(_TenantAuth, Facade):
    """A tenant's mesh namespace (default deny), RequestAuthentication for its issuer and an
    AuthorizationPolicy per model it may call, on the guard's routes only."""

    namespace: pulumi.Output[str]
    """The tenant's namespace, tenant-<name>."""
    issuer: str
    """The issuer whose tokens identify the tenant."""

    def __init__(self, name: str, args: TenantAuthInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("TenantAuth")
        tenant = problems.spec(TenantModel, args.get("tenant"), "tenant")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        problems.raise_any()
        # A dedicated tenant's namespace holds its servers' service accounts (TenantAuthArgs' default).
        self.inputs, self.args = args, TenantAuthArgs(
            tenant=tenant, provider=LATER, serving_namespace=args["serving_namespace"],
            shared_models=list(args.get("shared_models") or []), picker_models=list(args.get("picker_models") or []),
            sources=TrustedSources.for_cluster(cluster.proxy_only_cidr, cluster.pods_cidr, cluster.subnet_cidr))
        with named_inputs("TenantAuth"):
            super().__init__(name, self.args, opts)
        # The library's MeshNamespace, as the package's output: its name.
        self.namespace = self.namespace.name  # pyright: ignore[reportIncompatibleVariableOverride]
        self.issuer = tenant.jwt.issuer

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
