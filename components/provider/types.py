"""Input types of the vllm-gke component package.

GENERATED from components/model/specs/ by components/provider/generate_types.py: do not edit;
change the specs and regenerate. Keys are the specs' fields; the package components validate
them with the specs themselves."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from enum import Enum
from typing import TypedDict

from typing_extensions import NotRequired

class ReleaseChannel(str, Enum):
    """GKE release channel (also picks the managed mesh revision)."""

    RAPID = 'RAPID'
    REGULAR = 'REGULAR'
    STABLE = 'STABLE'


class Scope(str, Enum):
    """Which upgrades are held back."""

    NO_UPGRADES = 'NO_UPGRADES'
    NO_MINOR_UPGRADES = 'NO_MINOR_UPGRADES'
    NO_MINOR_OR_NODE_UPGRADES = 'NO_MINOR_OR_NODE_UPGRADES'


class Strategy(str, Enum):
    """Node upgrade strategy."""

    SURGE = 'SURGE'
    BLUE_GREEN = 'BLUE_GREEN'


class GpusharingStrategy(str, Enum):
    """How pods share a GPU; GKE's TIME_SHARING (MPS is not offered here: its clients run at once)."""

    TIME_SHARING = 'TIME_SHARING'


class Dtype(str, Enum):
    """Weight dtype or quantisation."""

    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'
    FP8 = 'fp8'
    INT8 = 'int8'
    AWQ = 'awq'
    GPTQ = 'gptq'


class KvCacheDtype(str, Enum):
    """KV-cache dtype."""

    AUTO = 'auto'
    FP8 = 'fp8'


class Routing(str, Enum):
    """length: a short and a long pool, chosen by request size. inference-gateway: one pool (the `short` settings) behind GKE Inference Gateway's endpoint picker, which picks the replica by queue depth, KV-cache use and prefix-cache affinity, with per-tenant priorities."""

    LENGTH = 'length'
    INFERENCE_GATEWAY = 'inference-gateway'


class Transport(str, Enum):
    """How NIXL (UCX) moves KV blocks between the pools. rdma: GPUDirect RDMA over the node pool's RDMA NICs (only machines vllm-gke sets that network up for); tcp: the data-centre network; auto: rdma where the prefill and decode node pools both have it, else tcp."""

    AUTO = 'auto'
    RDMA = 'rdma'
    TCP = 'tcp'


class Level(str, Enum):
    """1: the weights go to the node's RAM while asleep and come back over PCIe in seconds (every sleeping model's weights count against the node's memory). 2: the weights are dropped and reloaded from the weights share on wake (slower, no RAM held)."""

    V1 = '1'
    V2 = '2'


class Method(str, Enum):
    """What proposes the tokens: ngram (prompt lookup, no weights), draft_model (a smaller model of the same tokenizer), eagle or eagle3 (a head reading the model's hidden states), mtp (the model's own multi-token-prediction layers; DeepSeek-V3 and custom shapes whose checkpoint has them)."""

    NGRAM = 'ngram'
    DRAFT_MODEL = 'draft_model'
    EAGLE = 'eagle'
    EAGLE3 = 'eagle3'
    MTP = 'mtp'


class ClassName(str, Enum):
    """Internal by default: exposing models to the internet is a decision, with TLS required."""

    GKE_L7_REGIONAL_EXTERNAL_MANAGED = 'gke-l7-regional-external-managed'
    GKE_L7_RILB = 'gke-l7-rilb'
    GKE_L7_GLOBAL_EXTERNAL_MANAGED = 'gke-l7-global-external-managed'


class Backend(str, Enum):
    """Where the one copy of the weights lives: a Filestore share (NFS, ReadOnlyMany), or a Cloud Storage bucket mounted by GKE's Cloud Storage FUSE CSI driver with a file cache and parallel downloads (regional, no capacity to size; each node caches what it reads), or Hyperdisk ML disks (ReadOnlyMany, one per weight set and zone) that GKE Volume Populator fills from that bucket once the loaders have written it."""

    FILESTORE = 'filestore'
    GCS = 'gcs'
    HYPERDISK_ML = 'hyperdisk-ml'


class Tier(str, Enum):
    """The Filestore tier, fixed for the share's life (a change re-creates it). REGIONAL replicates across the region's zones: the share survives a zone outage, which a zonal tier serving a multi-zone cluster does not. BASIC_HDD reads at 100 MiB/s whatever its size."""

    BASIC_HDD = 'BASIC_HDD'
    BASIC_SSD = 'BASIC_SSD'
    ZONAL = 'ZONAL'
    REGIONAL = 'REGIONAL'


class Environment(str, Enum):
    """A label on every resource; behaviour comes from the other settings, never from this."""

    DEV = 'dev'
    STAGING = 'staging'
    PROD = 'prod'


class Distribution(str, Enum):
    """A length distribution in tokens: lognormal gives the long tail real prompts have."""

    LOGNORMAL = 'lognormal'
    NORMAL = 'normal'
    UNIFORM = 'uniform'
    FIXED = 'fixed'


class FailureMode(str, Enum):
    """What the load balancer does while no picker answers. FailClose (the default): the request fails (500) - no tenant's priority, queue or shedding is bypassed. FailOpen: the load balancer sends it to a replica of its own choosing, with no priorities, no queueing, no prefix or load awareness, for as long as the picker is down (a leader's crash: up to 15 s; its rollout or drain: until the new leader is ready, see the routing guide)."""

    FAILCLOSE = 'FailClose'
    FAILOPEN = 'FailOpen'


class PrefixCache(str, Enum):
    """How the prefix-cache scorer knows what a replica holds. approximate: the picker's own record of what it sent where. precise: vLLM's KV-cache events (ZMQ, readable by the picker's pods alone) and a tokenizer, <model>-render (two pods of 1 CPU, 2 GiB on the system pool, apart from the picker), reading the model's shared weights; CUDA pools only (components/model/picker_prefix.py)."""

    APPROXIMATE = 'approximate'
    PRECISE = 'precise'


class Gpu(str, Enum):
    """The GPU each instance gets (one an instance): Cloud Run offers NVIDIA L4 (24 GB) and RTX PRO 6000 Blackwell (96 GB) in some regions only; the plan checks the region."""

    NVIDIA_L4 = 'nvidia-l4'
    NVIDIA_RTX_PRO_6000 = 'nvidia-rtx-pro-6000'


class Auth(str, Enum):
    """How a tenant's identity is verified before the guard sees a request; either way the service takes traffic from the stack's load balancer alone. iam (the default: Cloud Run verifies the caller before any instance starts, so a request without a good token never wakes a GPU): Cloud Run's invoker check, one roles/run.invoker binding per tenant service account (tenants[].cloudRunInvokers), each client's Google ID token minted for the model's audience (the plan's tenant URLs show it); the guard maps the verified account to its tenant. jwt (tenants without Google service accounts): the tenant's own JWT (tenants[].jwt), verified by the guard against its issuer's keys, Cloud Run's invoker check off (a forged but well-formed token still starts an instance, billed until it idles out)."""

    JWT = 'jwt'
    IAM = 'iam'


class AuthorizedNetwork(TypedDict):
    """AuthorizedNetwork settings (see docs/reference/config.md)."""

    cidr: str
    """A source range allowed to reach the control plane."""
    display_name: NotRequired[str]
    """A label for the range. Default: authorized."""


class MaintenanceWindow(TypedDict):
    """A recurring window (RFC 5545 RRULE) in which GKE may upgrade the control plane and nodes."""

    start_time: str
    """e.g. 2026-01-03T02:00:00Z; the time of day and length repeat."""
    end_time: str
    """End of the first window (RFC 3339 UTC)."""
    recurrence: NotRequired[str]
    """How the window repeats (RFC 5545 RRULE). Default: FREQ=WEEKLY;BYDAY=SA,SU."""


class MaintenanceExclusion(TypedDict):
    """A period with no upgrades of the given scope (e.g. a launch week)."""

    name: str
    """The exclusion's name."""
    start_time: str
    """Start (RFC 3339 UTC)."""
    end_time: str
    """End (RFC 3339 UTC)."""
    scope: NotRequired[Scope]
    """Which upgrades are held back. One of: NO_UPGRADES, NO_MINOR_UPGRADES, NO_MINOR_OR_NODE_UPGRADES. Default: NO_MINOR_OR_NODE_UPGRADES."""


class MaintenanceSpec(TypedDict):
    """MaintenanceSpec settings (see docs/reference/config.md)."""

    window: NotRequired[MaintenanceWindow]
    """When GKE may upgrade; unset lets GKE choose."""
    exclusions: NotRequired[list[MaintenanceExclusion]]
    """Periods with no upgrades."""


class ClusterSpec(TypedDict):
    """ClusterSpec settings (see docs/reference/config.md)."""

    name: str
    """Cluster name; also the prefix of the VPC, subnets and service accounts."""
    zones: list[str]
    """Zones of the node pools, in gcp:region; the first also holds a zonal Filestore."""
    release_channel: NotRequired[ReleaseChannel]
    """GKE release channel (also picks the managed mesh revision). One of: RAPID, REGULAR, STABLE. Default: REGULAR."""
    system_machine_type: NotRequired[str]
    """Machine type of the CPU system pool. Default: e2-standard-4."""
    system_nodes: NotRequired[int]
    """Total system nodes across all zones (not per zone); the pool autoscales up to systemMaxNodes. Default: 1."""
    system_max_nodes: NotRequired[int]
    """Upper bound of the system pool's autoscaling (total)."""
    subnet_cidr: NotRequired[str]
    """Node subnet range. Default: 10.10.0.0/20."""
    pods_cidr: NotRequired[str]
    """Pod (secondary) range. Default: 10.20.0.0/14."""
    services_cidr: NotRequired[str]
    """Service (secondary) range. Default: 10.24.0.0/20."""
    master_cidr: NotRequired[str]
    """The control plane's private range: exactly a /28 (GKE's requirement). Default: 172.16.0.0/28."""
    proxy_only_cidr: NotRequired[str]
    """The proxy-only subnet regional load balancers' Envoys use (one per region and VPC). Default: 10.129.0.0/23."""
    private_nodes: NotRequired[bool]
    """Nodes without public IPs (egress through Cloud NAT). Default: true."""
    dataplane_v2: NotRequired[bool]
    """GKE Dataplane V2, which enforces the NetworkPolicies the platform declares for its pods outside the mesh (the endpoint picker). Fixed at creation: changing it replaces the cluster, so a cluster made without it (vllm-gke 0.2.0) keeps false, and the plan says what is then not enforced. Default: true."""
    deletion_protection: NotRequired[bool]
    """Protect the cluster and the weights share from deletion. Default: true."""
    manage_mesh_feature: NotRequired[bool]
    """Cloud Service Mesh (managed Istio) enforces the tenants' JWT and authorization policies. The fleet feature is one per project: set false where another stack already manages it. Default: true."""
    authorized_networks: NotRequired[list[AuthorizedNetwork]]
    """Who may reach the control plane's public endpoint; empty means anyone (with credentials)."""
    private_endpoint: NotRequired[bool]
    """Control plane reachable only from inside the VPC (Pulumi must then run from there). Default: false."""
    maintenance: NotRequired[MaintenanceSpec]
    """Maintenance window and exclusions."""
    min_master_version: NotRequired[str]
    """Lowest control-plane version GKE may run (1.X, 1.X.Y or 1.X.Y-gke.N; "1.X" picks the newest patch of 1.X, per the GKE API). Unset: the release channel's default. 1.34 or later for models with routing: inference-gateway."""


class UpgradeSpec(TypedDict):
    """How GKE replaces this pool's nodes. SURGE with maxSurge >= 1 creates the new node first, so
    a replica can move before its old node drains (it needs quota for one more node); BLUE_GREEN
    keeps the old nodes until the new ones soak."""

    strategy: NotRequired[Strategy]
    """Node upgrade strategy. One of: SURGE, BLUE_GREEN. Default: SURGE."""
    max_surge: NotRequired[int]
    """SURGE: extra nodes created during an upgrade. Default: 1."""
    max_unavailable: NotRequired[int]
    """SURGE: nodes that may be down at once. Default: 0."""
    soak_minutes: NotRequired[int]
    """BLUE_GREEN: how long the new nodes soak. Default: 30."""


class GpuSharingSpec(TypedDict):
    """GKE GPU time-sharing: each GPU is offered to up to maxSharedClientsPerGpu pods, which take
    turns on it. GKE isolates no memory between them: only models with sleepMode share it, one
    awake at a time."""

    strategy: NotRequired[GpusharingStrategy]
    """How pods share a GPU; GKE's TIME_SHARING (MPS is not offered here: its clients run at once). One of: TIME_SHARING. Default: TIME_SHARING."""
    max_shared_clients_per_gpu: NotRequired[int]
    """Pods (servers of the models that swap) one GPU holds at most. Default: 4."""


class NodePoolSpec(TypedDict):
    """A GPU or TPU node pool. Accelerator type and count come from the machine type. Node counts
    are totals across the cluster's zones (GKE's total_*_node_count), not per zone; a TPU pool
    lives in one zone (`tpuZone`)."""

    name: str
    """Node pool name, referenced by models[].nodePool."""
    machine_type: str
    """GPU or TPU machine type; the accelerator and its count follow from it."""
    gpu_partition_size: NotRequired[str]
    """MIG profile to split each GPU into (valid for that GPU)."""
    tpu_topology: NotRequired[str]
    """TPU pools: the slice topology (e.g. 2x4; default the machine type's single-host one). One larger than a host makes a multi-host slice: that many nodes form one slice, created and scaled as a whole (minNodes 0 or the slice's hosts, maxNodes the slice's hosts)."""
    tpu_zone: NotRequired[str]
    """TPU pools: the zone (one of cluster.zones) the slice is in; TPUs are zonal. Default the first."""
    spot: NotRequired[bool]
    """Spot VMs. Default: false."""
    on_demand_fallback: NotRequired[bool]
    """Spot pools get an on-demand twin (<name>-ondemand, min 0, maxNodes of its own) that a ComputeClass falls back to: with it the pool reaches up to twice maxNodes. Default: true."""
    min_nodes: NotRequired[int]
    """Fewest nodes (total across zones). Default: 0."""
    max_nodes: NotRequired[int]
    """Most nodes (total across zones); a spot pool's on-demand twin has as many again. Default: 1."""
    disk_size_gb: NotRequired[int]
    """Boot disk per node, GB. Default: 200."""
    upgrade: NotRequired[UpgradeSpec]
    """How GKE replaces the pool's nodes."""
    spot_return_migration: NotRequired[bool]
    """With a fallback pool: move pods back to spot when it returns. Off by default: it evicts warm replicas that then reload their weights, a visible outage on single-replica pools. Default: false."""
    gpu_sharing: NotRequired[GpuSharingSpec]
    """GKE GPU time-sharing: each GPU offered to several pods, which take turns (no memory isolation: only models with sleepMode run here, one awake per GPU)."""


class CustomShape(TypedDict):
    """CustomShape settings (see docs/reference/config.md)."""

    params_billion: float
    """Parameters, in billions."""
    layers: int
    """Transformer layers."""
    kv_heads: int
    """Key/value heads."""
    head_dim: int
    """Dimension of one attention head."""
    active_params_billion: NotRequired[float]
    """A mixture of experts: parameters one token passes through (default: all of them)."""
    attention_heads: NotRequired[int]
    """Query heads (tensorParallelSize must divide them; unset: not checked)."""
    hidden_size: NotRequired[int]
    """Width of the residual stream (unset: attentionHeads x headDim, or estimated from the parameters)."""
    max_context: NotRequired[int]
    """The longest context the model takes (its config.json's max_position_embeddings, scaled as vLLM scales it); maxModelLen may not exceed it (unset: not checked)."""
    sliding_window: NotRequired[int]
    """Tokens a sliding-window layer attends to (and caches); unset: every layer caches the whole context."""
    sliding_window_layers: NotRequired[int]
    """Layers that use slidingWindow (the rest attend to the whole context; default: all of them)."""
    bytes_per_weight: NotRequired[float]
    """Bytes each parameter takes in the checkpoint, averaged over its parts (a quantised one keeps its embeddings in 16 bits); default: dtype's (2 for bfloat16, 1 for fp8 and int8, 0.5 for awq and gptq)."""


class ServingPoolSpec(TypedDict):
    """One replica set of a model; each model has a short-request and a long-request pool."""

    min_replicas: NotRequired[int]
    """Fewest replicas (the autoscaler's floor); 0 scales the pool to zero when idle (KEDA), and a standby answers 503 with Retry-After until a replica is ready again. Default: 1."""
    max_replicas: NotRequired[int]
    """Most replicas (the autoscaler's ceiling). Default: 2."""
    max_num_seqs: NotRequired[int]
    """Sequences vLLM batches at once (--max-num-seqs). Default: 64."""
    max_num_batched_tokens: NotRequired[int]
    """Tokens per scheduler step (--max-num-batched-tokens)."""
    max_model_len: NotRequired[int]
    """Context window this pool accepts; defaults to the model's maxModelLen."""
    context_tokens: NotRequired[int]
    """Tokens (prompt + output) a typical request of this pool holds; the capacity check wants room for maxNumSeqs of them. Defaults to the pool's maxModelLen."""
    queue_depth_target: NotRequired[int]
    """HPA target: average vllm:num_requests_waiting per pod before scaling out. Default: 8."""
    max_rate_per_endpoint: NotRequired[int]
    """Load balancer target rate per replica, requests per second (GCPBackendPolicy maxRatePerEndpoint): a capacity the load balancer balances by, not a cap - it prefers replicas below it and, once every replica is at it, overfills them in proportion."""
    cooldown_seconds: NotRequired[int]
    """minReplicas 0: seconds without a request (none running, none waiting) before the last replica goes (KEDA's cooldownPeriod). Default: 900."""


class CanarySpec(TypedDict):
    """A new revision of a model, served side by side with the current one on a share of traffic.
    Roll forward by raising the weight, back by lowering it to 0 or removing the canary."""

    revision: str
    """The revision to try (a git branch, tag or commit of the model's source)."""
    weight: int
    """Percent of each route's traffic the canary gets, 0-100."""
    replicas: NotRequired[int]
    """Replicas of the canary in each of the model's pools. Default: 1."""


class AdapterSpec(TypedDict):
    """A LoRA adapter of a model, loaded onto the share beside it and served by the same replicas."""

    name: str
    """The name clients send as `model` to use it."""
    source: str
    """hf://org/repo or gs://bucket/prefix."""
    revision: NotRequired[str]
    """Git branch, tag or commit of the source. Default: main."""
    rank: NotRequired[int]
    """The adapter's LoRA rank (r); the model's --max-lora-rank is the largest of its adapters'. Default: 16."""
    disk_gb: NotRequired[float]
    """GiB the adapter's files take on disk (default: estimated from the rank and the model's shape). Sizes its Hyperdisk ML disk; raise it when the loader says so."""
    tenants: list[str]
    """Tenants allowed to call it; each must also be allowed the base model."""


class FallbackSpec(TypedDict):
    """Where a model's replicas send the requests of the tenants they shed for overload (negative
    tenants[].priority, while the queue is over monitoring.queueLatencySloSeconds) instead of
    answering 429: another, smaller model of the stack, for the shed tenants allowed to call it."""

    model: str
    """The model that serves them: another of the stack's models, without a fallback of its own. Only tenants whose models list it are sent; the others still get 429 with Retry-After."""


class PrefillPoolSpec(TypedDict):
    """The prefill pool: its own workload, node pool, scaling and disruption budget."""

    node_pool: NotRequired[str]
    """Node pool the prefill replicas run on (default: the model's nodePool)."""
    min_replicas: NotRequired[int]
    """Fewest prefill replicas; at least 1: a decode pod told to pull KV blocks from a prefill pod that does not exist fails the request. Default: 1."""
    max_replicas: NotRequired[int]
    """Most prefill replicas (the autoscaler's ceiling). Default: 2."""
    max_num_seqs: NotRequired[int]
    """Sequences a prefill replica batches at once (--max-num-seqs). Default: 16."""
    max_num_batched_tokens: NotRequired[int]
    """Tokens per prefill scheduler step (--max-num-batched-tokens; default vLLM's)."""


class DisaggregationLoad(TypedDict):
    """The traffic both pools are sized for (the plan's capacity and cost comparison)."""

    prompt_tokens_per_second: float
    """Prompt tokens per second across the model (what the prefill pool computes)."""
    output_tokens_per_second: float
    """Output tokens per second across the model (what the decode pool generates)."""


class DisaggregationSpec(TypedDict):
    """Prefill on one pool, decode on another: llm-d-router's P/D scheduling picks a decode pod and,
    for prompts long enough, a prefill pod; the decode pod's routing sidecar asks the prefill pod for
    the prompt's KV cache, which vLLM's NixlConnector then reads across (routing: inference-gateway)."""

    prefill: NotRequired[PrefillPoolSpec]
    """The prefill pool (the model's `short` pool is the decode pool)."""
    transport: NotRequired[Transport]
    """How NIXL (UCX) moves KV blocks between the pools. rdma: GPUDirect RDMA over the node pool's RDMA NICs (only machines vllm-gke sets that network up for); tcp: the data-centre network; auto: rdma where the prefill and decode node pools both have it, else tcp. One of: auto, rdma, tcp. Default: auto."""
    min_prompt_tokens: NotRequired[int]
    """Prompts with fewer uncached tokens than this (after the decode pod's prefix-cache hit) are prefilled on the decode pod itself (llm-d-router's prefix-based-pd-decider nonCachedTokens; 0 there turns P/D off, so at least 1). The picker counts its tokenizer's tokens: with its estimate backend (no real tokenizer), 4-byte pseudo-tokens (tokenizer/estimate.go:35-37). Default: 256."""
    load: NotRequired[DisaggregationLoad]
    """The traffic the two pools are sized for; unset, the plan sizes them from their replicas."""


class SleepModeSpec(TypedDict):
    """vLLM's sleep mode (--enable-sleep-mode) on a time-shared GPU: the tenant guard wakes its
    server when a request comes and the GPU's lease is free, and puts it back to sleep when another
    model on the same GPU wants it. Needs vllm-gke:globalLimits (the lease is in the limit store)."""

    level: NotRequired[Level]
    """1: the weights go to the node's RAM while asleep and come back over PCIe in seconds (every sleeping model's weights count against the node's memory). 2: the weights are dropped and reloaded from the weights share on wake (slower, no RAM held). One of: 1, 2. Default: 1."""
    wait_seconds: NotRequired[int]
    """Longest a request waits for its model to wake (the awake one to finish and sleep) before a 503 with Retry-After. Default: 60."""
    min_awake_seconds: NotRequired[int]
    """Once awake, the model keeps the GPU at least this long before it yields to another (fewer swaps under mixed traffic, at the others' wait). Default: 5."""


class KvOffloadSpec(TypedDict):
    """What the server passes vLLM as --kv-offloading-backend and --kv-offloading-size."""

    backend: NotRequired[str]
    """native (the only one served): vLLM's own CPU offloading (its OffloadingConnector) into pinned host memory inside the server container. lmcache is refused: vLLM 0.34 runs it as a client of a separate LMCache server that this platform does not deploy, and the server image adds no lmcache package. Default: native."""
    size_gb: NotRequired[float]
    """GiB of host memory one replica's offloaded KV cache takes, summed over its GPUs as vLLM counts it (--kv-offloading-size). Default: nine tenths of what each replica's pods may take on the node (its allocatable after the kernel's and GKE's reservations and GKE's own pods, shared among the replicas) beside the server's estimated own need; the plan refuses a size that does not fit."""


class DraftShape(TypedDict):
    """A draft's architecture, as its config.json gives it (an EAGLE head: its one or few layers)."""

    params_billion: float
    """Parameters, in billions (an EAGLE head's own: its layer(s), fusion and lm_head)."""
    layers: int
    """Transformer layers (num_hidden_layers)."""
    kv_heads: int
    """Key/value heads (num_key_value_heads)."""
    head_dim: int
    """Dimension of one attention head (head_dim, else hidden_size / num_attention_heads)."""
    attention_heads: NotRequired[int]
    """Query heads (num_attention_heads): the draft's tensor parallelism (the model's) must divide them, as vLLM checks (config/model.py:1577-1583). Required for draft_model."""
    vocab_size: NotRequired[int]
    """Its vocabulary (vocab_size): a draft_model's must be the model's (config/speculative.py:1723-1735). Required for draft_model."""


class DraftSpec(TypedDict):
    """The draft model or EAGLE head, copied onto the share beside the model by its own loader Job;
    the servers read it from there (never from the hub) once its ready marker is written."""

    source: str
    """hf://org/repo or gs://bucket/prefix."""
    revision: NotRequired[str]
    """Git branch, tag or commit of the source. Default: main."""
    shape: NotRequired[str]
    """The named form of `shape` (or give `custom_shape`). Its architecture: a catalog name (as models[].shape) or {paramsBillion, layers, kvHeads, headDim, attentionHeads, vocabSize}."""
    custom_shape: NotRequired[DraftShape]
    """The structured form of `shape` (give one of the two). Its architecture: a catalog name (as models[].shape) or {paramsBillion, layers, kvHeads, headDim, attentionHeads, vocabSize}."""
    bytes_per_weight: NotRequired[float]
    """Bytes each parameter takes in its checkpoint (vLLM loads a draft unquantised unless its checkpoint says otherwise: 2 for bfloat16). Default: 2.0."""
    disk_gb: NotRequired[float]
    """GiB its files take on disk (default: paramsBillion x bytesPerWeight)."""


class SpeculativeSpec(TypedDict):
    """Speculative decoding: each step proposes numSpeculativeTokens tokens and the model verifies
    them together, keeping the accepted prefix and one token of its own."""

    method: Method
    """What proposes the tokens: ngram (prompt lookup, no weights), draft_model (a smaller model of the same tokenizer), eagle or eagle3 (a head reading the model's hidden states), mtp (the model's own multi-token-prediction layers; DeepSeek-V3 and custom shapes whose checkpoint has them). One of: ngram, draft_model, eagle, eagle3, mtp."""
    num_speculative_tokens: NotRequired[int]
    """Tokens proposed per step (vLLM's num_speculative_tokens, k). Default: 3."""
    prompt_lookup_max: NotRequired[int]
    """ngram: the longest n-gram of the recent tokens looked up in the prompt (vLLM's prompt_lookup_max; unset: promptLookupMin, else 5, vLLM's default)."""
    prompt_lookup_min: NotRequired[int]
    """ngram: the shortest n-gram looked up (vLLM's prompt_lookup_min; unset: promptLookupMax, else 5)."""
    draft: NotRequired[DraftSpec]
    """draft_model, eagle, eagle3: the draft's weights and shape (required for them, refused otherwise)."""
    mean_acceptance_length: NotRequired[float]
    """Tokens each verification step yields a sequence, the bonus token included, as vLLM measures it on your traffic at this numSpeculativeTokens: 1 + rate(vllm:spec_decode_num_accepted_tokens_total) / rate(vllm:spec_decode_num_drafts_total) (its mean acceptance length, v1/spec_decode/metrics.py: 177-195); above 1, below numSpeculativeTokens + 1. The plan solves it for the per-token acceptance a of (1 - a^(k+1)) / (1 - a). Unset: the method's assumed a (ngram 0.3, draft_model 0.6, eagle 0.6, eagle3 0.7, mtp 0.8); the plan says which it used. For ngram vLLM counts only the steps where an n-gram matched (v1/core/sched/scheduler.py:3447): state the yield over every step instead, rate(vllm:generation_tokens_total) / (that rate - rate(vllm:spec_decode_num_accepted_tokens_total))."""


class ModelSpec(TypedDict):
    """ModelSpec settings (see docs/reference/config.md)."""

    name: str
    """Model name: the served model name and route /<name>/v1."""
    source: str
    """hf://org/repo or gs://bucket/prefix."""
    revision: NotRequired[str]
    """Git branch, tag or commit of the source. Default: main."""
    shape: NotRequired[str]
    """The named form of `shape` (or give `custom_shape`). Architecture from the catalog (llama-3-8b, llama-3-70b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-72b, mistral-7b, llama-3.1-405b, deepseek-v3). Unset in a stack: read from the model's config.json, which the stack program and `vllm-gke plan` fetch once and cache beside the stack file (model-configs/<org>--<repo>@<revision>.json: commit it with the stack); a Python program reads it with with_model_configs. Through the component package (TypeScript, Go, C#, Java, YAML): required, this or customShape."""
    custom_shape: NotRequired[CustomShape]
    """The structured form of `shape` (give one of the two). Architecture from the catalog (llama-3-8b, llama-3-70b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-72b, mistral-7b, llama-3.1-405b, deepseek-v3). Unset in a stack: read from the model's config.json, which the stack program and `vllm-gke plan` fetch once and cache beside the stack file (model-configs/<org>--<repo>@<revision>.json: commit it with the stack); a Python program reads it with with_model_configs. Through the component package (TypeScript, Go, C#, Java, YAML): required, this or customShape."""
    dtype: NotRequired[Dtype]
    """Weight dtype or quantisation. One of: bfloat16, float16, fp8, int8, awq, gptq. Default: bfloat16."""
    disk_gb: NotRequired[float]
    """GiB the files vLLM reads take on disk: the weights it opens plus config and tokenizer (default: paramsBillion x dtype bytes). Sizes the Hyperdisk ML disks and the Filestore share; a loader that finds more says which value to set."""
    kv_cache_dtype: NotRequired[KvCacheDtype]
    """KV-cache dtype. One of: auto, fp8. Default: auto."""
    tensor_parallel_size: NotRequired[int]
    """GPUs or TPU chips each pipeline stage of a replica shards its layers over (whole devices only). Default: 1."""
    pipeline_parallel_size: NotRequired[int]
    """Pipeline stages of a replica. Devices per replica = tensorParallelSize x pipelineParallelSize; more than one node holds spans several (a LeaderWorkerSet group, one pod per node). Default: 1."""
    multi_host: NotRequired[bool]
    """Let a replica span hosts: required when tensorParallelSize x pipelineParallelSize exceeds one node's GPUs, or the node pool is a multi-host TPU slice. Each replica then runs as a LeaderWorkerSet group whose hosts talk over the data-centre network (TCP at the machine's NIC bandwidth on GPUs: vllm-gke sets up no GPUDirect; a TPU slice's ICI), in one zone. Default: false."""
    max_model_len: NotRequired[int]
    """Longest context, in tokens. Default: 8192."""
    gpu_memory_utilization: NotRequired[float]
    """Share of each GPU or slice vLLM may use. Default: 0.9."""
    enable_chunked_prefill: NotRequired[bool]
    """Split long prefills across steps. Default: true."""
    enable_prefix_caching: NotRequired[bool]
    """Reuse KV cache across requests with a common prefix. Default: true."""
    node_pool: str
    """Node pool the replicas run on."""
    long_request_bytes: NotRequired[int]
    """Requests whose body is at least this many bytes go to the long pool. Default: 16384."""
    short: NotRequired[ServingPoolSpec]
    """The short-request pool."""
    long: NotRequired[ServingPoolSpec]
    """The long-request pool."""
    extra_args: NotRequired[list[str]]
    """More vLLM flags, checked against the release's parser; platform-managed flags (--model, --download-dir, --load-format, ...) and secrets are refused."""
    canary: NotRequired[CanarySpec]
    """A canary of another revision, weighted against this one."""
    adapters: NotRequired[list[AdapterSpec]]
    """LoRA adapters served by the model's replicas (--enable-lora), each for the tenants it names."""
    max_loras: NotRequired[int]
    """Adapters resident on the GPU at once (--max-loras; default: all of them, at most 8)."""
    routing: NotRequired[Routing]
    """length: a short and a long pool, chosen by request size. inference-gateway: one pool (the `short` settings) behind GKE Inference Gateway's endpoint picker, which picks the replica by queue depth, KV-cache use and prefix-cache affinity, with per-tenant priorities. One of: length, inference-gateway. Default: length."""
    fallback: NotRequired[FallbackSpec]
    """While a replica sheds tenants of negative priority, their requests go to this model instead of a 429 (for the tenants allowed to call it), and come back as the shed tiers do."""
    disaggregation: NotRequired[DisaggregationSpec]
    """Prefill/decode disaggregation: a prefill pool beside the decode pool (`short`), the KV cache moved between them by vLLM's NIXL connector (routing: inference-gateway)."""
    sleep_mode: NotRequired[SleepModeSpec]
    """Sleep mode on a time-shared GPU (its node pool's gpuSharing): the model sleeps while another on the same GPU serves, and wakes in seconds for its next request instead of a cold start."""
    kv_offload: NotRequired[KvOffloadSpec]
    """Offload KV blocks that leave the GPU to the node's host memory (vLLM's native CPU offloading), so prefixes seen before and preempted sequences load back instead of being recomputed; the server's memory request and limit grow by its size. It does not raise the batch that runs at once."""
    speculative: NotRequired[SpeculativeSpec]
    """Speculative decoding (vLLM's --speculative-config): n-gram prompt lookup, a draft model, an EAGLE/EAGLE-3 head or the model's own MTP heads propose tokens its replicas verify in one step. The plan counts the draft's memory and scales the decode rate by the acceptance rate."""


class JwtSpec(TypedDict):
    """JwtSpec settings (see docs/reference/config.md)."""

    issuer: str
    """The JWT issuer (iss) of the tenant's tokens, an https URL, exactly as the tokens carry it (a trailing '/', as Auth0's, included)."""
    jwks_uri: str
    """Where the issuer's signing keys are (https)."""
    audiences: list[str]
    """Required: without audiences the mesh accepts a token the issuer minted for any other service."""
    subjects: NotRequired[list[str]]
    """The token subjects (sub) that are this tenant; none: every subject of the issuer. Required on an issuer anyone can get tokens from (accounts.google.com: a service account's uniqueId)."""


class RateLimitSpec(TypedDict):
    """RateLimitSpec settings (see docs/reference/config.md)."""

    requests_per_minute: int
    """Requests admitted per tenant in any 60 seconds: per replica, or across all replicas with vllm-gke:globalLimits enabled (each replica's own count is then the fallback)."""
    tokens_per_minute: NotRequired[int]
    """Generated tokens per tenant in any 60 seconds, across all replicas (needs globalLimits, and at least the tenant's maxTokens): each request counts what it may make vLLM generate (its bound under maxTokens)."""


class DedicatedSpec(TypedDict):
    """Models a tenant gets its own replicas of, on its own (often MIG) node pool."""

    models: list[str]
    """Models the tenant gets its own replicas of."""
    node_pool: str
    """Node pool of those replicas."""


class TenantSpec(TypedDict):
    """TenantSpec settings (see docs/reference/config.md)."""

    name: str
    """Tenant name; its namespace is tenant-<name>."""
    jwt: JwtSpec
    """How the tenant's tokens are verified."""
    models: list[str]
    """Models the tenant may call."""
    rate_limit: RateLimitSpec
    """The tenant's request rate limit."""
    max_tokens: int
    """Most tokens one request may make vLLM generate (all sequences together)."""
    dedicated: NotRequired[DedicatedSpec]
    """Replicas of the tenant's own."""
    priority: NotRequired[int]
    """Priority of the tenant's requests (-100 to 100, default 0). In the in-server guard, a negative one is shed (429 with Retry-After) while a replica's queue time is over monitoring.queueLatencySloSeconds, the most negative tier first; 0 and above never are. On models with routing: inference-gateway it is also the tenant's InferenceObjective's (llm-d-router v0.10.0, picker.flowControl on): each distinct priority is a band of the picker's queue; while the pool is saturated the highest band is dispatched first (processor.go:402-414), the tenants of one band in turn (round robin over their fairness ids), first come first served within a tenant. A full band or a wait past picker.flowControl.queueTtlSeconds answers 429, 503 while the pool has no replica (requestcontrol/admission.go:240-285); negative bands have picker.flowControl's small sheddable bounds, so they are shed first. With flow control off, only negative ones are shed (429 while saturated) and positive ones change nothing. Default: 0."""
    cloud_run_invokers: NotRequired[list[str]]
    """Google service accounts (emails) that are this tenant on the Cloud Run models whose auth is iam (cloudRun.models[].auth): each gets roles/run.invoker on the services of those models it lists, Cloud Run verifies the account's Google ID token (asked for with its email claim), and the guard maps the verified account to this tenant. An account is one tenant's."""


class GatewaySpec(TypedDict):
    """GatewaySpec settings (see docs/reference/config.md)."""

    class_name: NotRequired[ClassName]
    """Internal by default: exposing models to the internet is a decision, with TLS required. One of: gke-l7-regional-external-managed, gke-l7-rilb, gke-l7-global-external-managed. Default: gke-l7-rilb."""
    hostname: NotRequired[str]
    """The DNS name clients use (required for a managed certificate)."""
    tls_secret_name: NotRequired[str]
    """TLS from an existing kubernetes.io/tls Secret in the serving namespace."""
    managed_certificate: NotRequired[bool]
    """...or a Google-managed Certificate Manager certificate for `hostname` (DNS authorization: create the CNAME record the stack exports as `dnsAuthorization`). Default: false."""
    static_ip: NotRequired[bool]
    """Reserve the load balancer's address, so DNS records survive a re-created Gateway. Default: true."""
    request_timeout_seconds: NotRequired[int]
    """Backend timeout; long generations stream for minutes. Default: 600."""


class SecretKeyRef(TypedDict):
    """SecretKeyRef settings (see docs/reference/config.md)."""

    name: str
    """Secret name."""
    key: NotRequired[str]
    """Key in the Secret's data. Default: token."""


class ImageRef(TypedDict):
    """ImageRef settings (see docs/reference/config.md)."""

    repository: str
    """Image repository, without tag or digest (e.g. us-central1-docker.pkg.dev/proj/repo/vllm-server)."""
    tag: NotRequired[str]
    """Image tag: a release, never latest (tag or digest is required)."""
    digest: NotRequired[str]
    """Image digest, sha256:<64 hex>; pins the image exactly."""


class WeightsSpec(TypedDict):
    """WeightsSpec settings (see docs/reference/config.md)."""

    backend: NotRequired[Backend]
    """Where the one copy of the weights lives: a Filestore share (NFS, ReadOnlyMany), or a Cloud Storage bucket mounted by GKE's Cloud Storage FUSE CSI driver with a file cache and parallel downloads (regional, no capacity to size; each node caches what it reads), or Hyperdisk ML disks (ReadOnlyMany, one per weight set and zone) that GKE Volume Populator fills from that bucket once the loaders have written it. One of: filestore, gcs, hyperdisk-ml. Default: filestore."""
    bucket: NotRequired[str]
    """gcs, hyperdisk-ml: the bucket (default <project>-<cluster>-weights); created by the stack."""
    hyperdisk_throughput_mib_s: NotRequired[int]
    """hyperdisk-ml: each disk's provisioned throughput, MiB/s (Hyperdisk ML takes 400 to 1,200,000; GKE's Volume Populator guide uses 2,400). Readers of one disk share it. Default: 2400."""
    populator_machine_type: NotRequired[str]
    """hyperdisk-ml: the machine type of the transfer nodes Volume Populator's Jobs run on (a node pool that scales from zero; C3 or C3D, which attach Hyperdisk ML, with at least 8 vCPUs). Default: c3-standard-44."""
    cold_start_budget_seconds: NotRequired[int]
    """Warn when a pool's estimated time from node ready to serving exceeds this. Default: 900."""
    read_throughput_mib_s: NotRequired[float]
    """The weights store's read throughput, MiB/s, as measured (overrides the documented figure)."""
    tier: NotRequired[Tier]
    """The Filestore tier, fixed for the share's life (a change re-creates it). REGIONAL replicates across the region's zones: the share survives a zone outage, which a zonal tier serving a multi-zone cluster does not. BASIC_HDD reads at 100 MiB/s whatever its size. One of: BASIC_HDD, BASIC_SSD, ZONAL, REGIONAL. Default: ZONAL."""
    capacity_gb: NotRequired[int]
    """Filestore capacity, GiB; default: the tier's minimum or what the weights need: every copy, plus the largest again (a new revision or source loads beside the current copy), plus 30%. Below that the config is refused. On BASIC tiers the share's size, which only grows, so it is never derived; on ZONAL and REGIONAL a floor over what the models need, and crossing 9.75 TiB brings up a new share, since the two size ranges do not convert in place."""
    secret_manager_secret: NotRequired[str]
    """Secret Manager secret holding the Hugging Face token; the loader mounts it through the GKE Secret Manager CSI add-on, so the token never enters Pulumi state or a manifest. Default: hf-token."""
    hf_token_kubernetes_secret: NotRequired[SecretKeyRef]
    """Or: an existing Kubernetes Secret in the loader namespace, vllm-gke-system (e.g. synced from Secret Manager by External Secrets); the loader then reads HF_TOKEN through a secretKeyRef."""
    gcs_loader_image: NotRequired[ImageRef]
    """hf:// sources load with the server image (it ships the HF CLI); gs:// ones need gcloud."""


class SloSpec(TypedDict):
    """SloSpec settings (see docs/reference/config.md)."""

    enabled: NotRequired[bool]
    """Objectives as code: a Cloud Monitoring service per model and per tenant, its SLOs over a rolling window, and the SRE workbook's multi-window, multi-burn-rate alerts on each. Default: true."""
    availability: NotRequired[float]
    """Share of requests answered without a server error, an overload refusal or a lost replica (the guard's count per tenant and model; a tenant's own 4xx are not the service's failures). Default: 0.995."""
    ttft: NotRequired[float]
    """Share of requests whose first token comes within monitoring.ttftSloSeconds (vLLM's histogram, per model). Default: 0.95."""
    window_days: NotRequired[int]
    """The window the objectives hold over; Cloud Monitoring's rolling periods run 1 to 30 days. Default: 28."""


class TraceSpec(TypedDict):
    """TraceSpec settings (see docs/reference/config.md)."""

    enabled: NotRequired[bool]
    """vLLM's OpenTelemetry spans, each under a span of the guard's with the tenant, route, model, outcome and tokens, through an in-cluster collector to Cloud Trace. Default: false."""
    sample_ratio: NotRequired[float]
    """Share of tenant requests traced: the guard's root span is sampled at this ratio and vLLM's span follows it (a client's own trace context is dropped, so it cannot raise the rate). Default: 0.01."""
    image: NotRequired[ImageRef]
    """The collector image (otel/opentelemetry-collector-contrib, with the googlecloud exporter)."""


class MonitoringSpec(TypedDict):
    """MonitoringSpec settings (see docs/reference/config.md)."""

    notification_emails: NotRequired[list[str]]
    """Who alert policies notify."""
    queue_latency_slo_seconds: NotRequired[float]
    """p95 queue time that pages. Default: 2.0."""
    ttft_slo_seconds: NotRequired[float]
    """p95 time to first token that warns. Default: 3.0."""
    kv_cache_alert_ratio: NotRequired[float]
    """KV-cache usage that warns. Default: 0.95."""
    slos: NotRequired[SloSpec]
    """Service level objectives and their burn-rate alerts."""
    traces: NotRequired[TraceSpec]
    """Request traces to Cloud Trace (off unless enabled)."""


class CostSpec(TypedDict):
    """CostSpec settings (see docs/reference/config.md)."""

    tokens_per_second_per_gpu: NotRequired[float]
    """Measured output tokens a second of one GPU (or TPU chip) for your models; unset, each pool's tokens/s is estimated by the roofline from its accelerator and model (components/model/throughput.py)."""
    target_utilization: NotRequired[float]
    """Expected share of capacity in use. Default: 0.6."""
    hours_per_month: NotRequired[float]
    """Hours a month the report prices. Default: 730.0."""


class BudgetSpec(TypedDict):
    """BudgetSpec settings (see docs/reference/config.md)."""

    billing_account: str
    """A Cloud Billing budget on the stack's project, alerting the monitoring channels. The Cloud Billing account the project bills to (XXXXXX-XXXXXX-XXXXXX)."""
    monthly_amount: int
    """The month's amount, in the billing account's currency."""
    currency: NotRequired[str]
    """The billing account's currency (ISO 4217); a budget in another currency is refused by the API. Default: USD."""
    thresholds: NotRequired[list[float]]
    """Shares of the amount whose crossing notifies, on actual spend (and 1.0 on the forecast too)."""


class GlobalLimitsSpec(TypedDict):
    """One shared store of the tenants' sliding windows, so limits hold across replicas."""

    enabled: NotRequired[bool]
    """Count requests and tokens per tenant across all replicas (an in-cluster Redis, reached over the mesh's mTLS: only the vLLM pods' identities may connect; no password exists). Default: false."""
    image: NotRequired[ImageRef]
    """The store's image."""


class TokenLengths(TypedDict):
    """TokenLengths settings (see docs/reference/config.md)."""

    distribution: NotRequired[Distribution]
    """A length distribution in tokens: lognormal gives the long tail real prompts have. One of: lognormal, normal, uniform, fixed. Default: lognormal."""
    mean: int
    """Mean."""
    std_dev: NotRequired[int]
    """Std dev. Default: 0."""
    min: NotRequired[int]
    """Min. Default: 1."""
    max: int
    """Max."""


class LoadStage(TypedDict):
    """LoadStage settings (see docs/reference/config.md)."""

    rate: float
    """Requests a second, arriving as a Poisson process (so bursts happen as they do in traffic)."""
    duration_seconds: int
    """How long the stage lasts; it sends rate x seconds requests."""


class SharedPrefixLoad(TypedDict):
    """SharedPrefixLoad settings (see docs/reference/config.md)."""

    groups: NotRequired[int]
    """A second phase of requests whose prompts share long prefixes in groups, as agents and RAG send them: it measures the prefix cache's effect (only meaningful with models[].enablePrefixCaching). Default: 8."""
    prompts_per_group: NotRequired[int]
    """Prompts per group. Default: 16."""
    prefix_tokens: NotRequired[int]
    """Prefix tokens. Default: 2048."""
    question_tokens: NotRequired[int]
    """Question tokens. Default: 128."""
    output_tokens: NotRequired[int]
    """Output tokens. Default: 128."""
    concurrency: NotRequired[int]
    """Requests in flight at once. Default: 16."""


class LoadTestSpec(TypedDict):
    """An on-demand load test of one tenant's route: a suspended CronJob that
    `kubectl create job --from=cronjob/loadtest-<name>` runs (see docs/guides/operating-by-slo.md)."""

    name: str
    """Name."""
    tenant: str
    """Whose route and credentials: the tenant's URL /<tenant>/<model>/v1, with a token of its issuer."""
    model: str
    """Model."""
    token_secret: NotRequired[str]
    """The Kubernetes Secret (key `token`) holding a bearer JWT of the tenant's issuer, in the namespace the test runs in (the model's serving namespace, or the tenant's for dedicated replicas). Created out of band: a token never goes through Pulumi's state. Default loadtest-<name>-token: one per test, so two tenants' tests in one namespace never share a token."""
    prompt_tokens: NotRequired[TokenLengths]
    """The mixed workload: prompt and output lengths (completions, streamed) over the stages."""
    output_tokens: NotRequired[TokenLengths]
    """Output tokens."""
    stages: NotRequired[list[LoadStage]]
    """Steady, a burst, steady again."""
    shared_prefix: NotRequired[SharedPrefixLoad]
    """Shared prefix."""
    lora_mix: NotRequired[bool]
    """Spread requests over the model's adapters the tenant may use (equal shares with the base model), where it has any. Default: true."""
    max_failure_ratio: NotRequired[float]
    """The share of failed requests over which the Job fails (default: what monitoring.slos.availability allows, 1 - availability)."""
    image: NotRequired[ImageRef]
    """Image."""


class RolloutGates(TypedDict):
    """What a canary must meet at each step, against the primary over the same window (Flagger's
    analysis: components/model/rollouts.py). A gate looser than the SLO it guards is flagged by the
    policy pack (policies/rollouts.py)."""

    ttft_ratio: NotRequired[float]
    """The canary's P99 time to first token, and at the TTFT SLO's percentile, at most this many times the primary's (tighter than 1.5 fails healthy canaries on the histogram's coarse buckets: docs/guides/rollouts.md). Default: 1.5."""
    itl_ratio: NotRequired[float]
    """The canary's P99 inter-token latency at most this many times the primary's. Default: 1.5."""
    error_share: NotRequired[float]
    """The canary's share of server errors (the guard's `error` outcome: a 5xx or no answer) above the primary's, at most (default: the availability SLO's error budget, 1 - monitoring.slos.availability)."""
    refused_share: NotRequired[float]
    """The canary's share of refused requests (a 4xx: an adapter it lost, a shorter context) above the primary's, at most. Default: 0.02."""
    ttft_seconds: NotRequired[float]
    """The canary's time to first token at the TTFT SLO's percentile, at most (default: monitoring.ttftSloSeconds): the SLO itself, whatever the primary does."""


class RolloutSpec(TypedDict):
    """Progressive delivery with Flagger: every change to a serving pool (vLLM release or image, model
    revision, flags, adapters) rolls out as a canary whose share of the pool's route grows by steps,
    each held only while the gates hold, and rolls back at once when they fail."""

    enabled: NotRequired[bool]
    """Flagger (installed by the stack) rolls out the pools that can run a canary (see docs/guides/rollouts.md for what the others do); off, a change rolls in place. Default: false."""
    step_weight: NotRequired[int]
    """Percent of the pool's traffic the canary gains each step. Default: 10."""
    max_weight: NotRequired[int]
    """The canary's share at which it is promoted. Default: 50."""
    interval_seconds: NotRequired[int]
    """Seconds between steps (Flagger's analysis interval); each gate reads twice this, at least 5 minutes. Default: 60."""
    failed_checks: NotRequired[int]
    """Failed checks (a gate broken, or no traffic to judge) before the rollback. Default: 2."""
    gates: NotRequired[RolloutGates]
    """What the canary must meet at each step, against the primary over the same window."""
    load_tests: NotRequired[list[str]]
    """The loadTests entries the canaries' pre-rollout and load webhooks start, so the analysis has traffic to judge at any hour: each for the canaries of the pools its tenant's route reaches (its model's shared pools, or the tenant's dedicated copy). Unset: every load test of the stack."""


class PickerScorers(TypedDict):
    """The weights of the scheduling profile's scorers: each replica's score is the weighted sum,
    the highest wins. 0 leaves a scorer out."""

    queue: NotRequired[int]
    """Fewest requests waiting in the replica's vLLM queue (vllm:num_requests_waiting). Default: 2."""
    kv_cache_utilization: NotRequired[int]
    """Most free KV cache (1 - vllm:kv_cache_usage_perc). Default: 2."""
    prefix_cache: NotRequired[int]
    """Longest prompt prefix the replica likely holds in its prefix cache (the picker's own approximate index of what it sent where; tenants' cache_salt keeps their blocks apart). Default: 3."""


class PickerSaturation(TypedDict):
    """When the pool counts as saturated (the picker's utilization-detector): the mean over replicas
    of max(waiting / queueDepthThreshold, KV-cache use / kvCacheUtilThreshold) reaching 1. While it
    is, flow control holds requests in their bands (without flow control, negative priorities are
    shed with 429)."""

    queue_depth_threshold: NotRequired[int]
    """Requests waiting in a replica's vLLM queue that count as full. Default: 5."""
    kv_cache_util_threshold: NotRequired[float]
    """Share of a replica's KV cache in use that counts as full. Default: 0.8."""
    metrics_staleness_ms: NotRequired[int]
    """Age after which a replica's scraped metrics count as stale, milliseconds: a stale replica counts as full (so a picker cut off from the replicas queues rather than overloads them). Default: 200."""


class PickerFlowControl(TypedDict):
    """Flow control: while the pool is saturated the picker queues requests in priority bands (one
    per tenant priority), dispatching the highest band first and, within a band, the tenants in turn
    (round robin over fairness ids, first come first served within a tenant); bounded queues and a
    time-to-live shed what cannot wait."""

    enabled: NotRequired[bool]
    """Queue by priority (the picker's flowControl feature gate). Off: nothing waits in the picker, positive priorities change nothing and negative ones are shed (429) while saturated. Default: true."""
    queue_ttl_seconds: NotRequired[int]
    """Longest a request waits in the picker's queue, seconds; then 429 (503 while the pool has no replica). Must stay below gateway.requestTimeoutSeconds: the load balancer's backend timeout counts the wait too, and past it the client gets the load balancer's error instead. Default: 60."""
    band_max_requests: NotRequired[int]
    """Requests one band (priority >= 0) may hold queued and in flight; beyond it, 429. Default: 1000."""
    band_max_bytes_mib: NotRequired[int]
    """Bytes of request bodies one band (priority >= 0) may hold, MiB. Default: 512."""
    sheddable_max_requests: NotRequired[int]
    """The same bounds for each negative-priority band: small, so sheddable tenants are shed first. Default: 50."""
    sheddable_max_bytes_mib: NotRequired[int]
    """Sheddable max bytes mib. Default: 64."""
    max_requests: NotRequired[int]
    """Bounds across all bands: the queued bodies live in the picker's memory (a 4 GiB limit). Default: 2000."""
    max_bytes_mib: NotRequired[int]
    """Max bytes mib. Default: 1024."""


class PickerSpec(TypedDict):
    """The endpoint picker of every model with routing: inference-gateway."""

    failure_mode: NotRequired[FailureMode]
    """What the load balancer does while no picker answers. FailClose (the default): the request fails (500) - no tenant's priority, queue or shedding is bypassed. FailOpen: the load balancer sends it to a replica of its own choosing, with no priorities, no queueing, no prefix or load awareness, for as long as the picker is down (a leader's crash: up to 15 s; its rollout or drain: until the new leader is ready, see the routing guide). One of: FailClose, FailOpen. Default: FailClose."""
    prefix_cache: NotRequired[PrefixCache]
    """How the prefix-cache scorer knows what a replica holds. approximate: the picker's own record of what it sent where. precise: vLLM's KV-cache events (ZMQ, readable by the picker's pods alone) and a tokenizer, <model>-render (two pods of 1 CPU, 2 GiB on the system pool, apart from the picker), reading the model's shared weights; CUDA pools only (components/model/picker_prefix.py). One of: approximate, precise. Default: approximate."""
    scorers: NotRequired[PickerScorers]
    """The scorers' weights."""
    saturation: NotRequired[PickerSaturation]
    """When the pool counts as saturated."""
    flow_control: NotRequired[PickerFlowControl]
    """Priority bands, fairness and bounded queues while saturated."""


class CloudRunModelSpec(TypedDict):
    """One model on Cloud Run: a service of the project's server image (vLLM with the tenant guard)
    on one GPU an instance, its weights read from the stack's bucket through a Cloud Storage volume."""

    name: str
    """Model name: the served model name and route /<name>/v1 (unique across models and cloudRun.models)."""
    source: str
    """hf://org/repo or gs://bucket/prefix (the loader copies it into the stack's bucket once)."""
    revision: NotRequired[str]
    """Git branch, tag or commit of the source. Default: main."""
    shape: NotRequired[str]
    """The named form of `shape` (or give `custom_shape`). Architecture from the catalog, or customShape; unset: read from the model's config.json as for models[]."""
    custom_shape: NotRequired[CustomShape]
    """The structured form of `shape` (give one of the two). Architecture from the catalog, or customShape; unset: read from the model's config.json as for models[]."""
    dtype: NotRequired[Dtype]
    """Weight dtype or quantisation. One of: bfloat16, float16, fp8, int8, awq, gptq. Default: bfloat16."""
    disk_gb: NotRequired[float]
    """GiB the files vLLM reads take on disk (default: paramsBillion x dtype bytes)."""
    kv_cache_dtype: NotRequired[KvCacheDtype]
    """KV-cache dtype. One of: auto, fp8. Default: auto."""
    max_model_len: NotRequired[int]
    """Longest context, in tokens. Default: 8192."""
    gpu_memory_utilization: NotRequired[float]
    """Share of the GPU vLLM may use. Default: 0.9."""
    enable_prefix_caching: NotRequired[bool]
    """Reuse KV cache across requests with a common prefix. Default: true."""
    max_num_seqs: NotRequired[int]
    """Sequences one instance's vLLM batches at once (--max-num-seqs); the instance's request concurrency is sized from it and the capacity model unless `concurrency` is set. Default: 32."""
    extra_args: NotRequired[list[str]]
    """More vLLM flags, checked against the release's parser as for models[].extraArgs."""
    gpu: NotRequired[Gpu]
    """The GPU each instance gets (one an instance): Cloud Run offers NVIDIA L4 (24 GB) and RTX PRO 6000 Blackwell (96 GB) in some regions only; the plan checks the region. One of: nvidia-l4, nvidia-rtx-pro-6000. Default: nvidia-l4."""
    region: NotRequired[str]
    """Region of the service (default: the stack's region). A regional gateway class needs the stack's own region: its serverless NEG must be in the load balancer's region."""
    min_instances: NotRequired[int]
    """Instances kept warm: 0 scales to zero between bursts (each burst's first request waits for a cold start, which the plan estimates); 1 or more are billed all the time. Default: 0."""
    max_instances: NotRequired[int]
    """Most instances at once (each is one GPU against the project's Cloud Run GPU quota). Default: 3."""
    concurrency: NotRequired[int]
    """Requests one instance takes at once (default: from the capacity model); more queue at Cloud Run or start another instance."""
    gpu_zonal_redundancy: NotRequired[bool]
    """Cloud Run's GPU zonal redundancy: capacity reserved in another zone for a zone's outage, at a higher GPU price (the plan shows both). Off: cheaper, and a zone's outage waits for capacity. Default: false."""
    cpu: NotRequired[int]
    """vCPUs and GiB of memory of the server container (vLLM and the guard). Each instance also runs the metrics sidecar (1 vCPU, 0.5 GiB), billed too: an L4 instance holds at most 8 vCPUs and 32 GiB in all, so the server takes at most 6 and 24 there (4 or 6 vCPUs, at most 4 GiB a vCPU). Cloud Run's least with the GPU: 4 vCPUs and 16 GiB with an L4, 20 and 80 with an RTX PRO 6000; the plan checks them. Default: 6."""
    memory_gib: NotRequired[int]
    """Memory gib. Default: 24."""
    auth: NotRequired[Auth]
    """How a tenant's identity is verified before the guard sees a request; either way the service takes traffic from the stack's load balancer alone. iam (the default: Cloud Run verifies the caller before any instance starts, so a request without a good token never wakes a GPU): Cloud Run's invoker check, one roles/run.invoker binding per tenant service account (tenants[].cloudRunInvokers), each client's Google ID token minted for the model's audience (the plan's tenant URLs show it); the guard maps the verified account to its tenant. jwt (tenants without Google service accounts): the tenant's own JWT (tenants[].jwt), verified by the guard against its issuer's keys, Cloud Run's invoker check off (a forged but well-formed token still starts an instance, billed until it idles out). One of: jwt, iam. Default: iam."""


class CloudRunSpec(TypedDict):
    """Models on Cloud Run GPUs, and what they share: the load balancer in front of them, the VPC
    subnet their instances reach the limit store through."""

    models: list[CloudRunModelSpec]
    """The models served on Cloud Run."""
    hostname: NotRequired[str]
    """The DNS name of the load balancer in front of the Cloud Run models (GKE's Gateway takes no serverless backend, so they have a load balancer of the gateway's class beside it, with the same URL scheme: /<model>/v1 and /<tenant>/<model>/v1). Required with an external gateway class (its certificate is issued for it)."""
    egress_subnet_cidr: NotRequired[str]
    """The subnet Cloud Run's Direct VPC egress gives instances their addresses from (in the cluster's VPC and region): the limit store admits it alone. Must not overlap the cluster's ranges. Default: 10.30.0.0/24."""


class StackConfig(TypedDict):
    """A whole platform's settings: what one stack's config holds (see docs/reference/config.md)."""

    project: str
    """The Google Cloud project everything is created in (stack config: gcp:project)."""
    region: str
    """The region of the cluster, its subnets, gateway and bucket (stack config: gcp:region)."""
    environment: Environment
    """A label on every resource; behaviour comes from the other settings, never from this. One of: dev, staging, prod."""
    cluster: ClusterSpec
    """The GKE cluster: name, zones, ranges, release channel, private nodes, maintenance."""
    node_pools: list[NodePoolSpec]
    """The GPU node pools (machine type, MIG partition, spot, sizes) the models run on."""
    models: list[ModelSpec]
    """The models served: source, shape, dtype, pools, routing, adapters, canary."""
    tenants: NotRequired[list[TenantSpec]]
    """The tenants: JWT issuer, the models each may call, rate limits and token caps."""
    server_image: ImageRef
    """The vLLM server image built from images/: a tag of the chosen vLLM release (v<version> or v<version>-<suffix>, never latest), or a digest (sha256:...)."""
    vllm_version: NotRequired[str]
    """The vLLM release the server image is built on (see components/model/vllm_versions.py). Default: 0.34.0."""
    tpu_server_image: NotRequired[ImageRef]
    """Models on TPU node pools: the server image built from images/ on the vLLM TPU release (VLLM_IMAGE=vllm/vllm-tpu; a tag v<version> or v<version>-<suffix>, or a digest)."""
    tpu_vllm_version: NotRequired[str]
    """The vLLM TPU release (vllm-tpu on PyPI, image vllm/vllm-tpu) that image is built on. Default: 0.32.0."""
    serving_namespace: NotRequired[str]
    """The namespace of the shared model pools. Default: vllm."""
    gateway: NotRequired[GatewaySpec]
    """The load balancer: Gateway class, hostname, TLS, request timeout."""
    weights: NotRequired[WeightsSpec]
    """Where the one copy of the weights lives (Filestore, a bucket, Hyperdisk ML) and the HF token."""
    monitoring: NotRequired[MonitoringSpec]
    """Alert e-mails and SLO thresholds."""
    cost: NotRequired[CostSpec]
    """Throughput and utilisation assumptions of the cost report."""
    budget: NotRequired[BudgetSpec]
    """A Cloud Billing budget on the project (none without it); the plan warns when the baseline exceeds it."""
    global_limits: NotRequired[GlobalLimitsSpec]
    """Per-tenant limits across all replicas (a shared store) instead of per replica."""
    load_tests: NotRequired[list[LoadTestSpec]]
    """On-demand load tests of tenants' routes (suspended CronJobs running inference-perf)."""
    rollouts: NotRequired[RolloutSpec]
    """Progressive delivery: Flagger canaries gated by the SLOs (off: a change rolls in place)."""
    picker: NotRequired[PickerSpec]
    """The endpoint picker of models with routing: inference-gateway: failure mode, scorers, saturation, flow control."""
    cloud_run: NotRequired[CloudRunSpec]
    """Models on Cloud Run GPUs beside the cluster: scale to zero, per-second billing, the same tenants, guard and URL scheme (docs/guides/cloud-run.md)."""
