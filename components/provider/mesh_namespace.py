"""MeshNamespace, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..mesh_namespace import MeshNamespace as _MeshNamespace
from ..mesh_namespace import MeshNamespaceArgs, TrustedSources
from ..model.config_rules import check_serving_namespace
from ..model.mesh_identity import STANDBY_SA, jwks_host
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import TenantSpec as TenantModel
from ..model.weights_layout import SERVER_SA
from .convert import Problems, kubernetes_provider
from .facade import LATER, Facade
from .types import ClusterSpec, TenantSpec


class MeshNamespaceInputs(TypedDict):
    """Inputs of MeshNamespace."""

    name: str
    """The namespace's name: where the shared models' servers, their Services and the Gateway live."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    cluster: ClusterSpec
    """The cluster's settings, as given to GpuCluster: its proxy-only subnet (with Google's ranges) may
    health-check the servers and its pod and node ranges scrape their metrics (KEDA scales on them)."""
    tenants: list[TenantSpec]
    """The tenants calling models here: the mesh fetches their issuers' signing keys (JWKS) from this
    namespace (without them every token here fails verification)."""


class MeshNamespace(_MeshNamespace, Facade):
    """A namespace in the mesh that denies every request it does not allow: load balancer health
    checks and metric scrapes from the cluster's ranges pass, tenants pass by TenantAuth. It holds
    the servers' service accounts (VllmService runs as vllm-server)."""

    name: pulumi.Output[str]
    """The namespace's name (VllmService.namespace, Gateway.namespace, TenantAuth.servingNamespace)."""

    def __init__(self, name: str, args: MeshNamespaceInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("MeshNamespace")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        tenants = problems.specs(TenantModel, args.get("tenants"), "tenants")
        # The serving namespace's checks: they need the tenants, which the library's args do not hold.
        if not args.get("name"):
            problems.add("name", "is required: the namespace the servers run in (e.g. vllm)")
        else:
            check_serving_namespace(problems.add, "name", str(args["name"]), tenants)
        if not args.get("tenants"):
            problems.add("tenants", "none given: the mesh would fetch no issuer's keys here and refuse every token; "
                         "list the tenants that call the models in this namespace")
        problems.raise_any()
        self.inputs, self.args = args, MeshNamespaceArgs(
            args["name"], LATER, sources=TrustedSources.for_cluster(cluster.proxy_only_cidr, cluster.pods_cidr,
                                                                    cluster.subnet_cidr),
            jwks_hosts=sorted({jwks_host(t) for t in tenants}), service_accounts=(SERVER_SA, STANDBY_SA))
        super().__init__(name, self.args, opts)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
