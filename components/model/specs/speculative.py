"""Speculative decoding of a model (models[].speculative): what proposes the tokens its replicas
verify, how many a step, and the acceptance rate the plan's decode rate is scaled by. The
methods are those of vLLM 0.34's --speculative-config that serve here (its SpeculativeMethod,
vllm/config/speculative.py:90-97); the draft's weights are loaded onto the share like the model's."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from ..catalog import MODEL_SHAPES, ModelShape
from .base import Revision, Spec, WeightsSource, config_mapping

# The methods served, and what proposes the tokens: the prompt's own n-grams (no weights), a
# smaller model of the same tokenizer, an EAGLE or EAGLE-3 head reading the model's hidden
# states, or the model's own multi-token-prediction layers (DeepSeek-V3 and the like).
SpeculativeMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]
DRAFTED_METHODS = ("draft_model", "eagle", "eagle3")
# Catalog shapes whose checkpoints carry MTP layers (vLLM's MTPModelTypes, speculative.py:53-83).
MTP_SHAPES = ("deepseek-v3",)
# Each catalog shape's vocabulary (its config.json's vocab_size): a draft_model must have the
# target's (vLLM refuses another, config/speculative.py:1723-1735).
VOCAB_SIZES = {"llama-3-8b": 128256, "llama-3-70b": 128256, "llama-3.1-405b": 128256, "qwen2.5-1.5b": 151936,
               "qwen2.5-7b": 152064, "qwen2.5-72b": 152064, "mistral-7b": 32768, "deepseek-v3": 129280}


class DraftShape(Spec):
    """A draft's architecture, as its config.json gives it (an EAGLE head: its one or few layers)."""

    # Parameters, in billions (an EAGLE head's own: its layer(s), fusion and lm_head).
    params_billion: float = Field(gt=0)
    # Transformer layers (num_hidden_layers).
    layers: int = Field(gt=0)
    # Key/value heads (num_key_value_heads).
    kv_heads: int = Field(gt=0)
    # Dimension of one attention head (head_dim, else hidden_size / num_attention_heads).
    head_dim: int = Field(gt=0)
    # Query heads (num_attention_heads): the draft's tensor parallelism (the model's) must divide them,
    # as vLLM checks (config/model.py:1577-1583). Required for draft_model.
    attention_heads: Optional[int] = Field(default=None, gt=0)
    # Its vocabulary (vocab_size): a draft_model's must be the model's (config/speculative.py:1723-1735).
    # Required for draft_model.
    vocab_size: Optional[int] = Field(default=None, gt=0)


class DraftSpec(Spec):
    """The draft model or EAGLE head, copied onto the share beside the model by its own loader Job;
    the servers read it from there (never from the hub) once its ready marker is written."""

    # hf://org/repo or gs://bucket/prefix
    source: WeightsSource
    # Git branch, tag or commit of the source.
    revision: Revision = "main"
    # Its architecture: a catalog name (as models[].shape) or {paramsBillion, layers, kvHeads, headDim,
    # attentionHeads, vocabSize}.
    shape: str | DraftShape
    # Bytes each parameter takes in its checkpoint (vLLM loads a draft unquantised unless its
    # checkpoint says otherwise: 2 for bfloat16).
    bytes_per_weight: float = Field(default=2.0, gt=0, le=4)
    # GiB its files take on disk (default: paramsBillion x bytesPerWeight).
    disk_gb: Optional[float] = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _custom_shape(cls, data: Any) -> Any:
        """`customShape` is the structured form of `shape`, as the component package names it (its
        schema has no unions), as for models[].customShape."""
        if config_mapping(data) and ("customShape" in data or "custom_shape" in data):
            data = dict(data)
            custom = data.pop("customShape", None) or data.pop("custom_shape", None)
            if data.get("shape") is not None:
                raise ValueError("give shape (a catalog name) or customShape ({paramsBillion, layers, kvHeads, "
                                 "headDim}), not both")
            data["shape"] = custom
        return data

    @model_validator(mode="after")
    def _known_shape(self) -> "DraftSpec":
        if isinstance(self.shape, str) and self.shape not in MODEL_SHAPES:
            raise ValueError(f"unknown draft shape '{self.shape}'; use one of {', '.join(MODEL_SHAPES)} or give "
                             "{paramsBillion, layers, kvHeads, headDim} from the draft's config.json")
        return self

    @property
    def model_shape(self) -> ModelShape:
        if isinstance(self.shape, str):
            return MODEL_SHAPES[self.shape]
        return ModelShape(self.shape.params_billion, self.shape.layers, self.shape.kv_heads, self.shape.head_dim,
                          attention_heads=self.shape.attention_heads)

    @property
    def vocab_size(self) -> Optional[int]:
        return VOCAB_SIZES.get(self.shape) if isinstance(self.shape, str) else self.shape.vocab_size

    @property
    def params_billion(self) -> float:
        return self.model_shape.params_billion


class SpeculativeSpec(Spec):
    """Speculative decoding: each step proposes numSpeculativeTokens tokens and the model verifies
    them together, keeping the accepted prefix and one token of its own."""

    # What proposes the tokens: ngram (prompt lookup, no weights), draft_model (a smaller model of the
    # same tokenizer), eagle or eagle3 (a head reading the model's hidden states), mtp (the model's own
    # multi-token-prediction layers; DeepSeek-V3 and custom shapes whose checkpoint has them).
    method: SpeculativeMethod
    # Tokens proposed per step (vLLM's num_speculative_tokens, k).
    num_speculative_tokens: int = Field(default=3, ge=1, le=16)
    # ngram: the longest n-gram of the recent tokens looked up in the prompt (vLLM's prompt_lookup_max;
    # unset: promptLookupMin, else 5, vLLM's default).
    prompt_lookup_max: Optional[int] = Field(default=None, ge=1, le=64)
    # ngram: the shortest n-gram looked up (vLLM's prompt_lookup_min; unset: promptLookupMax, else 5).
    prompt_lookup_min: Optional[int] = Field(default=None, ge=1, le=64)
    # draft_model, eagle, eagle3: the draft's weights and shape (required for them, refused otherwise).
    draft: Optional[DraftSpec] = None
    # Tokens each verification step yields a sequence, the bonus token included, as vLLM measures it
    # on your traffic at this numSpeculativeTokens: 1 + rate(vllm:spec_decode_num_accepted_tokens_total)
    # / rate(vllm:spec_decode_num_drafts_total) (its mean acceptance length, v1/spec_decode/metrics.py:
    # 177-195); above 1, below numSpeculativeTokens + 1. The plan solves it for the per-token acceptance
    # a of (1 - a^(k+1)) / (1 - a). Unset: the method's assumed a (ngram 0.3, draft_model 0.6, eagle
    # 0.6, eagle3 0.7, mtp 0.8); the plan says which it used. For ngram vLLM counts only the steps where
    # an n-gram matched (v1/core/sched/scheduler.py:3447): state the yield over every step instead,
    # rate(vllm:generation_tokens_total) / (that rate - rate(vllm:spec_decode_num_accepted_tokens_total)).
    mean_acceptance_length: Optional[float] = Field(default=None, gt=1)

    @model_validator(mode="after")
    def _method_inputs(self) -> "SpeculativeSpec":
        drafted = self.method in DRAFTED_METHODS
        if drafted and self.draft is None:
            raise ValueError(f"method {self.method} needs draft: {{source, shape}} (the draft's weights are loaded "
                             "onto the share like the model's)")
        if not drafted and self.draft is not None:
            why = "proposes from the prompt" if self.method == "ngram" else "reads the model's own MTP layers"
            raise ValueError(f"method {self.method} {why}: remove draft, or use draft_model, eagle or eagle3")
        lookup = self.prompt_lookup_max is not None or self.prompt_lookup_min is not None
        if lookup and self.method != "ngram":
            raise ValueError("promptLookupMax and promptLookupMin apply to method ngram only; remove them")
        if self.method == "draft_model" and self.draft is not None and not isinstance(self.draft.shape, str):
            missing = [k for k, v in (("attentionHeads", self.draft.shape.attention_heads),
                                      ("vocabSize", self.draft.shape.vocab_size)) if v is None]
            if missing:
                raise ValueError(f"draft.shape needs {' and '.join(missing)} for draft_model (its config.json's "
                                 "num_attention_heads, vocab_size): vLLM checks them against the model")
        length, k = self.mean_acceptance_length, self.num_speculative_tokens
        if length is not None and length >= k + 1:
            raise ValueError(f"meanAcceptanceLength ({length:g}) must be below numSpeculativeTokens + 1 ({k + 1}), "
                             "the most a step yields: measure it at this numSpeculativeTokens")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"promptLookupMin ({low}) is above promptLookupMax ({high}); vLLM refuses it "
                             "(v1/worker/gpu/spec_decode/ngram/config.py:33-37)")
        return self
