"""A Flagger pool, as the plan declares it and as Flagger completes it (policies/flagger_objects.py,
derived from Flagger v1.44.0's source): prod rolls out every pool by canary, and a request still
reaches the pool its length says, through the guard's header stripping, on the serving listener,
with a health check and a backend policy on each of Flagger's Services."""

from __future__ import annotations

from typing import Any

from tests.conftest import manifests_of, vllm_deployments
from vllm_gke.components.model.rollouts import WORKLOAD_LABEL
from vllm_gke.components.model.serving_plan import pool_rollout, servings
from vllm_gke.policies.flagger_objects import flagger_objects
from vllm_gke.policies.route_match import HttpRequest, reach


def _flagger(plan) -> list[dict[str, Any]]:
    return flagger_objects(manifests_of(plan, "Canary"), manifests_of(plan, "Deployment"))


def _routes(plan) -> list[dict[str, Any]]:
    declared = [r for r in manifests_of(plan, "HTTPRoute") if r["metadata"]["name"] != "https-redirect"]
    return declared + [o for o in _flagger(plan) if o["kind"] == "HTTPRoute"]


def _pool_of(reached) -> set[str]:
    """The serving pools a rule sends to: a Flagger pool's primary and canary are one pool."""
    return {b["name"].removesuffix("-primary").removesuffix("-canary") for b in reached.rule["backendRefs"]}


def test_prod_rolls_out_every_pool_by_canary(plans):
    """All of prod's pools can run a canary (floor of one, one node a replica, routed by length): the
    plan declares a Canary for each and no Service or HTTPRoute of the names Flagger owns."""
    plan = plans["prod"]
    canaries = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in manifests_of(plan, "Canary")}
    pools = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in vllm_deployments(plan)}
    assert canaries == pools and len(pools) == 8
    owned = {(ns, n + suffix) for ns, n in canaries for suffix in ("", "-primary", "-canary")}
    declared = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in
                manifests_of(plan, "Service") + manifests_of(plan, "HTTPRoute")}
    assert not owned & declared
    for d in vllm_deployments(plan):
        name = d["metadata"]["name"]
        assert d["spec"]["selector"]["matchLabels"][WORKLOAD_LABEL] == name
        assert d["spec"]["template"]["metadata"]["labels"][WORKLOAD_LABEL] == name


def test_a_request_reaches_the_pool_its_length_says(plans):
    """Flagger's routes hold each pool's own matches: the long pool's header matches outrank the short
    pool's path match across routes, as they did in one route."""
    plan = plans["prod"]
    routes = _routes(plan)
    for serving in servings(plan.config):
        model = serving.model
        base = f"/{serving.path}/v1/chat/completions"
        short = reach(routes, HttpRequest(base, headers={"content-length": "100"}), "https")
        long = reach(routes, HttpRequest(base, headers={"content-length": str(model.long_request_bytes)}), "https")
        hinted = reach(routes, HttpRequest(base, headers={"content-length": "100", "x-vllm-gke-length": "long"}),
                       "https")
        assert short and long and hinted, serving.key
        assert _pool_of(short) == {f"{model.name}-short"}, serving.key
        assert _pool_of(long) == _pool_of(hinted) == {f"{model.name}-long"}, serving.key
        # Namespaces tell a dedicated copy's pool from the shared one.
        ns = short.route["metadata"]["namespace"]
        assert ns == ("vllm" if serving.tenant is None else f"tenant-{serving.tenant}")


def test_flaggers_routes_strip_verified_headers_on_the_serving_listener(plans):
    plan = plans["prod"]
    for route in (o for o in _flagger(plan) if o["kind"] == "HTTPRoute"):
        (rule,) = route["spec"]["rules"]
        assert rule["filters"] == [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "remove": ["x-vllm-gke-issuer", "x-vllm-gke-subject"]}}]
        assert route["spec"]["parentRefs"] == [{"name": "vllm", "namespace": "vllm", "sectionName": "https"}]
        assert route["spec"]["hostnames"] == ["llm.acme.example"]
        assert {b["weight"] for b in rule["backendRefs"]} == {100, 0}


def test_each_of_flaggers_services_has_a_health_check_and_a_backend_policy(plans):
    plan = plans["prod"]
    services = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in _flagger(plan) if o["kind"] == "Service"}
    backends = {(r["metadata"]["namespace"], b["name"]) for r in _routes(plan) for rule in r["spec"]["rules"]
                for b in rule.get("backendRefs") or []}
    assert backends <= services
    for kind in ("HealthCheckPolicy", "GCPBackendPolicy"):
        covered = {(p["metadata"]["namespace"], p["spec"]["targetRef"]["name"]) for p in manifests_of(plan, kind)}
        assert backends <= covered, (kind, backends - covered)
    rates = {p["spec"]["targetRef"]["name"]: p["spec"]["default"].get("maxRatePerEndpoint")
             for p in manifests_of(plan, "GCPBackendPolicy", "vllm")}
    assert rates["llama-8b-short-primary"] == rates["llama-8b-short-canary"] == 40


def test_the_canary_service_selects_the_target_and_the_primary_its_copy(plans):
    """Flagger's canary Service selects the target's pods by the workload label; the primary's selects
    the value Flagger gives its copy (<name>-primary), which no pod the plan declares carries."""
    plan = plans["prod"]
    pods = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["template"]["metadata"]["labels"]
            for d in vllm_deployments(plan)}
    for svc in (o for o in _flagger(plan) if o["kind"] == "Service"):
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        selected = [k for k, labels in pods.items() if k[0] == ns and svc["spec"]["selector"].items() <= labels.items()]
        if name.endswith("-canary"):
            assert selected == [(ns, name.removesuffix("-canary"))]
        else:
            assert selected == [] and svc["spec"]["selector"] == {WORKLOAD_LABEL: f"{name.removesuffix('-primary')}-primary"}


def test_canary_ceilings_follow_the_plan(plans):
    """The target's ScaledObject runs the canary at the plan's ceiling while Flagger resumes it (paused
    at 0 from the start); the primary's, which the plan declares so that a scaling change reaches it,
    is what Flagger computes from the Canary: the pool's floor, the plan's primary ceiling, the
    primary's queries (scaled_object_reconciler.go reconcilePrimaryScaler)."""
    plan = plans["prod"]
    cfg = plan.config
    objects = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in manifests_of(plan, "ScaledObject")}
    canaries = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in manifests_of(plan, "Canary")}
    for serving in servings(cfg):
        ns = "vllm" if serving.tenant is None else f"tenant-{serving.tenant}"
        for which in serving.model.pool_names:
            rollout, name = pool_rollout(cfg, serving, which), f"{serving.model.name}-{which}"
            target, canary = objects[(ns, name)], canaries[(ns, name)]["spec"]
            # Flagger pauses it; the plan never declares the annotation (an update would set it back).
            assert "autoscaling.keda.sh/paused-replicas" not in (target["metadata"].get("annotations") or {})
            so = target["spec"]
            assert (so["minReplicaCount"], so["maxReplicaCount"]) == (rollout.canary_replicas, rollout.canary_replicas)
            scaler = canary["autoscalerRef"]
            assert scaler["primaryScalerReplicas"] == {
                "minReplicas": getattr(serving.model, which).min_replicas, "maxReplicas": rollout.primary_max}
            assert set(scaler["primaryScalerQueries"]) == {t["name"] for t in so["triggers"]}
            assert canary["analysis"]["maxWeight"] == rollout.max_weight
            assert canary["analysis"]["maxWeight"] % canary["analysis"]["stepWeight"] == 0
            primary = objects[(ns, f"{name}-primary")]["spec"]
            assert primary["scaleTargetRef"] == {**so["scaleTargetRef"], "name": f"{name}-primary"}
            assert (primary["minReplicaCount"], primary["maxReplicaCount"]) == (
                scaler["primaryScalerReplicas"]["minReplicas"], scaler["primaryScalerReplicas"]["maxReplicas"])
            assert [t["metadata"]["query"] for t in primary["triggers"]] == [
                scaler["primaryScalerQueries"][t["name"]] for t in so["triggers"]]
            assert primary["advanced"] == so["advanced"]


def test_a_flagger_target_starts_at_zero(plans):
    """Flagger copies the target to the primary, which serves: the target runs only while a canary
    is analysed, so it is created at 0 (no replica loads for nothing on the first `pulumi up`)."""
    for d in vllm_deployments(plans["prod"]):
        assert d["spec"]["replicas"] == 0, d["metadata"]["name"]


def test_no_canary_can_outlast_its_failed_checks(plans):
    """Flagger never lowers the failed-check count and promotes after `steps` passed checks: a
    threshold of `steps` would promote a canary passing and failing by turns (P F P). Each Canary's is
    below its steps (one where it has one step)."""
    for c in manifests_of(plans["prod"], "Canary"):
        a = c["spec"]["analysis"]
        steps = a["maxWeight"] // a["stepWeight"]
        assert a["threshold"] == min(plans["prod"].config.rollouts.failed_checks, max(1, steps - 1))
    short = next(c for c in manifests_of(plans["prod"], "Canary") if c["metadata"]["name"] == "llama-70b-short")
    assert short["spec"]["analysis"]["maxWeight"] // short["spec"]["analysis"]["stepWeight"] == 2
    assert short["spec"]["analysis"]["threshold"] == 1


def test_a_one_step_canary_rolls_back_at_its_first_failed_check(plans):
    """A canary promoted after one step (its share under one stack step) gets a threshold of 1."""
    from vllm_gke.components.model.rollouts import FlaggerPool, RolloutPlan, canary_spec

    cfg = plans["prod"].config
    one = RolloutPlan("canary", "", 1, 19, 5, 900, 120, 600, step_weight=5)
    spec = canary_spec("m-short", "short", 2, FlaggerPool(one, cfg.rollouts, cfg.monitoring, "m", 16384, "https"),
                       "vllm", {"queue": "q", "keep": "k"})
    assert cfg.rollouts.failed_checks == 2 and spec["analysis"]["threshold"] == 1
    assert (spec["analysis"]["stepWeight"], spec["analysis"]["maxWeight"]) == (5, 5)
