"""A model's architecture read from its Hugging Face config.json: the shape capacity and throughput
plan with, for a model given only by its id. Pure: infra/model_configs.py fetches and caches the
file; this only reads it.

The numbers follow vLLM 0.34.0's reading of the same file where it has one
(vllm/transformers_utils/model_arch_config_convertor.py: head size, KV heads and experts by the
aliases of vllm/transformers_utils/config.py:57-87, the longest context at :374-402 and
vllm/config/model.py:2589-2720), and transformers 5.22.2's defaults where a config leaves a key
out (Gemma 3's text_config names few). Parameters are counted from the layer sizes: embeddings,
attention (multi-head latent attention where kv_lora_rank is set), a gated MLP or the experts (the
routed ones a token uses, plus shared experts), and a vision tower's encoder layers. Approximated:
norms, biases and a multimodal projector are left out or estimated (well under 1%); a quantised
checkpoint keeps embeddings, the output head and the vision tower in 16 bits and everything else at
its bits (modules_to_not_convert is not read); sliding-window layers cache at most the window
(vLLM's hybrid KV-cache manager), which ModelSpec.kv_bytes_per_token counts at the model's shortest
pool context. Hybrid layers (linear attention, Mamba) are not modelled: such a config is refused
with the keys that say so, and customShape is the way to plan it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, cast

# vLLM 0.34.0 vllm/transformers_utils/config.py:57-87.
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "moe_topk", "moe_top_k",
                          "top_k")
# vllm/transformers_utils/model_arch_config_convertor.py:376-395: the smallest wins, model_max_length overrides.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings is already scaled (vllm/config/model.py:2647-2654).
PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# vLLM's assumption when a config names no context length (vllm/config/model.py:2631).
UNKNOWN_CONTEXT = 2048
# transformers 5.22.2's defaults for keys configs on the Hub leave out (models/<type>/configuration_<type>.py).
TYPE_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "sliding_window": 4096, "sliding_window_pattern": 6},
    "gemma2": {"vocab_size": 256_000, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "max_position_embeddings": 8192, "sliding_window": 4096, "sliding_window_pattern": 2},
    "gpt_oss": {"sliding_window_pattern": 2},
    "cohere2": {"sliding_window_pattern": 4},
}
# Model types whose config class ties the output head to the embeddings by default (transformers 5.22.2).
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text", "gemma3n_text", "cohere", "cohere2", "ernie4_5",
                             "ernie4_5_moe", "granite_swa", "jetmoe", "lfm2", "lfm2_moe", "minicpm3", "smollm3",
                             "starcoder2", "vaultgemma"})
# Two-matrix MLPs (up, down); every other model type is counted with a gated one (gate, up, down).
PLAIN_MLP = frozenset({"starcoder2", "phi", "gpt_neox", "falcon", "opt", "gpt_bigcode", "gpt2"})
# quant_method -> the stack's dtype, where it names one (`int8` is vLLM's --quantization compressed-tensors).
SPEC_DTYPE = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "compressed-tensors": "int8"}
# Bits of methods whose config does not state them.
METHOD_BITS = {"fp8": 8.0, "fbgemm_fp8": 8.0, "modelopt": 8.0, "mxfp4": 4.25, "modelopt_fp4": 4.5}
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
HYBRID_KEYS = ("hybrid_override_pattern", "layers_block_type", "attn_layer_period", "block_configs")


class HfConfigError(ValueError):
    """What a config.json lacks, or holds that is not modelled, naming its keys."""


@dataclass(frozen=True)
class ConfigFacts:
    """What the plan needs of a model, read from its config.json."""

    model_type: str
    params_billion: float
    # Parameters a token passes through: a mixture of experts' routed share, a multimodal model's
    # language model; None: all of them.
    active_params_billion: Optional[float]
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    # The longest context vLLM serves the model at (its derived max_model_len).
    max_context: int
    sliding_window: Optional[int] = None
    sliding_window_layers: int = 0
    torch_dtype: Optional[str] = None
    quant_method: Optional[str] = None
    weight_bits: Optional[float] = None
    # A quantised checkpoint's bytes per parameter, averaged over its 16-bit and quantised parts.
    bytes_per_weight: Optional[float] = None
    approximations: tuple[str, ...] = field(default=())

    @property
    def dtype(self) -> Optional[str]:
        """The stack's `dtype` for this checkpoint; None: the spec's default serves it."""
        if self.quant_method:
            return SPEC_DTYPE.get(self.quant_method)
        return self.torch_dtype if self.torch_dtype in ("bfloat16", "float16") else None

    def custom_shape(self) -> dict[str, Any]:
        """The facts as the stack's `customShape` (camelCase keys), parameters to 10 million."""
        shape: dict[str, Any] = {
            "paramsBillion": round(self.params_billion, 2), "layers": self.layers, "kvHeads": self.kv_heads,
            "headDim": self.head_dim, "attentionHeads": self.attention_heads, "hiddenSize": self.hidden_size,
            "maxContext": self.max_context}
        if self.active_params_billion is not None:
            shape["activeParamsBillion"] = round(self.active_params_billion, 2)
        if self.sliding_window:
            shape.update(slidingWindow=self.sliding_window, slidingWindowLayers=self.sliding_window_layers)
        if self.bytes_per_weight is not None:
            shape["bytesPerWeight"] = self.bytes_per_weight
        return shape


def _mapping(value: Any) -> Optional[Mapping[str, Any]]:
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else None


def _number(cfg: Mapping[str, Any], *keys: str) -> Optional[float]:
    """The first of `keys` the config sets to a positive number."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def _required(cfg: Mapping[str, Any], where: str, *keys: str) -> int:
    value = _number(cfg, *keys)
    if value is None:
        raise HfConfigError(f"config.json has no {' or '.join(where + k for k in keys)} (a positive number): "
                            "give customShape for this model")
    return int(value)


def text_config(doc: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The language model's settings (a multimodal config nests them in text_config), with
    transformers' defaults for the keys its type leaves out, and the prefix its keys are named by."""
    nested, where = _mapping(doc.get("text_config")), "text_config."
    if nested is None:
        nested, where = _mapping(doc.get("llm_config")), "llm_config."
    text = nested if nested is not None else doc
    model_type = str(text.get("model_type") or doc.get("model_type") or "")
    if nested is not None and not text.get("model_type") and f"{model_type}_text" in TYPE_DEFAULTS:
        model_type = f"{model_type}_text"
    return {"model_type": model_type, **TYPE_DEFAULTS.get(model_type, {}), **text}, where if nested is not None else ""


def _hybrid_refused(text: Mapping[str, Any], where: str) -> None:
    kinds = text.get("layer_types")
    others = sorted({str(k) for k in cast(list[Any], kinds)} - set(ATTENTION_LAYER_TYPES)) \
        if isinstance(kinds, list) else []
    keys = [k for k in HYBRID_KEYS if text.get(k)]
    if others or keys:
        what = f"{where}layer_types has {', '.join(others)} layers" if others else f"it sets {where}{keys[0]}"
        raise HfConfigError(f"{what}: hybrid layers (linear attention, Mamba, per-layer blocks) are not modelled; "
                            "give customShape for this model")


def max_context(text: Mapping[str, Any], model_type: str) -> int:
    """vLLM's derived max_model_len: the smallest context key, times a RoPE scaling factor where
    max_position_embeddings is not already scaled (Gemma 3's is)."""
    found = [float(v) for k in CONTEXT_KEYS if (v := _number(text, k)) is not None]
    length = _number(text, "model_max_length") or (min(found) if found else UNKNOWN_CONTEXT)
    rope = _mapping(text.get("rope_scaling")) or _mapping(text.get("rope_parameters")) or {}
    params = [rope] if "rope_type" in rope or "type" in rope or "factor" in rope else \
        [p for v in rope.values() if (p := _mapping(v)) is not None]
    factor = 1.0
    if "gemma3" not in model_type:
        for p in params:
            if str(p.get("rope_type", p.get("type", "default"))) not in PRESCALED_ROPE:
                factor = _number(p, "factor") or factor
    return int(length * factor)


def _sliding(text: Mapping[str, Any], layers: int, context: int) -> tuple[Optional[int], int]:
    """The window and how many layers use it (layer_types, Qwen's max_window_layers, a
    sliding_window_pattern of which every n-th layer is global, else all layers)."""
    window = _number(text, "sliding_window")
    if window is None or text.get("use_sliding_window") is False or window >= context:
        return None, 0
    kinds = text.get("layer_types")
    if isinstance(kinds, list):
        sliding = sum(1 for k in cast(list[Any], kinds) if k == "sliding_attention")
    elif "use_sliding_window" in text:
        sliding = layers - min(layers, int(_number(text, "max_window_layers") or 0))
    elif (pattern := _number(text, "sliding_window_pattern")) is not None:
        sliding = sum(1 for i in range(layers) if (i + 1) % int(pattern))
    else:
        sliding = layers
    return (int(window), sliding) if sliding else (None, 0)


@dataclass(frozen=True)
class _Attention:
    heads: int
    kv_heads: int
    head_dim: int
    params_per_layer: float


def _attention(text: Mapping[str, Any], where: str, hidden: int) -> _Attention:
    """Heads, the KV cache's heads x head dim, and the projections' parameters of one layer. Multi-head
    latent attention caches one latent of kv_lora_rank + qk_rope_head_dim per layer, counted (as the
    catalog's deepseek-v3) as one head of half that for K and as much for V."""
    heads = _required(text, where, "num_attention_heads", "n_head", "num_heads")
    latent = _number(text, "kv_lora_rank")
    if latent is not None:
        rope, nope = _number(text, "qk_rope_head_dim") or 0, _number(text, "qk_nope_head_dim") or 0
        v_dim, q_rank = _number(text, "v_head_dim") or nope, _number(text, "q_lora_rank")
        q = (hidden * q_rank + q_rank * heads * (nope + rope)) if q_rank else hidden * heads * (nope + rope)
        params = q + hidden * (latent + rope) + latent * heads * (nope + v_dim) + heads * v_dim * hidden
        return _Attention(heads, 1, math.ceil((latent + rope) / 2), params)
    head_dim = int(_number(text, "head_dim", "hidden_size_per_head") or hidden // heads)
    kv_heads = int(_number(text, *KV_HEAD_KEYS) or heads)
    params = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return _Attention(heads, kv_heads, head_dim, params)


def _moe_layers(text: Mapping[str, Any], layers: int) -> int:
    """Layers whose MLP is the experts: DeepSeek's first_k_dense_replace and moe_layer_freq, Qwen's
    mlp_only_layers and decoder_sparse_step, Llama 4's interleave_moe_layer_step; else all."""
    first_dense = int(_number(text, "first_k_dense_replace") or 0)
    every = int(_number(text, "moe_layer_freq") or 1)
    step = int(_number(text, "decoder_sparse_step", "interleave_moe_layer_step") or 1)
    dense_only = {int(i) for i in cast(list[Any], text.get("mlp_only_layers") or []) if isinstance(i, int)}
    return sum(1 for i in range(layers)
               if i >= first_dense and i % every == 0 and (i + 1) % step == 0 and i not in dense_only)


def _mlp(text: Mapping[str, Any], where: str, hidden: int, layers: int) -> tuple[float, float]:
    """All MLP parameters of the model, and those one token passes through."""
    matrices = 2 if str(text.get("model_type")) in PLAIN_MLP else 3
    experts = int(_number(text, *EXPERT_KEYS) or 0)
    moe = _moe_layers(text, layers) if experts else 0
    dense = (layers - moe) * matrices * hidden * _required(text, where, "intermediate_size") if layers > moe else 0
    if not moe:
        return dense, dense
    per_token = int(_number(text, *EXPERTS_PER_TOKEN_KEYS) or 0)
    if not per_token:
        raise HfConfigError(f"config.json sets {experts} experts but not how many a token uses "
                            f"({where}num_experts_per_tok): give customShape for this model")
    width = _required(text, where, "moe_intermediate_size", "intermediate_size")
    expert = matrices * hidden * width
    shared = (_number(text, "n_shared_experts", "moe_num_shared_experts") or 0) * expert + \
        matrices * hidden * (_number(text, "shared_expert_intermediate_size") or 0)
    router = hidden * experts
    return (dense + moe * (experts * expert + shared + router),
            dense + moe * (per_token * expert + shared + router))


def _vision(doc: Mapping[str, Any], text_hidden: int) -> Optional[float]:
    """A vision encoder's parameters (attention 4h^2 and MLP 2h x intermediate per layer, and a
    projector to the language model's width); None where vision_config does not give its sizes."""
    vision = _mapping(doc.get("vision_config"))
    if vision is None:
        return 0.0
    hidden, inter = _number(vision, "hidden_size"), _number(vision, "intermediate_size")
    layers = _number(vision, "num_hidden_layers", "depth")
    if hidden is None or inter is None or layers is None:
        return None
    return layers * (4 * hidden * hidden + 2 * hidden * inter) + hidden * text_hidden


def _quantization(doc: Mapping[str, Any], text: Mapping[str, Any]) -> tuple[Optional[str], Optional[float]]:
    """The checkpoint's quant_method (as vLLM normalises it) and its weights' bits."""
    q = _mapping(doc.get("quantization_config")) or _mapping(doc.get("compression_config")) or \
        _mapping(text.get("quantization_config"))
    if q is None:
        return None, None
    method = str(q.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
    algo = str(q.get("quant_algo") or (_mapping(q.get("quantization")) or {}).get("quant_algo") or "").upper()
    if algo:
        method = "modelopt_fp4" if algo == "NVFP4" else "modelopt"
    groups = _mapping(q.get("config_groups")) or {}
    group_bits = [b for g in groups.values() if (w := _mapping((_mapping(g) or {}).get("weights")))
                  and (b := _number(w, "num_bits")) is not None]
    bits = _number(q, "bits", "w_bit") or (max(group_bits) if group_bits else None) or METHOD_BITS.get(method)
    group = _number(q, "group_size", "q_group_size")
    if bits is not None and bits < 8 and group and group > 0:
        # Grouped integer weights also store a 16-bit scale per group, and AWQ/GPTQ a packed zero point.
        bits += 16 / group + (bits / group if method in ("awq", "gptq") else 0)
    return method or None, bits


def _dtype(doc: Mapping[str, Any], text: Mapping[str, Any]) -> Optional[str]:
    for cfg in (doc, text):
        for key in ("torch_dtype", "dtype"):
            if isinstance(cfg.get(key), str):
                return str(cfg[key])
    return None


def shape_from_config(doc: Mapping[str, Any]) -> ConfigFacts:
    """The plan's facts about a model from its config.json; HfConfigError names what is missing."""
    text, where = text_config(doc)
    _hybrid_refused(text, where)
    model_type = str(text["model_type"])
    layers = _required(text, where, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _required(text, where, "hidden_size", "n_embd", "d_model")
    vocab = _required(text, where, "vocab_size")
    attention = _attention(text, where, hidden)
    mlp, mlp_active = _mlp(text, where, hidden, layers)
    tied = text.get("tie_word_embeddings", doc.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT))
    embeddings = vocab * hidden * (1 if tied else 2)
    vision = _vision(doc, hidden)
    notes = () if vision is not None else ("vision tower not counted: vision_config gives no sizes",)
    text_params = embeddings + layers * attention.params_per_layer + mlp
    total = text_params + (vision or 0)
    active = embeddings + layers * attention.params_per_layer + mlp_active
    context = max_context(text, model_type)
    window, sliding = _sliding(text, layers, context)
    method, bits = _quantization(doc, text)
    if method and bits is None:
        bits, notes = 16.0, notes + (f"{method} weights counted at 16 bits: its config states none",)
    unquantised = embeddings + (vision or 0)
    per_weight = None if not method or bits is None else \
        round((unquantised * 2 + (total - unquantised) * bits / 8) / total, 3)
    return ConfigFacts(
        model_type=model_type, params_billion=total / 1e9,
        active_params_billion=active / 1e9 if active < total else None, layers=layers,
        attention_heads=attention.heads, kv_heads=attention.kv_heads, head_dim=attention.head_dim,
        hidden_size=hidden, vocab_size=vocab, max_context=context, sliding_window=window,
        sliding_window_layers=sliding, torch_dtype=_dtype(doc, text), quant_method=method, weight_bits=bits,
        bytes_per_weight=per_weight, approximations=notes)
