"""What a stack serves, as data (components/model/serving_plan.py), from the stacks' own configs
and without Pulumi: the Platform declares exactly these."""

from __future__ import annotations

from tests.conftest import by_hand
from vllm_gke.components.model.k8s_objects import service_name_of
from vllm_gke.components.model.serving_plan import pool_services, servings
from vllm_gke.infra.config import parse
from vllm_gke.infra.plan import read_stack_config


def _prod():
    return parse(read_stack_config("prod"))


def test_shared_replicas_then_each_tenants_dedicated_copy():
    cfg = _prod()
    plan = servings(cfg)
    assert [s.key for s in plan] == [*(m.name for m in cfg.models), "analytics-qwen-7b"]
    dedicated = plan[-1]
    assert (dedicated.tenant, dedicated.consumer, dedicated.node_pool) == ("analytics", "analytics", "a100-mig")
    assert [t.name for t in dedicated.callers] == ["analytics"]
    assert dedicated.path == "analytics/qwen-7b"
    shared = {s.key: s for s in plan}
    # analytics has its own copy of qwen-7b: the shared one serves only support.
    assert [t.name for t in shared["qwen-7b"].callers] == ["support"]
    assert shared["qwen-7b"].consumer == "serving" and shared["qwen-7b"].path == "qwen-7b"


def test_a_canary_is_its_own_pools_of_the_canary_revision():
    values = read_stack_config("prod")
    by_hand(values)
    cfg = parse(values)
    llama = next(s for s in servings(cfg) if s.key == "llama-8b")
    stable, canary = pool_services(cfg, llama), pool_services(cfg, llama, canary=True)
    assert [p.key for p in stable] == ["llama-8b-short", "llama-8b-long"]
    assert [p.key for p in canary] == ["llama-8b-canary-short", "llama-8b-canary-long"]
    assert {p.model.revision for p in canary} == {"0e9e39f249a16976918f6564b8830bc894c89659"}
    assert all(p.canary for p in canary) and not any(p.canary for p in stable)


def test_the_guard_of_a_pool_knows_only_its_callers_and_the_limit_store():
    cfg = _prod()
    by_key = {s.key: s for s in servings(cfg)}
    (short, _long) = pool_services(cfg, by_key["analytics-qwen-7b"], limit_store=("limits.example", 6379))
    guard = short.guard_config
    assert guard["globalLimits"] == {"host": "limits.example", "port": 6379}
    assert [i["tenant"] for i in guard["issuers"].values()] == ["analytics"]
    # A dedicated copy answers under its tenant's path only.
    assert guard["pathPrefixes"] == ["/analytics/qwen-7b"]
    assert "globalLimits" not in pool_services(cfg, by_key["analytics-qwen-7b"])[0].guard_config


def test_only_a_pool_that_may_sleep_names_a_standby():
    cfg = parse(read_stack_config("staging"))
    for serving in servings(cfg):
        for p in pool_services(cfg, serving):
            expected = f"{service_name_of(p.model.name, p.which)}-standby" if p.pool.min_replicas == 0 else ""
            assert p.standby_name == expected
    assert any(p.standby_name for s in servings(cfg) for p in pool_services(cfg, s))
