"""Cost report: node-hours x dated list prices, monthly totals, $ per million tokens."""

from __future__ import annotations

import copy

import pytest

from vllm_gke.components.model.capacity_report import capacity_report
from vllm_gke.components.model.catalog import MACHINE_TYPES
from vllm_gke.infra.config import parse
from vllm_gke.infra.cost import cost_report
from vllm_gke.infra.pricing import MACHINE_PRICES, PRICES_AS_OF


def test_every_machine_type_has_a_price():
    assert set(MACHINE_PRICES) == set(MACHINE_TYPES)
    for price in MACHINE_PRICES.values():
        assert 0 < price.spot_hour < price.on_demand_hour
    assert PRICES_AS_OF[:4].isdigit()


def test_dev_cost(plans):
    cfg = plans["dev"].config
    report = cost_report(cfg, "BASIC_HDD", 1024)
    (pool,) = report.pools
    assert (pool.machine_type, pool.spot, pool.baseline_nodes, pool.peak_nodes) == ("a2-highgpu-1g", True, 1, 1)
    assert pool.baseline_month == pytest.approx(1.2245 * 730)
    assert report.fixed_month["GKE cluster fee"] == pytest.approx(73.0)
    assert report.fixed_month["Filestore BASIC_HDD 1024 GiB"] == pytest.approx(163.84)
    assert report.baseline_month == pytest.approx(pool.baseline_month + 0.134 * 730 + 73 + 163.84)
    # Output tokens at baseline: each pool's floor at the roofline's tokens/s for it.
    rows = capacity_report(cfg)
    floor = {("short",): cfg.models[0].short.min_replicas, ("long",): cfg.models[0].long.min_replicas}
    tps = sum(r.decode_tokens_s * floor[(r.pool,)] for r in rows)
    assert report.throughput_source == "roofline" and report.baseline_tokens_per_second == pytest.approx(tps)
    tokens = tps * 0.6 * 3600 * 730
    assert report.usd_per_million_tokens == pytest.approx(report.baseline_month / (tokens / 1e6))


def test_prod_baseline_follows_min_replicas_and_peak_max_replicas(plans):
    report = cost_report(plans["prod"].config, "ZONAL", 1024)
    nodes = {p.pool: (p.baseline_nodes, p.peak_nodes) for p in report.pools}
    # llama-70b: TP8 -> one node per replica; min 1+1, max 4+2
    assert nodes["a100-tp8"] == (2, 6)
    # qwen-7b on 3g.20gb (16 slices/node): min 3 shared + 3 dedicated, max 9 + 9
    assert nodes["a100-mig"] == (1, 2)
    assert report.peak_month > report.baseline_month
    assert report.baseline_gpus == 8 * (2 + 1 + 1)


def test_more_throughput_means_cheaper_tokens(stack_values):
    """A measured tokens/s per device replaces the roofline's estimate, in proportion."""
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:cost"] = {"tokensPerSecondPerGpu": 1500}
    slow = cost_report(parse(values), "BASIC_HDD", 1024)
    values["vllm-gke:cost"] = {"tokensPerSecondPerGpu": 3000}
    fast = cost_report(parse(values), "BASIC_HDD", 1024)
    assert slow.throughput_source == fast.throughput_source == "measured"
    assert fast.usd_per_million_tokens == pytest.approx(slow.usd_per_million_tokens / 2)
    # dev's two 3g.40gb slices share one A100: 1500 tokens/s between them.
    assert slow.baseline_tokens_per_second == 1500 * slow.baseline_gpus


def test_a_region_priced_as_us_central1_is_said_so(stack_values):
    import copy

    from vllm_gke.infra.advice import plan_warnings
    from vllm_gke.infra.config import parse

    values = copy.deepcopy(stack_values["dev"])
    assert not [w for w in plan_warnings(parse(values), "BASIC_HDD") if "list prices" in w]
    values["gcp:region"] = "europe-west4"
    values["vllm-gke:cluster"]["zones"] = ["europe-west4-a"]
    (warning,) = [w for w in plan_warnings(parse(values), "BASIC_HDD") if "list prices" in w]
    assert "us-central1 list prices; europe-west4's differ" in warning


def test_a_spot_pool_bursts_at_the_on_demand_price_up_to_twice_its_max_nodes(stack_values):
    """dev's pool is spot with the on-demand fallback: baseline at spot, the nodes a burst adds at
    on-demand (a burst is when spot runs out and the fallback twin takes the nodes); the twin has
    maxNodes of its own, so the peak reaches twice maxNodes before it is capped."""
    from vllm_gke.infra.report import capped_peaks

    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["short"]["maxReplicas"] = 5  # 6 slices: 3 nodes wanted, maxNodes 1 (+1 twin)
    report = cost_report(parse(values), "BASIC_HDD", 1024)
    (pool,) = report.pools
    price = MACHINE_PRICES["a2-highgpu-1g"]
    assert (pool.baseline_nodes, pool.peak_nodes, pool.wanted_peak_nodes, pool.reach_nodes) == (1, 2, 3, 2)
    assert pool.baseline_month == pytest.approx(price.spot_hour * 730)
    assert pool.peak_month == pytest.approx((price.spot_hour + price.on_demand_hour) * 730)
    (warning,) = capped_peaks(report)
    assert warning.startswith("vllm-gke:nodePools[a100-mig].maxNodes: every serving pool at maxReplicas needs 3 nodes but "
                              "the pool reaches 2 (maxNodes 1, and as many on its on-demand twin)"), warning


def test_a_spot_pool_without_fallback_peaks_at_spot(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:nodePools"][0]["onDemandFallback"] = False
    (pool,) = cost_report(parse(values), "BASIC_HDD", 1024).pools
    assert pool.peak_month == pytest.approx(pool.peak_nodes * MACHINE_PRICES["a2-highgpu-1g"].spot_hour * 730)


def test_a_capped_peak_is_said(plans):
    """prod's llama-70b at maxReplicas wants 6 nodes: with maxNodes 4 the plan says the peak is
    capped and what to change."""
    from vllm_gke.infra.report import capped_peaks

    cfg = plans["prod"].config
    tp8 = next(p for p in cfg.node_pools if p.name == "a100-tp8")
    capped_cfg = cfg.model_copy(update={"node_pools": [p.model_copy(update={"max_nodes": 4}) if p is tp8 else p
                                                       for p in cfg.node_pools]})
    report = cost_report(capped_cfg, "ZONAL", 1024)
    pool = next(p for p in report.pools if p.pool == "a100-tp8")
    assert (pool.peak_nodes, pool.wanted_peak_nodes, pool.capped) == (4, 6, True)
    (warning,) = capped_peaks(report)
    assert warning.startswith("vllm-gke:nodePools[a100-tp8].maxNodes: ") and "needs 6 nodes but the pool reaches 4 " \
        "(maxNodes 4)" in warning, warning
    assert capped_peaks(cost_report(cfg, "ZONAL", 1024)) == []
