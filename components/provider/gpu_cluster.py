"""GpuCluster, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..gpu_cluster import GpuCluster as _GpuCluster
from ..gpu_cluster import GpuClusterArgs
from ..model.config_rules import check_network, check_zones
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import NodePoolSpec as NodePoolModel
from ..options import child_opts
from ..project_apis import ProjectApis, ProjectApisArgs
from .convert import Problems
from .types import ClusterSpec, NodePoolSpec

# What the cluster and every node need (iamcredentials: Workload Identity; artifactregistry: the
# server image; logging: the nodes' logs), as the stack program enables them (platform.BASE_APIS).
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


class GpuCluster(pulumi.ComponentResource):
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
    node_pool_names: pulumi.Output[list[str]]
    """The node pools: system, the GPU pools and their on-demand twins."""

    def __init__(self, name: str, args: GpuClusterInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:GpuCluster", name, {}, opts)
        problems = Problems("GpuCluster")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        pools = problems.specs(NodePoolModel, args.get("node_pools"), "node_pools")
        if cluster is not None:
            # The stack config's checks on the cluster alone: zones in the region, ranges apart.
            check_zones(problems.add, str(args.get("region")), cluster.zones, "cluster.zones", "region")
            check_network(problems.add, cluster)
        problems.raise_any()
        child = child_opts(self, opts)
        apis = None
        if args.get("enable_apis", True):
            apis = ProjectApis(f"{name}-apis", ProjectApisArgs(args["project"], CLUSTER_APIS), opts=child)
        inner = _GpuCluster(name, GpuClusterArgs(project=args["project"], region=args["region"], cluster=cluster,
                                                 node_pools=pools, labels=args.get("labels") or {}, apis=apis),
                            opts=child)
        self.cluster_name = inner.cluster.name
        self.endpoint = inner.cluster.endpoint
        self.kubeconfig = inner.kubeconfig
        self.network_name = inner.network.name
        self.subnetwork_id = inner.subnetwork.id
        self.workload_pool = pulumi.Output.from_input(inner.workload_pool)
        self.node_pool_names = pulumi.Output.from_input(list(inner.node_pools))
        self.register_outputs({"clusterName": self.cluster_name, "endpoint": self.endpoint,
                               "kubeconfig": self.kubeconfig, "networkName": self.network_name,
                               "subnetworkId": self.subnetwork_id, "workloadPool": self.workload_pool,
                               "nodePoolNames": self.node_pool_names})
