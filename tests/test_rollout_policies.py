"""The rollout policies: in prod every serving pool is a Flagger Canary's target (or the plan says why it
cannot be), and a Canary's gates are no looser than the SLOs and can fail it before promotion."""

from __future__ import annotations

import pytest

from tests.test_policies import kind, resources, violations_of
from vllm_gke.policies.rules import Resource, evaluate

GATED = "prod-rollouts-gated"
GATES = "rollout-gates-hold-slos"


def _as_prod(rs: list[Resource]) -> None:
    cluster = next(r for r in rs if r.type == "gcp:container/cluster:Cluster")
    cluster.props["resourceLabels"]["environment"] = "prod"


def _by_workload(found) -> dict[str, str]:
    return {v.message.split(" (")[0]: v.message for v in found}


def test_frontiers_pools_roll_in_place_each_with_its_reason(plans):
    """frontier is prod without rollouts: its multi-host groups and its pool that may go to zero say
    why they cannot be canaries; the one pool that could be is told to turn rollouts on."""
    found = violations_of(resources(plans["frontier"]), GATED)
    assert {v.level for v in found} == {"advisory"}
    by = _by_workload(found)
    assert set(by) == {"LeaderWorkerSet vllm/llama-405b-short-group", "LeaderWorkerSet vllm/llama-70b-tpu-short-group",
                       "Deployment vllm/llama-8b-tpu-short", "Deployment vllm/llama-8b-tpu-long"}
    for group in ("llama-405b-short-group", "llama-70b-tpu-short-group"):
        assert "because a replica spans hosts (a LeaderWorkerSet" in by[f"LeaderWorkerSet vllm/{group}"]
    assert "because it may scale to zero" in by["Deployment vllm/llama-8b-tpu-long"]
    short = by["Deployment vllm/llama-8b-tpu-short"]
    assert "no Flagger Canary targets it" in short and short.endswith("set vllm-gke:rollouts.enabled")


def test_only_prod_is_judged(plans):
    """staging has the same kinds of pools (one behind the endpoint picker, one that may go to zero)
    and no Canary: not prod, nothing said; labelled prod, each is named with its reason."""
    rs = resources(plans["staging"])
    assert violations_of(rs, GATED) == []
    _as_prod(rs)
    by = _by_workload(violations_of(rs, GATED))
    assert "behind the endpoint picker its backend is one InferencePool (llama-8b)" in by["Deployment vllm/llama-8b-short"]
    assert "may scale to zero" in by["Deployment vllm/mistral-7b-long"]
    assert by["Deployment vllm/mistral-7b-short"].endswith("set vllm-gke:rollouts.enabled")
    # A program's own resources without a cluster: no environment, nothing judged.
    assert violations_of([r for r in rs if r.type != "gcp:container/cluster:Cluster"], GATED) == []


def test_with_rollouts_on_a_pool_without_a_canary_points_at_the_plan(plans):
    """prod with one pool's Canary gone, the others' kept: rollouts are on, so what keeps it in place is
    its node pool's room, which the config holds and the plan's rollouts table says."""
    rs = resources(plans["prod"])
    rs.remove(kind(rs, "Canary", "llama-8b-long"))
    (v,) = violations_of(rs, GATED)
    assert v.message.startswith("Deployment vllm/llama-8b-long (llama-8b long) serves in prod with no rollback gate")
    assert "though other pools' do" in v.message and "rollouts table says why" in v.message


def test_a_manual_canary_split_in_prod_is_told_to_use_rollouts(plans):
    """A model split by hand (models[].canary: a '<pool>-canary' Deployment beside the stable one)."""
    rs = resources(plans["prod"])
    rs[:] = [r for r in rs if r.props.get("kind") != "Canary"]
    dep = kind(rs, "Deployment", "qwen-7b-short", "vllm")
    labels = dep.props["spec"]["template"]["metadata"]["labels"]
    twin = Resource(dep.type, "qwen-7b-canary-short", {
        **dep.props, "metadata": {**dep.props["metadata"], "name": "qwen-7b-canary-short"},
        "spec": {**dep.props["spec"], "template": {**dep.props["spec"]["template"], "metadata": {
            "labels": {**labels, "vllm-gke.io/serving-pool": "short-canary"}}}}}, "urn:twin")
    rs.append(twin)
    by = _by_workload(violations_of(rs, GATED))
    for name in ("qwen-7b-short", "qwen-7b-canary-short"):
        assert "a manual canary split (models[].canary) is set by hand" in by[f"Deployment vllm/{name}"]
    assert by["Deployment vllm/llama-8b-short"].endswith("set vllm-gke:rollouts.enabled")


def _gate(rs, canary: str, suffix: str) -> dict:
    return next(m for m in kind(rs, "Canary", canary, "vllm").props["spec"]["analysis"]["metrics"] if m["name"].endswith(suffix))


def test_prods_gates_are_the_slos_own(plans):
    """prod's gates: its TTFT SLO's bound at its percentile and its availability's error budget."""
    rs = resources(plans["prod"])
    assert violations_of(rs, GATES) == []
    cfg = plans["prod"].config
    assert _gate(rs, "llama-70b-short", "-seconds")["thresholdRange"]["max"] == cfg.monitoring.ttft_slo_seconds
    assert _gate(rs, "llama-70b-short", "error-share-excess")["thresholdRange"]["max"] == pytest.approx(
        1 - cfg.monitoring.slos.availability)


def test_a_ttft_gate_above_the_slos_bound_or_below_its_percentile(plans):
    rs = resources(plans["prod"])
    _gate(rs, "qwen-7b-long", "-seconds")["thresholdRange"]["max"] = 2.5
    (v,) = violations_of(rs, GATES)
    assert v.resource and "Canary vllm/qwen-7b-long gate vllm-ttft-p95-seconds" in v.message
    assert "reach 2.5s, looser than the SLO (95.00% of first tokens within 2s)" in v.message
    assert "rollouts.gates.ttftSeconds at most 2" in v.message
    rs = resources(plans["prod"])
    gate = _gate(rs, "qwen-7b-long", "-seconds")
    gate["name"] = gate["templateRef"]["name"] = "vllm-ttft-p90-seconds"
    (v,) = violations_of(rs, GATES)
    assert "p90 time to first token" in v.message


def test_an_error_gate_above_the_error_budget(plans):
    rs = resources(plans["prod"])
    _gate(rs, "qwen-7b-short", "error-share-excess")["thresholdRange"]["max"] = 0.02
    (v,) = violations_of(rs, GATES)
    assert "fail 0.02 of its requests more than the primary, above the availability SLO's error budget (0.005)" \
        in v.message and "rollouts.gates.errorShare at most 0.005" in v.message


@pytest.mark.parametrize("change,words", [
    (lambda a, s: a.update(metrics=[]), "has no metric with a thresholdRange"),
    (lambda a, s: [m.pop("thresholdRange") for m in a["metrics"]], "has no metric with a thresholdRange"),
    (lambda a, s: s.update(skipAnalysis=True), "skips its analysis"),
    (lambda a, s: a.update(threshold=6), "rolled back after 6 failed checks but promoted after 5 passed ones"),
    (lambda a, s: a.update(threshold=4, stepWeights=[5, 25]), "after 4 failed checks but promoted after 3"),
    (lambda a, s: [a.update(threshold=3, stepWeights=[5, 25]), a.pop("stepWeight")],
     "after 3 failed checks but promoted after 2"),
])
def test_a_canary_that_cannot_fail_before_promotion(plans, change, words):
    """No gate, no analysis, or a threshold of failed checks above the passed checks to promotion
    (Flagger never lowers its count: a canary failing every other check gets through)."""
    rs = resources(plans["prod"])
    spec = kind(rs, "Canary", "llama-8b-short", "vllm").props["spec"]
    assert spec["analysis"]["maxWeight"] == 50 and spec["analysis"]["stepWeight"] == 10
    before = {(v.policy, v.message) for v in evaluate(rs)}
    change(spec["analysis"], spec)
    (v,) = [v for v in evaluate(rs) if (v.policy, v.message) not in before]
    assert v.policy == GATES and "Canary vllm/llama-8b-short" in v.message and words in v.message
