"""The plan's Cloud Run lines (vllm-gke:cloudRun): per model, what one instance holds and serves, the
concurrency and startup probe the service gets, the cold start by part, the price by the second with
and without GPU zonal redundancy, a warm minimum's month, and the busy hours a day from which a GKE
node pool serving the same traffic is cheaper (components/model/cloud_run_capacity.py)."""

from __future__ import annotations

from typing import Optional

from ..components.model import cloud_run_capacity as cloud_run
from ..components.model.machine_prices import MACHINE_PRICES
from ..components.model.specs.cloud_run import CloudRunModelSpec
from .config import StackConfig

GUIDE = "docs/guides/cloud-run.md"
# The bursts a day the break-even assumes at min 0: each pays a cold start and an idle tail.
BURSTS_PER_DAY = 3


def cloud_run_lines(cfg: StackConfig) -> list[str]:
    """The plan's Cloud Run section: one paragraph a model."""
    return [line for m in cfg.cloud_run_models for line in _model_lines(cfg, m)]


def _model_lines(cfg: StackConfig, m: CloudRunModelSpec) -> list[str]:
    row = cloud_run.instance_capacity(m)
    if not row.fits:
        return [f"{m.name} on Cloud Run ({m.gpu}): does not fit: {row.problem}; {row.fix()}"]
    start = cloud_run.cold_start(m)
    probe = cloud_run.startup_probe(m)
    lines = [
        f"{m.name} on Cloud Run ({m.gpu}, {cfg.cloud_run_region(m)}): one instance decodes {cloud_run.batch(m)} "
        f"sequences at ~{row.decode_tokens_s:,.0f} tokens/s (the roofline's); concurrency {cloud_run.concurrency(m)}"
        f"{' (set)' if m.concurrency else ' (its batch)'}; cold start ~{start.total_s:,.0f} s: instance "
        f"{start.instance_s:.0f} s (documented) + image {start.image_s:.0f} s + weights {start.weights_s:.0f} s through "
        f"the Cloud Storage volume + vLLM load and CUDA graphs {start.engine_s:.0f} s (estimates, not measured); "
        f"startup probe waits {cloud_run.probe_window_seconds(probe)} s ({probe['initial_delay_seconds']} s initial "
        f"delay, {probe['failure_threshold']} probes {probe['period_seconds']} s apart; a service's most is "
        f"{cloud_run.STARTUP_PROBE_LIMIT_S} s).",
        _price_line(cfg, m),
        _break_even_line(cfg, m),
    ]
    if (problem := cloud_run.startup_problem(m)) is not None:
        lines.append(problem)
    return lines


def _price_line(cfg: StackConfig, m: CloudRunModelSpec) -> str:
    region = cfg.cloud_run_region(m)
    tier = cloud_run.price_tier(region)
    tier_note = ("" if tier == 1 else f"; {region} is a Tier 2 region, whose prices are not pinned: these are Tier 1's "
                 "and understate it")
    plain, zonal = cloud_run.instance_usd_per_hour(m, False), cloud_run.instance_usd_per_hour(m, True)
    warm = cloud_run.warm_minimum_month(m, cfg.cost.hours_per_month)
    floor = (f"a warm minimum of {m.min_instances} costs ${warm:,.0f} a month idle or not" if m.min_instances
             else "min 0: nothing fixed, each burst's first request waits for the cold start")
    return (f"{m.name}: an instance costs ${plain:.3f}/h without GPU zonal redundancy, ${zonal:.3f}/h with it "
            f"({'on' if m.gpu_zonal_redundancy else 'off'} here), billed by the second from its start to its shutdown "
            f"(instance-based billing, {cloud_run.PRICING_URL} as of {cloud_run.PRICES_AS_OF}{tier_note}); {floor}.")


def node_pools_with(cfg: StackConfig, gpu: str) -> list[tuple[str, float]]:
    """(node pool, $ an hour a GPU at its price: spot where spot) of the stack's GKE pools with this GPU."""
    out: list[tuple[str, float]] = []
    for pool in cfg.node_pools:
        acc = pool.machine.accelerator
        if acc is None or acc.gke_type != gpu:
            continue
        price = MACHINE_PRICES[pool.machine_type]
        out.append((pool.name, (price.spot_hour if pool.spot else price.on_demand_hour) / pool.machine.gpus))
    return out


def _against(m: CloudRunModelSpec, what: str, node_hour: float, tokens_s: float, util: float) -> str:
    hours: Optional[float] = cloud_run.break_even_busy_hours(m, node_hour, BURSTS_PER_DAY)
    if hours is None:
        return f"{what} (${node_hour:.3f}/h) is cheaper at any load"
    if hours >= 24:
        return f"Cloud Run is cheaper than {what} (${node_hour:.3f}/h) even busy all day"
    tokens = hours * 3600 * tokens_s * util
    return (f"{what} (${node_hour:.3f}/h) is cheaper from {hours:.1f} busy hours a day "
            f"(~{tokens / 1e6:,.1f}M output tokens a day at {util:.0%})")


def _break_even_line(cfg: StackConfig, m: CloudRunModelSpec) -> str:
    """Cloud Run against a GKE node kept up all day for the same traffic: the cheapest g2-type machine
    with the GPU on-demand, and the stack's own pools with it."""
    tps, util = cloud_run.instance_capacity(m).decode_tokens_s, cfg.cost.target_utilization
    rivals: list[str] = []
    if (machine := cloud_run.cheapest_machine(m.gpu)) is not None:
        rivals.append(_against(m, f"a {machine} node on-demand", MACHINE_PRICES[machine].on_demand_hour, tps, util))
    rivals += [_against(m, f"a GPU of node pool '{name}'", hour, tps, util) for name, hour in node_pools_with(cfg, m.gpu)]
    if not rivals:
        return f"{m.name}: no GKE machine with {m.gpu} in the catalog to weigh Cloud Run against."
    how = (f"{BURSTS_PER_DAY} bursts a day, each paying the cold start and ~{cloud_run.IDLE_TAIL_S / 60:.0f} min idle "
           "before Cloud Run stops the instance" if not m.min_instances else "the warm minimum serving it")
    return (f"{m.name}: against a GKE node kept up all day for the same traffic (one instance's rate, {how}): "
            + "; ".join(rivals) + f"; below that, Cloud Run costs less ({GUIDE}).")
