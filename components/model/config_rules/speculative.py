"""A model's speculative decoding (models[].speculative) against the rest of its config: MTP only
where the checkpoint has MTP layers, and room in each step for every sequence's proposals where
vLLM checks it (with LoRA adapters)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..specs import item_key
from ..specs.speculative import MTP_SHAPES
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def speculative_decoding(cfg: "StackConfig", add: Add) -> None:
    for i, model in enumerate(cfg.models):
        spec = model.speculative
        if spec is None:
            continue
        key = f"{item_key('models', cfg.models, i)}.speculative"
        if spec.method == "mtp" and isinstance(model.shape, str) and model.shape not in MTP_SHAPES:
            add(f"{key}.method", f"shape '{model.shape}' has no multi-token-prediction layers for mtp to read; "
                "use eagle3 or draft_model with a draft, or ngram")
        if not model.adapters:
            continue
        # vLLM refuses LoRA with speculative decoding unless a step holds every sequence's k + 1
        # tokens (vllm/engine/arg_utils.py:2747-2761).
        need = spec.num_speculative_tokens + 1
        for which in model.pool_names:
            pool = getattr(model, which)
            if (pool.max_num_batched_tokens or 0) < pool.max_num_seqs * need:
                add(f"{item_key('models', cfg.models, i)}.{which}.maxNumBatchedTokens",
                    f"with adapters and speculative decoding vLLM needs maxNumBatchedTokens of at least maxNumSeqs x "
                    f"(numSpeculativeTokens + 1) = {pool.max_num_seqs * need}; set it, or lower maxNumSeqs")
