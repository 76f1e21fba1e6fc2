"""Typed, validated specs for what the components declare.

These pydantic models are both the stack config schema (camelCase keys in stacks/*.yaml)
and the typed inputs of the components, so a program that imports the components gets
the same validation as `pulumi up`. Field validators reject a bad value with a message
that names the fix; cross-field rules live in infra/config.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .catalog import (
    CPU_MACHINE_TYPES,
    GPU_MACHINE_TYPES,
    KV_CACHE_BYTES,
    MACHINE_TYPES,
    MODEL_SHAPES,
    WEIGHT_BYTES,
    MachineType,
    ModelShape,
)

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(
            f"'{value}' is not a valid name; use 1-32 lowercase letters, digits or '-', "
            "starting with a letter (it becomes Kubernetes and GCP resource names)"
        )
    return value


Name = Annotated[str, AfterValidator(_dns_label)]


def _utc_time(value: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", value):
        raise ValueError(f"'{value}' must be an RFC 3339 UTC time like 2026-01-03T02:00:00Z")
    return value


UtcTime = Annotated[str, AfterValidator(_utc_time)]

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOSTNAME = re.compile(r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z][-a-z0-9]{0,61}[a-z0-9]$")
_EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,}$")
# A Docker tag; digests are checked separately.
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPOSITORY = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")
# A git branch, tag, commit or Hugging Face ref (refs/pr/1); never a path out of the model's folder.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
# What a credential looks like: a Hugging Face token, or a long run of key-like characters.
_TOKEN_LIKE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|[A-Za-z0-9+/_=-]{40,})$")


def gke_version(value: str) -> Optional[tuple[int, int, int, int]]:
    """(major, minor, patch, gke.N) of a GKE version or alias; a missing part reads as the newest
    (the alias picks the highest), so comparisons ask "can this alias resolve below the minimum"
    only for what is spelled out. None if it is not a version."""
    m = re.fullmatch(r"1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?", value)
    if not m:
        return None
    big = 10**9
    return (1, int(m[1]), int(m[2]) if m[2] is not None else big, int(m[3]) if m[3] is not None else big)


def _k8s_name(value: str) -> str:
    if len(value) > 253 or not _K8S_NAME.match(value):
        raise ValueError(f"'{value}' is not a Kubernetes object name: use lowercase letters, digits, '-' "
                         "and '.', starting and ending with a letter or digit")
    return value


def _hostname(value: str) -> str:
    if len(value) > 253 or not _HOSTNAME.match(value):
        raise ValueError(f"'{value}' is not a DNS hostname like llm.example.com (lowercase, optionally '*.' first)")
    return value


def _email(value: str) -> str:
    if not _EMAIL.match(value):
        raise ValueError(f"'{value}' is not an e-mail address like oncall@example.com")
    return value


def cidr_range(hint: int, smallest: int = 32, why: str = "") -> Callable[[str], str]:
    """A validator of an IPv4 range: a bare address is refused (ip_network would read it as a
    /32) with the range it probably means (`hint` its prefix), set host bits with the range they
    belong to, and a range smaller than a /`smallest` with `why`."""
    import ipaddress

    def check(value: str) -> str:
        if "/" not in value:
            try:
                address = ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"'{value}' is not an IPv4 range like 10.0.0.0/{hint}") from None
            if address.version == 4:
                raise ValueError(f"'{value}' has no prefix length; write the range, like "
                                 f"{ipaddress.ip_network(f'{value}/{hint}', strict=False)}")
        try:
            network = ipaddress.ip_network(value, strict=True)
        except ValueError:
            try:
                meant = ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError(f"'{value}' is not an IPv4 range like 10.0.0.0/{hint}") from None
            raise ValueError(f"'{value}' has address bits past its prefix; the range is {meant}") from None
        if network.version != 4:
            raise ValueError(f"'{value}' is IPv6: these ranges are IPv4 (like 10.0.0.0/{hint})")
        if network.prefixlen > smallest:
            raise ValueError(f"'{value}' is too small: a /{smallest} at least{why}")
        return value

    return check


def _git_revision(value: str) -> str:
    if len(value) > 255 or not _REVISION.fullmatch(value) or ".." in value or value.endswith((".lock", "/", ".")):
        raise ValueError(f"revision '{value}' is not a git branch, tag or commit (like main, v1.0, a 40-character "
                         "sha or refs/pr/1)")
    return value


K8sName = Annotated[str, AfterValidator(_k8s_name)]
Revision = Annotated[str, AfterValidator(_git_revision)]
Hostname = Annotated[str, AfterValidator(_hostname)]
Email = Annotated[str, AfterValidator(_email)]
Cidr = Annotated[str, AfterValidator(cidr_range(32))]
SubnetCidr = Annotated[str, AfterValidator(cidr_range(20, 29, " (GKE's smallest node subnet)"))]
PodsCidr = Annotated[str, AfterValidator(cidr_range(14, 21, ": each node takes a /24 of it, so a /21 is 8 nodes"))]
ServicesCidr = Annotated[str, AfterValidator(cidr_range(20, 27, " (GKE's smallest services range)"))]
MasterCidr = Annotated[str, AfterValidator(cidr_range(28))]
ProxyOnlyCidr = Annotated[str, AfterValidator(cidr_range(23, 26, " (Google's smallest proxy-only subnet)"))]


class Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def item_key(field: str, items: Any, i: int) -> str:
    """The config key of a list's i-th item as the stack file reads it, by its name
    ('models[qwen-7b]'); by index ('models[0]') where it has no name or its list repeats the name
    (the repeat itself is reported on its own)."""
    name = getattr(items[i], "name", None)
    unique = isinstance(name, str) and name and sum(getattr(x, "name", None) == name for x in items) == 1
    return f"{field}[{name}]" if unique else f"{field}[{i}]"


class ImageRef(Spec):
    # Image repository, without tag or digest (e.g. us-central1-docker.pkg.dev/proj/repo/vllm-server).
    repository: str
    # Image tag: a release, never latest (tag or digest is required).
    tag: Optional[str] = None
    # Image digest, sha256:<64 hex>; pins the image exactly.
    digest: Optional[str] = None

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _REPOSITORY.match(v):
            raise ValueError(f"'{v}' is not an image repository like us-central1-docker.pkg.dev/proj/repo/name "
                             "(no tag or digest here: use `tag` or `digest`)")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _TAG.match(v):
            raise ValueError(f"tag '{v}' is not a Docker tag: 1-128 of letters, digits, '_', '.', '-', "
                             "not starting with '.' or '-'")
        return v

    @model_validator(mode="after")
    def _pinned(self) -> "ImageRef":
        if self.digest is None and (self.tag is None or self.tag == "latest"):
            raise ValueError(
                "image must be pinned; set `tag` to a release (not 'latest') or `digest` to sha256:..."
            )
        if self.digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", self.digest):
            raise ValueError("digest must look like sha256:<64 hex chars>")
        return self

    @property
    def uri(self) -> str:
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


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
    exclusions: list[MaintenanceExclusion] = Field(default_factory=list)


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
    authorized_networks: list[AuthorizedNetwork] = Field(default_factory=list)
    # Control plane reachable only from inside the VPC (Pulumi must then run from there).
    private_endpoint: bool = False
    # Maintenance window and exclusions.
    maintenance: MaintenanceSpec = Field(default_factory=MaintenanceSpec)
    # Lowest control-plane version GKE may run (1.X, 1.X.Y or 1.X.Y-gke.N; "1.X" picks the newest
    # patch of 1.X, per the GKE API). Unset: the release channel's default.
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
    """A GPU node pool. Accelerator type and count come from the machine type. Node counts are
    totals across the cluster's zones (GKE's total_*_node_count), not per zone."""

    # Node pool name, referenced by models[].nodePool.
    name: Name
    # GPU machine type; the accelerator and its count follow from it.
    machine_type: str
    # MIG profile to split each GPU into (valid for that GPU).
    gpu_partition_size: Optional[str] = None
    # Spot VMs.
    spot: bool = False
    # Spot pools get an on-demand twin (min 0) that a ComputeClass falls back to.
    on_demand_fallback: bool = True
    # Fewest nodes (total across zones).
    min_nodes: int = Field(default=0, ge=0)
    # Most nodes (total across zones).
    max_nodes: int = Field(default=1, ge=1, le=1000)
    # Boot disk per node, GB.
    disk_size_gb: int = Field(default=200, ge=100)
    # How GKE replaces the pool's nodes.
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec)
    # With a fallback pool: move pods back to spot when it returns. Off by default: it evicts warm
    # replicas that then reload their weights, a visible outage on single-replica pools.
    spot_return_migration: bool = False

    @field_validator("machine_type")
    @classmethod
    def _known_machine(cls, v: str) -> str:
        if v not in GPU_MACHINE_TYPES:
            raise ValueError(
                f"unknown GPU machine type '{v}'; use one of {', '.join(GPU_MACHINE_TYPES)}"
            )
        return v

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
    def slice_memory_gb(self) -> float:
        assert self.machine.accelerator is not None
        return self.machine.accelerator.slice_memory_gb(self.gpu_partition_size)

    @property
    def slices_per_node(self) -> int:
        """Schedulable `nvidia.com/gpu` units per node (MIG instances count one each)."""
        assert self.machine.accelerator is not None
        return self.machine.gpus * self.machine.accelerator.slices_per_gpu(self.gpu_partition_size)

    @property
    def has_fallback_pool(self) -> bool:
        return self.spot and self.on_demand_fallback


# vLLM options the platform sets itself, by argparse dest, and the config key to use instead.
MANAGED_VLLM_OPTIONS: dict[str, str] = {
    "model": "the weights are the shared read-only copy: set models[].source",
    "model_tag": "the weights are the shared read-only copy: set models[].source",
    "download_dir": "replicas never download: weights come read-only from the shared store",
    "load_format": "weights come read-only from the shared store",
    "served_model_name": "set models[].name",
    "host": "the platform binds the server", "port": "the platform binds the server",
    "uds": "the platform binds the server", "root_path": "routes come from the Gateway",
    "middleware": "the platform loads its tenant guard there",
    "tensor_parallel_size": "set models[].tensorParallelSize",
    "max_model_len": "set models[].maxModelLen or the pool's maxModelLen",
    "max_num_seqs": "set the pool's maxNumSeqs", "max_num_batched_tokens": "set the pool's maxNumBatchedTokens",
    "gpu_memory_utilization": "set models[].gpuMemoryUtilization",
    "enable_prefix_caching": "set models[].enablePrefixCaching",
    "enable_chunked_prefill": "set models[].enableChunkedPrefill",
    "dtype": "set models[].dtype", "quantization": "set models[].dtype", "kv_cache_dtype": "set models[].kvCacheDtype",
    "enable_lora": "set models[].adapters", "max_loras": "set models[].maxLoras",
    "max_lora_rank": "set models[].adapters[].rank", "lora_modules": "set models[].adapters",
    "max_cpu_loras": "set models[].maxLoras",
    "api_key": "a secret on the command line; tenants authenticate with JWTs at the mesh",
    "hf_token": "a secret on the command line; only the loader holds the token",
}
_MANAGED_LONG_FLAGS = {f"--{d.replace('_', '-')}": d for d in MANAGED_VLLM_OPTIONS}
_MANAGED_LONG_FLAGS.update({f"--no-{k[2:]}": d for k, d in list(_MANAGED_LONG_FLAGS.items())})
_MANAGED_LONG_FLAGS.update({"--disable-prefix-caching": "enable_prefix_caching",
                            "--disable-chunked-prefill": "enable_chunked_prefill", "--disable-lora": "enable_lora"})


def normalise_flag(arg: str) -> str:
    """An option as vLLM's FlexibleArgumentParser reads it: '--max_model_len=8' -> '--max-model-len'."""
    if not arg.startswith("--"):
        return arg
    return "--" + arg[2:].split("=", 1)[0].replace("_", "-")


def extra_arg_problem(arg: str) -> Optional[str]:
    """Why an extraArgs entry is refused, before any vLLM snapshot is consulted; None if not."""
    dest = _MANAGED_LONG_FLAGS.get(normalise_flag(arg))
    if dest is not None:
        return f"extraArgs may not set {normalise_flag(arg)}: {MANAGED_VLLM_OPTIONS[dest]}"
    if _TOKEN_LIKE.match(arg.split("=", 1)[-1]):
        return "extraArgs holds what looks like a credential; secrets never go on a command line"
    return None


class CustomShape(Spec):
    # Parameters, in billions.
    params_billion: float = Field(gt=0)
    # Transformer layers.
    layers: int = Field(gt=0)
    # Key/value heads.
    kv_heads: int = Field(gt=0)
    # Dimension of one attention head.
    head_dim: int = Field(gt=0)


class ServingPoolSpec(Spec):
    """One replica set of a model; each model has a short-request and a long-request pool."""

    # Fewest replicas (the autoscaler's floor); 0 scales the pool to zero when idle (KEDA), and a
    # standby answers 503 with Retry-After until a replica is ready again.
    min_replicas: int = Field(default=1, ge=0)
    # Most replicas (the autoscaler's ceiling).
    max_replicas: int = Field(default=2, ge=1)
    # Sequences vLLM batches at once (--max-num-seqs).
    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    # Tokens per scheduler step (--max-num-batched-tokens).
    max_num_batched_tokens: Optional[int] = Field(default=None, ge=256)
    # Context window this pool accepts; defaults to the model's maxModelLen.
    max_model_len: Optional[int] = Field(default=None, ge=256)
    # Tokens (prompt + output) a typical request of this pool holds; the capacity check wants
    # room for maxNumSeqs of them. Defaults to the pool's maxModelLen.
    context_tokens: Optional[int] = Field(default=None, ge=16)
    # HPA target: average vllm:num_requests_waiting per pod before scaling out.
    queue_depth_target: int = Field(default=8, ge=1)
    # Load balancer target rate per replica, requests per second (GCPBackendPolicy
    # maxRatePerEndpoint): a capacity the load balancer balances by, not a cap - it prefers
    # replicas below it and, once every replica is at it, overfills them in proportion.
    max_rate_per_endpoint: Optional[int] = Field(default=None, ge=1)
    # minReplicas 0: seconds without a request (none running, none waiting) before the last
    # replica goes (KEDA's cooldownPeriod).
    cooldown_seconds: int = Field(default=900, ge=60, le=86400)

    @field_validator("max_replicas")
    @classmethod
    def _replicas(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas", 1)
        if low > v:
            raise ValueError(f"maxReplicas ({v}) is below minReplicas ({low}); raise maxReplicas")
        return v


class CanarySpec(Spec):
    """A new revision of a model, served side by side with the current one on a share of traffic.
    Roll forward by raising the weight, back by lowering it to 0 or removing the canary."""

    # The revision to try (a git branch, tag or commit of the model's source).
    revision: Revision
    # Percent of each route's traffic the canary gets, 0-100.
    weight: int = Field(ge=0, le=100)
    # Replicas of the canary in each of the model's pools.
    replicas: int = Field(default=1, ge=1, le=16)


def _weights_source(v: str) -> str:
    hf = r"hf://[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
    gs = r"gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[A-Za-z0-9._-]+)*/?"
    if not re.fullmatch(f"({hf}|{gs})", v) or "/../" in v + "/" or "/./" in v + "/":
        raise ValueError(f"source '{v}' must be hf://<org>/<repo> or gs://<bucket>/<path> (letters, digits, "
                         "'.', '_', '-'; no '..' segments)")
    return v


WeightsSource = Annotated[str, AfterValidator(_weights_source)]
# The ranks vLLM's --max-lora-rank accepts (its parser's choices).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class AdapterSpec(Spec):
    """A LoRA adapter of a model, loaded onto the share beside it and served by the same replicas."""

    # The name clients send as `model` to use it.
    name: Name
    # hf://org/repo or gs://bucket/prefix
    source: WeightsSource
    # Git branch, tag or commit of the source.
    revision: Revision = "main"
    # The adapter's LoRA rank (r); the model's --max-lora-rank is the largest of its adapters'.
    rank: int = 16
    # GiB the adapter's files take on disk (default: estimated from the rank and the model's
    # shape). Sizes its Hyperdisk ML disk; raise it when the loader says so.
    disk_gb: Optional[float] = Field(default=None, gt=0)
    # Tenants allowed to call it; each must also be allowed the base model.
    tenants: list[Name] = Field(min_length=1)

    @field_validator("rank")
    @classmethod
    def _rank(cls, v: int) -> int:
        if v not in LORA_RANKS:
            raise ValueError(f"rank {v} is not one vLLM serves; use one of {', '.join(map(str, LORA_RANKS))} "
                             "(the next one up from the adapter's r)")
        return v


def _short_default() -> ServingPoolSpec:
    return ServingPoolSpec(max_num_seqs=128)


def _long_default() -> ServingPoolSpec:
    return ServingPoolSpec(max_num_seqs=16, max_replicas=1)


class ModelSpec(Spec):
    # Model name: the served model name and route /<name>/v1.
    name: Name
    # hf://org/repo or gs://bucket/prefix
    source: str
    # Git branch, tag or commit of the source.
    revision: Revision = "main"
    # Architecture from the catalog (llama-3-8b, llama-3-70b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-72b, mistral-7b).
    shape: str | CustomShape
    # Weight dtype or quantisation.
    dtype: Literal["bfloat16", "float16", "fp8", "int8", "awq", "gptq"] = "bfloat16"
    # GiB the files vLLM reads take on disk (default: paramsBillion x dtype bytes). Sizes the
    # Hyperdisk ML disks and the Filestore share; raise it when the loader says so.
    disk_gb: Optional[float] = Field(default=None, gt=0)
    # KV-cache dtype.
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # GPUs one replica spans (whole GPUs only).
    tensor_parallel_size: int = Field(default=1, ge=1, le=16)
    # Longest context, in tokens.
    max_model_len: int = Field(default=8192, ge=256)
    # Share of each GPU or slice vLLM may use.
    gpu_memory_utilization: float = Field(default=0.90, ge=0.5, le=0.98)
    # Split long prefills across steps.
    enable_chunked_prefill: bool = True
    # Reuse KV cache across requests with a common prefix.
    enable_prefix_caching: bool = True
    # Node pool the replicas run on.
    node_pool: Name
    # Requests whose body is at least this many bytes go to the long pool.
    long_request_bytes: int = Field(default=16384, ge=1024)
    # The short-request pool.
    short: ServingPoolSpec = Field(default_factory=_short_default)
    # The long-request pool.
    long: ServingPoolSpec = Field(default_factory=_long_default)
    # More vLLM flags, checked against the release's parser; platform-managed flags and secrets are refused.
    extra_args: list[str] = Field(default_factory=list)
    # A canary of another revision, weighted against this one.
    canary: Optional[CanarySpec] = None
    # LoRA adapters served by the model's replicas (--enable-lora), each for the tenants it names.
    adapters: list[AdapterSpec] = Field(default_factory=list)
    # Adapters resident on the GPU at once (--max-loras; default: all of them, at most 8).
    max_loras: Optional[int] = Field(default=None, ge=1, le=64)
    # length: a short and a long pool, chosen by request size. inference-gateway: one pool (the
    # `short` settings) behind GKE Inference Gateway's endpoint picker, which picks the replica by
    # queue depth, KV-cache use and prefix-cache affinity, with per-tenant priorities.
    routing: Literal["length", "inference-gateway"] = "length"

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return _weights_source(v)

    @model_validator(mode="after")
    def _adapter_names(self) -> "ModelSpec":
        names = [a.name for a in self.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1 or n == self.name})
        if dupes:
            raise ValueError(f"adapters {dupes} repeat a name (or the model's own): each is a distinct `model` value "
                             "clients send")
        if self.max_loras is not None and not self.adapters:
            raise ValueError("maxLoras needs adapters")
        return self

    @property
    def lora_slots(self) -> int:
        """Adapters resident on the GPU at once."""
        return self.max_loras or min(len(self.adapters), 8)

    @property
    def max_lora_rank(self) -> int:
        return max((a.rank for a in self.adapters), default=0)

    def lora_gb(self) -> float:
        """GPU memory vLLM sets aside for LoRA: `lora_slots` adapters at the largest rank, A and B
        matrices of every attention and MLP projection of every layer, 16-bit. The hidden size is
        estimated from the shape (params ~ 12 x layers x hidden^2); the MLP counts as 3.5x hidden."""
        if not self.adapters:
            return 0.0
        s = self.model_shape
        hidden = (s.params_billion * 1e9 / (12 * s.layers)) ** 0.5
        # q, k, v, o: (hidden + hidden) each; gate, up, down: (hidden + 3.5 hidden) each.
        per_rank_per_layer = 4 * 2 * hidden + 3 * 4.5 * hidden
        return self.lora_slots * self.max_lora_rank * s.layers * per_rank_per_layer * 2 / 1e9


    @model_validator(mode="before")
    @classmethod
    def _custom_shape(cls, data: Any) -> Any:
        """`customShape` is the structured form of `shape`, as the component package names it
        (its schema has no unions): one name per concept in the stack config and every language."""
        if isinstance(data, dict) and ("customShape" in data or "custom_shape" in data):
            data = dict(data)
            custom = data.pop("customShape", None) or data.pop("custom_shape", None)
            if data.get("shape") is not None:
                raise ValueError("give shape (a catalog name) or customShape ({paramsBillion, layers, kvHeads, "
                                 "headDim}), not both")
            data["shape"] = custom
        return data

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: str | CustomShape) -> str | CustomShape:
        if isinstance(v, str) and v not in MODEL_SHAPES:
            raise ValueError(
                f"unknown model shape '{v}'; use one of {', '.join(MODEL_SHAPES)} or give "
                "customShape: {paramsBillion, layers, kvHeads, headDim}"
            )
        return v

    @field_validator("extra_args")
    @classmethod
    def _unmanaged_flags(cls, v: list[str]) -> list[str]:
        for arg in v:
            problem = extra_arg_problem(arg)
            if problem:
                raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _canary_differs(self) -> "ModelSpec":
        if self.canary is not None and self.canary.revision == self.revision:
            raise ValueError(f"canary.revision '{self.canary.revision}' is the model's own revision; give the new "
                             "revision to try, or remove canary")
        return self

    @model_validator(mode="after")
    def _one_pool_behind_the_picker(self) -> "ModelSpec":
        if self.routing != "inference-gateway":
            return self
        length_only = sorted({"long", "long_request_bytes"} & self.model_fields_set)
        if length_only:
            keys = ", ".join(to_camel(k) for k in length_only)
            raise ValueError(f"{keys} only apply to routing: length; with routing: inference-gateway the model "
                             "has one pool, configured under `short`, and the endpoint picker balances it")
        if self.canary is not None:
            raise ValueError("canary needs routing: length for now: a weighted split between two InferencePools "
                             "would lose the tenants' objectives on the canary side")
        if self.short.max_rate_per_endpoint is not None:
            raise ValueError("short.maxRatePerEndpoint applies to routing: length; the endpoint picker balances "
                             "by load, not by a fixed rate")
        return self

    @property
    def pool_names(self) -> tuple[Literal["short", "long"], ...]:
        """The model's serving pools: both with length routing, one behind the endpoint picker."""
        return ("short",) if self.routing == "inference-gateway" else ("short", "long")

    def canary_model(self) -> Optional["ModelSpec"]:
        """This model at the canary's revision, with the canary's replica count in both pools. A
        canary follows its pool's scaling: beside a pool that may go to zero it may too (up to
        its replicas), so a sleeping model keeps no canary GPU up."""
        if self.canary is None:
            return None
        replicas = self.canary.replicas
        pools = {which: getattr(self, which).model_copy(update={
            "min_replicas": 0 if getattr(self, which).min_replicas == 0 else replicas, "max_replicas": replicas})
                 for which in ("short", "long")}
        return self.model_copy(update={"revision": self.canary.revision, "canary": None, **pools})

    @property
    def model_shape(self) -> ModelShape:
        if isinstance(self.shape, str):
            return MODEL_SHAPES[self.shape]
        return ModelShape(**self.shape.model_dump())

    @property
    def weights_gb(self) -> float:
        return self.model_shape.params_billion * WEIGHT_BYTES[self.dtype]

    @property
    def files_gb(self) -> float:
        """What the loaded files take on disk: the stack's figure, else the weights' estimate."""
        return self.disk_gb or self.weights_gb

    @property
    def kv_bytes_per_token(self) -> int:
        s = self.model_shape
        return int(2 * s.layers * s.kv_heads * s.head_dim * KV_CACHE_BYTES[self.kv_cache_dtype])

    def pool_max_model_len(self, pool: ServingPoolSpec) -> int:
        return pool.max_model_len or self.max_model_len

    @property
    def served_max_model_len(self) -> int:
        """The longest context any of the model's pools serves: the long pool's with length
        routing, the one pool's behind the endpoint picker (which may be shorter than the model's)."""
        return max(self.pool_max_model_len(getattr(self, which)) for which in self.pool_names)


class JwtSpec(Spec):
    # The JWT issuer (iss) of the tenant's tokens, an https URL.
    issuer: str
    # Where the issuer's signing keys are (https).
    jwks_uri: str
    # Required: without audiences the mesh accepts a token the issuer minted for any other service.
    audiences: list[str] = Field(min_length=1)

    @field_validator("issuer", "jwks_uri")
    @classmethod
    def _https(cls, v: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme != "https" or not parts.hostname or not _HOSTNAME.match(parts.hostname) \
                or any(c.isspace() for c in v) or parts.query or parts.fragment:
            raise ValueError(f"'{v}' must be an https:// URL with a DNS host and no query or fragment")
        return v.rstrip("/") if parts.path in ("", "/") else v


class RateLimitSpec(Spec):
    # Requests admitted per tenant in any 60 seconds: per replica, or across all replicas with
    # vllm-gke:globalLimits enabled (each replica's own count is then the fallback).
    requests_per_minute: int = Field(ge=1)
    # Generated tokens per tenant in any 60 seconds, across all replicas (needs globalLimits):
    # each request counts what it may make vLLM generate (its bound under maxTokens).
    tokens_per_minute: Optional[int] = Field(default=None, ge=1)


class GlobalLimitsSpec(Spec):
    """One shared store of the tenants' sliding windows, so limits hold across replicas."""

    # Count requests and tokens per tenant across all replicas (an in-cluster Redis, reached
    # over the mesh's mTLS: only the vLLM pods' identities may connect; no password exists).
    enabled: bool = False
    # The store's image.
    image: ImageRef = Field(default_factory=lambda: ImageRef(repository="mirror.gcr.io/library/redis", tag="7.4.2-alpine"))


class DedicatedSpec(Spec):
    """Models a tenant gets its own replicas of, on its own (often MIG) node pool."""

    # Models the tenant gets its own replicas of.
    models: list[Name] = Field(min_length=1)
    # Node pool of those replicas.
    node_pool: Name


class TenantSpec(Spec):
    # Tenant name; its namespace is tenant-<name>.
    name: Name
    # How the tenant's tokens are verified.
    jwt: JwtSpec
    # Models the tenant may call.
    models: list[Name] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, v: list[str]) -> list[str]:
        dupes = sorted({m for m in v if v.count(m) > 1})
        if dupes:
            raise ValueError(f"models {dupes} are listed more than once")
        return v

    # The tenant's request rate limit.
    rate_limit: RateLimitSpec
    # Most tokens one request may make vLLM generate (all sequences together).
    max_tokens: int = Field(ge=1, le=131072)
    # Replicas of the tenant's own.
    dedicated: Optional[DedicatedSpec] = None
    # Priority of the tenant's requests on models with routing: inference-gateway (its
    # InferenceObjective). The pinned endpoint picker (gateway-api-inference-extension v1.2.0,
    # without its experimental flow control) only sheds: while every replica of the pool is
    # saturated (more than 5 requests waiting or KV cache over 80% on each), a negative priority's
    # requests get 429; 0, the default, is never shed. It orders nothing by priority.
    priority: int = Field(default=0, ge=-100, le=100)

    @field_validator("priority")
    @classmethod
    def _sheddable_or_not(cls, v: int) -> int:
        if v > 0:
            raise ValueError(
                f"{v} would change nothing: the pinned endpoint picker (v1.2.0) serves no priority before "
                "another, it only sheds negative ones (429) while the pool is saturated; use 0 (never shed) "
                "or a negative number (shed first)")
        return v


class GatewaySpec(Spec):
    # Internal by default: exposing models to the internet is a decision, with TLS required.
    class_name: Literal[
        "gke-l7-regional-external-managed", "gke-l7-rilb", "gke-l7-global-external-managed"
    ] = "gke-l7-rilb"
    # The DNS name clients use (required for a managed certificate).
    hostname: Optional[Hostname] = None
    # TLS from an existing kubernetes.io/tls Secret in the serving namespace...
    tls_secret_name: Optional[K8sName] = None
    # ...or a Google-managed Certificate Manager certificate for `hostname` (DNS authorization:
    # create the CNAME record the stack exports as `dnsAuthorization`).
    managed_certificate: bool = False
    # Reserve the load balancer's address, so DNS records survive a re-created Gateway.
    static_ip: bool = True
    # Backend timeout; long generations stream for minutes.
    request_timeout_seconds: int = Field(default=600, ge=30, le=3600)

    @property
    def external(self) -> bool:
        return self.class_name != "gke-l7-rilb"

    @property
    def regional(self) -> bool:
        return self.class_name != "gke-l7-global-external-managed"

    @property
    def tls(self) -> bool:
        return bool(self.tls_secret_name or self.managed_certificate)

    @model_validator(mode="after")
    def _tls(self) -> "GatewaySpec":
        if self.tls_secret_name and self.managed_certificate:
            raise ValueError("set either tlsSecretName or managedCertificate, not both")
        if self.managed_certificate and not self.hostname:
            raise ValueError("managedCertificate needs a hostname to issue the certificate for")
        if self.external and not self.tls:
            raise ValueError(
                f"an external gateway ({self.class_name}) serves HTTPS only, so bearer tokens never cross "
                "the internet in clear: set managedCertificate: true (with hostname) or tlsSecretName")
        return self


class SecretKeyRef(Spec):
    # Secret name.
    name: K8sName
    # Key in the Secret's data.
    key: str = "token"

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", v):
            raise ValueError(f"'{v}' is not a Secret data key: letters, digits, '-', '_' or '.'")
        return v


class WeightsSpec(Spec):
    # Where the one copy of the weights lives: a Filestore share (NFS, ReadOnlyMany), or a Cloud
    # Storage bucket mounted by GKE's Cloud Storage FUSE CSI driver with a file cache and parallel
    # downloads (regional, no capacity to size; each node caches what it reads), or Hyperdisk ML
    # disks (ReadOnlyMany, one per weight set and zone) that GKE Volume Populator fills from
    # that bucket once the loaders have written it.
    backend: Literal["filestore", "gcs", "hyperdisk-ml"] = "filestore"
    # gcs, hyperdisk-ml: the bucket (default <project>-<cluster>-weights); created by the stack.
    bucket: Optional[str] = None
    # hyperdisk-ml: each disk's provisioned throughput, MiB/s (Hyperdisk ML takes 400 to
    # 1,200,000; GKE's Volume Populator guide uses 2,400). Readers of one disk share it.
    hyperdisk_throughput_mib_s: int = Field(default=2400, ge=400, le=1_200_000, alias="hyperdiskThroughputMiBps")
    # hyperdisk-ml: the machine type of the transfer nodes Volume Populator's Jobs run on (a
    # node pool that scales from zero; C3 or C3D, which attach Hyperdisk ML).
    populator_machine_type: str = "c3-standard-44"
    # Warn when a pool's estimated time from node ready to serving exceeds this.
    cold_start_budget_seconds: int = Field(default=900, ge=60, le=7200)
    # The weights store's read throughput, MiB/s, as measured (overrides the documented figure).
    read_throughput_mib_s: Optional[float] = Field(default=None, gt=0, alias="readThroughputMiBps")
    # The Filestore tier, fixed for the share's life (a change re-creates it). REGIONAL replicates
    # across the region's zones: the share survives a zone outage, which a zonal tier serving a
    # multi-zone cluster does not. BASIC_HDD reads at 100 MiB/s whatever its size.
    tier: Literal["BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL"] = "ZONAL"

    @field_validator("tier", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        if v == "auto":
            raise ValueError("'auto' is no longer a tier: it chose BASIC_HDD or ZONAL from the models' total size, so "
                             "adding a model re-created the share. Set the tier the share has: BASIC_HDD if it was "
                             "made while the weights totalled 100 GB or less, else ZONAL")
        return v

    @field_validator("populator_machine_type")
    @classmethod
    def _populator_machine(cls, v: str) -> str:
        from .catalog import populator_vcpus

        if populator_vcpus(v) is None:
            raise ValueError(f"'{v}' is not a C3 or C3D machine type with at least 8 vCPUs (e.g. c3-standard-44, "
                             "c3-highcpu-22, c3d-standard-30): the transfer Jobs need a series that attaches "
                             "Hyperdisk ML")
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: Optional[str]) -> Optional[str]:
        from .gcp_names import is_bucket_name

        if v is not None and not is_bucket_name(v):
            raise ValueError(f"'{v}' is not a Cloud Storage bucket name: 3-63 lowercase letters, digits, '-' or '_', "
                             "a letter or digit at both ends, not starting with goog or containing google")
        return v
    # Filestore capacity, GiB; default: the tier's minimum or the weights plus headroom.
    capacity_gb: Optional[int] = Field(default=None, ge=1024)
    # Secret Manager secret holding the Hugging Face token; the loader mounts it through the
    # GKE Secret Manager CSI add-on, so the token never enters Pulumi state or a manifest.
    secret_manager_secret: str = "hf-token"

    @field_validator("secret_manager_secret")
    @classmethod
    def _secret_id(cls, v: str) -> str:
        if _TOKEN_LIKE.match(v):
            raise ValueError("looks like a token itself: give the Secret Manager secret's id (e.g. hf-token), "
                             "never the token; put the token in Secret Manager with gcloud secrets create")
        if not _SECRET_ID.match(v):
            raise ValueError(f"'{v}' is not a Secret Manager secret id: 1-255 letters, digits, '_' or '-'")
        return v
    # Or: an existing Kubernetes Secret in the loader namespace (e.g. synced from Secret Manager
    # by External Secrets); the loader then reads HF_TOKEN through a secretKeyRef.
    hf_token_kubernetes_secret: Optional[SecretKeyRef] = None
    # hf:// sources load with the server image (it ships the HF CLI); gs:// ones need gcloud.
    gcs_loader_image: ImageRef = Field(
        default_factory=lambda: ImageRef(
            repository="gcr.io/google.com/cloudsdktool/google-cloud-cli", tag="499.0.0-slim"
        )
    )


class MonitoringSpec(Spec):
    # Who alert policies notify.
    notification_emails: list[Email] = Field(default_factory=list)
    # p95 queue time that pages.
    queue_latency_slo_seconds: float = Field(default=2.0, gt=0)
    # p95 time to first token that warns.
    ttft_slo_seconds: float = Field(default=3.0, gt=0)
    # KV-cache usage that warns.
    kv_cache_alert_ratio: float = Field(default=0.95, gt=0, le=1)


class CostSpec(Spec):
    # Sustained generation throughput of one physical GPU for your models (measure it).
    tokens_per_second_per_gpu: float = Field(default=1500.0, gt=0)
    # Expected share of capacity in use.
    target_utilization: float = Field(default=0.6, gt=0, le=1)
    # Hours a month the report prices.
    hours_per_month: float = Field(default=730.0, gt=0, le=744)


__all__ = [
    "AuthorizedNetwork", "MaintenanceExclusion", "MaintenanceSpec", "MaintenanceWindow", "UpgradeSpec",
    "ClusterSpec", "CostSpec", "CustomShape", "DedicatedSpec", "GatewaySpec", "ImageRef",
    "GlobalLimitsSpec", "JwtSpec", "ModelSpec", "MonitoringSpec", "NodePoolSpec", "RateLimitSpec", "SecretKeyRef",
    "ServingPoolSpec", "Spec", "TenantSpec", "WeightsSpec", "AdapterSpec", "item_key",
]
