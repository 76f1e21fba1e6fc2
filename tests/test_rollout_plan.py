"""What the plan says of rollouts: per serving pool, a Flagger canary (its ceiling, largest share,
analysis and what one rollout costs) or in place and why, as a table, in the JSON, and as warnings."""

from __future__ import annotations

import copy
import io
import json
import math
from types import SimpleNamespace

import pytest
from rich.console import Console

from vllm_gke.components.model.cold_start import NODE_PROVISION_S, cold_start_seconds, rollout_seconds
from vllm_gke.components.model.serving_plan import pool_rollout, servings
from vllm_gke.components.model.serving_pool import grace_seconds
from vllm_gke.infra.advice import plan_warnings, rollout_trade_offs
from vllm_gke.infra.config import parse
from vllm_gke.infra.cost import cost_report
from vllm_gke.infra.plan_report import plan_report, render_json
from vllm_gke.infra.plan_text import render_text, rollouts_table, whole_or_records
from vllm_gke.infra.report import RolloutRow, rollout_rows


def _config(stack_values, stack, mutate=lambda v: None, rollouts=True):
    values = copy.deepcopy(stack_values[stack])
    if rollouts:
        values["vllm-gke:rollouts"] = {**values.get("vllm-gke:rollouts", {}), "enabled": True}
    mutate(values)
    return parse(values)


def _rows(cfg) -> dict[tuple[str, str, str | None], RolloutRow]:
    return {(r.model, r.pool, r.tenant): r for r in rollout_rows(cfg, cost_report(cfg, "REGIONAL", 1024))}


def _pool(values, name):
    return next(p for p in values["vllm-gke:nodePools"] if p["name"] == name)


def _slots(cfg, node_pool: str) -> int:
    """Devices the node pool reaches (its maxNodes, twice with an on-demand twin), from the config."""
    pool = cfg.pool(node_pool)
    return pool.max_nodes * (2 if pool.has_fallback_pool else 1) * pool.slices_per_node


def _ceilings(cfg, node_pool: str) -> int:
    """Devices every serving pool on the node pool takes at its ceiling."""
    return sum(getattr(s.model, w).max_replicas * s.model.devices_per_replica
               for s in servings(cfg) if s.node_pool == node_pool for w in s.model.pool_names)


def _surges(cfg, node_pool: str) -> int:
    """A replica more of each pool there: its primary's promotion surges while the canaries run."""
    return sum(s.model.devices_per_replica for s in servings(cfg) if s.node_pool == node_pool
               for _w in s.model.pool_names)


def test_prod_borrows_a_replica_for_llama_70b_whose_node_pool_its_ceilings_fill(stack_values):
    """a100-tp8 reaches 6 nodes of 8 GPUs, which llama-70b's pools fill at their ceilings (4 + 2
    replicas of 8): no room beside them, so each canary borrows the primary's last replica and its
    largest share is what one replica of the pool carries, in whole steps (Flagger adds stepWeight
    without clamping to maxWeight); the long pool's primary, replaced in place at promotion, hands
    all traffic to the canary (one replica against its one) while it reloads."""
    cfg = _config(stack_values, "prod", rollouts=False)
    assert cfg.rollouts.enabled and _slots(cfg, "a100-tp8") == _ceilings(cfg, "a100-tp8")
    rows, step, top = _rows(cfg), cfg.rollouts.step_weight, cfg.rollouts.max_weight
    for which in ("short", "long"):
        row, pool = rows[("llama-70b", which, None)], getattr(cfg.model("llama-70b"), which)
        assert (row.mode, row.canary_replicas, row.primary_max) == ("canary", 1, pool.max_replicas - 1)
        assert f"the primary's ceiling is {pool.max_replicas - 1} of {pool.max_replicas}" in row.note
        assert row.devices == 8 and row.max_weight % step == 0
        if which == "long":  # its primary rolls in place (no surge room): the canary carries it all
            assert row.max_weight == 100 and "carries all traffic (100%)" in row.note
        else:
            assert row.max_weight == max(step, min(top, 100 // pool.max_replicas) // step * step)


def test_prod_pools_with_room_get_the_whole_canary(stack_values):
    """Beside every pool at its ceiling with a promotion's surge replica, what is left of a node pool
    is shared by the pools in proportion to their ceilings: a pool whose share holds its canary's
    need carries maxWeight of its pool and the plan notes nothing; one whose share holds less takes
    what fits, promoted at the share those replicas carry (in whole steps)."""
    cfg = _config(stack_values, "prod", rollouts=False)
    rows = _rows(cfg)
    full = 0
    for serving in servings(cfg):
        if serving.node_pool == "a100-tp8":
            continue
        spare = _slots(cfg, serving.node_pool) - _ceilings(cfg, serving.node_pool) - _surges(cfg, serving.node_pool)
        for which in serving.model.pool_names:
            row, pool = rows[(serving.model.name, which, serving.tenant)], getattr(serving.model, which)
            mine = pool.max_replicas * serving.model.devices_per_replica
            room = int(spare * mine / _ceilings(cfg, serving.node_pool)) // serving.model.devices_per_replica
            need = math.ceil(pool.max_replicas * cfg.rollouts.max_weight / 100)
            assert row.mode == "canary" and row.canary_replicas == min(room, need)
            if room >= need:
                full += 1
                assert (row.note, row.max_weight) == ("", cfg.rollouts.max_weight)
            else:
                step = cfg.rollouts.step_weight
                assert row.max_weight == room * 100 // pool.max_replicas // step * step
                assert row.note.startswith(f"room for {room} canary replica(s) of the {need}")
            assert row.analysis_seconds == (row.max_weight // step_of(cfg, row) + 1) * cfg.rollouts.interval_seconds
    assert full >= 4


def step_of(cfg, row) -> int:
    return min(cfg.rollouts.step_weight, row.max_weight)


def test_some_room_lowers_the_canarys_largest_share(stack_values):
    """Four more a100-tp8 nodes (32 GPUs), half of them for the promotions' surge replicas, the rest
    shared by the two pools' ceilings (32 : 16): one replica's room for the short pool, whose 50% of
    4 replicas needs 2, so it is promoted at 20% (25% carried by its one replica, in whole steps of
    10); the long pool's share is under a replica, so it still borrows one."""
    cfg = _config(stack_values, "prod", lambda v: _pool(v, "a100-tp8").update(maxNodes=10), rollouts=False)
    rows = _rows(cfg)
    short, long_ = rows[("llama-70b", "short", None)], rows[("llama-70b", "long", None)]
    assert (short.canary_replicas, short.primary_max, short.max_weight) == (1, 4, 20)
    assert short.note.startswith("room for 1 canary replica(s) of the 2 its 50% needs") and "promoted at 20%" in short.note
    assert (long_.canary_replicas, long_.primary_max) == (1, 1) and "primary's ceiling is 1 of 2" in long_.note
    warnings = rollout_trade_offs(cfg)
    assert any(w.startswith("canary of llama-70b short: room for 1 canary replica(s)") and "'a100-tp8'" in w
               for w in warnings), warnings


def test_one_replica_with_no_room_rolls_in_place(stack_values):
    """dev's qwen-7b pools are one replica each on two MIG slices; without the spot pool's on-demand
    twin there is no slice for a canary, and a pool of one replica cannot lend one: in place, said."""
    cfg = _config(stack_values, "dev", lambda v: _pool(v, "a100-mig").update(onDemandFallback=False))
    assert _slots(cfg, "a100-mig") == _ceilings(cfg, "a100-mig") == 2
    for row in _rows(cfg).values():
        assert (row.mode, row.canary_replicas, row.usd_per_rollout) == ("in-place", 0, 0)
        assert row.note.startswith("no room on its node pool for a canary beside its one replica (maxReplicas 1)")
    warnings = rollout_trade_offs(cfg)
    assert len(warnings) == 2 and all("rolls in place though rollouts are on, because no room" in w
                                      and "not gated by the SLOs" in w for w in warnings)
    assert set(warnings) <= set(plan_warnings(cfg, "BASIC_HDD"))


@pytest.mark.parametrize("stack,model,which,reason", [
    ("staging", "llama-8b", "short", "behind the endpoint picker its backend is an InferencePool"),
    ("staging", "mistral-7b", "long", "it may scale to zero"),
    ("frontier", "llama-405b", "short", "a replica spans 2 hosts (a LeaderWorkerSet"),
    ("frontier", "llama-70b-tpu", "short", "a replica spans 4 hosts (a LeaderWorkerSet"),
    ("frontier", "llama-8b-tpu", "long", "it may scale to zero"),
])
def test_pools_that_cannot_run_a_canary_roll_in_place_and_say_why(stack_values, stack, model, which, reason):
    cfg = _config(stack_values, stack)
    row = _rows(cfg)[(model, which, None)]
    assert row.mode == "in-place" and row.note.startswith(reason)
    assert (row.canary_replicas, row.devices, row.max_weight, row.analysis_seconds, row.usd_per_rollout) == (0, 0, 0, 0, 0)
    (warning,) = [w for w in rollout_trade_offs(cfg) if w.startswith(f"rollout of {model} {which}:")]
    assert f"because {reason}" in warning and "its changes are not gated by the SLOs" in warning


def test_rollouts_off_say_nothing(stack_values):
    cfg = _config(stack_values, "staging", rollouts=False)
    assert not cfg.rollouts.enabled and _rows(cfg) == {} and rollout_trade_offs(cfg) == []


@pytest.fixture(scope="module")
def prod_report(plans):
    return plan_report(plans["prod"], {}, None, None)


def test_a_rollouts_dollars_are_the_cost_reports_replica_for_the_analysis(prod_report):
    """The canary at its ceiling for the whole analysis, at the price the cost report gives a
    replica above the floor (on-demand where the spot pool bursts onto its twin)."""
    v = prod_report.verdicts
    cfg = prod_report.plan.config
    assert len(v.rollouts) == sum(len(s.model.pool_names) for s in servings(cfg))
    for row in v.rollouts:
        (replica,) = [r for r in v.cost.replicas if (r.model, r.pool, r.tenant, r.canary)
                      == (row.model, row.pool, row.tenant, False)]
        price = replica.burst_usd_per_hour or replica.usd_per_hour
        assert row.replica_usd_per_hour == price
        # It holds its devices from its node and load (the cold start) to promotion.
        serving = next(s for s in servings(cfg) if s.model.name == row.model and s.tenant == row.tenant)
        ready = pool_rollout(cfg, serving, row.pool).ready_seconds
        load = cold_start_seconds(cfg, serving.model, cfg.pool(serving.node_pool))
        assert ready == int(NODE_PROVISION_S + load)
        # ...through the analysis, until the primary's promotion at its ceiling is done (Flagger scales
        # the canary to 0 only then).
        plan = pool_rollout(cfg, serving, row.pool)
        promotion = rollout_seconds(plan.primary_max, load, grace_seconds(cfg.gateway.request_timeout_seconds))
        assert plan.promotion_seconds == int(promotion) > 0
        assert row.usd_per_rollout == pytest.approx(
            row.canary_replicas * price * (ready + row.analysis_seconds + plan.promotion_seconds) / 3600)
        assert row.devices == row.canary_replicas * cfg.model(row.model).devices_per_replica
    spot = next(r for r in v.rollouts if r.node_pool == "a100-spot")
    od = next(r for r in v.cost.replicas if r.node_pool == "a100-spot")
    assert spot.replica_usd_per_hour == od.burst_usd_per_hour > od.usd_per_hour


def test_the_json_holds_the_tables_rows(prod_report):
    doc = json.loads(render_json(prod_report))
    rows = prod_report.verdicts.rollouts
    assert [(r["model"], r["pool"], r["tenant"], r["mode"], r["canaryReplicas"], r["devices"], r["maxWeight"],
             r["analysisSeconds"], r["usdPerRollout"], r["note"]) for r in doc["rollouts"]] == [
        (r.model, r.pool, r.tenant, r.mode, r.canary_replicas, r.devices, r.max_weight, r.analysis_seconds,
         pytest.approx(r.usd_per_rollout), r.note) for r in rows]
    assert not [k for row in doc["rollouts"] for k in row if "_" in k]
    out = io.StringIO()
    render_text(prod_report, Console(file=out, width=1000), detail=False)
    text = " ".join(out.getvalue().split())
    assert "rollouts per serving pool" in text and all(" ".join(r.note.split()) in text for r in rows if r.note)
    assert all(f"{r.usd_per_rollout:,.2f}" in text for r in rows)


def test_no_rollouts_table_where_rollouts_are_off(plans):
    out = io.StringIO()
    render_text(plan_report(plans["dev"], {}, None, None), Console(file=out, width=200), detail=False)
    assert "rollouts per serving pool" not in out.getvalue()


@pytest.mark.parametrize("width", range(60, 221, 8))
def test_the_rollouts_table_fits_every_width(stack_values, width):
    """Whole values in a table, or one block per row: never cropped, never a figure folded."""
    for cfg in (_config(stack_values, "staging"), _config(stack_values, "prod", rollouts=False)):
        rows = list(_rows(cfg).values())
        out = io.StringIO()
        Console(file=out, width=width).print(whole_or_records(rollouts_table(SimpleNamespace(rollouts=rows)), width))
        text = out.getvalue()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
        # A table keeps its right border on every line (rich crops a table wider than the console).
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in text.splitlines() if line.startswith(tuple("┏┃┡│└")))
        flat = " ".join(text.split())
        for r in rows:
            assert r.model in flat and (r.mode != "canary" or f"{r.usd_per_rollout:,.2f} " in flat + " ")


def test_a_canary_pools_long_rollout_is_flaggers_promotion_not_pulumis_wait(stack_values):
    """Pulumi updates a Flagger target at 0 replicas: the long wait at a ceiling is the primary's
    promotion, after the analysis, which Flagger waits for; with rollouts off `pulumi up` waits."""
    from vllm_gke.infra.advice import long_rollouts

    on = parse(copy.deepcopy(stack_values["prod"]))
    off_values = copy.deepcopy(stack_values["prod"])
    off_values["vllm-gke:rollouts"] = {"enabled": False}
    off = parse(off_values)
    llama_on = [w for w in long_rollouts(on) if w.startswith("rollout of llama-8b short")]
    llama_off = [w for w in long_rollouts(off) if w.startswith("rollout of llama-8b short")]
    assert len(llama_on) == len(llama_off) == 1
    assert "Flagger's promotion of the primary" in llama_on[0] and "`pulumi up` does not wait" in llama_on[0]
    assert llama_off[0].endswith("`pulumi up` waits that long for it")


def test_each_canary_gets_the_load_tests_that_reach_it_and_a_warning_where_none_does(plans, stack_values):
    """A canary's webhooks start the load tests whose tenant's route reaches its pool (the model's
    shared pools, or the tenant's own copy; a long pool's canary, their variants hinted to the long
    pool), so every canary has traffic at night; one that none reaches is warned about."""
    from tests.conftest import manifests_of
    from vllm_gke.infra.advice import rollout_trade_offs

    started = {(c["metadata"]["namespace"], c["metadata"]["name"]):
               {w["name"] for w in c["spec"]["analysis"].get("webhooks", [])} for c in manifests_of(plans["prod"], "Canary")}
    assert started[("vllm", "llama-70b-short")] == {"pre-rollout-loadtest-search-llama-70b", "rollout-loadtest-search-llama-70b"}
    assert started[("vllm", "qwen-7b-long")] == {"pre-rollout-loadtest-support-qwen-7b-long",
                                                 "rollout-loadtest-support-qwen-7b-long"}
    assert started[("vllm", "qwen-7b-short")] == {"pre-rollout-loadtest-support-qwen-7b", "rollout-loadtest-support-qwen-7b"}
    assert started[("tenant-analytics", "qwen-7b-short")] == {"pre-rollout-loadtest-analytics-qwen-7b",
                                                              "rollout-loadtest-analytics-qwen-7b"}
    assert all(started.values())
    assert not [w for w in rollout_trade_offs(plans["prod"].config) if "no load test reaches" in w]
    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:rollouts"]["loadTests"] = ["search-llama-8b"]
    warned = [w for w in rollout_trade_offs(parse(values)) if "no load test reaches" in w]
    assert sorted(w.split(":")[0] for w in warned) == ["canaries of llama-70b", "canaries of qwen-7b",
                                                        "canaries of qwen-7b (analytics)"]


def test_a_full_pool_whose_floor_is_its_ceiling_rolls_in_place(stack_values):
    """No room beside llama-70b long at 2 of 2 with its floor at 2: borrowing a replica would give the
    primary's ScaledObject a floor above its ceiling (KEDA refuses minReplicaCount > maxReplicaCount),
    so it rolls in place and says why; with a floor of 1 it borrows."""
    def fixed(v):
        next(m for m in v["vllm-gke:models"] if m["name"] == "llama-70b")["long"].update(minReplicas=2, maxReplicas=2)

    row = _rows(_config(stack_values, "prod", fixed))[("llama-70b", "long", None)]
    assert row.mode == "in-place" and "its floor is its ceiling (2)" in row.note
    row = _rows(_config(stack_values, "prod"))[("llama-70b", "long", None)]
    assert row.mode == "canary" and row.primary_max == 1


def test_a_share_under_one_step_is_its_own_step(stack_values):
    """Room for one canary replica of a pool of 20 carries 5%, under the 10% step: the Canary steps
    5% once (Flagger adds stepWeight unclamped, so a 10% step would put 10% on it)."""
    from vllm_gke.components.model.rollouts import rollout_plan

    cfg = _config(stack_values, "prod")
    model = cfg.model("llama-8b").model_copy(update={"short": cfg.model("llama-8b").short.model_copy(
        update={"max_replicas": 20})})
    plan = rollout_plan(cfg.rollouts, model, "short", 1, 1, 600.0)
    assert (plan.canary_replicas, plan.max_weight, plan.step_weight) == (1, 5, 5)
    assert plan.analysis_seconds == 2 * cfg.rollouts.interval_seconds
