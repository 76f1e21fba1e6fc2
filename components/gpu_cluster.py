"""GpuCluster: a VPC-native GKE cluster with a CPU system pool and GPU/MIG node pools."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, cast

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .model.catalog import MACHINE_TYPES
from .model.config_rules.components import check_gpu_cluster
from .model.gcp_names import service_account_id
from .model.hyperdisk_ml import TRANSFER_COMPUTE_CLASS
from .model.k8s_objects import COMPUTE_CLASS_LABEL
from .model.node_pools import TRANSFER_POOL, GkePool, compute_class_spec, compute_classes, gke_pools
from .model.specs import ClusterSpec, MaintenanceSpec, NodePoolSpec, UpgradeSpec
from .options import child_opts
from .project_apis import ProjectApis

NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/artifactregistry.reader",
)


@dataclass
class GpuClusterArgs:
    project: str
    region: str
    cluster: ClusterSpec
    node_pools: Sequence[NodePoolSpec]
    labels: Mapping[str, str] = field(default_factory=dict[str, str])
    # Enabled APIs to wait for; None where the project's APIs are managed elsewhere.
    apis: Optional[ProjectApis] = None
    # The Cloud Storage FUSE CSI add-on (weights in a bucket).
    gcs_fuse: bool = False
    # The Secret Manager CSI add-on, for weights' HF tokens read from Secret Manager: off where
    # nothing mounts a secret from it (one less node DaemonSet with access to the API).
    secret_manager: bool = True
    # Hyperdisk ML weights: the machine type of the pool GKE Volume Populator's transfer Jobs run on.
    populator_machine_type: Optional[str] = None


def kubeconfig(name: str, endpoint: str, ca_cert: str) -> str:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin: no static credentials in state."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": f"https://{endpoint}",
                                                 "certificate-authority-data": ca_cert}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "gke-gcloud-auth-plugin", "provideClusterInfo": True,
            "installHint": "gcloud components install gke-gcloud-auth-plugin"}}}],
    })


def maintenance_policy(spec: MaintenanceSpec) -> Optional[gcp.container.ClusterMaintenancePolicyArgsDict]:
    """GKE upgrades only inside the window and never during an exclusion (node upgrades restart
    every replica on the node: a cold start of minutes while the weights load again)."""
    policy: gcp.container.ClusterMaintenancePolicyArgsDict = {}
    if spec.window:
        policy["recurring_window"] = {"start_time": spec.window.start_time, "end_time": spec.window.end_time,
                                      "recurrence": spec.window.recurrence}
    if spec.exclusions:
        policy["maintenance_exclusions"] = [
            {"exclusion_name": e.name, "start_time": e.start_time, "end_time": e.end_time,
             "exclusion_options": {"scope": e.scope}} for e in spec.exclusions]
    return policy or None


def upgrade_settings(spec: UpgradeSpec) -> gcp.container.NodePoolUpgradeSettingsArgsDict:
    if spec.strategy == "BLUE_GREEN":
        return {"strategy": "BLUE_GREEN", "blue_green_settings": {
            "node_pool_soak_duration": f"{spec.soak_minutes * 60}s",
            "standard_rollout_policy": {"batch_node_count": 1, "batch_soak_duration": "60s"}}}
    return {"strategy": "SURGE", "max_surge": spec.max_surge, "max_unavailable": spec.max_unavailable}


def addons_config(gcs_fuse: bool) -> gcp.container.ClusterAddonsConfigArgsDict:
    addons: gcp.container.ClusterAddonsConfigArgsDict = {
        "gcp_filestore_csi_driver_config": {"enabled": True},
        "gce_persistent_disk_csi_driver_config": {"enabled": True},
    }
    if gcs_fuse:
        addons["gcs_fuse_csi_driver_config"] = {"enabled": True}
    addons["http_load_balancing"] = {"disabled": False}
    addons["horizontal_pod_autoscaling"] = {"disabled": False}
    return addons


def optional_settings(spec: ClusterSpec) -> dict[str, Any]:
    """Settings set only where configured (unset, the provider's default applies)."""
    authorized: dict[str, Any] = {}
    if spec.authorized_networks:
        authorized = {"master_authorized_networks_config": {
            "cidr_blocks": [{"cidr_block": n.cidr, "display_name": n.display_name}
                            for n in spec.authorized_networks],
            "gcp_public_cidrs_access_enabled": False}}
    maintenance = maintenance_policy(spec.maintenance)
    return {
        # A floor, not a pin: GKE still upgrades along the channel (pulumi-gcp minMasterVersion).
        **({"min_master_version": spec.min_master_version} if spec.min_master_version else {}),
        # Dataplane V2 enforces NetworkPolicy (immutable: set at creation only).
        **({"datapath_provider": "ADVANCED_DATAPATH"} if spec.dataplane_v2 else {}),
        **authorized,
        **({"maintenance_policy": maintenance} if maintenance else {}),
    }


def pool_of(config: Any) -> Any:
    """The cluster's Workload Identity pool (a str: the cluster sets it) from its
    workload_identity_config: a dict under the plan's mocks, ClusterWorkloadIdentityConfig when deployed."""
    return (cast(dict[str, Any], config) or {}).get("workload_pool") if isinstance(config, dict) \
        else config.workload_pool


def taints_of(pool: GkePool) -> list[gcp.container.NodePoolNodeConfigTaintArgsDict]:
    return [{"key": key, "value": value, "effect": "NO_SCHEDULE"} for key, value in pool.taints()]


class GpuCluster(pulumi.ComponentResource):
    """VPC + GKE cluster (Workload Identity, managed Prometheus + DCGM, Filestore CSI, Gateway API)."""

    network: gcp.compute.Network
    subnetwork: gcp.compute.Subnetwork
    cluster: gcp.container.Cluster
    node_pools: dict[str, gcp.container.NodePool]
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    # PROJECT.svc.id.goog: exists only once the cluster does, so bindings to it must wait.
    workload_pool: pulumi.Output[str]
    # What GKE Volume Populator's transfer Jobs need before a claim asks for a copy.
    transfer_ready: list[pulumi.Resource]

    def __init__(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        check_gpu_cluster(args.region, args.cluster)
        super().__init__("vllm-gke:index:GpuCluster", name, None, opts)
        labels = {"managed-by": "pulumi", "app": "vllm-gke", **args.labels}
        self._network(name, args, opts)
        self._node_identity(name, args, opts)
        self.cluster = self._cluster(name, args, labels, opts)
        self.workload_pool = self.cluster.workload_identity_config.apply(pool_of)
        self.node_pools = self._node_pools(name, args, labels, opts)
        self._fleet_mesh(name, args, opts)
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.master_auth.cluster_ca_certificate
        ).apply(lambda a: kubeconfig(a[0], a[1], a[2])))
        self.provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig, enable_server_side_apply=True,
            opts=child_opts(self, opts, depends_on=[*self.node_pools.values(), self.mesh]))
        self._compute_classes(name, args, opts)
        self.register_outputs({
            "clusterName": self.cluster.name,
            "endpoint": self.cluster.endpoint,
            "network": self.network.id,
            "kubeconfig": self.kubeconfig,
            "workloadPool": self.workload_pool,
            "nodePools": list(self.node_pools),
        })

    def _needs(self, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions], *api_names: str,
               depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
        """A child's options, waiting for these APIs (where the project's APIs are managed here)."""
        waits = [*(args.apis.needs(*api_names) if args.apis else []), *depends_on]
        return child_opts(self, opts, depends_on=waits)

    def _network(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions]) -> None:
        spec = args.cluster
        compute = self._needs(args, opts, "compute.googleapis.com")
        self.network = gcp.compute.Network(
            f"{name}-vpc", name=f"{spec.name}-vpc", project=args.project,
            auto_create_subnetworks=False, opts=compute)
        self.subnetwork = gcp.compute.Subnetwork(
            f"{name}-subnet", name=f"{spec.name}-nodes", project=args.project, region=args.region,
            network=self.network.id, ip_cidr_range=spec.subnet_cidr, private_ip_google_access=True,
            secondary_ip_ranges=[
                {"range_name": "pods", "ip_cidr_range": spec.pods_cidr},
                {"range_name": "services", "ip_cidr_range": spec.services_cidr},
            ], opts=compute)
        # Regional Application Load Balancers (the Gateway classes used here) need a proxy-only subnet.
        self.proxy_subnetwork = gcp.compute.Subnetwork(
            f"{name}-proxy-subnet", name=f"{spec.name}-proxy-only", project=args.project,
            region=args.region, network=self.network.id, ip_cidr_range=spec.proxy_only_cidr,
            purpose="REGIONAL_MANAGED_PROXY", role="ACTIVE", opts=compute)
        self.proxy_only_cidr = spec.proxy_only_cidr
        router = gcp.compute.Router(
            f"{name}-router", name=f"{spec.name}-router", project=args.project, region=args.region,
            network=self.network.id, opts=compute)
        # Private nodes still need egress to pull weights from Hugging Face and tenants' JWKS.
        gcp.compute.RouterNat(
            f"{name}-nat", name=f"{spec.name}-nat", project=args.project, region=args.region,
            router=router.name, nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES", opts=compute)

    def _node_identity(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.node_service_account = gcp.serviceaccount.Account(
            f"{name}-nodes-sa", account_id=service_account_id(args.cluster.name, "nodes"), project=args.project,
            display_name=f"GKE nodes of {args.cluster.name} (least privilege)",
            opts=self._needs(args, opts, "iam.googleapis.com"))
        for role in NODE_ROLES:
            gcp.projects.IAMMember(
                f"{name}-nodes-{role.split('/')[1].replace('.', '-')}", project=args.project, role=role,
                member=self.node_service_account.email.apply(lambda e: f"serviceAccount:{e}"),
                opts=self._needs(args, opts, "cloudresourcemanager.googleapis.com"))

    def _cluster(self, name: str, args: GpuClusterArgs, labels: Mapping[str, str],
                 opts: Optional[pulumi.ResourceOptions]) -> gcp.container.Cluster:
        spec = args.cluster
        return gcp.container.Cluster(
            f"{name}-gke", name=spec.name, project=args.project, location=args.region,
            node_locations=list(spec.zones), network=self.network.id, subnetwork=self.subnetwork.id,
            remove_default_node_pool=True, initial_node_count=1,
            deletion_protection=spec.deletion_protection,
            release_channel={"channel": spec.release_channel},
            networking_mode="VPC_NATIVE",
            ip_allocation_policy={"cluster_secondary_range_name": "pods",
                                  "services_secondary_range_name": "services"},
            private_cluster_config={"enable_private_nodes": spec.private_nodes,
                                    "enable_private_endpoint": spec.private_endpoint,
                                    "master_ipv4_cidr_block": spec.master_cidr},
            **optional_settings(spec),
            workload_identity_config={"workload_pool": f"{args.project}.svc.id.goog"},
            addons_config=addons_config(args.gcs_fuse),
            gateway_api_config={"channel": "CHANNEL_STANDARD"},
            secret_manager_config={"enabled": args.secret_manager},
            monitoring_config={
                "enable_components": ["SYSTEM_COMPONENTS", "POD", "DEPLOYMENT", "HPA", "DCGM"],
                "managed_prometheus": {"enabled": True},
            },
            logging_config={"enable_components": ["SYSTEM_COMPONENTS", "WORKLOADS"]},
            cluster_autoscaling={"autoscaling_profile": "OPTIMIZE_UTILIZATION"},
            resource_labels=dict(labels),
            opts=self._needs(args, opts, "container.googleapis.com", "compute.googleapis.com",
                             "containerfilesystem.googleapis.com"))

    def _node_pools(self, name: str, args: GpuClusterArgs, labels: Mapping[str, str],
                    opts: Optional[pulumi.ResourceOptions]) -> dict[str, gcp.container.NodePool]:
        """The system pool, each accelerator pool (and its on-demand twin), and the transfer pool."""
        spec = args.cluster
        pools = {"system": gcp.container.NodePool(
            f"{name}-system", name="system", project=args.project, location=args.region,
            cluster=self.cluster.name,
            # Per zone: a set value, so later resizes by the autoscaler never force a re-create.
            initial_node_count=math.ceil(spec.system_nodes / len(spec.zones)),
            autoscaling={"total_min_node_count": spec.system_nodes,
                         "total_max_node_count": spec.system_pool_max, "location_policy": "BALANCED"},
            node_config=self._node_config(spec.system_machine_type, 100, {"vllm-gke.io/role": "system"}, labels),
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings={"strategy": "SURGE", "max_surge": 1, "max_unavailable": 0},
            opts=child_opts(self, opts))}
        for pool in gke_pools(args.node_pools):
            pools[pool.name] = (self._tpu_pool(name, args, pool, labels, opts) if pool.is_tpu
                                else self._gpu_pool(name, args, pool, labels, opts))
        if args.populator_machine_type:
            pools[TRANSFER_POOL] = self._transfer_pool(name, args, args.populator_machine_type, labels, opts)
        return pools

    def _transfer_pool(self, name: str, args: GpuClusterArgs, machine_type: str, labels: Mapping[str, str],
                       opts: Optional[pulumi.ResourceOptions]) -> gcp.container.NodePool:
        """GKE Volume Populator on a Standard cluster without node auto-provisioning: a pool
        labelled and tainted with the compute class its transfer Jobs select, scaled from zero (a
        node exists only while a disk is being filled), one node per zone at most."""
        return gcp.container.NodePool(
            f"{name}-{TRANSFER_POOL}", name=TRANSFER_POOL, project=args.project, location=args.region,
            cluster=self.cluster.name, initial_node_count=0,
            # Per zone (not a total, which location policy ANY may put in one zone): at most one
            # node in each zone, where that zone's disks are filled.
            autoscaling={"min_node_count": 0, "max_node_count": 1, "location_policy": "ANY"},
            node_config=self._node_config(
                machine_type, 100, {COMPUTE_CLASS_LABEL: TRANSFER_COMPUTE_CLASS}, labels,
                taints=[{"key": COMPUTE_CLASS_LABEL, "value": TRANSFER_COMPUTE_CLASS, "effect": "NO_SCHEDULE"}]),
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings={"strategy": "SURGE", "max_surge": 1, "max_unavailable": 0},
            opts=child_opts(self, opts))

    def _fleet_mesh(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.membership = gcp.gkehub.Membership(
            f"{name}-fleet", membership_id=args.cluster.name, project=args.project, location="global",
            endpoint={"gke_cluster": {"resource_link": self.cluster.id.apply(
                lambda cid: f"//container.googleapis.com/{cid}")}}, opts=self._needs(args, opts, "gkehub.googleapis.com"))
        mesh_deps: list[pulumi.Resource] = []
        if args.cluster.manage_mesh_feature:
            mesh_deps.append(gcp.gkehub.Feature(
                f"{name}-mesh-feature", name="servicemesh", project=args.project, location="global",
                opts=self._needs(args, opts, "gkehub.googleapis.com", "mesh.googleapis.com")))
        # Completes when the fleet accepts the spec; the control plane is provisioned afterwards,
        # asynchronously (see MeshReadiness).
        self.mesh = gcp.gkehub.FeatureMembership(
            f"{name}-mesh", project=args.project, location="global", feature="servicemesh",
            membership=self.membership.membership_id, mesh={"management": "MANAGEMENT_AUTOMATIC"},
            opts=self._needs(args, opts, "gkehub.googleapis.com", "mesh.googleapis.com", depends_on=mesh_deps))

    def _compute_classes(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions]) -> None:
        """The pools' ComputeClasses, and the transfer pool's (`transfer_ready`)."""
        in_cluster = child_opts(self, opts, provider=self.provider)
        for class_name, spec in compute_classes(args.node_pools).items():
            custom_resource(f"{name}-cc-{class_name}", "cloud.google.com/v1", "ComputeClass", meta(class_name),
                            spec, in_cluster)
        self.transfer_ready = []
        if args.populator_machine_type:
            self.transfer_ready = [self.node_pools[TRANSFER_POOL], custom_resource(
                f"{name}-cc-{TRANSFER_COMPUTE_CLASS}", "cloud.google.com/v1", "ComputeClass",
                meta(TRANSFER_COMPUTE_CLASS), compute_class_spec([TRANSFER_POOL]), in_cluster)]

    def _node_config(self, machine_type: str, disk_gb: int, node_labels: Mapping[str, str],
                     resource_labels: Mapping[str, str], *, spot: Optional[bool] = None,
                     guest_accelerators: Optional[list[gcp.container.NodePoolNodeConfigGuestAcceleratorArgsDict]] = None,
                     taints: Optional[list[gcp.container.NodePoolNodeConfigTaintArgsDict]] = None,
                     ) -> gcp.container.NodePoolNodeConfigArgsDict:
        config: gcp.container.NodePoolNodeConfigArgsDict = {
            "machine_type": machine_type,
            "disk_size_gb": disk_gb,
            # TPU hosts take no pd-ssd (v6e: Hyperdisk Balanced; v5e, v5p: Balanced PD).
            "disk_type": MACHINE_TYPES[machine_type].boot_disk_type if machine_type in MACHINE_TYPES else "pd-ssd",
            "service_account": self.node_service_account.email,
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "shielded_instance_config": {"enable_secure_boot": True, "enable_integrity_monitoring": True},
            # Image streaming: the multi-GB vLLM image starts before it is fully pulled.
            "gcfs_config": {"enabled": True},
            "gvnic": {"enabled": True},
            "labels": dict(node_labels),
            "resource_labels": dict(resource_labels),
        }
        # Those given, in this order.
        if spot is not None:
            config["spot"] = spot
        if guest_accelerators is not None:
            config["guest_accelerators"] = guest_accelerators
        if taints is not None:
            config["taints"] = taints
        return config

    def _gpu_pool(self, name: str, args: GpuClusterArgs, pool: GkePool, labels: Mapping[str, str],
                  opts: Optional[pulumi.ResourceOptions]) -> gcp.container.NodePool:
        spec = pool.spec
        acc = spec.machine.accelerator
        assert acc is not None
        accelerator: gcp.container.NodePoolNodeConfigGuestAcceleratorArgsDict = {
            "type": acc.gke_type,
            "count": spec.machine.gpus,
            # GKE installs and upgrades the NVIDIA driver; no driver DaemonSet to keep in sync.
            "gpu_driver_installation_config": {"gpu_driver_version": "LATEST"},
        }
        if spec.gpu_partition_size:
            accelerator["gpu_partition_size"] = spec.gpu_partition_size
        if spec.gpu_sharing:
            # Each GPU offered to this many pods, which take turns on it (models[].sleepMode swaps them).
            accelerator["gpu_sharing_config"] = {
                "gpu_sharing_strategy": spec.gpu_sharing.strategy,
                "max_shared_clients_per_gpu": spec.gpu_sharing.max_shared_clients_per_gpu}
        return gcp.container.NodePool(
            f"{name}-{pool.name}", name=pool.name, project=args.project, location=args.region,
            cluster=self.cluster.name,
            # Zero per zone at creation; the autoscaler adds nodes for pending replicas. Set, so a
            # resize never reads as a change that re-creates the pool.
            initial_node_count=0,
            autoscaling={
                # Totals across zones: min/max_node_count would be per zone, and a three-zone pool
                # would run three times what the capacity check and cost report assume.
                "total_min_node_count": pool.min_nodes,
                "total_max_node_count": spec.max_nodes,
                # Spot capacity is wherever it is; on-demand stays spread for availability.
                "location_policy": "ANY" if pool.spot else "BALANCED",
            },
            node_config=self._node_config(
                spec.machine_type, spec.disk_size_gb, pool.node_labels(), labels,
                spot=pool.spot, guest_accelerators=[accelerator], taints=taints_of(pool)),
            # Release channels require auto-upgrade; the cluster's maintenance window and
            # exclusions decide when, the upgrade strategy how.
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings=upgrade_settings(spec.upgrade),
            opts=child_opts(self, opts))

    def _tpu_pool(self, name: str, args: GpuClusterArgs, pool: GkePool, labels: Mapping[str, str],
                  opts: Optional[pulumi.ResourceOptions]) -> gcp.container.NodePool:
        """A TPU slice pool: in one zone (TPUs are zonal; a slice's hosts share its interconnect),
        no guest accelerators (the machine type carries the chips). A multi-host slice is a
        COMPACT placement of its topology: GKE creates, repairs and scales its nodes as one
        (0 or all of them), so a LeaderWorkerSet group lands on one whole slice."""
        spec = pool.spec
        zone = spec.tpu_zone or args.cluster.zones[0]
        placement: Optional[gcp.container.NodePoolPlacementPolicyArgsDict] = (
            {"type": "COMPACT", "tpu_topology": spec.topology or ""} if spec.hosts > 1 else None)
        return gcp.container.NodePool(
            f"{name}-{pool.name}", name=pool.name, project=args.project, location=args.region,
            cluster=self.cluster.name, node_locations=[zone], initial_node_count=0,
            # One zone: per-zone counts are the totals.
            autoscaling={"min_node_count": pool.min_nodes, "max_node_count": spec.max_nodes},
            placement_policy=placement,
            node_config=self._node_config(spec.machine_type, spec.disk_size_gb, pool.node_labels(), labels,
                                          spot=pool.spot, taints=taints_of(pool)),
            management={"auto_repair": True, "auto_upgrade": True},
            upgrade_settings=upgrade_settings(spec.upgrade),
            opts=child_opts(self, opts))
