"""The cluster and its node pools: ranges, access, maintenance, machine types, MIG and spot."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..catalog import (
    CPU_MACHINE_TYPES,
    GPU_MACHINE_TYPES,
    MACHINE_TYPES,
    MachineType,
    topology_chips,
)
from .base import (
    Cidr,
    MasterCidr,
    Name,
    PodsCidr,
    ProxyOnlyCidr,
    ServicesCidr,
    Spec,
    SubnetCidr,
    UtcTime,
    gke_version,
)
from .sleep_mode import GpuSharingSpec


class AuthorizedNetwork(Spec):
    # A source range allowed to reach the control plane.
    cidr: Cidr
    # A label for the range.
    display_name: str = "authorized"


class MaintenanceWindow(Spec):
    """A recurring window (RFC 5545 RRULE) in which GKE may upgrade the control plane and nodes."""

    start_time: UtcTime  # e.g. 2026-01-03T02:00:00Z; the time of day and length repeat
    # End of the first window (RFC 3339 UTC).
    end_time: UtcTime
    # How the window repeats (RFC 5545 RRULE).
    recurrence: str = "FREQ=WEEKLY;BYDAY=SA,SU"

    @field_validator("recurrence")
    @classmethod
    def _rrule(cls, v: str) -> str:
        if not v.startswith("FREQ="):
            raise ValueError(f"'{v}' must be an RFC 5545 RRULE such as FREQ=WEEKLY;BYDAY=SA,SU")
        return v


class MaintenanceExclusion(Spec):
    """A period with no upgrades of the given scope (e.g. a launch week)."""

    # The exclusion's name.
    name: Name
    # Start (RFC 3339 UTC).
    start_time: UtcTime
    # End (RFC 3339 UTC).
    end_time: UtcTime
    # Which upgrades are held back.
    scope: Literal["NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES"] = "NO_MINOR_OR_NODE_UPGRADES"


class MaintenanceSpec(Spec):
    # When GKE may upgrade; unset lets GKE choose.
    window: Optional[MaintenanceWindow] = None
    # Periods with no upgrades.
    exclusions: list[MaintenanceExclusion] = Field(default_factory=list[MaintenanceExclusion])


class ClusterSpec(Spec):
    # Cluster name; also the prefix of the VPC, subnets and service accounts.
    name: Name
    # Zones of the node pools, in gcp:region; the first also holds a zonal Filestore.
    zones: list[str] = Field(min_length=1)
    # GKE release channel (also picks the managed mesh revision).
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    # Machine type of the CPU system pool.
    system_machine_type: str = "e2-standard-4"
    # Total system nodes across all zones (not per zone); the pool autoscales up to systemMaxNodes.
    system_nodes: int = Field(default=1, ge=1, le=10)
    # Upper bound of the system pool's autoscaling (total).
    system_max_nodes: Optional[int] = Field(default=None, ge=1, le=20)
    # Node subnet range.
    subnet_cidr: SubnetCidr = "10.10.0.0/20"
    # Pod (secondary) range.
    pods_cidr: PodsCidr = "10.20.0.0/14"
    # Service (secondary) range.
    services_cidr: ServicesCidr = "10.24.0.0/20"
    # The control plane's private range: exactly a /28 (GKE's requirement).
    master_cidr: MasterCidr = "172.16.0.0/28"
    # The proxy-only subnet regional load balancers' Envoys use (one per region and VPC).
    proxy_only_cidr: ProxyOnlyCidr = "10.129.0.0/23"
    # Nodes without public IPs (egress through Cloud NAT).
    private_nodes: bool = True
    # GKE Dataplane V2, which enforces the NetworkPolicies the platform declares for its pods
    # outside the mesh (the endpoint picker). Fixed at creation: changing it replaces the cluster,
    # so a cluster made without it (vllm-gke 0.2.0) keeps false, and the plan says what is then
    # not enforced.
    dataplane_v2: bool = True
    # Protect the cluster and the weights share from deletion.
    deletion_protection: bool = True
    # Cloud Service Mesh (managed Istio) enforces the tenants' JWT and authorization policies.
    # The fleet feature is one per project: set false where another stack already manages it.
    manage_mesh_feature: bool = True
    # Who may reach the control plane's public endpoint; empty means anyone (with credentials).
    authorized_networks: list[AuthorizedNetwork] = Field(default_factory=list[AuthorizedNetwork])
    # Control plane reachable only from inside the VPC (Pulumi must then run from there).
    private_endpoint: bool = False
    # Maintenance window and exclusions.
    maintenance: MaintenanceSpec = Field(default_factory=MaintenanceSpec)
    # Lowest control-plane version GKE may run (1.X, 1.X.Y or 1.X.Y-gke.N; "1.X" picks the newest
    # patch of 1.X, per the GKE API). Unset: the release channel's default. 1.34 or later for
    # models with routing: inference-gateway.
    min_master_version: Optional[str] = None

    @field_validator("min_master_version")
    @classmethod
    def _gke_version(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and gke_version(v) is None:
            raise ValueError(f"'{v}' is not a GKE version like 1.34, 1.34.1 or 1.34.0-gke.1626000")
        return v

    @property
    def system_pool_max(self) -> int:
        return max(self.system_nodes, self.system_max_nodes or self.system_nodes)

    @field_validator("master_cidr")
    @classmethod
    def _slash_28(cls, v: str) -> str:
        if not v.endswith("/28"):
            raise ValueError(f"'{v}' must be a /28: GKE takes exactly 16 addresses for the control plane")
        return v

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, v: list[str]) -> list[str]:
        for zone in v:
            if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", zone):
                hint = " (that is a region; zones are like us-central1-a)" if re.fullmatch(
                    r"[a-z]+-[a-z]+[0-9]+", zone) else ""
                raise ValueError(f"'{zone}' is not a zone like us-central1-a{hint}")
        dupes = sorted({z for z in v if v.count(z) > 1})
        if dupes:
            raise ValueError(f"zones {dupes} are listed more than once")
        return v

    @field_validator("system_machine_type")
    @classmethod
    def _cpu_machine(cls, v: str) -> str:
        if v not in CPU_MACHINE_TYPES:
            raise ValueError(f"unknown system machine type '{v}'; use one of {', '.join(CPU_MACHINE_TYPES)}")
        return v


class UpgradeSpec(Spec):
    """How GKE replaces this pool's nodes. SURGE with maxSurge >= 1 creates the new node first, so
    a replica can move before its old node drains (it needs quota for one more node); BLUE_GREEN
    keeps the old nodes until the new ones soak."""

    # Node upgrade strategy.
    strategy: Literal["SURGE", "BLUE_GREEN"] = "SURGE"
    # SURGE: extra nodes created during an upgrade.
    max_surge: int = Field(default=1, ge=0, le=20)
    # SURGE: nodes that may be down at once.
    max_unavailable: int = Field(default=0, ge=0, le=20)
    # BLUE_GREEN: how long the new nodes soak.
    soak_minutes: int = Field(default=30, ge=0, le=1440)

    @model_validator(mode="after")
    def _progress(self) -> "UpgradeSpec":
        if self.strategy == "SURGE" and self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0: an upgrade could never progress")
        return self


class NodePoolSpec(Spec):
    """A GPU or TPU node pool. Accelerator type and count come from the machine type. Node counts
    are totals across the cluster's zones (GKE's total_*_node_count), not per zone; a TPU pool
    lives in one zone (`tpuZone`)."""

    # Node pool name, referenced by models[].nodePool.
    name: Name
    # GPU or TPU machine type; the accelerator and its count follow from it.
    machine_type: str
    # MIG profile to split each GPU into (valid for that GPU).
    gpu_partition_size: Optional[str] = None
    # TPU pools: the slice topology (e.g. 2x4; default the machine type's single-host one). One
    # larger than a host makes a multi-host slice: that many nodes form one slice, created and
    # scaled as a whole (minNodes 0 or the slice's hosts, maxNodes the slice's hosts).
    tpu_topology: Optional[str] = None
    # TPU pools: the zone (one of cluster.zones) the slice is in; TPUs are zonal. Default the first.
    tpu_zone: Optional[str] = None
    # Spot VMs.
    spot: bool = False
    # Spot pools get an on-demand twin (<name>-ondemand, min 0, maxNodes of its own) that a
    # ComputeClass falls back to: with it the pool reaches up to twice maxNodes.
    on_demand_fallback: bool = True
    # Fewest nodes (total across zones).
    min_nodes: int = Field(default=0, ge=0)
    # Most nodes (total across zones); a spot pool's on-demand twin has as many again.
    max_nodes: int = Field(default=1, ge=1, le=1000)
    # Boot disk per node, GB.
    disk_size_gb: int = Field(default=200, ge=100)
    # How GKE replaces the pool's nodes.
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec)
    # With a fallback pool: move pods back to spot when it returns. Off by default: it evicts warm
    # replicas that then reload their weights, a visible outage on single-replica pools.
    spot_return_migration: bool = False
    # GKE GPU time-sharing: each GPU offered to several pods, which take turns (no memory
    # isolation: only models with sleepMode run here, one awake per GPU).
    gpu_sharing: Optional[GpuSharingSpec] = None

    @field_validator("machine_type")
    @classmethod
    def _known_machine(cls, v: str) -> str:
        if v not in GPU_MACHINE_TYPES:
            raise ValueError(
                f"unknown GPU or TPU machine type '{v}'; use one of {', '.join(GPU_MACHINE_TYPES)}"
            )
        return v

    @model_validator(mode="after")
    def _tpu_slice(self) -> "NodePoolSpec":
        machine = self.machine
        if not machine.is_tpu:
            for key in ("tpu_topology", "tpu_zone"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{'tpuTopology' if key == 'tpu_topology' else 'tpuZone'} applies to TPU "
                                     f"machine types; {self.machine_type} is a GPU machine: remove it")
            return self
        if self.tpu_topology is not None and self.tpu_topology not in machine.tpu_topologies:
            raise ValueError(f"tpuTopology '{self.tpu_topology}' is not one GKE builds of {self.machine_type}; use "
                             f"one of {', '.join(machine.tpu_topologies)}")
        hosts = self.hosts
        if hosts > 1 and (self.max_nodes != hosts or self.min_nodes not in (0, hosts)):
            raise ValueError(f"a {self.topology} slice of {self.machine_type} is {hosts} nodes created and scaled "
                             f"as one: set maxNodes to {hosts} and minNodes to 0 or {hosts} (for more slices, "
                             "add more pools)")
        return self

    @field_validator("gpu_partition_size")
    @classmethod
    def _mig_profile(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        machine = MACHINE_TYPES.get(info.data.get("machine_type", ""))
        if v is None or machine is None or machine.accelerator is None:
            return v
        acc = machine.accelerator
        if v not in acc.mig_profiles:
            valid = ", ".join(acc.mig_profiles) or "none (this GPU has no MIG; remove gpuPartitionSize)"
            raise ValueError(
                f"'{v}' is not a MIG profile of {acc.gke_type} ({machine.name}); valid: {valid}"
            )
        return v

    @model_validator(mode="after")
    def _sharing_on_gpus(self) -> "NodePoolSpec":
        if self.gpu_sharing is not None and self.machine.is_tpu:
            raise ValueError(f"gpuSharing time-shares GPUs; {self.machine_type} is a TPU machine: remove it")
        return self

    @model_validator(mode="after")
    def _twin_name(self) -> "NodePoolSpec":
        if self.has_fallback_pool and len(f"{self.name}-ondemand") > 40:
            raise ValueError(f"name '{self.name}' is too long for a spot pool: its on-demand twin "
                             f"'{self.name}-ondemand' exceeds GKE's 40 characters; use at most 31")
        return self

    @field_validator("max_nodes")
    @classmethod
    def _nodes(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_nodes", 0)
        if low > v:
            raise ValueError(f"maxNodes ({v}) is below minNodes ({low}); raise maxNodes or lower minNodes")
        return v

    @property
    def machine(self) -> MachineType:
        return MACHINE_TYPES[self.machine_type]

    @property
    def is_tpu(self) -> bool:
        return self.machine.is_tpu

    @property
    def topology(self) -> Optional[str]:
        """A TPU pool's slice topology (the machine type's single-host one unless set)."""
        return (self.tpu_topology or self.machine.tpu_topologies[0]) if self.is_tpu else None

    @property
    def hosts(self) -> int:
        """Nodes one slice spans: a multi-host TPU topology's chips over the chips per node; 1 else."""
        topology = self.topology
        return topology_chips(topology) // self.machine.gpus if topology else 1

    @property
    def slice_memory_gb(self) -> float:
        assert self.machine.accelerator is not None
        return self.machine.accelerator.slice_memory_gb(self.gpu_partition_size)

    @property
    def slices_per_node(self) -> int:
        """Schedulable `nvidia.com/gpu` units per node (MIG instances count one each; a time-shared
        GPU, as many as its shared clients: GKE advertises each as a unit)."""
        assert self.machine.accelerator is not None
        shared = self.gpu_sharing.max_shared_clients_per_gpu if self.gpu_sharing else 1
        return self.machine.gpus * self.machine.accelerator.slices_per_gpu(self.gpu_partition_size) * shared

    @property
    def has_fallback_pool(self) -> bool:
        return self.spot and self.on_demand_fallback
