"""Cost report per stack: node-hours x list price, monthly totals, $ per million tokens.

Baseline is what runs with every pool at its minReplicas (never below minNodes); peak is
every pool at maxReplicas (never above maxNodes: replicas beyond it stay pending, which the report
says). A spot pool with its on-demand fallback has an on-demand twin of the same maxNodes, so its
peak reaches up to twice maxNodes; it is priced at spot for the baseline, and the peak's nodes above
the baseline at the on-demand price: a burst is when spot capacity is likeliest to run out and the
twin takes the nodes (the worst case for the burst). Token cost is output tokens at baseline: every
serving pool's minReplicas at the roofline's tokens/s for its model, accelerator, batch and context
(components/model/throughput.py), or at a measured `cost.tokensPerSecondPerGpu` per device where the
stack gives one, at the configured utilisation. A Cloud Run model (cloudRun.models) is a pool of one-GPU
instances billed by the second while they run (instance-based billing): its warm minimum (minInstances)
counts in the baseline, min 0 nothing fixed, maxInstances the peak (components/model/cloud_run_capacity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..components.model import cloud_run_capacity as cloud_run
from ..components.model.capacity import gpu_slots_by_pool
from ..components.model.capacity_report import capacity_report
from ..components.model.disaggregation import prefill_capacity
from ..components.model.weights_backends import backend_of
from .pricing import (
    FILESTORE_GIB_MONTH,
    GCS_STANDARD_GB_MONTH,
    GKE_CLUSTER_FEE_HOUR,
    MACHINE_PRICES,
    PRICES_AS_OF,
)

if TYPE_CHECKING:
    from ..components.model.specs.cloud_run import CloudRunModelSpec
    from .config import StackConfig


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
    # The price a node above the baseline is charged at: on-demand where a spot pool falls back to it.
    peak_hour_price: float = 0.0
    # Nodes every pool at maxReplicas would need (above the pool's reach: the peak is capped).
    wanted_peak_nodes: int = 0
    # The most nodes the pool can have: maxNodes, twice that with an on-demand twin.
    reach_nodes: int = 0
    on_demand_twin: bool = False

    @property
    def baseline_month(self) -> float:
        return self.baseline_nodes * self.hour_price * self.hours_per_month

    @property
    def peak_month(self) -> float:
        burst = self.peak_nodes - self.baseline_nodes
        return (self.baseline_month
                + burst * (self.peak_hour_price or self.hour_price) * self.hours_per_month)

    @property
    def capped(self) -> bool:
        return self.wanted_peak_nodes > self.peak_nodes


@dataclass(frozen=True)
class ReplicaCost:
    """One replica of a serving pool as the stack runs it: its devices' share of its node pool's
    machines (a multi-host group, every host), at the pool's price (spot where spot), and the output
    tokens it makes a second. The cost report's tokens a second (and so its $ per million tokens),
    the tenants' ceilings and the options table's `this stack` rows all read these."""

    model: str
    pool: str  # short | long | prefill (models[].disaggregation: no output tokens)
    node_pool: str
    machine_type: str
    gpu_partition_size: str | None
    spot: bool
    devices: int
    hosts: int
    batch: int
    tokens_per_second: float
    usd_per_hour: float
    min_replicas: int
    max_replicas: int
    tenant: str | None = None
    canary: bool = False
    # What a replica above the baseline costs an hour: on-demand where a spot pool bursts onto its
    # on-demand twin (as the cost report prices the peak's nodes), else usd_per_hour.
    burst_usd_per_hour: float = 0.0

    @property
    def peak_usd_per_hour(self) -> float:
        """Every replica of the pool at maxReplicas, the ones above the floor at the burst price."""
        return (self.min_replicas * self.usd_per_hour
                + (self.max_replicas - self.min_replicas) * (self.burst_usd_per_hour or self.usd_per_hour))

    def usd_per_million_tokens(self, utilization: float) -> float:
        rate = self.tokens_per_second * utilization * 3600
        return self.usd_per_hour / rate * 1e6 if rate else math.inf


@dataclass(frozen=True)
class CostReport:
    stack: str
    prices_as_of: str
    pools: list[PoolCost]
    fixed_month: dict[str, float]  # system pool, cluster fee, Filestore
    # Output tokens a second all baseline replicas serve at full batch.
    baseline_tokens_per_second: float
    utilization: float
    hours_per_month: float
    # "roofline" (estimated per pool) or "measured" (cost.tokensPerSecondPerGpu x devices).
    throughput_source: str = "roofline"
    # Every serving pool's replica, as priced and counted above.
    replicas: tuple[ReplicaCost, ...] = ()

    @property
    def peak_tokens_per_second(self) -> float:
        """Output tokens a second with every serving pool at maxReplicas (a capped pool counted whole)."""
        return sum(r.tokens_per_second * r.max_replicas for r in self.replicas)

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
        return self.baseline_tokens_per_second * self.utilization * 3600 * self.hours_per_month

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
        wanted = max(baseline, math.ceil(high.get(pool.name, 0) / per_node))
        # The twin (components/gpu_cluster.py) has the pool's maxNodes of its own.
        reach = pool.max_nodes * (2 if pool.has_fallback_pool else 1)
        peak = min(reach, wanted)
        pools.append(PoolCost(pool.name, pool.machine_type, pool.spot,
                              price.spot_hour if pool.spot else price.on_demand_hour,
                              baseline, peak, pool.machine.gpus, hours,
                              peak_hour_price=price.on_demand_hour if pool.has_fallback_pool
                              else (price.spot_hour if pool.spot else price.on_demand_hour),
                              wanted_peak_nodes=wanted, reach_nodes=reach,
                              on_demand_twin=pool.has_fallback_pool))
    system = MACHINE_PRICES[cfg.cluster.system_machine_type].on_demand_hour * cfg.cluster.system_nodes * hours
    fixed = {"system pool": system, "GKE cluster fee": GKE_CLUSTER_FEE_HOUR * hours,
             **({f"Cloud Storage bucket {filestore_gb} GB": GCS_STANDARD_GB_MONTH * filestore_gb}
                if not backend_of(cfg.weights).has_filestore_share else
                {f"Filestore {filestore_tier} {filestore_gb} GiB": FILESTORE_GIB_MONTH[filestore_tier] * filestore_gb})}
    pools += [cloud_run_pool(m, hours) for m in cfg.cloud_run_models]
    replicas = replica_costs(cfg) + [cloud_run_replica(m) for m in cfg.cloud_run_models]
    tps = sum(r.tokens_per_second * r.min_replicas for r in replicas)
    return CostReport(cfg.environment, PRICES_AS_OF, pools, fixed, tps, cfg.cost.target_utilization, hours,
                      throughput_source="measured" if cfg.cost.tokens_per_second_per_gpu is not None else "roofline",
                      replicas=tuple(replicas))


def replica_costs(cfg: "StackConfig") -> list[ReplicaCost]:
    """Each serving pool's replica (capacity_report's rows): its slots' share of the node's price and
    its tokens a second, the roofline's or `cost.tokensPerSecondPerGpu` per physical device."""
    measured = cfg.cost.tokens_per_second_per_gpu
    out = []
    for r in [*capacity_report(cfg), *prefill_capacity(cfg)]:  # models[].disaggregation: prefill rows too
        pool = cfg.pool(r.node_pool)
        price = MACHINE_PRICES[pool.machine_type]
        # Per physical GPU or chip: a MIG slice gets its share. A prefill replica makes no output tokens.
        tps = r.devices * measured / _units_per_device(cfg, r.node_pool) if measured is not None else r.decode_tokens_s
        tps = 0.0 if r.pool == "prefill" else tps
        out.append(ReplicaCost(
            r.model, r.pool, r.node_pool, pool.machine_type, pool.gpu_partition_size, pool.spot, r.devices, r.hosts,
            min(r.max_num_seqs, r.seqs_fit), tps,
            (price.spot_hour if pool.spot else price.on_demand_hour) * r.devices / pool.slices_per_node,
            r.min_replicas, r.max_replicas, r.tenant, r.canary,
            (price.on_demand_hour if pool.has_fallback_pool else (price.spot_hour if pool.spot else price.on_demand_hour))
            * r.devices / pool.slices_per_node))
    return out


def cloud_run_pool(m: "CloudRunModelSpec", hours: float) -> PoolCost:
    """A Cloud Run model's instances as a pool of one-GPU nodes billed by the second (instance-based):
    a warm minimum (minInstances) is the baseline, min 0 counts nothing fixed; maxInstances the peak."""
    hour = cloud_run.instance_usd_per_hour(m)
    # What the instance is billed for: the server's and the metrics sidecar's vCPUs and memory.
    machine = f"Cloud Run {m.gpu}, {cloud_run.billed_cpu(m):g} vCPU, {cloud_run.billed_memory_gib(m):g} GiB"
    return PoolCost(cloud_run_name(m), machine, False, hour, m.min_instances, m.max_instances, 1, hours, peak_hour_price=hour,
                    wanted_peak_nodes=m.max_instances, reach_nodes=m.max_instances)


def cloud_run_replica(m: "CloudRunModelSpec") -> ReplicaCost:
    """One Cloud Run instance as a replica: the roofline's tokens/s on its GPU, its price by the second."""
    row = cloud_run.instance_capacity(m)
    hour = cloud_run.instance_usd_per_hour(m)
    return ReplicaCost(m.name, "short", cloud_run_name(m), f"cloud-run-{m.gpu}", None, False, 1, 1,
                       cloud_run.batch(m), row.decode_tokens_s, hour, m.min_instances, m.max_instances,
                       burst_usd_per_hour=hour)


def cloud_run_name(m: "CloudRunModelSpec") -> str:
    """The cost report's item (and its replica's node_pool) for a Cloud Run model: no GKE pool has it."""
    return f"{cloud_run.CLOUD_RUN_POOL}/{m.name}"


def prefill_share(r: ReplicaCost, replicas: tuple[ReplicaCost, ...]) -> float:
    """$ an hour of its model's prefill pool a decode (short) replica carries, both pools at their floors
    (models[].disaggregation; 0 for any other row): the options table's 'this stack' price includes it."""
    if r.pool != "short":
        return 0.0
    prefill = [p for p in replicas if (p.model, p.pool, p.tenant, p.canary) == (r.model, "prefill", r.tenant, r.canary)]
    return sum(p.usd_per_hour * p.min_replicas for p in prefill) / max(1, r.min_replicas)


def _units_per_device(cfg: "StackConfig", node_pool: str) -> int:
    pool = cfg.pool(node_pool)
    acc = pool.machine.accelerator
    return acc.slices_per_gpu(pool.gpu_partition_size) if acc else 1
