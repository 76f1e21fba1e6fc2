"""models[].kvOffload against where the model runs: a backend vLLM 0.34 can run there, and a host
tier that fits the node's memory beside the other replicas (components/model/kv_offload.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import placements
from ..kv_offload import offload_problems
from ..specs import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def kv_offload(cfg: "StackConfig", add: Add) -> None:
    """Each node pool a model with kvOffload runs on (its own, a dedicated tenant's): one report per
    key and problem."""
    names = {p.name for p in cfg.node_pools}
    seen: set[tuple[str, str]] = set()
    for model, pool, _tenant in placements(cfg):
        if model.kv_offload is None or pool not in names:
            continue
        i = next(j for j, m in enumerate(cfg.models) if m.name == model.name)
        for key, problem in offload_problems(model, cfg.pool(pool)):
            where = f"{item_key('models', cfg.models, i)}.kvOffload.{key}"
            if (where, problem) not in seen:
                seen.add((where, problem))
                add(where, problem)
