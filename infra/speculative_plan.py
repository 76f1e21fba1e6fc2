"""What speculative decoding (models[].speculative) buys each model, said in the plan: tokens/s of
one replica plain and, at most, speculative at the batch its pool runs, the $ a token scaled alike,
the draft's memory, and the batch from which it stops paying (the step turns compute-bound and the
k + 1 scored tokens cost compute: components/model/speculative.py). The speculative rate is the
roofline's upper bound: it counts no drafting launches, rejection sampling or scheduling, and the
measured gains at batch 64 are far smaller (MEASURED)."""

from __future__ import annotations

from ..components.model.capacity import pool_capacity
from ..components.model.specs import ModelSpec
from ..components.model.speculative import acceptance, break_even_batch, expected_tokens, pool_rates
from .config import StackConfig

# What batches of 64 and more measure, against which the roofline's gain is a ceiling: EAGLE-3 on
# Llama 3.1 8B, one H100, SGLang: 1.38x at batch 64 (Li et al., arXiv:2503.01840, abstract); EAGLE-3
# on gpt-oss-120b, vLLM: +10-21% over concurrencies up to 200 requests (Red Hat Developer, 2026-04-16).
MEASURED = "measured: 1.38x at batch 64 (EAGLE-3, SGLang) and 1.10-1.21x up to 200 concurrent requests (EAGLE-3, vLLM)"
# vLLM counts a step in its acceptance metrics only where something was drafted (v1/core/sched/scheduler.py:3447):
# an n-gram step that found no match yields one token and is not counted, so its mean length overstates the yield.
NGRAM_LENGTH = ("; for ngram state the length over every step, rate(vllm:generation_tokens_total) / "
                "(rate(vllm:generation_tokens_total) - rate(vllm:spec_decode_num_accepted_tokens_total)): vLLM's "
                "mean acceptance length counts only the steps where an n-gram matched")


def speculative_lines(cfg: StackConfig) -> list[str]:
    """One line per speculative model and pool: the gain at its batch and where it ends (the plan's
    speculative section)."""
    return [line for m in cfg.models if m.speculative is not None for which in m.pool_names
            for line in _pool_line(cfg, m, which)]


def speculative_trade_offs(cfg: StackConfig) -> list[str]:
    """The plan's warnings: the pools where speculation does not pay at the batch they run."""
    return [line for line in speculative_lines(cfg) if "does NOT pay" in line]


def _pool_line(cfg: StackConfig, model: ModelSpec, which: str) -> list[str]:
    spec, pool, node_pool = model.speculative, getattr(model, which), cfg.pool(model.node_pool)
    if spec is None or node_pool.machine.accelerator is None:
        return []
    row = pool_capacity(model, which, pool, node_pool)
    batch = max(1, min(pool.max_num_seqs, row.seqs_fit))
    plain, fast = pool_rates(model, pool, node_pool, batch, row.hosts)
    a, k = acceptance(spec), spec.num_speculative_tokens
    length = expected_tokens(a, k)
    stated = (f"mean acceptance length {length:.2f} stated, per-token a {a:.2f}" if spec.mean_acceptance_length
              else f"per-token a {a:.2f} assumed, {length:.2f} tokens a step: state meanAcceptanceLength "
                   "(1 + accepted / drafts, from vLLM's spec_decode metrics)")
    head = (f"{model.name} {which}: speculative decoding ({spec.method}, {k} tokens a step, {stated}) at batch "
            f"{batch}: at most {fast:,.0f} tokens/s a replica against {plain:,.0f} plain, $ a token x{plain / fast:.2f} "
            f"at best (the roofline's bound, no drafting or sampling overhead; {MEASURED})")
    memory = (f"; the draft takes {row.draft_per_gpu_gb:.2f} GB a GPU and its KV cache leaves {row.tokens_fit:,} "
              "tokens" if row.draft_per_gpu_gb else "")
    end = break_even_batch(model, pool, node_pool, row.hosts)
    if end is not None and end <= batch:
        where = (f"; it does NOT pay here: from batch {end} the verification step is compute-bound and the "
                 f"{k} extra tokens a sequence cost more than they save: lower numSpeculativeTokens or maxNumSeqs, "
                 "or remove speculative")
    else:
        where = f"; by the roofline it pays at every batch this replica holds (up to {batch})"
    return [head + memory + where + (NGRAM_LENGTH if spec.method == "ngram" else "")]
