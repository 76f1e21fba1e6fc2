"""Keda, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..keda import Keda as _Keda
from ..keda import KedaArgs
from ..model.gcp_names import service_account_id
from ..model.specs import ClusterSpec as ClusterModel
from .convert import kubernetes_provider, named_inputs, to_spec
from .facade import LATER, Facade
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


class Keda(_Keda, Facade):
    """The KEDA operator (chart 2.20.2) with a Google service account that may read Managed
    Prometheus and nothing else, and the ClusterTriggerAuthentication VllmService scales with
    (scale to zero and back); a private cluster's control plane reaches its metrics server."""

    auth_name: str
    """The ClusterTriggerAuthentication's name (VllmService.kedaAuth)."""

    def __init__(self, name: str, args: KedaInputs, opts: Optional[pulumi.ResourceOptions] = None):
        cluster = to_spec(ClusterModel, args.get("cluster"), "Keda", "cluster")
        self.inputs, self.args = args, KedaArgs(
            project=args["project"], provider=LATER, workload_pool=args["workload_pool"],
            gsa_name=service_account_id(cluster.name, "keda"), network=args["network_name"],
            control_plane_cidr=cluster.master_cidr if cluster.private_nodes else None)
        with named_inputs("Keda"):
            super().__init__(name, self.args, opts)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
        self.args.apis = self.project_apis(name, opts, self.inputs["project"], KEDA_APIS,
                                           self.inputs.get("enable_apis", True))
