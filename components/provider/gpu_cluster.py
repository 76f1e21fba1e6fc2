"""GpuCluster, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..gpu_cluster import GpuCluster as _GpuCluster
from ..gpu_cluster import GpuClusterArgs
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import NodePoolSpec as NodePoolModel
from .convert import Problems, named_inputs
from .facade import Facade
from .types import ClusterSpec, NodePoolSpec

# What the cluster and every node need (iamcredentials: Workload Identity; artifactregistry: the
# server image; logging: the nodes' logs), as the stack program enables them (model/gcp_apis.py BASE_APIS).
CLUSTER_APIS = ("serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com", "iam.googleapis.com",
                "iamcredentials.googleapis.com", "compute.googleapis.com", "container.googleapis.com",
                "containerfilesystem.googleapis.com", "artifactregistry.googleapis.com", "gkehub.googleapis.com",
                "mesh.googleapis.com", "logging.googleapis.com")


class GpuClusterInputs(TypedDict):
    """Inputs of GpuCluster."""

    project: str
    """The GCP project."""
    region: str
    """The region of the cluster, its subnets and Cloud NAT."""
    cluster: ClusterSpec
    """The cluster's settings."""
    node_pools: list[NodePoolSpec]
    """The GPU node pools."""
    labels: NotRequired[dict[str, str]]
    """Resource labels for the cluster and its nodes."""
    enable_apis: NotRequired[bool]
    """Enable the Google APIs the cluster needs first (default true)."""


class GpuCluster(_GpuCluster, Facade):
    """A VPC-native GKE cluster with a CPU system pool, GPU/MIG node pools, Workload Identity,
    Managed Prometheus with DCGM, Filestore CSI, the Gateway API and managed Cloud Service Mesh."""

    cluster_name: pulumi.Output[str]
    """The GKE cluster's name."""
    endpoint: pulumi.Output[str]
    """The control plane's address."""
    kubeconfig: pulumi.Output[str]
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (secret)."""
    network_name: pulumi.Output[str]
    """The VPC's name (ModelStore's network)."""
    subnetwork_id: pulumi.Output[str]
    """The node subnet (an internal Gateway's address comes from it)."""
    workload_pool: pulumi.Output[str]
    """The Workload Identity pool, PROJECT.svc.id.goog, once the cluster exists."""
    node_pool_names: list[str]
    """The node pools: system, the GPU pools and their on-demand twins."""

    def __init__(self, name: str, args: GpuClusterInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("GpuCluster")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        pools = problems.specs(NodePoolModel, args.get("node_pools"), "node_pools")
        problems.raise_any()
        self.inputs, self.args = args, GpuClusterArgs(project=args["project"], region=args["region"], cluster=cluster,
                                                      node_pools=pools, labels=args.get("labels") or {})
        with named_inputs("GpuCluster"):
            super().__init__(name, self.args, opts)
        self.cluster_name, self.endpoint = self.cluster.name, self.cluster.endpoint
        self.network_name, self.subnetwork_id = self.network.name, self.subnetwork.id
        self.node_pool_names = list(self.node_pools)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.apis = self.project_apis(name, opts, self.inputs["project"], CLUSTER_APIS,
                                           self.inputs.get("enable_apis", True))
