"""What speculative decoding (models[].speculative) buys each model, said in the plan: tokens/s of
one replica plain and speculative at the batch its pool runs, the $ a token scaled alike, the draft's
memory, and the batch from which it stops paying (the step turns compute-bound and the k + 1
scored tokens cost compute: components/model/speculative.py)."""

from __future__ import annotations

from ..components.model.capacity import pool_capacity
from ..components.model.specs import ModelSpec
from ..components.model.speculative import acceptance, break_even_batch, expected_tokens, pool_rates
from .config import StackConfig


def speculative_trade_offs(cfg: StackConfig) -> list[str]:
    """One line per speculative model and pool: the gain at its batch and where it ends."""
    return [line for m in cfg.models if m.speculative is not None for which in m.pool_names
            for line in _pool_line(cfg, m, which)]


def _pool_line(cfg: StackConfig, model: ModelSpec, which: str) -> list[str]:
    spec, pool, node_pool = model.speculative, getattr(model, which), cfg.pool(model.node_pool)
    if spec is None or node_pool.machine.accelerator is None:
        return []
    row = pool_capacity(model, which, pool, node_pool)
    batch = max(1, min(pool.max_num_seqs, row.seqs_fit))
    plain, fast = pool_rates(model, pool, node_pool, batch, row.hosts)
    a, k = acceptance(spec), spec.num_speculative_tokens
    stated = "stated" if spec.acceptance_rate is not None else "assumed: state acceptanceRate from vLLM's spec_decode metrics"
    head = (f"{model.name} {which}: speculative decoding ({spec.method}, {k} tokens a step, acceptance {a:.2f} "
            f"{stated}; {expected_tokens(a, k):.2f} tokens a step) at batch {batch}: {fast:,.0f} tokens/s a replica "
            f"against {plain:,.0f} plain, $ a token x{plain / fast:.2f}")
    memory = (f"; the draft takes {row.draft_per_gpu_gb:.2f} GB a GPU and its KV cache leaves {row.tokens_fit:,} "
              "tokens" if row.draft_per_gpu_gb else "")
    end = break_even_batch(model, pool, node_pool, row.hosts)
    if end is None:
        where = "; it pays at every batch up to 4096"
    elif end <= batch:
        where = (f"; it does NOT pay here: from batch {end} the verification step is compute-bound and the "
                 f"{k} extra tokens a sequence cost more than they save: lower numSpeculativeTokens or maxNumSeqs, "
                 "or remove speculative")
    else:
        where = (f"; it stops paying from batch {end} (compute-bound: the {k} extra tokens a sequence cost compute), "
                 f"above this pool's {batch}")
    return [head + memory + where]
