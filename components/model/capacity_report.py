"""The plan's capacity table: every serving pool's fit, throughput and cold start (capacity.py
and cold_start.py, which reads capacity's placements, meet here)."""

from __future__ import annotations

from dataclasses import replace

from .capacity import PoolCapacity, placements, pool_capacity
from .cold_start import cold_start_seconds
from .kv_offload import with_host_tier
from .stack_config import StackConfig


def capacity_report(cfg: "StackConfig") -> list[PoolCapacity]:
    """One row per serving pool the stack declares, shared and dedicated."""
    pools = {p.name: p for p in cfg.node_pools}
    return [with_host_tier(replace(pool_capacity(model, which, getattr(model, which), pools[pool_name], tenant),
                                   canary=model.revision != cfg.model(model.name).revision,
                                   cold_start_s=cold_start_seconds(cfg, model, pools[pool_name])),
                           model, pools[pool_name])
            for model, pool_name, tenant in placements(cfg) for which in model.pool_names]
