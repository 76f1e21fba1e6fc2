"""Capacity check: weights + KV cache per GPU or MIG slice, with the numbers in the verdict."""

from __future__ import annotations

import copy

import pytest

from vllm_gke.components.model.capacity import GB, RUNTIME_OVERHEAD_GB, pool_capacity
from vllm_gke.components.model.capacity_report import capacity_report
from vllm_gke.components.model.catalog import MODEL_SHAPES
from vllm_gke.components.model.specs import ModelSpec, NodePoolSpec, ServingPoolSpec
from vllm_gke.infra.config import ConfigError, parse


@pytest.mark.parametrize("shape,kv_bytes", [
    ("llama-3-8b", 131072), ("llama-3-70b", 327680), ("qwen2.5-7b", 57344),
    ("qwen2.5-72b", 327680), ("mistral-7b", 131072),
])
def test_kv_bytes_per_token_of_shipped_shapes(shape, kv_bytes):
    model = ModelSpec(name="m", source="hf://a/b", shape=shape, node_pool="p")
    assert model.kv_bytes_per_token == kv_bytes  # 2 x layers x kv_heads x head_dim x 2 bytes


def test_shipped_shapes_cover_the_common_models():
    assert {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b"} <= set(MODEL_SHAPES)


def test_pool_capacity_arithmetic():
    model = ModelSpec(name="m", source="hf://a/b", shape="llama-3-8b", node_pool="p", gpu_memory_utilization=0.9)
    pool = NodePoolSpec(name="p", machine_type="a2-ultragpu-1g")
    row = pool_capacity(model, "short", ServingPoolSpec(max_num_seqs=32, context_tokens=4096), pool)
    assert row.usable_gb == pytest.approx(72.0)
    assert row.weights_per_gpu_gb == pytest.approx(16.06)
    assert row.kv_budget_gb == pytest.approx(72.0 - 16.06 - RUNTIME_OVERHEAD_GB)
    assert row.tokens_fit == int(row.kv_budget_gb * GB // 131072)
    assert row.seqs_fit == row.tokens_fit // 4096 and row.fits


def test_tensor_parallel_shards_weights_and_kv_heads():
    one = ModelSpec(name="m", source="hf://a/b", shape="llama-3-70b", node_pool="p", tensor_parallel_size=4)
    eight = one.model_copy(update={"tensor_parallel_size": 8})
    pool = NodePoolSpec(name="p", machine_type="a2-ultragpu-8g")
    r4, r8 = (pool_capacity(m, "long", ServingPoolSpec(), pool) for m in (one, eight))
    assert r4.weights_per_gpu_gb == pytest.approx(2 * r8.weights_per_gpu_gb)
    assert r4.kv_bytes_per_token_per_gpu == pytest.approx(2 * r8.kv_bytes_per_token_per_gpu)


def test_kv_heads_replicate_beyond_their_count():
    shape = {"params_billion": 1, "layers": 10, "kv_heads": 2, "head_dim": 64}
    model = ModelSpec(name="m", source="hf://a/b", shape=shape, node_pool="p", tensor_parallel_size=8)
    row = pool_capacity(model, "short", ServingPoolSpec(), NodePoolSpec(name="p", machine_type="a2-highgpu-8g"))
    assert row.kv_bytes_per_token_per_gpu == model.kv_bytes_per_token / 2


def test_report_covers_every_serving_pool(prod_by_hand):
    rows = capacity_report(prod_by_hand.config)
    assert len(rows) == 10 and all(r.fits for r in rows)  # llama-8b's canary included
    assert {(r.model, r.tenant) for r in rows} == {("llama-70b", None), ("qwen-7b", None), ("llama-8b", None),
                                                   ("qwen-7b", "analytics")}
    # The canary's rows say so, with the revision they serve.
    assert [(r.pool, r.revision) for r in rows if r.canary] == [
        ("short", "0e9e39f249a16976918f6564b8830bc894c89659"), ("long", "0e9e39f249a16976918f6564b8830bc894c89659")]


def test_too_many_sequences_fail_with_the_numbers(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["short"]["maxNumSeqs"] = 64
    with pytest.raises(ConfigError) as exc:
        parse(values)
    (issue,) = exc.value.issues
    assert issue.key == "vllm-gke:models[qwen-7b].short"
    assert "48130 tokens (2.76 GB): 23 sequences of 2048 tokens, fewer than maxNumSeqs 64" in issue.problem
    assert "kvCacheDtype fp8" in issue.problem


def test_fp8_kv_cache_doubles_what_fits(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["short"]["maxNumSeqs"] = 40
    values["vllm-gke:models"][0]["kvCacheDtype"] = "fp8"
    (short, _long) = capacity_report(parse(values))
    assert short.tokens_fit == 96261 and short.seqs_fit == 47


def test_max_model_len_must_fit_once(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["maxModelLen"] = 65536
    values["vllm-gke:models"][0]["long"]["maxNumSeqs"] = 1
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert any("less than one maxModelLen sequence of 65536" in i.problem for i in exc.value.issues)


def test_custom_shape_is_accepted(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["shape"] = {"paramsBillion": 3.2, "layers": 28, "kvHeads": 8, "headDim": 128}
    rows = capacity_report(parse(values))
    assert rows[0].weights_per_gpu_gb == pytest.approx(6.4)


@pytest.mark.parametrize("pool_kwargs,machine,helps,misleads", [
    # Weights alone overflow the slice: fewer sequences cannot help.
    ({"max_num_seqs": 1}, ("a2-highgpu-8g", "1g.5gb"), "quantise the weights", "maxNumSeqs"),
    # One maxModelLen sequence does not fit: a shorter maxModelLen does.
    ({"max_num_seqs": 1, "max_model_len": 131072}, ("a2-highgpu-1g", "3g.20gb"), "lower maxModelLen", "maxNumSeqs"),
    # Too many sequences of the stated context: fewer do.
    ({"max_num_seqs": 512, "context_tokens": 8192}, ("a2-ultragpu-1g", None), "lower maxNumSeqs", "quantise"),
])
def test_the_fix_offered_is_one_that_helps(pool_kwargs, machine, helps, misleads):
    model = ModelSpec(name="m", source="hf://a/b", shape="llama-3-8b", node_pool="p")
    node_pool = NodePoolSpec(name="p", machine_type=machine[0], gpu_partition_size=machine[1])
    row = pool_capacity(model, "short", ServingPoolSpec(**pool_kwargs), node_pool)
    assert not row.fits
    assert helps in row.fix() and misleads not in row.fix()


def test_a_pool_whose_node_pool_is_full_at_its_ceiling_rolls_in_place_from_there(plans):
    """prod's llama-70b fills a100-tp8 (6 nodes x 8 GPUs) at 4 + 2 replicas of TP 8: a surge pod at
    the ceiling would wait for a node forever. Surge while it fits, then an old replica first."""
    from tests.conftest import vllm_deployments
    from vllm_gke.components.model.capacity import rollout_strategy, surge_room

    cfg = plans["prod"].config
    llama = cfg.model("llama-70b")
    # long at its ceiling of 2 with its own surge replica: 48 - 24 = 24 GPUs, three replicas of 8
    assert surge_room(cfg, llama, "a100-tp8", None, "short") == 3
    # short at 4 with a surge replica leaves 8: not even a second long replica's surge fits
    assert surge_room(cfg, llama, "a100-tp8", None, "long") == 1
    strategies = {d["metadata"]["name"]: d["spec"]["strategy"]["rollingUpdate"] for d in vllm_deployments(plans["prod"])}
    assert strategies["llama-70b-short"] == {"maxSurge": 1, "maxUnavailable": "34%"}  # floor(0.34 x 2) = 0
    assert strategies["llama-70b-long"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert strategies["qwen-7b-short"] == {"maxSurge": 1, "maxUnavailable": 0}  # room to spare
    # Kubernetes rounds a percentage down: 0 below the count (up to 10; above, it may turn 1 a
    # replica or two early: never late), at least 1 from it.
    for full_at in range(2, 40):
        share = int(str(rollout_strategy(full_at)["maxUnavailable"]).rstrip("%"))
        assert share * full_at // 100 >= 1
        assert full_at > 10 or share * (full_at - 1) // 100 == 0
    assert rollout_strategy(1) == {"maxSurge": 0, "maxUnavailable": 1}
    # The plan says what the rollout needs.
    from vllm_gke.infra.advice import plan_warnings

    notes = [w for w in plan_warnings(cfg, plans["prod"].platform.store.tier) if w.startswith("rollout of")]
    assert any("llama-70b short: surges a replica while fewer than 3 run" in w for w in notes)
    assert any("llama-70b long: node pool 'a100-tp8' has no room" in w and "an outage" in w for w in notes)


def test_rollouts_wait_for_a_replica_to_load_before_calling_it_stuck(plans):
    from tests.conftest import vllm_deployments

    for dep in vllm_deployments(plans["frontier"]):
        probe = dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        # default 600 s would fail `pulumi up` while a 70B replica is still loading
        assert dep["spec"]["progressDeadlineSeconds"] >= budget + 300


def test_a_dedicated_copy_on_another_accelerator_has_its_own_cold_start(stack_values):
    """frontier's shared llama-8b-tpu on a v6e chip (an XLA compile before it serves) and the assistant
    tenant's dedicated copy on an A100 node: the capacity rows and the plan's warnings give each its own
    pool's cold start, not the model's node pool's."""
    from vllm_gke.components.model.cold_start import cold_start_seconds
    from vllm_gke.infra.advice import plan_warnings

    values = copy.deepcopy(stack_values["frontier"])
    values["vllm-gke:nodePools"].append({"name": "a100", "machineType": "a2-ultragpu-1g", "minNodes": 0, "maxNodes": 2})
    assistant = next(t for t in values["vllm-gke:tenants"] if t["name"] == "assistant")
    assistant["dedicated"] = {"models": ["llama-8b-tpu"], "nodePool": "a100"}
    cfg = parse(values)
    model = cfg.model("llama-8b-tpu")
    tpu, gpu = cold_start_seconds(cfg, model, cfg.pool("v6e-single")), cold_start_seconds(cfg, model, cfg.pool("a100"))
    assert tpu >= gpu + 600  # the compile (10 minutes at least)
    rows = [r for r in capacity_report(cfg) if r.model == "llama-8b-tpu" and r.pool == "short"]
    assert {r.tenant: r.cold_start_s for r in rows} == {None: pytest.approx(tpu), "assistant": pytest.approx(gpu)}
    (single,) = [w for w in plan_warnings(cfg, "ZONAL") if "one replica (" in w]
    assert f"llama-8b-tpu short ~{tpu / 60:.0f} min" in single
    assert f"llama-8b-tpu (assistant) short ~{gpu / 60:.0f} min" in single
    values["vllm-gke:weights"]["coldStartBudgetSeconds"] = int((tpu + gpu) / 2)
    slow = [w for w in plan_warnings(parse(values), "ZONAL") if "from node ready to serving" in w]
    assert any(w.startswith("llama-8b-tpu:") for w in slow) and not any("(assistant)" in w for w in slow)


def test_an_in_place_step_on_a_full_node_pool_may_wait_behind_another_pools(plans):
    """prod's llama-70b pools share a full node pool: a device the long pool frees may go to the
    short pool's pending pod (the scheduler favours no waiter), again and again until the short
    pool's rollout is done; the deadline allows that, or the controller calls the rollout failed
    (and `pulumi up` with it) while it still goes well."""
    from tests.conftest import vllm_deployments
    from vllm_gke.components.model.cold_start import NODE_PROVISION_S

    deps = {d["metadata"]["name"]: d for d in vllm_deployments(plans["prod"])}
    long_ = deps["llama-70b-long"]["spec"]
    probe = long_["template"]["spec"]["containers"][0]["startupProbe"]
    window = probe["periodSeconds"] * probe["failureThreshold"]
    grace = long_["template"]["spec"]["terminationGracePeriodSeconds"]
    assert long_["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
    # ...and not once: each device it frees may go to the short pool's next pending pod, so its
    # step may wait the short pool's whole rollout (4 replicas at its ceiling, one at a time).
    short = deps["llama-70b-short"]["spec"]["template"]["spec"]
    short_window = short["containers"][0]["startupProbe"]["failureThreshold"] * 10
    assert long_["progressDeadlineSeconds"] >= NODE_PROVISION_S + grace + window + 4 * (grace + short_window) * 0.8
    # a surge-only pool waits for no one
    qwen = deps["qwen-7b-short"]["spec"]
    probe = qwen["template"]["spec"]["containers"][0]["startupProbe"]
    assert qwen["progressDeadlineSeconds"] == NODE_PROVISION_S + probe["periodSeconds"] * probe["failureThreshold"]
