"""models[].fallback in the plan: the config's checks (key, fix, exit 2), who each pool's guard
sends where (components/model/fallback.py), the token kept on the sent tenants' requests, the
mesh admitting a sent request exactly as the tenant's own call (no new grant), the dashboard's
chart. The guard's side: tests/test_guard_fallback.py and tests/test_guard_fallback_in_vllm.py."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, vllm_deployments
from tests.test_config_rules import problems
from vllm_gke.components.model.fallback import fallback_guard_config, forwards_token
from vllm_gke.components.model.monitoring import FALLBACK_REQUESTS_METRIC, alert_policies
from vllm_gke.components.model.specs import MonitoringSpec
from vllm_gke.infra.config import parse

SUPPORT = "https://auth.acme.example/support"


def model(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in values["vllm-gke:models"] if m["name"] == name)


def tenant(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in values["vllm-gke:tenants"] if t["name"] == name)


def with_fallback(values: dict[str, Any]) -> None:
    """prod, llama-8b's shed tenant (support, -1, which may call qwen-7b) sent to qwen-7b."""
    model(values, "llama-8b")["fallback"] = {"model": "qwen-7b"}


def guard_configs(plan) -> dict[str, dict[str, Any]]:
    out = {}
    for d in vllm_deployments(plan):
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            if "GKE_LLM_GUARD_CONFIG" in env:
                out[f'{d["metadata"]["namespace"]}/{d["metadata"]["name"]}'] = json.loads(env["GKE_LLM_GUARD_CONFIG"])
    return out


@pytest.fixture(scope="module")
def prod_plans(stack_values):
    from vllm_gke.infra.plan import run_program

    values = copy.deepcopy(stack_values["prod"])
    with_fallback(values)
    return run_program("prod", copy.deepcopy(stack_values["prod"])), run_program("prod", values)


def test_the_shed_tenants_allowed_the_fallback_are_sent_there_from_every_pool_of_the_model(prod_plans):
    _, plan = prod_plans
    configs = guard_configs(plan)
    sending = {k for k, c in configs.items() if "fallback" in c}
    # llama-8b's pools; nothing else sends (qwen-7b, llama-70b, a dedicated copy).
    assert sending and all(k.startswith("vllm/llama-8b-") for k in sending), sending
    assert {k.split("/")[1].removesuffix("-primary") for k in sending} >= {"llama-8b-short", "llama-8b-long"}
    for key in sending:
        fallback = configs[key]["fallback"]
        assert fallback["model"] == "qwen-7b" and fallback["paths"] == ["/v1/chat/completions", "/v1/completions"]
        # support (-1) may call qwen-7b; search (0) is never shed.
        assert fallback["tenants"] == {"support": {
            "url": "http://qwen-7b-short.vllm.svc.cluster.local:8000/qwen-7b",
            "longUrl": "http://qwen-7b-long.vllm.svc.cluster.local:8000/qwen-7b"}}
        assert fallback["longRequestBytes"] == 16384 and fallback["timeoutSeconds"] == 600
    assert not any("fallback" in c for c in guard_configs(prod_plans[0]).values())


def test_the_guard_reads_the_plans_fallback(prod_plans):
    from tests.test_guard import guard

    (cfg, *_) = (c for k, c in guard_configs(prod_plans[1]).items() if "fallback" in c)
    mw = guard.GuardMiddleware(lambda *a: None, {k: v for k, v in cfg.items() if k != "globalLimits"})
    assert mw.fallback is not None and set(mw.fallback.routes) == {"support"}
    assert mw.fallback.route("support", "/v1/chat/completions") is not None
    assert mw.fallback.route("search", "/v1/chat/completions") is None
    assert mw.fallback.route("support", "/v1/responses") is None


def test_behind_the_picker_and_to_a_dedicated_copy(stack_values):
    # staging: mistral-7b's shed tenant (support) sent to llama-8b, behind the endpoint picker.
    values = copy.deepcopy(stack_values["staging"])
    model(values, "mistral-7b")["fallback"] = {"model": "llama-8b"}
    cfg = parse(values)
    mistral = cfg.model("mistral-7b")
    sent = fallback_guard_config(cfg, mistral, [t for t in cfg.tenants if "mistral-7b" in t.models])
    assert sent is not None and sent["tenants"] == {"support": {
        "url": f"http://llama-8b-short.{cfg.serving_namespace}.svc.cluster.local:8000/support/llama-8b",
        "headers": {"x-llm-d-inference-objective": "support.llama-8b"}}}
    # prod: analytics (made sheddable, allowed llama-8b) has qwen-7b dedicated: its own copy serves it.
    values = copy.deepcopy(stack_values["prod"])
    with_fallback(values)
    tenant(values, "analytics").update(priority=-2, models=["qwen-7b", "llama-8b"])
    cfg = parse(values)
    callers = [t for t in cfg.tenants if "llama-8b" in t.models]
    sent = fallback_guard_config(cfg, cfg.model("llama-8b"), callers)
    assert sent is not None and sent["tenants"]["analytics"] == {
        "url": "http://qwen-7b-short.tenant-analytics.svc.cluster.local:8000/analytics/qwen-7b",
        "longUrl": "http://qwen-7b-long.tenant-analytics.svc.cluster.local:8000/analytics/qwen-7b"}
    assert fallback_guard_config(cfg, cfg.model("llama-8b"), callers, dedicated=True) is None
    assert [t.name for t in cfg.tenants if forwards_token(cfg, t)] == ["support", "analytics"]


def test_only_the_sent_tenants_token_stays_on_their_requests_to_the_shared_servers(prod_plans):
    """Istio drops the token after verifying it; the replica can send it on only where it is kept:
    for the tenants sent to a fallback, in the serving namespace only."""
    for plan, kept in zip(prod_plans, [set(), {("vllm", "jwt-support")}]):
        found = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in plan.manifests()
                 if d["kind"] == "RequestAuthentication" and d["spec"]["jwtRules"][0]["forwardOriginalToken"]}
        assert found == kept


def test_the_mesh_admits_a_sent_request_as_the_tenants_own_call_and_nothing_new(prod_plans):
    """No new grant: the fallback's policies are those of the stack without it. A request sent with
    the tenant's token is admitted by the tenant's own allow for the fallback model (its sidecar
    verifies the token again); without the token, or a tenant not allowed the fallback, refused."""
    from vllm_gke.policies.mesh_authz import Request, decide

    def policies(plan):
        return sorted(json.dumps(d, sort_keys=True) for d in plan.manifests() if d["kind"] == "AuthorizationPolicy")

    plain, plan = prod_plans
    assert policies(plain) == policies(plan)
    docs, labels = plan.manifests(), {"vllm-gke.io/model": "qwen-7b"}

    def sent(token=None, headers=None):
        # From the llama-8b replica's pod, through its sidecar's mTLS, to the qwen-7b replica's sidecar.
        return decide(docs, Request("vllm", "/qwen-7b/v1/chat/completions", "POST", labels, "10.20.3.7",
                                    token=token, headers=headers or {}))

    assert sent((SUPPORT, "drafts-service")).allowed
    assert sent().status == 403
    assert sent(headers={"x-vllm-gke-issuer": SUPPORT}).status == 403  # a claim header without its token
    assert sent(("https://auth.acme.example/search", "s")).status == 403  # search may not call qwen-7b


def test_the_dashboard_charts_what_is_sent(prod_plans):
    def charted(plan):
        return [FALLBACK_REQUESTS_METRIC in r.props["dashboardJson"]
                for r in plan.of_type("gcp:monitoring/dashboard:Dashboard")]

    assert not any(charted(prod_plans[0])) and any(charted(prod_plans[1]))


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI evaluates the alert's query: .ci/run installs Debian's prometheus (promtool)")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    return tool


def test_the_shed_alert_still_warns_while_the_fallback_takes_the_overflow(tmp_path):
    """'Tenants shed for overload', its query and duration as a Prometheus alerting rule, run by
    promtool over a guard's series (per replica: pod): a tenant the fallback serves keeps it
    firing as one answered 429 does, and a refused request (counted `shed` too) once."""
    import yaml

    (policy,) = [p for p in alert_policies("c", MonitoringSpec(), sheddable=True)
                 if p["display_name"] == "Tenants shed for overload"]
    condition = policy["conditions"][0]["condition_prometheus_query_language"]
    rules = {"groups": [{"name": "g", "rules": [{"alert": "shed", "expr": condition["query"],
                                                  "for": condition["duration"]}]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))

    def series(metric, tenant, outcome, **labels):  # six a minute for half an hour
        found = ",".join(f'{k}="{v}"' for k, v in {"cluster": "c", "pod": "p", "tenant": tenant, "model": "m",
                                                      "outcome": outcome, **labels}.items())
        return {"series": f"{metric}{{{found}}}", "values": "0+6x30"}

    fallback, requests = FALLBACK_REQUESTS_METRIC, "vllm_gke_tenant_requests_total"
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [series(fallback, "drafts", "served", fallback="small"),  # every shed request served there
                         series(fallback, "drafts", "cut", fallback="small"),
                         series(requests, "batch", "shed"),  # answered 429
                         series(requests, "support", "shed"), series(fallback, "support", "refused", fallback="small"),
                         series(requests, "search", "ok")],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "shed", "exp_alerts": [
            {"exp_labels": {"tenant": t, "model": "m"}} for t in ("drafts", "batch", "support")]}],
        "promql_expr_test": [{"expr": condition["query"].removesuffix(" > 0"), "eval_time": "20m", "exp_samples": [
            {"labels": f'{{tenant="{t}", model="m"}}', "value": v} for t, v in
            (("drafts", 0.2), ("batch", 0.1), ("support", 0.1))]}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run([_promtool(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _shed(values: dict[str, Any], priority: int) -> None:
    with_fallback(values)
    tenant(values, "support")["priority"] = priority


CASES = [
    ("itself", lambda v: model(v, "llama-8b").update(fallback={"model": "llama-8b"}),
     "'llama-8b' is the model itself"),
    ("undeclared", lambda v: model(v, "llama-8b").update(fallback={"model": "qwen-72b"}),
     "model 'qwen-72b' is not declared; use one of llama-70b, qwen-7b"),
    ("chain", lambda v: (with_fallback(v), model(v, "qwen-7b").update(fallback={"model": "llama-70b"})),
     "model 'qwen-7b' has a fallback of its own ('llama-70b')"),
    ("loop", lambda v: (with_fallback(v), model(v, "qwen-7b").update(fallback={"model": "llama-8b"})),
     "never along a chain or round a loop"),
    ("nobody-shed", lambda v: _shed(v, 0), "no tenant calling model 'llama-8b' on its shared replicas has a "
     "negative priority"),
    ("nobody-allowed", lambda v: model(v, "llama-8b").update(fallback={"model": "llama-70b"}),
     "none of the tenants model 'llama-8b' sheds (support) may call 'llama-70b'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_fallback_that_cannot_work_is_refused_with_the_key_and_the_fix(stack_values, case):
    _id, mutate, words = case
    values = copy.deepcopy(stack_values["prod"])
    mutate(values)
    found = problems(values)
    assert any(p.startswith("vllm-gke:models[") and ".fallback.model: " in p and words in p for p in found), found
    assert all(("remove" in p and "fallback" in p) or "add it under" in p for p in found if ".fallback." in p)


@pytest.mark.parametrize("queue", [2, 2.5])
def test_a_queue_objective_not_below_the_ttft_bound_is_refused_with_a_fallback(stack_values, queue):
    """Requests go to the fallback only while the queue time is over its objective: at or over the
    TTFT bound (prod's: 2 s), that bound is broken before any is sent."""
    values = copy.deepcopy(stack_values["prod"])
    with_fallback(values)
    values["vllm-gke:monitoring"]["queueLatencySloSeconds"] = queue
    found = [p for p in problems(values) if p.startswith("vllm-gke:monitoring.queueLatencySloSeconds: ")]
    assert len(found) == 1 and f"{queue:g}s is not below monitoring.ttftSloSeconds (2s)" in found[0], found
    assert "llama-8b" in found[0] and "set it below 2s" in found[0] and "remove models[].fallback" in found[0]
    values["vllm-gke:monitoring"]["queueLatencySloSeconds"] = 1.5
    parse(values)
    del model(values, "llama-8b")["fallback"]  # without a fallback, the objectives are the stack's own business
    values["vllm-gke:monitoring"]["queueLatencySloSeconds"] = queue
    parse(values)


def test_the_cli_exits_2_on_a_bad_fallback_without_a_traceback(tmp_path, stack_values):
    import yaml

    values = copy.deepcopy(stack_values["prod"])
    model(values, "llama-8b")["fallback"] = {"model": "llama-8b"}
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "bad", "--stacks-dir",
                             str(tmp_path), "--no-write"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "vllm-gke:models[llama-8b].fallback.model" in result.stdout and "is the model itself" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_bad_fallbacks_key_is_named(stack_values):
    values = copy.deepcopy(stack_values["prod"])
    model(values, "llama-8b")["fallback"] = {"modle": "qwen-7b"}
    found = problems(values)
    assert "vllm-gke:models[llama-8b].fallback.modle: is not a known setting; did you mean model?" in found, found


def test_a_lone_vllm_service_refuses_a_fallback_it_cannot_reach():
    """The component package's VllmService holds one model's pool: no other model's Service, no
    tenant's token. A fallback given there is named, not ignored (ServingPlatform serves one)."""
    from tests.test_package import MODEL, _service
    from vllm_gke.components import provider
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import _under_mocks

    with pytest.raises(InputError) as exc:
        _under_mocks("p", "dev", {}, lambda: provider.VllmService(
            "x", _service(model={**MODEL, "fallback": {"model": "llama-8b"}})))
    problems = {i.key: i.problem for i in exc.value.issues}
    assert "ServingPlatform" in problems.get("VllmService.model.fallback", ""), problems
