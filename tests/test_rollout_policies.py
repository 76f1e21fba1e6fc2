"""The rollout policies: in prod every serving pool is a Flagger Canary's target (or the plan says why it
cannot be), and a Canary's gates are no looser than the SLOs and can fail it before promotion."""

from __future__ import annotations

import pytest

from tests.test_policies import kind, resources, violations_of
from vllm_gke.components.model.rollouts import gates
from vllm_gke.components.model.specs import MonitoringSpec, RolloutSpec
from vllm_gke.policies.gate_queries import canary_error_share, ttft_quantile
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
    assert "behind the endpoint picker its backend is an InferencePool (llama-8b)" in by["Deployment vllm/llama-8b-short"]
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


def _template(rs, name: str) -> dict:
    return kind(rs, "MetricTemplate", name, "flagger-system").props["spec"]


def kube_canaries(rs) -> list:
    return [r for r in rs if r.props.get("kind") == "Canary"]


def _messages(rs, canary: str) -> list[str]:
    return [v.message for v in violations_of(rs, GATES) if f"Canary vllm/{canary} " in v.message]


def test_a_ttft_gate_above_the_slos_bound_or_below_its_percentile(plans):
    rs = resources(plans["prod"])
    _gate(rs, "qwen-7b-long", "-seconds")["thresholdRange"]["max"] = 2.5
    (v,) = violations_of(rs, GATES)
    assert v.resource and "Canary vllm/qwen-7b-long gate vllm-ttft-p95-seconds" in v.message
    assert "reach 2.5s, looser than the SLO (95.00% of first tokens within 2s)" in v.message
    assert "rollouts.gates.ttftSeconds at most 2" in v.message
    # The percentile is the query's, whatever the template's name says: p50 under the name p95.
    rs = resources(plans["prod"])
    template = _template(rs, "vllm-ttft-p95-seconds")
    template["query"] = template["query"].replace("histogram_quantile(0.95,", "histogram_quantile(0.5,")
    found = violations_of(rs, GATES)
    assert len(found) == len(kube_canaries(rs)), [v.message for v in found]
    (message,) = _messages(rs, "qwen-7b-long")
    assert "gate vllm-ttft-p95-seconds lets a canary's p50 time to first token reach 2s, looser than the SLO" in message
    assert "its MetricTemplate reads p50 (histogram_quantile's first argument): read the SLO's p95" in message


def test_a_gates_name_alone_says_nothing(plans):
    """Renamed, the stack's gates still hold the SLOs (their templates' queries do)."""
    rs = resources(plans["prod"])
    _gate(rs, "qwen-7b-long", "-seconds")["name"] = "vllm-ttft-p50-seconds"
    _gate(rs, "qwen-7b-long", "error-share-excess")["name"] = "whatever"
    assert violations_of(rs, GATES) == []


MISSING_TTFT = "has no gate on the canary's own time to first token at the SLO's percentile (p95 within 2s)"
MISSING_ERRORS = "has no gate on the canary's share of server errors"


@pytest.mark.parametrize("keep,bound", [
    (("vllm-itl-p99-ratio",), None),
    (("vllm-ttft-p99-ratio", "vllm-ttft-p95-ratio", "vllm-itl-p99-ratio"), 5.0),
])
def test_a_canary_without_the_slos_gates(plans, keep, bound):
    """Only the ITL gate; or only gates against the primary, however loose: a canary as slow as its
    primary, or failing within the primary's share of the budget, has nothing to stop it."""
    rs = resources(plans["prod"])
    analysis = kind(rs, "Canary", "llama-8b-short", "vllm").props["spec"]["analysis"]
    analysis["metrics"] = [m for m in analysis["metrics"] if m["name"] in keep]
    for m in analysis["metrics"]:
        m["thresholdRange"]["max"] = bound or m["thresholdRange"]["max"]
    ttft, errors = violations_of(rs, GATES)
    assert MISSING_TTFT in ttft.message and "histogram_quantile(0.95, ...)" in ttft.message
    assert "its thresholdRange.max at most 2 (the stack's vllm-ttft-p*-seconds)" in ttft.message
    assert MISSING_ERRORS in errors.message and "at most 0.005 (the stack's vllm-error-share-excess)" in errors.message


def test_gates_that_nothing_can_fail(plans):
    """Every gate at thresholdRange {min: 0}: each is named (and the SLO's gates are there, unbounded)."""
    rs = resources(plans["prod"])
    metrics = kind(rs, "Canary", "llama-8b-short", "vllm").props["spec"]["analysis"]["metrics"]
    for m in metrics:
        m["thresholdRange"] = {"min": 0}
    found = [v.message for v in violations_of(rs, GATES)]
    assert len(found) == len(metrics)
    assert all(f"Canary vllm/llama-8b-short gate {m['name']} has no max bound" in f for m, f in zip(metrics, found))


def _swap_workloads(query: str) -> str:
    """The query with the canary's and the primary's series swapped."""
    canary, primary = 'workload="{{ target }}"', 'workload="{{ target }}-primary"'
    assert canary in query
    return query.replace(primary, "\0").replace(canary, primary).replace("\0", canary)


@pytest.mark.parametrize("template,change,missing", [
    # The seconds gate on the primary's series: the primary's TTFT, not the canary's.
    ("vllm-ttft-p95-seconds", _swap_workloads, MISSING_TTFT),
    # Scaled: the canary's p95 may reach twice the bound.
    ("vllm-ttft-p95-seconds", lambda q: f"{q} / 2", MISSING_TTFT),
    # The primary's share less the canary's: an erring canary lowers it.
    ("vllm-error-share-excess", _swap_workloads, MISSING_ERRORS),
])
def test_a_gate_whose_query_reads_something_else(plans, template, change, missing):
    rs = resources(plans["prod"])
    spec = _template(rs, template)
    spec["query"] = change(spec["query"])
    (message,) = _messages(rs, "qwen-7b-long")
    assert missing in message


@pytest.mark.parametrize("cluster", ["", "vllm-prod"])
def test_what_the_stacks_gate_queries_read(cluster):
    """Of the stack's gates, the seconds gate alone is the canary's TTFT at one quantile (the SLO's, or
    the one its slos.ttft names), the error-share gate alone the canary's error share."""
    for q in (0.95, 0.995):
        monitoring = MonitoringSpec.model_validate({"slos": {"ttft": q}})
        read = {g.name: (ttft_quantile(g.query), canary_error_share(g.query))
                for g in gates(RolloutSpec(), monitoring, cluster)}
        seconds = "vllm-ttft-p95-seconds" if q == 0.95 else "vllm-ttft-p99-5-seconds"
        assert {n: v for n, v in read.items() if v != (None, False)} == {
            seconds: (q, False), "vllm-error-share-excess": (None, True)}, read


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
