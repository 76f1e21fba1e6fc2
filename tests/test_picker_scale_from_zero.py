"""Scale from zero behind the endpoint picker (components/model/picker_wake.py): a pool at zero
behind a picker that queues has no standby (its InferencePool selects vLLM pods only) and KEDA
wakes it on the picker's queue; length-routed pools and picker pools without flow control keep
their standby; the plan says whether first requests after idle outlive the wake."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.k8s_cluster import CONTROL_PLANE, CRD_FILES, CRDS, ControlPlane, apply_stack, crds_established, settle
from vllm_gke.components.model.keda_scaling import picker_wake_query
from vllm_gke.components.model.picker_wake import PickerWake, picker_wakes
from vllm_gke.components.model.serving_plan import pool_services, servings
from vllm_gke.infra.advice import plan_warnings
from vllm_gke.infra.config import parse
from vllm_gke.policies.rules import Resource, evaluate

LLMD_CRD_FILES = ("llmd-router-v0.10.0-inferenceobjectives.yaml", "llmd-router-v0.10.0-inferencemodelrewrites.yaml")


def picker_at_zero(values: dict[str, Any]) -> None:
    """staging's llama-8b (behind the picker, one Deployment a replica) allowed to go to zero."""
    (llama,) = [m for m in values["vllm-gke:models"] if m["name"] == "llama-8b"]
    llama["short"].update(minReplicas=0, cooldownSeconds=3600)


def flow_control_off(values: dict[str, Any]) -> None:
    picker_at_zero(values)
    values["vllm-gke:picker"] = {"flowControl": {"enabled": False}}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def answered(rs: list[Resource]) -> list[str]:
    """The policy scale-to-zero-answered's findings."""
    return [v.message for v in evaluate(rs) if v.policy == "scale-to-zero-answered"]


def resources(plan: Any) -> list[Resource]:
    return [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in plan.policy_resources()]


def of(rs: list[Resource], kind: str, name: str) -> dict[str, Any]:
    (found,) = [r.props for r in rs if r.props.get("kind") == kind and r.props["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_wake_query_sums_the_pickers_queue_and_undispatched_requests_over_its_replicas():
    queued = 'llm_d_epp_flow_control_queue_size{namespace="vllm",inference_pool="llama-8b"}'
    dropped = ('llm_d_epp_flow_control_requests_total{namespace="vllm",inference_pool="llama-8b",'
               'outcome!="Dispatched"}')
    # sum() with no `by`: over every picker replica (only the leader queues) and every band and tenant.
    assert picker_wake_query("vllm", "llama-8b") == (
        f"clamp_max((sum({queued}) or vector(0)) + (sum(increase({dropped}[2m])) or vector(0)) + "
        f"(sum({dropped} unless count_over_time({dropped}[1h] offset 2m)) or vector(0)), 1)")


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI evaluates the wake query: .ci/run installs Debian's prometheus (promtool)")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    return tool


QUEUE = ('llm_d_epp_flow_control_queue_size{{namespace="{ns}",inference_pool="{pool}",pod="{pod}",'
         'fairness_id="search",priority="0",model_name="llama-8b",target_model_name="llama-8b"}}')
OUTCOMES = ('llm_d_epp_flow_control_requests_total{{namespace="{ns}",inference_pool="{pool}",pod="{pod}",'
            'outcome="{outcome}",priority="0"}}')


@pytest.mark.parametrize("series, at, wake", [
    # One request queued on the leader; the other replica's gauge stays 0.
    ([(QUEUE, "epp-a", "", "0 0 1 1 1 0 0 0"), (QUEUE, "epp-b", "", "0x7")], "30s", 1),
    ([(QUEUE, "epp-a", "", "0 0 1 1 1 0 0 0"), (QUEUE, "epp-b", "", "0x7")], "0s", 0),
    # A burst that expired between two scrapes of the gauge: the counter's series is born at 1.
    ([(QUEUE, "epp-a", "", "0x20"), (OUTCOMES, "epp-a", "EvictedTTL", "_ _ _ _ 1x16")], "90s", 1),
    # ...and two minutes later it no longer asks.
    ([(QUEUE, "epp-a", "", "0x20"), (OUTCOMES, "epp-a", "EvictedTTL", "_ _ _ _ 1x16")], "4m", 0),
    # A full queue while empty, on a series that already counted some.
    ([(OUTCOMES, "epp-b", "RejectedNoEndpoints", "2x8 3x8")], "150s", 1),
    # A scrape gap of six minutes (a collector outage): the counter's series is back with its old total,
    # not born: no wake (counted whole, it would hold a GPU node for the cooldown)...
    ([(OUTCOMES, "epp-a", "EvictedTTL", "3x8 _x30 3x8")], "630s", 0),
    # ...while one that rises once it is back still wakes it.
    ([(OUTCOMES, "epp-a", "EvictedTTL", "3x8 _x30 3x4 4x4")], "690s", 1),
    # Requests dispatched (the pool serves): no wake.
    ([(QUEUE, "epp-a", "", "0x10"), (OUTCOMES, "epp-a", "Dispatched", "_ 1+1x10")], "150s", 0),
    # Another pool's queue, or the same pool's name in another namespace: not this pool's.
    ([(QUEUE.replace("{pool}", "other"), "epp-a", "", "1x10")], "60s", 0),
    ([(QUEUE.replace("{ns}", "tenant-a"), "epp-a", "", "1x10")], "60s", 0),
    # Many queued: still one replica asked for (the vLLM triggers take it from there).
    ([(QUEUE, "epp-a", "", "40x10"), (OUTCOMES, "epp-a", "EvictedTTL", "_ _ 7x8")], "60s", 1),
])
def test_the_wake_query_evaluated_by_prometheus(tmp_path, series, at, wake):
    import yaml

    inputs = [{"series": s.format(ns="vllm", pool="llama-8b", pod=pod, outcome=outcome), "values": values}
              for s, pod, outcome, values in series]
    # Evaluated at each scrape (promtool's default evaluation interval is a minute).
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": inputs,
        "promql_expr_test": [{"expr": picker_wake_query("vllm", "llama-8b"), "eval_time": at,
                              "exp_samples": [{"labels": "{}", "value": wake}]}]}]}))
    done = subprocess.run([_promtool(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_picker_pool_at_zero_waits_in_the_queue_with_no_standby(plan_variant):
    plan = plan_variant("staging", picker_at_zero)
    docs = plan.manifests()
    so = one(docs, "ScaledObject", "llama-8b-short")["spec"]
    wake, queue, keep = so["triggers"]
    assert (wake["name"], so["minReplicaCount"]) == ("wake", 0)
    assert wake["metadata"]["query"] == picker_wake_query("vllm", "llama-8b")
    # One queued request wakes it (activation above 0), and the trigger asks for one replica at most.
    assert (wake["metadata"]["threshold"], wake["metadata"]["activationThreshold"]) == ("1", "0")
    assert "vllm:num_requests_waiting" in queue["metadata"]["query"]
    assert "vllm:num_requests_running" in keep["metadata"]["query"]
    assert not [d for d in docs if d["metadata"]["name"].startswith("llama-8b-short-standby")
                or d["metadata"]["name"] == "llama-8b-short-ready"]
    # The InferencePool selects the vLLM pods and would select no standby: the length pool's
    # (mistral-7b long) carries the same kind of labels and is left out by the vLLM-only label.
    pool = one(docs, "InferencePool", "llama-8b")["spec"]["selector"]["matchLabels"]
    server = one(docs, "Deployment", "llama-8b-short")["spec"]["template"]["metadata"]["labels"]
    assert selects(pool, server)
    standby = one(docs, "Deployment", "mistral-7b-long-standby")["spec"]["template"]["metadata"]["labels"]
    assert not selects(pool, {**standby, "vllm-gke.io/model": "llama-8b", "vllm-gke.io/serving-pool": "short"})
    assert not answered(resources(plan))


def test_length_pools_and_pickers_without_flow_control_keep_their_standby(plan_variant):
    plan = plan_variant("staging", flow_control_off)
    docs = plan.manifests()
    # No queue in front of the picker: its standby answers at zero, selected by the InferencePool.
    standby = one(docs, "Deployment", "llama-8b-short-standby")["spec"]["template"]["metadata"]["labels"]
    assert selects(one(docs, "InferencePool", "llama-8b")["spec"]["selector"]["matchLabels"], standby)
    wake = one(docs, "ScaledObject", "llama-8b-short")["spec"]["triggers"][0]["metadata"]["query"]
    assert "vllm_gke_standby_requests_total" in wake and "llm_d_epp" not in wake
    # The length-routed pool at zero: the load balancer's only answer there is its standby.
    assert one(docs, "Deployment", "mistral-7b-long-standby")
    assert "vllm_gke_standby_requests_total" in \
        one(docs, "ScaledObject", "mistral-7b-long")["spec"]["triggers"][0]["metadata"]["query"]
    assert not answered(resources(plan))


def test_the_policy_refuses_a_standby_in_a_queueing_pickers_pool_and_a_pool_nothing_wakes(plan_variant):
    rs = resources(plan_variant("staging", picker_at_zero))
    of(rs, "InferencePool", "llama-8b")["spec"]["selector"]["matchLabels"].pop("app.kubernetes.io/name")
    standby = of(rs, "Deployment", "mistral-7b-long-standby")["spec"]["template"]["metadata"]["labels"]
    standby.update({"vllm-gke.io/model": "llama-8b", "vllm-gke.io/serving-pool": "short"})
    assert any("selects a standby" in m and "llama-8b" in m for m in answered(rs)), answered(rs)
    rs = resources(plan_variant("staging", picker_at_zero))
    so = of(rs, "ScaledObject", "llama-8b-short")["spec"]
    so["triggers"] = so["triggers"][1:]  # no wake trigger
    assert any("no standby sits behind" in m and "llama-8b-short" in m for m in answered(rs)), answered(rs)


def test_the_plan_says_first_requests_expire_when_the_wake_outlasts_the_queue(stack_values):
    cfg = parse(stack_values["frontier"])
    wakes = {w.label: w for w in picker_wakes(cfg)}
    assert set(wakes) == {"llama-405b", "llama-70b-tpu"}
    assert all(w.ttl_seconds == 60 and w.wake_seconds > 60 and w.first_requests == "expire" for w in wakes.values())
    warned = [w for w in plan_warnings(cfg, "BASIC_SSD") if "behind the picker, at zero" in w]
    assert len(warned) == 2 and all("queue time-to-live 60 s" in w and "rejected-no-endpoints" in w
                                    and "clients must retry" in w for w in warned)
    assert f"wakes in ~{wakes['llama-405b'].wake_seconds / 60:.0f} min" in next(w for w in warned if "405b" in w)
    # No pool at zero behind a picker: nothing to say.
    assert not picker_wakes(parse(stack_values["staging"]))


@pytest.mark.parametrize("wake, ttl, timeout, verdict", [
    (300, 60, 600, "expire"),
    (300, 400, 600, "served"),
    (300, 300, 300, "served"),
    (700, 900, 600, "cut"),  # the load balancer gives up before the queue does
    (700, 0, 600, "cut"),  # no time-to-live
    (500, 0, 600, "served"),
])
def test_first_requests_after_idle(wake, ttl, timeout, verdict):
    w = PickerWake("m", wake, ttl, timeout)
    assert w.first_requests == verdict
    assert (w.warning() is None) == (verdict == "served")


def test_a_picker_pool_at_zero_on_the_control_plane_has_no_ready_endpoint_and_scales_0_1_0(plan_variant):
    """On the real control plane: at zero the InferencePool's selector finds no ready pod (no standby
    stands in, so the picker's pool is empty and it queues); at one, the replica; back to zero."""
    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run this")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    plan = plan_variant("staging", picker_at_zero)
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-picker-zero-")))
    try:
        # The picker's objectives are llm-d.ai's (llm-d-router v0.10.0), beside the pinned files.
        for name in dict.fromkeys((*CRD_FILES, *LLMD_CRD_FILES)):
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        docs = apply_stack(cp, plan)
        settle(cp, timeout=240)
        pool = one(docs, "InferencePool", "llama-8b")
        selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())

        def ready() -> list[str]:
            pods = cp.get("pods", "-n", "vllm", "-l", selector)["items"]
            return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp") and any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])]

        assert one(docs, "ScaledObject", "llama-8b-short")["spec"]["minReplicaCount"] == 0
        assert not ready()
        # Every pod the length pool's standby runs is Ready here (no probes run): none is in the pool.
        assert cp.get("pods", "-n", "vllm", "-l", "vllm-gke.io/standby=true")["items"]
        cp.kubectl("scale", "deployment", "llama-8b-short", "-n", "vllm", "--replicas=1")
        settle(cp, timeout=240)
        assert [n for n in ready() if n.startswith("llama-8b-short-")] == ready() and len(ready()) == 1
        cp.kubectl("scale", "deployment", "llama-8b-short", "-n", "vllm", "--replicas=0")
        cp.wait_until("llama-8b-short at zero", lambda: not ready() and not [
            p for p in cp.get("pods", "-n", "vllm")["items"] if p["metadata"]["name"].startswith("llama-8b-short-")])
    finally:
        cp.down()


def test_a_picker_pool_with_a_floor_selects_vllm_pods_only(plan_variant):
    # staging as shipped: its picker pool keeps a floor of 2, so no standby and no wake trigger.
    docs = plan_variant("staging").manifests()
    assert one(docs, "InferencePool", "llama-8b")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "vllm"
    assert [t["name"] for t in one(docs, "ScaledObject", "llama-8b-short")["spec"]["triggers"]] == ["queue", "keep"]


def test_the_serving_plan_names_a_standby_or_the_pickers_pool_to_wake_on(stack_values):
    cfg = parse(stack_values["frontier"])
    wake = {p.key: (p.standby_name, p.picker_pool) for s in servings(cfg) for p in pool_services(cfg, s)
            if p.pool.min_replicas == 0}
    assert wake == {"llama-405b-short": ("", "llama-405b"), "llama-70b-tpu-short": ("", "llama-70b-tpu"),
                    "llama-8b-tpu-long": ("llama-8b-tpu-long-standby", "")}
