"""Speculative decoding (models[].speculative): vLLM's --speculative-config, the draft's GPU memory,
and what it does to the decode rate.

Each step the drafter proposes k tokens and the model verifies them in one forward pass, keeping
the accepted prefix plus one token of its own. With each proposal accepted independently at rate
a, a step yields (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding", ICML 2023, eq. 1). Its cost (throughput.py's roofline, with
a Speculation): the verification scores k + 1 tokens per sequence, so its compute grows k + 1 times
while its reads (weights once, each sequence's KV once) stay those of a plain step; the drafter
adds its own k steps: a draft model's or EAGLE head's roofline at the same batch, nothing for
n-gram lookup (on the CPU). At small batches the step is memory-bound and the extra tokens are
nearly free; at large ones it is compute-bound and the k + 1 scored tokens cost what they would
cost decoded one by one: speculation then stops paying (break_even_batch).

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
from .throughput import Speculation, roofline, slice_of
from .weights_layout import draft_dir

# The acceptance rate assumed per method where the stack states none: n-gram prompt lookup accepts
# little on chat (it pays on code editing and summaries, which repeat the prompt); an EAGLE-3 head
# for Llama 3.3 70B accepts 2.88 tokens a step at k = 7 on MT-bench (RedHatAI's speculator, as
# nebius/EAGLE3-Llama-3.3-70B-Instruct's model card measures it: a = 0.66); DeepSeek-V3's MTP
# module accepts its second token 85-90% of the time (DeepSeek-V3 technical report, section 5.4.3).
ASSUMED_ACCEPTANCE = {"ngram": 0.3, "draft_model": 0.6, "eagle": 0.6, "eagle3": 0.7, "mtp": 0.8}
# vLLM's n-gram window where none is given (v1/worker/gpu/spec_decode/ngram/config.py:21-24).
NGRAM_DEFAULT_WINDOW = 5


def acceptance(spec: SpeculativeSpec) -> float:
    """The stated acceptance rate, else the method's assumed one."""
    return spec.acceptance_rate if spec.acceptance_rate is not None else ASSUMED_ACCEPTANCE[spec.method]


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification step yields: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1)."""
    return (1 - a ** (k + 1)) / (1 - a)


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
