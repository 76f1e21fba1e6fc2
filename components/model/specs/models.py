"""Models and their serving pools: shape, dtype, pools, canaries, LoRA adapters, the vLLM
flags the platform sets itself."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal, Optional

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ..catalog import (
    KV_CACHE_BYTES,
    MODEL_SHAPES,
    WEIGHT_BYTES,
    ModelShape,
)
from .base import (
    TOKEN_LIKE,
    Name,
    Revision,
    Spec,
    WeightsSource,
    config_mapping,
    max_replicas_over_min,
    weights_source,
)
from .disaggregation import DisaggregationSpec
from .kv_offload import KvOffloadSpec
from .sleep_mode import SleepModeSpec
from .speculative import SpeculativeSpec

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
    "pipeline_parallel_size": "set models[].pipelineParallelSize",
    # A replica across hosts is a LeaderWorkerSet group the platform wires (components/multi_host.py).
    "nnodes": "set models[].pipelineParallelSize/tensorParallelSize: the hosts follow from the node pool",
    "node_rank": "the platform sets each host's rank in a multi-host group",
    "master_addr": "the platform points a group's hosts at its leader",
    "master_port": "the platform points a group's hosts at its leader",
    "headless": "the platform runs a group's workers headless",
    "distributed_executor_backend": "the platform picks the executor for one host or several",
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
    # The guard reads the engine's queue (overload) and each request's usage in its own process.
    "api_server_count": "one API server per pod: the guard reads the engine's queue and usage in its process",
    "data_parallel_size": "one engine per pod (scale with replicas): with several, vLLM starts several API "
                          "servers and the guard in each sees part of the queue",
    "disable_log_stats": "the guard's overload check reads vLLM's stats, and vLLM's traces need them "
                         "(v1/engine/output_processor.py:951 asserts them)",
    "otlp_traces_endpoint": "set monitoring.traces",
    # The TTFT SLO cuts vLLM's histogram at monitoring.ttftSloSeconds, a bound the servers add.
    "custom_histogram_buckets": "set monitoring.ttftSloSeconds: the servers add it to their TTFT buckets, "
                                "where the TTFT SLO cuts the histogram",
    "kv_offloading_size": "set models[].kvOffload: the plan sizes it against the node's memory",
    "kv_offloading_backend": "set models[].kvOffload",
    # The draft is the share's copy, loaded and waited for like the model (components/model/speculative.py).
    "speculative_config": "set models[].speculative", "spec_method": "set models[].speculative.method",
    "spec_model": "set models[].speculative.draft", "spec_tokens": "set models[].speculative.numSpeculativeTokens",
}
_MANAGED_LONG_FLAGS = {f"--{d.replace('_', '-')}": d for d in MANAGED_VLLM_OPTIONS}
_MANAGED_LONG_FLAGS.update({f"--no-{k[2:]}": d for k, d in list(_MANAGED_LONG_FLAGS.items())})
_MANAGED_LONG_FLAGS.update({"--disable-prefix-caching": "enable_prefix_caching",
                            "--disable-chunked-prefill": "enable_chunked_prefill", "--disable-lora": "enable_lora"})
# vLLM's short aliases of managed options (-sc: --speculative-config, engine/arg_utils.py:1897).
_MANAGED_SHORT_FLAGS = {"-sc": "speculative_config"}


def normalise_flag(arg: str) -> str:
    """An option as vLLM's FlexibleArgumentParser reads it: '--max_model_len=8' -> '--max-model-len'."""
    if not arg.startswith("--"):
        return arg
    return "--" + arg[2:].split("=", 1)[0].replace("_", "-")


def extra_arg_problem(arg: str) -> Optional[str]:
    """Why an extraArgs entry is refused, before any vLLM snapshot is consulted; None if not."""
    flag = normalise_flag(arg) if arg.startswith("--") else arg.split("=", 1)[0]
    dest = _MANAGED_LONG_FLAGS.get(flag) or _MANAGED_SHORT_FLAGS.get(flag)
    if dest is not None:
        return f"extraArgs may not set {flag}: {MANAGED_VLLM_OPTIONS[dest]}"
    # vLLM's parser takes an unambiguous prefix for a long option (--speculative-conf); no option of vLLM
    # 0.34 is a prefix of a managed one (tests/test_speculative.py checks the snapshot), so this is one.
    full = next((f for f in _MANAGED_LONG_FLAGS if len(flag) > 2 and f.startswith(flag)), None)
    if flag.startswith("--") and full is not None:
        return f"extraArgs may not set {flag}, which vLLM reads as {full}: {MANAGED_VLLM_OPTIONS[_MANAGED_LONG_FLAGS[full]]}"
    if TOKEN_LIKE.match(arg.split("=", 1)[-1]):
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
    # A mixture of experts: parameters one token passes through (default: all of them).
    active_params_billion: Optional[float] = Field(default=None, gt=0)
    # Query heads (tensorParallelSize must divide them; unset: not checked).
    attention_heads: Optional[int] = Field(default=None, gt=0)
    # Width of the residual stream (unset: attentionHeads x headDim, or estimated from the parameters).
    hidden_size: Optional[int] = Field(default=None, gt=0)
    # The longest context the model takes (its config.json's max_position_embeddings, scaled as vLLM
    # scales it); maxModelLen may not exceed it (unset: not checked).
    max_context: Optional[int] = Field(default=None, gt=0)
    # Tokens a sliding-window layer attends to (and caches); unset: every layer caches the whole context.
    sliding_window: Optional[int] = Field(default=None, gt=0)
    # Layers that use slidingWindow (the rest attend to the whole context; default: all of them).
    sliding_window_layers: Optional[int] = Field(default=None, ge=0)
    # Bytes each parameter takes in the checkpoint, averaged over its parts (a quantised one keeps its
    # embeddings in 16 bits); default: dtype's (2 for bfloat16, 1 for fp8 and int8, 0.5 for awq and gptq).
    bytes_per_weight: Optional[float] = Field(default=None, gt=0, le=4)

    @model_validator(mode="after")
    def _sliding_layers(self) -> "CustomShape":
        if self.sliding_window_layers is not None and self.sliding_window is None:
            raise ValueError("slidingWindowLayers needs slidingWindow")
        if (self.sliding_window_layers or 0) > self.layers:
            raise ValueError(f"slidingWindowLayers ({self.sliding_window_layers}) is more than layers ({self.layers})")
        return self

    def sliding_share(self, context: int) -> float:
        """The share of the KV cache a sequence of `context` tokens keeps, against every layer
        caching all of it: sliding layers keep at most the window."""
        if self.sliding_window is None:
            return 1.0
        sliding = self.layers if self.sliding_window_layers is None else self.sliding_window_layers
        kept = min(1.0, self.sliding_window / context)
        return (self.layers - sliding + sliding * kept) / self.layers


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
        return max_replicas_over_min(v, info)


class CanarySpec(Spec):
    """A new revision of a model, served side by side with the current one on a share of traffic.
    Roll forward by raising the weight, back by lowering it to 0 or removing the canary."""

    # The revision to try (a git branch, tag or commit of the model's source).
    revision: Revision
    # Percent of each route's traffic the canary gets, 0-100.
    weight: int = Field(ge=0, le=100)
    # Replicas of the canary in each of the model's pools.
    replicas: int = Field(default=1, ge=1, le=16)


class FallbackSpec(Spec):
    """Where a model's replicas send the requests of the tenants they shed for overload (negative
    tenants[].priority, while the queue is over monitoring.queueLatencySloSeconds) instead of
    answering 429: another, smaller model of the stack, for the shed tenants allowed to call it."""

    # The model that serves them: another of the stack's models, without a fallback of its own.
    # Only tenants whose models list it are sent; the others still get 429 with Retry-After.
    model: Name


# The ranks vLLM's --max-lora-rank accepts (its parser's choices).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Adapter names vLLM applies by itself: a chat request with a content part of type T gets the
# loaded LoRA named after T (input_ removed, else up to the first '_': text, image_url ->
# image, input_audio -> audio, ...) whatever its `model` names, so any tenant allowed the base
# model would be served the adapter (vllm-project/vllm@v0.34.0:
# vllm/entrypoints/serve/engine/serving.py:144-211). These are the types its chat request model
# keeps (vllm/renderers/chat_utils/types.py:264-281 and OpenAI's text, image_url, input_audio, file);
# and "input", which input_audio gave before 0.34 removed the prefix (the 0.11 release cuts at '_').
MODALITY_ADAPTER_NAMES = frozenset({"text", "image", "audio", "video", "file", "refusal", "prompt", "thinking",
                                    "tool", "input"})


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

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in MODALITY_ADAPTER_NAMES:
            raise ValueError(f"'{v}' is a content part type vLLM applies a LoRA of that name for by itself, to any "
                             "chat request with such a part, whatever its model; choose another name (not one of "
                             f"{', '.join(sorted(MODALITY_ADAPTER_NAMES))})")
        return v

    @field_validator("rank")
    @classmethod
    def _rank(cls, v: int) -> int:
        if v not in LORA_RANKS:
            raise ValueError(f"rank {v} is not one vLLM serves; use one of {', '.join(map(str, LORA_RANKS))} "
                             "(the next one up from the adapter's r)")
        return v


# The CustomShape fields a ModelShape carries (the rest only the spec reads).
_MODEL_SHAPE_FIELDS = {f.name for f in fields(ModelShape)}


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
    # Architecture from the catalog (llama-3-8b, llama-3-70b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-72b, mistral-7b,
    # llama-3.1-405b, deepseek-v3). Unset in a stack: read from the model's config.json, which the stack
    # program and `vllm-gke plan` fetch once and cache beside the stack file
    # (model-configs/<org>--<repo>@<revision>.json: commit it with the stack); a Python program reads it with
    # with_model_configs. Through the component package (TypeScript, Go, C#, Java, YAML): required, this or
    # customShape.
    shape: Optional[str | CustomShape] = Field(default=None, validate_default=True)
    # Weight dtype or quantisation.
    dtype: Literal["bfloat16", "float16", "fp8", "int8", "awq", "gptq"] = "bfloat16"
    # GiB the files vLLM reads take on disk: the weights it opens plus config and tokenizer
    # (default: paramsBillion x dtype bytes). Sizes the Hyperdisk ML disks and the Filestore share;
    # a loader that finds more says which value to set.
    disk_gb: Optional[float] = Field(default=None, gt=0)
    # KV-cache dtype.
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # GPUs or TPU chips each pipeline stage of a replica shards its layers over (whole devices only).
    tensor_parallel_size: int = Field(default=1, ge=1, le=256)
    # Pipeline stages of a replica. Devices per replica = tensorParallelSize x pipelineParallelSize;
    # more than one node holds spans several (a LeaderWorkerSet group, one pod per node).
    pipeline_parallel_size: int = Field(default=1, ge=1, le=16)
    # Let a replica span hosts: required when tensorParallelSize x pipelineParallelSize exceeds one
    # node's GPUs, or the node pool is a multi-host TPU slice. Each replica then runs as a
    # LeaderWorkerSet group whose hosts talk over the data-centre network (TCP at the machine's NIC
    # bandwidth on GPUs: vllm-gke sets up no GPUDirect; a TPU slice's ICI), in one zone.
    multi_host: bool = False
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
    # More vLLM flags, checked against the release's parser; platform-managed flags (--model,
    # --download-dir, --load-format, ...) and secrets are refused.
    extra_args: list[str] = Field(default_factory=list)
    # A canary of another revision, weighted against this one.
    canary: Optional[CanarySpec] = None
    # LoRA adapters served by the model's replicas (--enable-lora), each for the tenants it names.
    adapters: list[AdapterSpec] = Field(default_factory=list[AdapterSpec])
    # Adapters resident on the GPU at once (--max-loras; default: all of them, at most 8).
    max_loras: Optional[int] = Field(default=None, ge=1, le=64)
    # length: a short and a long pool, chosen by request size. inference-gateway: one pool (the
    # `short` settings) behind GKE Inference Gateway's endpoint picker, which picks the replica by
    # queue depth, KV-cache use and prefix-cache affinity, with per-tenant priorities.
    routing: Literal["length", "inference-gateway"] = "length"
    # While a replica sheds tenants of negative priority, their requests go to this model instead
    # of a 429 (for the tenants allowed to call it), and come back as the shed tiers do.
    fallback: Optional[FallbackSpec] = None
    # Prefill/decode disaggregation: a prefill pool beside the decode pool (`short`), the KV cache
    # moved between them by vLLM's NIXL connector (routing: inference-gateway).
    disaggregation: Optional[DisaggregationSpec] = None
    # Sleep mode on a time-shared GPU (its node pool's gpuSharing): the model sleeps while another
    # on the same GPU serves, and wakes in seconds for its next request instead of a cold start.
    sleep_mode: Optional[SleepModeSpec] = None
    # Offload KV blocks that leave the GPU to the node's host memory (vLLM's native CPU offloading), so
    # prefixes seen before and preempted sequences load back instead of being recomputed; the server's
    # memory request and limit grow by its size. It does not raise the batch that runs at once.
    kv_offload: Optional[KvOffloadSpec] = None
    # Speculative decoding (vLLM's --speculative-config): n-gram prompt lookup, a draft model, an
    # EAGLE/EAGLE-3 head or the model's own MTP heads propose tokens its replicas verify in one step.
    # The plan counts the draft's memory and scales the decode rate by the acceptance rate.
    speculative: Optional[SpeculativeSpec] = None

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return weights_source(v)

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
        if config_mapping(data) and ("customShape" in data or "custom_shape" in data):
            data = dict(data)
            custom = data.pop("customShape", None) or data.pop("custom_shape", None)
            if data.get("shape") is not None:
                raise ValueError("give shape (a catalog name) or customShape ({paramsBillion, layers, kvHeads, "
                                 "headDim}), not both")
            data["shape"] = custom
        return data

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: Optional[str | CustomShape]) -> str | CustomShape:
        if v is None:
            raise ValueError(
                "is not set and no config.json was read for the model; give shape (one of "
                f"{', '.join(MODEL_SHAPES)}) or customShape {{paramsBillion, layers, kvHeads, headDim}}, or read it "
                "from the model's config.json: the stack program and `vllm-gke plan` do for a stack; a Python "
                "program calls vllm_gke.infra.model_configs.with_model_configs(config, cache_dir) first; through "
                "the component package (TypeScript, Go, YAML, ...) give shape or customShape")
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
    def _within_context(self) -> "ModelSpec":
        limit = self.shape.max_context if isinstance(self.shape, CustomShape) else None
        longest = self.served_max_model_len
        if limit is not None and longest > limit:
            raise ValueError(f"maxModelLen {longest} is above the model's longest context, {limit} tokens "
                             "(customShape.maxContext, from its config.json): vLLM refuses to start; lower maxModelLen "
                             "(or the pools' maxModelLen) to at most that")
        return self

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
    def devices_per_replica(self) -> int:
        """GPUs (or MIG slices) or TPU chips one replica takes."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def model_shape(self) -> ModelShape:
        if isinstance(self.shape, CustomShape):
            return ModelShape(**self.shape.model_dump(include=_MODEL_SHAPE_FIELDS))
        assert self.shape is not None  # the validator refuses None
        return MODEL_SHAPES[self.shape]

    @property
    def bytes_per_weight(self) -> float:
        """What a weight takes: a quantised checkpoint's own figure (its config.json), else the dtype's."""
        per_weight = self.shape.bytes_per_weight if isinstance(self.shape, CustomShape) else None
        return per_weight or WEIGHT_BYTES[self.dtype]

    @property
    def weights_gb(self) -> float:
        return self.model_shape.params_billion * self.bytes_per_weight

    @property
    def files_gb(self) -> float:
        """What the loaded files take on disk: the stack's figure, else the weights' estimate."""
        return self.disk_gb or self.weights_gb

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes a token takes. With sliding-window layers, a sequence's average at the
        model's shortest pool context (its contextTokens, else maxModelLen): longer sequences keep
        less per token, so every pool's figure is on the safe side."""
        s = self.model_shape
        full = 2 * s.layers * s.kv_heads * s.head_dim * KV_CACHE_BYTES[self.kv_cache_dtype]
        if not isinstance(self.shape, CustomShape):
            return int(full)
        shortest = min(getattr(self, w).context_tokens or self.pool_max_model_len(getattr(self, w))
                       for w in self.pool_names)
        return int(full * self.shape.sliding_share(shortest))

    def pool_max_model_len(self, pool: ServingPoolSpec) -> int:
        return pool.max_model_len or self.max_model_len

    @property
    def served_max_model_len(self) -> int:
        """The longest context any of the model's pools serves: the long pool's with length
        routing, the one pool's behind the endpoint picker (which may be shorter than the model's)."""
        return max(self.pool_max_model_len(getattr(self, which)) for which in self.pool_names)
