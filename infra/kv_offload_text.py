"""The plan's note on each host KV tier (models[].kvOffload): what it holds, what it does and does
not do for the pool, what it costs, and where LMCache is the better choice."""

from __future__ import annotations

import math

from ..components.model.kv_offload import host_tier
from ..components.model.stack_config import StackConfig
from .report import Verdicts

GUIDE = "docs/guides/kv-offload.md"


def offload_lines(cfg: StackConfig, v: Verdicts) -> list[str]:
    """One line per model, tenant and node pool with a host tier (its first pool's figures)."""
    models = {m.name: m for m in cfg.models}
    lines: list[str] = []
    seen: set[tuple[str, str | None, str]] = set()
    for r in v.capacity:
        model = models.get(r.model)
        if not r.host_kv_tokens or r.canary or model is None or (r.model, r.tenant, r.node_pool) in seen:
            continue
        seen.add((r.model, r.tenant, r.node_pool))
        pool = cfg.pool(r.node_pool)
        tier = host_tier(model, pool)
        assert tier is not None
        label = r.model + (f" ({r.tenant})" if r.tenant else "")
        preempts = r.seqs_fit < r.max_num_seqs
        where = ("a sequence preempted at this context loads back instead of being recomputed" if preempts else
                 f"the GPU already holds maxNumSeqs {r.max_num_seqs} at {r.context_tokens:,} tokens, so it pays "
                 f"only for prompts that share prefixes beyond the GPU's {r.tokens_fit:,} tokens")
        lines.append(
            f"{label}: host KV tier {tier.size_gib:g} GiB a replica ({model.kv_offload.backend if model.kv_offload else ''}; "
            f"{tier.pod_gib:g} of the {tier.free_per_pod_gib:.0f} GiB each pod has left on {pool.machine_type}, pinned "
            f"in the server's memory: {tier.server_gib} -> {tier.server_gib + math.ceil(tier.pod_gib)} GiB) holds "
            f"{r.host_kv_tokens:,} tokens "
            f"({r.host_kv_tokens // r.context_tokens} sequences of {r.context_tokens:,}); prefixes evicted from the GPU "
            f"load back; the running batch stays {min(r.seqs_fit, r.max_num_seqs)} (vLLM runs only sequences whose "
            f"blocks are on the GPU); {where}. $0 more: the node's own memory. LMCache instead for KV shared across "
            f"replicas, disk or remote tiers, prefill/decode ({GUIDE}).")
    return lines
