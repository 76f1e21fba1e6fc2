"""Speculative decoding (models[].speculative): vLLM's --speculative-config, the draft's GPU memory,
and what it does to the decode rate.

Each step the drafter proposes k tokens and the model verifies them in one forward pass, keeping
the accepted prefix plus one token of its own. With each proposal accepted independently at rate
a, a step yields (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding", ICML 2023, eq. 1). Its cost (throughput.py's roofline, with
a Speculation): the verification scores k + 1 tokens per sequence, so its compute grows k + 1 times
while its reads (weights once, each sequence's KV once) stay those of a plain step; the drafter
adds its own k steps: a draft model's or EAGLE head's roofline at the same batch, nothing for
n-gram lookup (vLLM 0.34 runs it on the GPU, NgramGPUSpeculator, v1/worker/gpu/spec_decode/ngram/
config.py:12-15: a lookup over the tokens, no weights read). At small batches the step is
memory-bound and the extra tokens are nearly free; at large ones it is compute-bound and the k + 1
scored tokens cost what they would cost decoded one by one: speculation then stops paying
(break_even_batch). The rate is an upper bound: the drafter's per-step launches, the rejection
sampler and the scheduler's bookkeeping are not counted, and measured gains at batch 64 are far
below it where the roofline stays memory-bound (infra/speculative_plan.py says so).

The user states what vLLM measures, the mean acceptance length L (tokens a step yields, the bonus
token included: 1 + accepted / drafts, v1/spec_decode/metrics.py:177-195); the per-token rate a is
the root of (1 - a^(k+1)) / (1 - a) = L (per_token_acceptance). accepted / draft tokens is another
ratio: a(1 - a^k) / (k(1 - a)), not a.

The draft's memory (capacity.py): its weights per device (sharded as the model's: vLLM's draft
tensor parallelism defaults to the model's, config/speculative.py:1530-1552), and its KV cache
per token beside the model's (vLLM allocates the drafter's layers in the same KV cache,
v1/worker/gpu/spec_decode: uses_draft_kv_cache).
"""

from __future__ import annotations

import json
from typing import Optional

from .catalog import ModelShape
from .specs import ModelSpec, NodePoolSpec, ServingPoolSpec, SpeculativeSpec
from .specs.speculative import VOCAB_SIZES
from .throughput import Speculation, roofline, slice_of
from .weights_layout import draft_dir

# The acceptance rate assumed per method where the stack states none: n-gram prompt lookup accepts
# little on chat (it pays on code editing and summaries, which repeat the prompt); an EAGLE-3 head
# for Llama 3.3 70B accepts 2.88 tokens a step at k = 7 on MT-bench (RedHatAI's speculator, as
# nebius/EAGLE3-Llama-3.3-70B-Instruct's model card measures it: a = 0.66; not the tuned stack's
# head, yuhuili's, for which none is published); DeepSeek-V3's MTP
# module accepts its second token 85-90% of the time (DeepSeek-V3 technical report, section 5.4.3).
ASSUMED_ACCEPTANCE = {"ngram": 0.3, "draft_model": 0.6, "eagle": 0.6, "eagle3": 0.7, "mtp": 0.8}
# The methods whose drafter has weights of its own on the GPU (MTP's are the checkpoint's layers,
# loaded as a drafter): a level-2 sleep discards them (config_rules/speculative.py).
DRAFTED = ("draft_model", "eagle", "eagle3", "mtp")
# vLLM 0.34's max_num_batched_tokens for its API server where none is given, by the GPU's memory
# (engine/arg_utils.py:3005-3045): 16384 from 160 GiB, 8192 from 70 GiB (not an A100), else 2048.
DEFAULT_BATCHED_TOKENS = ((160, 16384), (70, 8192), (0, 2048))
# vLLM's n-gram window where none is given (v1/worker/gpu/spec_decode/ngram/config.py:21-24).
NGRAM_DEFAULT_WINDOW = 5


def acceptance(spec: SpeculativeSpec) -> float:
    """The per-token acceptance a: solved from the stated mean acceptance length, else the method's assumed one."""
    if spec.mean_acceptance_length is None:
        return ASSUMED_ACCEPTANCE[spec.method]
    return per_token_acceptance(spec.mean_acceptance_length, spec.num_speculative_tokens)


def per_token_acceptance(length: float, k: int) -> float:
    """The a whose (1 - a^(k+1)) / (1 - a) is `length` (1 < length < k + 1): it grows with a, so bisect."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification step yields: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def draft_mismatches(model: ModelSpec) -> list[str]:
    """What vLLM 0.34 refuses in a draft against its model: query heads its tensor parallelism (the
    model's) does not divide (config/model.py:1577-1583), and a draft_model's vocabulary other than
    the model's (config/speculative.py:1723-1735). Unknown numbers are not checked."""
    spec = model.speculative
    if spec is None or spec.draft is None:
        return []
    out: list[str] = []
    heads, tp = spec.draft.model_shape.attention_heads, model.tensor_parallel_size
    if heads is not None and heads % tp:
        out.append(f"the draft's {heads} attention heads are not divisible by tensorParallelSize {tp} (its tensor "
                   "parallelism is the model's): pick a draft whose heads it divides, or another tensorParallelSize")
    target = VOCAB_SIZES.get(model.shape) if isinstance(model.shape, str) else None
    vocab = spec.draft.vocab_size
    if spec.method == "draft_model" and None not in (target, vocab) and target != vocab:
        out.append(f"the draft's vocabulary ({vocab} tokens) is not the model's ({target}): a draft_model must share "
                   "the model's tokenizer; pick one of its family, or use eagle3 or ngram")
    return out


def max_num_batched_tokens(model: ModelSpec, pool: ServingPoolSpec, node_pool: NodePoolSpec) -> int:
    """The pool's maxNumBatchedTokens, else what vLLM 0.34 sets on this GPU (default_batched_tokens)."""
    if pool.max_num_batched_tokens:
        return pool.max_num_batched_tokens
    return default_batched_tokens(node_pool, pool.max_num_seqs, model.pool_max_model_len(pool),
                                  model.enable_chunked_prefill)


def default_batched_tokens(node_pool: NodePoolSpec, max_num_seqs: int, max_model_len: int, chunked: bool) -> int:
    """vLLM 0.34's max_num_batched_tokens where none is given (engine/arg_utils.py:3200-3262): the GPU's
    memory tier's default, at least max_model_len without chunked prefill, at most max_num_seqs x max_model_len."""
    acc = node_pool.machine.accelerator
    gib = acc.slice_memory_gb(node_pool.gpu_partition_size) * 1e9 / 2**30 if acc is not None else 0.0
    a100 = acc is not None and "a100" in acc.gke_type
    tokens = next(t for floor, t in DEFAULT_BATCHED_TOKENS if gib >= floor and not (floor == 70 and a100))
    if not chunked:
        tokens = max(max_model_len, tokens)
    return min(max_num_seqs * max_model_len, tokens)


def speculative_config(model: ModelSpec) -> Optional[dict[str, object]]:
    """--speculative-config's JSON: the draft is the share's copy (never a hub id), and MTP reads the
    model's own folder (vLLM's default for mtp, v1/worker/gpu/spec_decode/mtp/config.py:43-55)."""
    spec = model.speculative
    if spec is None:
        return None
    config: dict[str, object] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if (directory := draft_dir(model)) is not None:
        config["model"] = directory
    if spec.method == "ngram":
        config["prompt_lookup_max"] = spec.prompt_lookup_max or spec.prompt_lookup_min or NGRAM_DEFAULT_WINDOW
        config["prompt_lookup_min"] = spec.prompt_lookup_min or spec.prompt_lookup_max or NGRAM_DEFAULT_WINDOW
    return config


def speculative_args(model: ModelSpec) -> list[str]:
    """The flag vllm_args adds: one JSON value, as vLLM's parser reads it (engine/arg_utils.py:1895-1898)."""
    config = speculative_config(model)
    return [] if config is None else ["--speculative-config", json.dumps(config, separators=(",", ":"))]


def draft_shape(model: ModelSpec) -> Optional[ModelShape]:
    """What the drafter computes and caches: the draft model or head, or for MTP one layer of the
    model's own (DeepSeek-V3's MTP module is one transformer block); None for n-gram lookup."""
    spec = model.speculative
    if spec is None or spec.method == "ngram":
        return None
    if spec.draft is not None:
        return spec.draft.model_shape
    s = model.model_shape
    return ModelShape(s.params_billion / s.layers, 1, s.kv_heads, s.head_dim,
                      active_params_billion=s.active_billion / s.layers, attention_heads=s.attention_heads,
                      hidden_size=s.hidden_size)


def draft_weights_gb(model: ModelSpec) -> float:
    """GB the drafter's weights take on a replica, all devices together (MTP's are in the model's
    checkpoint but vLLM loads them as a draft beside the model's layers)."""
    spec, shape = model.speculative, draft_shape(model)
    if spec is None or shape is None:
        return 0.0
    per_weight = spec.draft.bytes_per_weight if spec.draft is not None else model.bytes_per_weight
    return shape.params_billion * per_weight


def draft_kv_bytes_per_token(model: ModelSpec) -> int:
    """KV-cache bytes the drafter's layers add to each token (in the model's KV dtype)."""
    shape = draft_shape(model)
    if shape is None:
        return 0
    per_layer = model.kv_bytes_per_token / max(1, model.model_shape.layers)
    return int(per_layer * shape.layers * shape.kv_heads * shape.head_dim
               / (model.model_shape.kv_heads * model.model_shape.head_dim))


def speculation(model: ModelSpec, node_pool: NodePoolSpec, hosts: int, batch: int,
                context: int) -> Optional[Speculation]:
    """The roofline's speculative terms for a pool at `batch`: k, a, and the drafter's k steps."""
    spec = model.speculative
    if spec is None:
        return None
    acc = node_pool.machine.accelerator
    assert acc is not None
    shape, draft_s = draft_shape(model), 0.0
    if shape is not None:
        per_weight = spec.draft.bytes_per_weight if spec.draft is not None else model.bytes_per_weight
        draft = roofline(slice_of(acc, node_pool.gpu_partition_size), shape, model.dtype, model.kv_cache_dtype,
                         model.devices_per_replica, model.tensor_parallel_size, hosts, batch, context,
                         network_gbps=node_pool.machine.nic_gbps, bytes_per_weight=per_weight)
        draft_s = spec.num_speculative_tokens * batch / draft.ceiling_tokens_s
    return Speculation(spec.num_speculative_tokens, acceptance(spec), draft_s)


def pool_rates(model: ModelSpec, pool: ServingPoolSpec, node_pool: NodePoolSpec, batch: int,
               hosts: int = 1) -> tuple[float, float]:
    """Decode tokens/s of one replica at `batch`: plain, and with the model's speculation."""
    acc = node_pool.machine.accelerator
    assert acc is not None
    context = pool.context_tokens or model.pool_max_model_len(pool)
    def rate(spec: Optional[Speculation]) -> float:
        return roofline(slice_of(acc, node_pool.gpu_partition_size), model.model_shape, model.dtype,
                        model.kv_cache_dtype, model.devices_per_replica, model.tensor_parallel_size, hosts, batch,
                        context, network_gbps=node_pool.machine.nic_gbps, bytes_per_weight=model.bytes_per_weight,
                        speculation=spec).decode_tokens_s
    return rate(None), rate(speculation(model, node_pool, hosts, batch, context))


def break_even_batch(model: ModelSpec, pool: ServingPoolSpec, node_pool: NodePoolSpec,
                     hosts: int = 1, up_to: int = 4096) -> Optional[int]:
    """The smallest batch at which speculation no longer pays (its tokens/s at or below the plain
    rate), None if it pays up to `up_to`: the step turns compute-bound, where the k + 1 scored
    tokens cost compute and the rejected ones are wasted."""
    lo, hi = 1, up_to
    if _pays(model, pool, node_pool, hi, hosts):
        return None
    if not _pays(model, pool, node_pool, lo, hosts):
        return lo
    while hi - lo > 1:  # the gain only shrinks as the batch grows: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _pays(model, pool, node_pool, mid, hosts) else (lo, mid)
    return hi


def _pays(model: ModelSpec, pool: ServingPoolSpec, node_pool: NodePoolSpec, batch: int, hosts: int) -> bool:
    plain, speculative = pool_rates(model, pool, node_pool, batch, hosts)
    return speculative > plain


def draft_per_device_gb(model: ModelSpec) -> float:
    """GB of the drafter's weights on each device: sharded by the model's tensor parallelism, all on
    one pipeline stage (vLLM builds the draft's parallel config with one stage, config/speculative.py:1584-1610)."""
    return draft_weights_gb(model) / model.tensor_parallel_size


def draft_kv_per_device(model: ModelSpec) -> float:
    """KV bytes the drafter adds to each token on a device (its KV heads shard as the model's do)."""
    shape = draft_shape(model)
    if shape is None:
        return 0.0
    return draft_kv_bytes_per_token(model) / min(model.tensor_parallel_size, shape.kv_heads)
