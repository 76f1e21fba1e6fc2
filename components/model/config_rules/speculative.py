"""A model's speculative decoding (models[].speculative) against the rest of its config: MTP only
where the checkpoint has MTP layers, a draft vLLM accepts beside its model, GPU pools only, no
level-2 sleep that would drop the draft, and room in each step for every sequence's proposals
where vLLM checks it (with LoRA adapters)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import placements
from ..specs import item_key
from ..specs.speculative import MTP_SHAPES
from ..speculative import DRAFTED, draft_mismatches, max_num_batched_tokens
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
        for problem in draft_mismatches(model):
            add(f"{key}.draft.shape", problem)
        if model.sleep_mode is not None and model.sleep_mode.level == 2 and spec.method in DRAFTED:
            # Level 2 discards the drafter's weights and the wake reloads the target's only
            # (v1/worker/gpu_worker.py:297-318): every wake would leave a drafter of garbage.
            add(f"{item_key('models', cfg.models, i)}.sleepMode.level",
                f"level 2 sleep discards the {spec.method} drafter's weights and the wake reloads only the model's, "
                "so speculation after a wake proposes garbage and runs slower than plain decoding; use level 1, "
                "or remove speculative (or use method ngram, which has no weights)")
    _per_node_pool(cfg, add)


def _per_node_pool(cfg: "StackConfig", add: Add) -> None:
    """Each node pool a speculative model runs on (its own, a dedicated tenant's)."""
    names, seen = {p.name for p in cfg.node_pools}, set[tuple[str, str]]()
    for model, pool_name, _tenant in placements(cfg):
        spec = model.speculative
        if spec is None or pool_name not in names:
            continue
        i = next(j for j, m in enumerate(cfg.models) if m.name == model.name)
        node_pool, prefix = cfg.pool(pool_name), item_key("models", cfg.models, i)
        problems: list[tuple[str, str]] = []
        if node_pool.is_tpu:
            # The TPU build (tpu-inference) is not shown to run vLLM's GPU speculators: refuse rather than guess.
            problems.append((f"{prefix}.speculative", f"node pool '{pool_name}' is a TPU pool and the TPU build of "
                             "vLLM is not checked to run speculative decoding here; serve it on a GPU pool, or "
                             "remove speculative"))
        elif model.adapters:
            # vLLM refuses LoRA with speculative decoding unless a step holds every sequence's k + 1
            # tokens (vllm/engine/arg_utils.py:2747-2761), against its own default where none is set.
            need = spec.num_speculative_tokens + 1
            for which in model.pool_names:
                pool = getattr(model, which)
                have = max_num_batched_tokens(model, pool, node_pool)
                if have < pool.max_num_seqs * need:
                    problems.append((f"{prefix}.{which}.maxNumBatchedTokens",
                                     f"with adapters and speculative decoding vLLM needs maxNumBatchedTokens of at least "
                                     f"maxNumSeqs x (numSpeculativeTokens + 1) = {pool.max_num_seqs * need}, and on "
                                     f"'{pool_name}' it is {have}{'' if pool.max_num_batched_tokens else ' (its default)'}"
                                     "; set it, or lower maxNumSeqs"))
        for where, problem in problems:
            if (where, problem) not in seen:
                seen.add((where, problem))
                add(where, problem)
