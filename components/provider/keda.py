"""Keda, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..keda import Keda as _Keda
from ..keda import KedaArgs
from ..model.gcp_names import service_account_id
from ..model.specs import ClusterSpec as ClusterModel
from ..options import child_opts
from ..project_apis import ProjectApis, ProjectApisArgs
from .convert import Problems, kubernetes_provider
from .types import ClusterSpec

KEDA_APIS = ["iam.googleapis.com", "cloudresourcemanager.googleapis.com", "compute.googleapis.com",
             "monitoring.googleapis.com"]


class KedaInputs(TypedDict):
    """Inputs of Keda."""

    project: str
    """The project whose Managed Prometheus KEDA reads (and where its service account is made)."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    workload_pool: pulumi.Input[str]
    """The cluster's Workload Identity pool (GpuCluster.workloadPool)."""
    cluster: ClusterSpec
    """The cluster's settings, as given to GpuCluster: with private nodes, its control plane range is let
    through to KEDA's metrics server and webhook."""
    network_name: pulumi.Input[str]
    """The cluster's VPC (GpuCluster.networkName), for that firewall rule."""
    enable_apis: NotRequired[bool]
    """Enable the APIs it needs first (default true)."""


class Keda(pulumi.ComponentResource):
    """The KEDA operator (chart 2.20.2) with a Google service account that may read Managed
    Prometheus and nothing else, and the ClusterTriggerAuthentication VllmService scales with
    (scale to zero and back); a private cluster's control plane reaches its metrics server."""

    auth_name: pulumi.Output[str]
    """The ClusterTriggerAuthentication's name (VllmService.kedaAuth)."""

    def __init__(self, name: str, args: KedaInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Keda", name, {}, opts)
        problems = Problems("Keda")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        if not args.get("project"):
            problems.add("project", "is required: the project whose Managed Prometheus KEDA reads")
        problems.raise_any()
        apis = ProjectApis(f"{name}-apis", ProjectApisArgs(args["project"], KEDA_APIS), opts=child_opts(self, opts)) \
            if args.get("enable_apis", True) else None
        inner = _Keda(name, KedaArgs(
            project=args["project"], provider=kubernetes_provider(name, args["kubeconfig"], self),
            workload_pool=args["workload_pool"], gsa_name=service_account_id(cluster.name, "keda"), apis=apis,
            network=args["network_name"], control_plane_cidr=cluster.master_cidr if cluster.private_nodes else None),
            opts=child_opts(self, opts))
        self.auth_name = pulumi.Output.from_input(inner.auth_name)
        self.register_outputs({"authName": self.auth_name})
