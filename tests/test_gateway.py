"""Gateway: GKE Gateway + HTTPRoutes that keep long and short requests on separate pools."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from components.gateway import LENGTH_HINT_HEADER, at_least_regex
from tests.conftest import manifests_of


@given(threshold=st.integers(1, 10**7), value=st.integers(0, 10**9))
def test_length_regex_matches_exactly_the_values_at_or_above(threshold, value):
    assert bool(re.fullmatch(at_least_regex(threshold), str(value))) == (value >= threshold)


def test_length_regex_rejects_non_numbers():
    assert not re.fullmatch(at_least_regex(16384), "016384")
    assert not re.fullmatch(at_least_regex(16384), "abc")


def test_gateway_class_and_listeners(plans):
    (dev,) = manifests_of(plans["dev"], "Gateway")
    assert dev["spec"]["gatewayClassName"] == "gke-l7-rilb"
    (prod,) = manifests_of(plans["prod"], "Gateway")
    assert prod["spec"]["gatewayClassName"] == "gke-l7-regional-external-managed"
    https = next(l for l in prod["spec"]["listeners"] if l["protocol"] == "HTTPS")
    assert https["tls"]["certificateRefs"] == [{"kind": "Secret", "name": "llm-acme-example-tls"}]
    assert https["hostname"] == "llm.acme.example"
    for listener in prod["spec"]["listeners"]:
        assert listener["allowedRoutes"]["namespaces"]["from"] == "Selector"


def test_routes_split_long_and_short(plans):
    (route,) = manifests_of(plans["dev"], "HTTPRoute")
    by_length_rule, by_hint_rule, short_rule = route["spec"]["rules"]
    for rule in by_length_rule, by_hint_rule:
        assert [b["name"] for b in rule["backendRefs"]] == ["qwen-7b-long"]
        assert len(rule["matches"]) == 1  # a rewriting rule takes exactly one PathPrefix match
    assert [b["name"] for b in short_rule["backendRefs"]] == ["qwen-7b-short"]
    (by_length,), (by_hint,) = by_length_rule["matches"], by_hint_rule["matches"]
    (header,) = by_length["headers"]
    assert header["name"] == "content-length" and header["type"] == "RegularExpression"
    assert re.fullmatch(header["value"], "8192") and not re.fullmatch(header["value"], "8191")
    assert by_hint["headers"] == [{"type": "Exact", "name": LENGTH_HINT_HEADER, "value": "long"}]
    assert short_rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/qwen-7b/v1"}}]
    rewrite = short_rule["filters"][0]["urlRewrite"]["path"]
    assert rewrite == {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}


def test_dedicated_tenant_route_lives_in_tenant_namespace(plans):
    routes = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in manifests_of(plans["prod"], "HTTPRoute")}
    assert set(routes) == {("vllm", "llama-70b"), ("vllm", "qwen-7b"), ("vllm", "llama-8b"),
                           ("tenant-analytics", "analytics-qwen-7b")}
    dedicated = routes[("tenant-analytics", "analytics-qwen-7b")]
    assert dedicated["spec"]["rules"][2]["matches"][0]["path"]["value"] == "/analytics/qwen-7b/v1"
    assert dedicated["spec"]["parentRefs"] == [{"name": "vllm", "namespace": "vllm"}]
    assert dedicated["spec"]["hostnames"] == ["llm.acme.example"]


def test_health_check_and_timeout_per_backend(plans):
    plan = plans["prod"]
    services = {s["metadata"]["name"] for s in manifests_of(plan, "Service", "vllm")}
    checks = {h["spec"]["targetRef"]["name"]: h for h in manifests_of(plan, "HealthCheckPolicy", "vllm")}
    assert set(checks) == services
    assert checks["llama-8b-short"]["spec"]["default"]["config"]["httpHealthCheck"]["requestPath"] == "/health"
    for policy in manifests_of(plan, "GCPBackendPolicy"):
        assert policy["spec"]["default"]["timeoutSec"] == 600
