"""Cost report per stack: node-hours x list price, monthly totals, $ per million tokens.

Baseline is what runs with every pool at its minReplicas (never below minNodes); peak is
every pool at maxReplicas (never above maxNodes). Token cost assumes the configured
tokens/s per physical GPU at the configured utilisation, at baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_gke.components.capacity import gpu_slots_by_pool
from vllm_gke.infra.pricing import (
    FILESTORE_GIB_MONTH, GCS_STANDARD_GB_MONTH, GKE_CLUSTER_FEE_HOUR, MACHINE_PRICES, PRICES_AS_OF,
)

if TYPE_CHECKING:
    from vllm_gke.infra.config import StackConfig


@dataclass(frozen=True)
class PoolCost:
    pool: str
    machine_type: str
    spot: bool
    hour_price: float
    baseline_nodes: int
    peak_nodes: int
    gpus_per_node: int
    hours_per_month: float

    @property
    def baseline_month(self) -> float:
        return self.baseline_nodes * self.hour_price * self.hours_per_month

    @property
    def peak_month(self) -> float:
        return self.peak_nodes * self.hour_price * self.hours_per_month


@dataclass(frozen=True)
class CostReport:
    stack: str
    prices_as_of: str
    pools: list[PoolCost]
    fixed_month: dict[str, float]  # system pool, cluster fee, Filestore
    tokens_per_second_per_gpu: float
    utilization: float
    hours_per_month: float

    @property
    def baseline_month(self) -> float:
        return sum(p.baseline_month for p in self.pools) + sum(self.fixed_month.values())

    @property
    def peak_month(self) -> float:
        return sum(p.peak_month for p in self.pools) + sum(self.fixed_month.values())

    @property
    def baseline_gpus(self) -> int:
        return sum(p.baseline_nodes * p.gpus_per_node for p in self.pools)

    @property
    def tokens_per_month(self) -> float:
        tps = self.baseline_gpus * self.tokens_per_second_per_gpu * self.utilization
        return tps * 3600 * self.hours_per_month

    @property
    def usd_per_million_tokens(self) -> float:
        return self.baseline_month / (self.tokens_per_month / 1e6) if self.tokens_per_month else math.inf


def cost_report(cfg: "StackConfig", filestore_tier: str, filestore_gb: int) -> CostReport:
    hours = cfg.cost.hours_per_month
    low, high = gpu_slots_by_pool(cfg, "min"), gpu_slots_by_pool(cfg, "max")
    pools = []
    for pool in cfg.node_pools:
        per_node = pool.slices_per_node
        price = MACHINE_PRICES[pool.machine_type]
        baseline = max(pool.min_nodes, math.ceil(low.get(pool.name, 0) / per_node))
        peak = min(pool.max_nodes, max(baseline, math.ceil(high.get(pool.name, 0) / per_node)))
        pools.append(PoolCost(pool.name, pool.machine_type, pool.spot,
                              price.spot_hour if pool.spot else price.on_demand_hour,
                              baseline, peak, pool.machine.gpus, hours))
    system = MACHINE_PRICES[cfg.cluster.system_machine_type].on_demand_hour * cfg.cluster.system_nodes * hours
    fixed = {"system pool": system, "GKE cluster fee": GKE_CLUSTER_FEE_HOUR * hours,
             **({f"Cloud Storage bucket {filestore_gb} GB": GCS_STANDARD_GB_MONTH * filestore_gb}
                if filestore_tier in ("gcs", "hyperdisk-ml") else
                {f"Filestore {filestore_tier} {filestore_gb} GiB": FILESTORE_GIB_MONTH[filestore_tier] * filestore_gb})}
    return CostReport(cfg.environment, PRICES_AS_OF, pools, fixed, cfg.cost.tokens_per_second_per_gpu,
                      cfg.cost.target_utilization, hours)
