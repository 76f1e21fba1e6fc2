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
        reach = r.host_kv_tokens - r.tokens_fit
        lines.append(
            f"{label}: host KV tier {tier.size_gib:g} GiB a replica ({model.kv_offload.backend if model.kv_offload else ''}; "
            f"{tier.pod_gib:g} GiB a pod on {pool.machine_type} beside the server's estimated {tier.need_gib:.0f} GiB, "
            f"pinned in its memory: {tier.server_gib} -> {tier.server_gib + math.ceil(tier.pod_gib)} GiB) holds "
            f"{r.host_kv_tokens:,} tokens; vLLM copies each new block there as it is computed, so it mirrors the GPU's "
            f"{r.tokens_fit:,} and adds {reach:,} tokens of prefix reach (older prefixes load back instead of being "
            f"recomputed); the running batch stays {min(r.seqs_fit, r.max_num_seqs)} (vLLM runs only sequences whose "
            f"blocks are on the GPU). $0 more: the node's own memory. LMCache instead for KV shared across "
            f"replicas, disk or remote tiers, prefill/decode ({GUIDE}).")
        if reach <= 0:
            lines.append(f"warning: {label}: the host tier is no larger than the GPU's KV cache, so it adds no prefix "
                         "reach: preemption recovery only; raise kvOffload.sizeGb or remove it")
    return lines
