"""Cloud Run capacity, cost and cold start (components/model/cloud_run_capacity.py), the plan's Cloud Run
lines (infra/cloud_run_plan.py), the options table's Cloud Run rows and the cost report's Cloud Run pools:
each figure against an independent calculation from the published prices and the model's shape."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from vllm_gke.components.model import cloud_run_capacity as cr
from vllm_gke.components.model.specs.cloud_run import CloudRunModelSpec
from vllm_gke.infra.accelerator_options import cloud_run_options
from vllm_gke.infra.cloud_run_plan import BURSTS_PER_DAY, _price_line, cloud_run_lines
from vllm_gke.infra.config import parse
from vllm_gke.infra.cost import cost_report

STAGING = Path(__file__).resolve().parents[1] / "stacks" / "Pulumi.staging.yaml"
# qwen2.5-1.5b (catalog): 1.54 B parameters, 28 layers, 2 KV heads of 128.
PARAMS_B, LAYERS, KV_HEADS, HEAD_DIM = 1.54, 28, 2, 128


def qwen(**over: Any) -> CloudRunModelSpec:
    return CloudRunModelSpec.model_validate({"name": "qwen", "source": "hf://Qwen/Qwen2.5-1.5B-Instruct",
                                             "shape": "qwen2.5-1.5b", **over})


def staging(**model: Any) -> Any:
    doc = copy.deepcopy(yaml.safe_load(STAGING.read_text())["config"])
    doc["vllm-gke:cloudRun"]["models"][0].update(model)
    return parse(doc)


def test_instance_price_per_second_from_the_published_rates():
    # Tier 1, instance-based: L4 $0.0001867/s (zonal redundancy $0.0002909), $0.000018 a vCPU-s, $0.000002 a GiB-s,
    # for every container: the server's and the metrics sidecar's 1 vCPU and 0.5 GiB.
    m = qwen()  # the server's 6 vCPUs and 24 GiB: the spec's defaults
    assert cr.instance_usd_per_hour(m) == pytest.approx((0.0001867 + 7 * 0.000018 + 24.5 * 0.000002) * 3600)
    assert cr.instance_usd_per_hour(m) == pytest.approx(1.30212)
    assert cr.instance_usd_per_hour(m, True) == pytest.approx((0.0002909 + 7 * 0.000018 + 24.5 * 0.000002) * 3600)
    assert cr.instance_usd_per_hour(qwen(gpuZonalRedundancy=True)) == cr.instance_usd_per_hour(m, True)
    assert cr.instance_usd_per_hour(qwen(cpu=4, memoryGib=16)) == pytest.approx(
        (0.0001867 + 5 * 0.000018 + 16.5 * 0.000002) * 3600)
    # An RTX PRO 6000 takes 20 vCPUs and 80 GiB at least: priced at them, and the sidecar's.
    rtx = qwen(gpu="nvidia-rtx-pro-6000")
    assert cr.instance_usd_per_hour(rtx) == pytest.approx((0.00036522 + 21 * 0.000018 + 80.5 * 0.000002) * 3600)
    assert (cr.price_tier("us-central1"), cr.price_tier("asia-southeast1"), cr.price_tier("us-west1")) == (1, 2, None)


def test_the_priced_sidecar_is_the_one_the_service_runs():
    from vllm_gke.components.model.cloud_run_monitoring import SIDECAR_LIMITS

    assert (str(cr.SIDECAR_CPU), f"{cr.SIDECAR_MEMORY_GIB * 1024:g}Mi") == (SIDECAR_LIMITS["cpu"], SIDECAR_LIMITS["memory"])


def test_unverified_rtx_prices_are_said_so():
    cfg = SimpleNamespace(cloud_run_region=lambda _m: "us-central1", cost=SimpleNamespace(hours_per_month=730))
    rtx = _price_line(cfg, qwen(gpu="nvidia-rtx-pro-6000"))  # pyright: ignore[reportArgumentType]
    assert "the nvidia-rtx-pro-6000's per-second prices are unverified" in rtx
    assert "unverified" not in _price_line(cfg, qwen())  # pyright: ignore[reportArgumentType]


def _seqs_fit(max_model_len: int) -> int:
    """Sequences of max_model_len an L4's KV cache holds: 24 GB x 0.9 less the bf16 weights and 1 GB."""
    kv_per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
    budget = 24 * 0.9 - PARAMS_B * 2 - 1.0
    return int(budget * 1e9 // kv_per_token) // max_model_len


def test_concurrency_is_the_batch_the_instance_holds():
    assert cr.concurrency(qwen()) == 32  # maxNumSeqs 32 fits
    held = _seqs_fit(32768)
    assert 1 < held < 256
    assert cr.concurrency(qwen(maxNumSeqs=256, maxModelLen=32768)) == held  # the KV cache bounds it
    assert cr.concurrency(qwen(maxNumSeqs=256, maxModelLen=32768, concurrency=7)) == 7  # set: kept


def test_throughput_is_the_roofline_on_the_instance_gpu():
    from vllm_gke.components.model.catalog import L4
    from vllm_gke.components.model.throughput import roofline

    m = qwen()
    shape = m.as_model().model_shape
    expected = roofline(L4, shape, "bfloat16", "auto", 1, 1, 1, 32, 8192)
    assert cr.instance_capacity(m).decode_tokens_s == pytest.approx(expected.decode_tokens_s)
    assert cr.instance_capacity(m).fits
    # The RTX PRO 6000 reads faster than the L4: more tokens/s at the same batch.
    assert cr.instance_capacity(qwen(gpu="nvidia-rtx-pro-6000")).decode_tokens_s > expected.decode_tokens_s


def test_cold_start_and_startup_probe():
    m = qwen()
    # Cloud Run's volume: a sequential stream assumed at 200 MiB/s, not GKE FUSE's parallel 1,000.
    weights_s = PARAMS_B * 2 * 1e9 / (200 * 1024 ** 2)
    assert cr.VOLUME_READ_MIB_S == 200 and cr.cold_start(m).weights_s == pytest.approx(weights_s)
    assert cr.cold_start(m).total_s == pytest.approx(5 + 30 + weights_s + 120)
    probe = cr.startup_probe(m)
    window = probe["initial_delay_seconds"] + probe["period_seconds"] * probe["failure_threshold"]
    assert 2 * cr.cold_start(m).total_s <= window < 2 * cr.cold_start(m).total_s + probe["period_seconds"]
    assert probe["period_seconds"] * probe["failure_threshold"] <= 240 and probe["initial_delay_seconds"] <= 240
    assert probe["timeout_seconds"] < probe["period_seconds"]
    assert cr.startup_problem(m) is None
    # 2 TB of weights read at 200 MiB/s: past the 480 s a service's startup probe may wait.
    big = qwen(diskGb=2000, shape={"paramsBillion": 1000, "layers": 80, "kvHeads": 8, "headDim": 128})
    assert cr.startup_budget_seconds(big) == 480
    problem = cr.startup_problem(big)
    assert problem is not None and "cloudRun.models[qwen]" in problem and "480 s" in problem


def test_break_even_flips_at_the_stated_busy_hours():
    m = qwen()
    node = 0.7068  # g2-standard-4 on-demand
    overhead_h = BURSTS_PER_DAY * (cr.cold_start(m).total_s + 15 * 60) / 3600
    hours = cr.break_even_busy_hours(m, node, BURSTS_PER_DAY)
    assert hours is not None and hours == pytest.approx(24 * node / 1.30212 - overhead_h)
    node_day = 24 * node
    assert cr.cloud_run_day_usd(m, hours - 0.5, BURSTS_PER_DAY) < node_day  # below: Cloud Run cheaper
    assert cr.cloud_run_day_usd(m, hours + 0.5, BURSTS_PER_DAY) > node_day  # above: the node pool
    assert cr.cheapest_machine("nvidia-l4") == "g2-standard-4"
    assert cr.cheapest_machine("nvidia-rtx-pro-6000") is None
    # A warm minimum bills all day: dearer than a g2 node at any load, cheaper than a pricier one always.
    warm = qwen(minInstances=1)
    assert cr.break_even_busy_hours(warm, node, BURSTS_PER_DAY) is None
    assert cr.break_even_busy_hours(warm, 2.0, BURSTS_PER_DAY) == 24.0
    assert cr.cloud_run_day_usd(warm, 1, BURSTS_PER_DAY) == pytest.approx(24 * 1.30212)
    assert cr.warm_minimum_month(warm, 730) == pytest.approx(1.30212 * 730)
    assert cr.warm_minimum_month(m, 730) == 0


def test_cost_report_counts_a_warm_minimum_in_the_baseline():
    cold, warm = staging(minInstances=0, maxInstances=2), staging(minInstances=1, maxInstances=2)
    at_zero, at_one = cost_report(cold, "ZONAL", 1024), cost_report(warm, "ZONAL", 1024)
    (pool,) = [p for p in at_zero.pools if p.pool == "cloud-run/qwen-1-5b"]
    hour = cr.instance_usd_per_hour(cold.cloud_run_models[0])
    assert (pool.baseline_month, pool.peak_month) == (0, pytest.approx(2 * hour * 730))
    assert at_one.baseline_month - at_zero.baseline_month == pytest.approx(hour * 730)
    assert at_one.peak_month == pytest.approx(at_zero.peak_month)
    (replica,) = [r for r in at_zero.replicas if r.model == "qwen-1-5b"]
    assert replica.usd_per_hour == pytest.approx(hour) and replica.min_replicas == 0


def test_options_offer_cloud_run_only_where_the_model_fits():
    cfg = staging()
    rows = cloud_run_options(cfg)
    here = [o for o in rows if o.this_stack]
    assert [(o.model, o.accelerator, o.cloud_run) for o in here] == [("qwen-1-5b", "nvidia-l4", True)]
    assert here[0].usd_per_hour == pytest.approx(1.30212)
    # staging's GKE models (8B at 64 sequences of 16k): neither Cloud Run GPU holds that batch.
    assert not [o for o in rows if not o.this_stack]
    doc = copy.deepcopy(yaml.safe_load(STAGING.read_text())["config"])
    doc["vllm-gke:models"][0]["short"] = {**doc["vllm-gke:models"][0].get("short", {}), "maxNumSeqs": 16}
    offered = {(o.model, o.accelerator) for o in cloud_run_options(parse(doc)) if not o.this_stack}
    # 16 sequences of 16k fit the RTX PRO 6000's 96 GB, not the L4's 24.
    assert offered == {(doc["vllm-gke:models"][0]["name"], "nvidia-rtx-pro-6000")}


def test_plan_lines_say_cost_cold_start_and_break_even():
    lines = cloud_run_lines(staging())
    text = "\n".join(lines)
    assert "cold start ~170 s" in text and "concurrency 32 (its batch)" in text
    assert "$1.302/h without GPU zonal redundancy, $1.677/h with it" in text
    assert "g2-standard-4 node on-demand ($0.707/h) is cheaper from" in text
    assert "min 0: nothing fixed" in text
    assert "Tier 2" not in text
    # A Tier 2 region (a global gateway class reaches one): priced at Tier 1's rates, and said so.
    cfg = SimpleNamespace(cloud_run_region=lambda _m: "asia-southeast1", cost=SimpleNamespace(hours_per_month=730))
    far = _price_line(cfg, qwen())  # pyright: ignore[reportArgumentType]
    assert "asia-southeast1 is a Tier 2 region, whose prices are not pinned" in far
