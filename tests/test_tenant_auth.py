"""TenantAuth: namespace per tenant, JWT per issuer, allow only a tenant's own models."""

from __future__ import annotations

import pytest

from tests.conftest import manifests_of
from vllm_gke.components.serving_api import TENANT_ROUTES, mesh_operations, tenant_routes
from vllm_gke.components.tenant_auth import ISSUER_HEADER


def namespaces(plan):
    return {n["metadata"]["name"]: n["metadata"]["labels"] for n in manifests_of(plan, "Namespace")}


def test_namespace_per_tenant_in_the_mesh(plans):
    ns = namespaces(plans["prod"])
    for tenant in ("search", "support", "analytics"):
        labels = ns[f"tenant-{tenant}"]
        assert labels["istio-injection"] == "enabled"
        assert labels["vllm-gke.io/tenant"] == tenant
    assert ns["vllm"]["istio-injection"] == "enabled"


def test_every_mesh_namespace_denies_by_default(plans):
    for plan in plans.values():
        mesh = [n for n, labels in namespaces(plan).items() if labels.get("istio-injection") == "enabled"]
        deny = {p["metadata"]["namespace"] for p in manifests_of(plan, "AuthorizationPolicy")
                if p["metadata"]["name"] == "deny-all"}
        assert deny == set(mesh)
        for p in manifests_of(plan, "AuthorizationPolicy"):
            if p["metadata"]["name"] == "deny-all":
                assert p["spec"] == {}


def test_request_authentication_per_tenant(plans):
    ras = manifests_of(plans["prod"], "RequestAuthentication")
    search = [r for r in ras if r["metadata"]["name"] == "jwt-search"]
    assert {r["metadata"]["namespace"] for r in search} == {"tenant-search", "vllm"}
    (rule,) = search[0]["spec"]["jwtRules"]
    assert rule["issuer"] == "https://auth.acme.example/search"
    assert rule["jwksUri"] == "https://auth.acme.example/search/.well-known/jwks.json"
    assert rule["audiences"] == ["llm.acme.example"]
    assert rule["outputClaimToHeaders"] == [{"header": ISSUER_HEADER, "claim": "iss"}]
    # analytics only has a dedicated model: nothing of it is trusted in the shared namespace
    assert {r["metadata"]["namespace"] for r in ras if r["metadata"]["name"] == "jwt-analytics"} == {"tenant-analytics"}


def test_tenants_reach_only_their_models(plans):
    plan = plans["prod"]
    allowed: dict[str, set[str]] = {}
    for p in manifests_of(plan, "AuthorizationPolicy", "vllm"):
        if p["spec"].get("action") != "ALLOW" or "selector" not in p["spec"]:
            continue
        model = p["spec"]["selector"]["matchLabels"]["vllm-gke.io/model"]
        (rule,) = p["spec"]["rules"]
        (principal,) = rule["from"][0]["source"]["requestPrincipals"]
        allowed.setdefault(principal.removesuffix("/*").rsplit("/", 1)[1], set()).add(model)
        # Exactly the guard's routes, method by method: no wildcard reaches an unguarded endpoint.
        assert rule["to"] == mesh_operations(tenant_routes())
        assert {p for op in rule["to"] for p in op["operation"]["paths"]} == {r.path for r in TENANT_ROUTES}
        assert not any("*" in p for op in rule["to"] for p in op["operation"]["paths"])
    assert allowed == {"search": {"llama-70b", "llama-8b"}, "support": {"llama-8b", "qwen-7b"}}


def test_guard_config_carries_caps_of_the_callers_only(plans):
    import json

    plan = plans["prod"]
    def guard(name, ns="vllm"):
        dep = next(d for d in manifests_of(plan, "Deployment", ns) if d["metadata"]["name"] == name)
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        return json.loads(env["GKE_LLM_GUARD_CONFIG"])

    shared = guard("llama-8b-short")
    assert {v["tenant"] for v in shared["issuers"].values()} == {"search", "support"}
    assert shared["issuers"]["https://auth.acme.example/support"] == {
        "tenant": "support", "maxTokens": 1024, "requestsPerMinute": 1200, "tokensPerMinute": 400000,
        "models": ["llama-8b", "support-sql"], "cacheSalt": "tenant-support", "priority": -1}
    # support may be shed under overload, over the stack's queue-time objective; search never is
    assert shared["overload"] == {"queueSloSeconds": plan.config.monitoring.queue_latency_slo_seconds}
    assert "priority" not in shared["issuers"]["https://auth.acme.example/search"]
    dedicated = guard("qwen-7b-short", "tenant-analytics")
    assert list(dedicated["issuers"]) == ["https://auth.acme.example/analytics"]
    assert "overload" not in dedicated  # nobody there to shed
    assert shared["issuerHeader"] == ISSUER_HEADER


def test_trusted_sources_have_no_default_that_skips_a_health_check_or_a_scrape():
    from vllm_gke.components.mesh_namespace import GOOGLE_HEALTH_CHECK_RANGES, TrustedSources

    with pytest.raises(TypeError):
        TrustedSources()  # no defaults
    with pytest.raises(ValueError, match="proxy-only subnet"):
        TrustedSources(health_checks=list(GOOGLE_HEALTH_CHECK_RANGES), metrics=["10.20.0.0/14"])
    with pytest.raises(ValueError, match="KEDA would never scale"):
        TrustedSources(health_checks=[*GOOGLE_HEALTH_CHECK_RANGES, "10.129.0.0/23"], metrics=[])
    derived = TrustedSources.for_cluster("10.129.0.0/23", "10.20.0.0/14", "10.10.0.0/20")
    assert list(derived.health_checks) == [*GOOGLE_HEALTH_CHECK_RANGES, "10.129.0.0/23"]
    assert list(derived.metrics) == ["10.20.0.0/14", "10.10.0.0/20"]
