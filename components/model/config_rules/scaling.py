"""Scale to zero against the time a replica takes to wake."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import placements
from ..cold_start import NODE_PROVISION_S, cold_start_seconds
from ..specs import ModelSpec
from ..specs.base import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def wake_seconds(cfg: "StackConfig", model: ModelSpec, node_pool_name: str) -> int:
    """From KEDA's scale-up at zero to a replica serving: a GPU node, then the replica's cold start."""
    return int(NODE_PROVISION_S + cold_start_seconds(cfg, model, cfg.pool(node_pool_name)))


def cooldown_covers_wake(cfg: "StackConfig", add: Add) -> None:
    """KEDA counts a pool's cooldown from its last active time, which the scale-up from zero sets
    and only an active trigger moves after (kedacore/keda v2.20.2
    pkg/scaling/executor/scale_scaledobjects.go:78-80,212-213,285-286). A waking replica has no
    vLLM metric and, once clients stop retrying, the standby counts nothing: a cooldown shorter
    than the wake scales the loading replica back to zero and the pool never serves."""
    need_by_model = wake_needed(cfg)
    for index, model in enumerate(cfg.models):
        for which in model.pool_names:
            pool = getattr(model, which)
            need = need_by_model.get(model.name, 0)
            if pool.min_replicas == 0 and pool.cooldown_seconds < need:
                add(f"{item_key('models', cfg.models, index)}.{which}.cooldownSeconds",
                    f"is {pool.cooldown_seconds}, but waking this pool from zero takes about {need} s (an accelerator "
                    f"node {NODE_PROVISION_S:.0f} s, then the replica's cold start): KEDA would scale the loading "
                    f"replica back to zero before it serves; set it to {need} or more (or minReplicas 1)")


def wake_needed(cfg: "StackConfig") -> dict[str, int]:
    """Each model's slowest wake over every node pool it runs on (shared, dedicated, canary)."""
    out: dict[str, int] = {}
    known = {p.name for p in cfg.node_pools}
    for model, node_pool_name, _tenant in placements(cfg):
        if node_pool_name not in known:
            continue  # reported as an unknown nodePool
        out[model.name] = max(out.get(model.name, 0), wake_seconds(cfg, model, node_pool_name))
    return out
