"""Gateway: GKE Gateway + HTTPRoutes that keep long and short requests on separate pools."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO_ROOT, STACKS, by_hand, manifests_of, props_of, vllm_deployments
from vllm_gke.components.model.gateway_routes import LENGTH_HINT_HEADER, at_least_regex
from vllm_gke.components.model.weights_layout import model_dir


@given(threshold=st.integers(1, 10**7), value=st.integers(0, 10**9))
def test_length_regex_matches_exactly_the_values_at_or_above(threshold, value):
    assert bool(re.fullmatch(at_least_regex(threshold), str(value))) == (value >= threshold)


def test_length_regex_rejects_non_numbers():
    assert not re.fullmatch(at_least_regex(16384), "016384")
    assert not re.fullmatch(at_least_regex(16384), "abc")


def test_gateway_class_and_listeners(plans):
    (dev,) = manifests_of(plans["dev"], "Gateway")
    assert dev["spec"]["gatewayClassName"] == "gke-l7-rilb"
    assert [listener["name"] for listener in dev["spec"]["listeners"]] == ["http"]  # internal, no TLS configured
    (prod,) = manifests_of(plans["prod"], "Gateway")
    assert prod["spec"]["gatewayClassName"] == "gke-l7-regional-external-managed"
    https, http = prod["spec"]["listeners"]
    assert (https["name"], https["protocol"], https["port"]) == ("https", "HTTPS", 443)
    assert https["tls"]["certificateRefs"] == [{"kind": "Secret", "name": "llm-acme-example-tls"}]
    assert https["hostname"] == "llm.acme.example"
    assert https["allowedRoutes"]["namespaces"]["from"] == "Selector"
    # Plain HTTP admits only the gateway's own redirect: no tenant route can attach to it.
    assert (http["protocol"], http["allowedRoutes"]) == ("HTTP", {"namespaces": {"from": "Same"}})


def test_external_routes_attach_to_https_only_and_http_redirects(plans):
    for stack in ("staging", "prod"):
        routes = manifests_of(plans[stack], "HTTPRoute")
        redirect = next(r for r in routes if r["metadata"]["name"] == "https-redirect")
        assert redirect["spec"]["parentRefs"] == [{"name": "vllm", "sectionName": "http"}]
        assert redirect["spec"]["rules"] == [{"filters": [{"type": "RequestRedirect", "requestRedirect": {
            "scheme": "https", "statusCode": 301}}]}]
        assert not redirect["spec"]["rules"][0].get("backendRefs")
        for route in routes:
            if route is not redirect:
                assert [p["sectionName"] for p in route["spec"]["parentRefs"]] == ["https"]


def test_external_gateway_has_a_reserved_address(plans):
    (prod,) = manifests_of(plans["prod"], "Gateway")
    assert prod["spec"]["addresses"] == [{"type": "NamedAddress", "value": "vllm-prod-gateway"}]
    (address,) = props_of(plans["prod"], "gcp:compute/address:Address")
    assert (address["name"], address["addressType"], address["region"]) == ("vllm-prod-gateway", "EXTERNAL",
                                                                             "us-central1")
    plan = plans["prod"]
    gateway = plan.kube("Gateway", "vllm")
    assert plan.waits_for(gateway, plan.named("gcp:compute/address:Address", "gateway-ip"))
    (internal,) = props_of(plans["dev"], "gcp:compute/address:Address")
    assert (internal["addressType"], internal["purpose"]) == ("INTERNAL", "SHARED_LOADBALANCER_VIP")


def test_managed_certificate_for_a_regional_gateway(plans):
    plan = plans["staging"]
    (gateway,) = manifests_of(plan, "Gateway")
    https = next(x for x in gateway["spec"]["listeners"] if x["name"] == "https")
    assert https["tls"] == {"mode": "Terminate",
                            "options": {"networking.gke.io/cert-manager-certs": "vllm-staging-gateway"}}
    # The Gateway's own (the Cloud Run models' load balancer has one for cloudRun.hostname: test_cloud_run_gateway.py).
    (cert,) = [c for c in props_of(plan, "gcp:certificatemanager/certificate:Certificate")
               if c["managed"]["domains"] == ["llm.staging.acme.example"]]
    assert cert["location"] == "us-central1"
    (auth,) = [a for a in props_of(plan, "gcp:certificatemanager/dnsAuthorization:DnsAuthorization")
               if a["domain"] == "llm.staging.acme.example"]
    assert auth["domain"] == "llm.staging.acme.example" and auth["location"] == "us-central1"
    assert plan.waits_for(plan.kube("Gateway", "vllm"),
                          plan.named("gcp:certificatemanager/certificate:Certificate", "gateway-cert"))


def test_the_global_class_is_refused_for_every_routing(stack_values):
    """Length routes match Content-Length by regular expression, and the picker's routes bound
    it the same way: the global external load balancer has no regexMatch (Compute API urlMaps,
    HttpHeaderMatch), so no model could be routed through gke-l7-global-external-managed."""
    import copy

    from vllm_gke.infra.config import ConfigError, parse

    for stack in ("prod", "staging"):  # length only; length and the picker
        values = copy.deepcopy(stack_values[stack])
        values["vllm-gke:gateway"]["className"] = "gke-l7-global-external-managed"
        with pytest.raises(ConfigError) as exc:
            parse(values)
        found = [str(i) for i in exc.value.issues]
        assert any(p.startswith("vllm-gke:gateway.className:") and "routing is length" in p
                   and "gke-l7-regional-external-managed" in p for p in found), found


def test_routes_split_long_and_short(plans):
    (route,) = manifests_of(plans["dev"], "HTTPRoute")
    by_length_rule, by_hint_rule, short_rule = route["spec"]["rules"]
    for rule in by_length_rule, by_hint_rule:
        assert [b["name"] for b in rule["backendRefs"]] == ["qwen-7b-long"]
        assert len(rule["matches"]) == 1
    assert [b["name"] for b in short_rule["backendRefs"]] == ["qwen-7b-short"]
    (by_length,), (by_hint,) = by_length_rule["matches"], by_hint_rule["matches"]
    (header,) = by_length["headers"]
    assert header["name"] == "content-length" and header["type"] == "RegularExpression"
    assert re.fullmatch(header["value"], "8192") and not re.fullmatch(header["value"], "8191")
    assert by_hint["headers"] == [{"type": "Exact", "name": LENGTH_HINT_HEADER, "value": "long"}]
    assert short_rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/qwen-7b/v1"}}]
    # Forwarded as sent: the guard strips /qwen-7b (GKE does not claim HTTPRoute path rewrites).
    assert [f["type"] for f in short_rule["filters"]] == ["RequestHeaderModifier"]


@pytest.mark.parametrize("stack", STACKS)
def test_no_route_rewrites_the_path(plans, stack):
    """GKE's conformance run exempts HTTPRoutePathRewrite (infra/contracts/gateway.py): no route
    relies on a URLRewrite of the path (a host rewrite would be fine; none is used)."""
    for route in manifests_of(plans[stack], "HTTPRoute"):
        for rule in route["spec"]["rules"]:
            for f in rule.get("filters") or []:
                assert f["type"] != "URLRewrite" or "path" not in f.get("urlRewrite", {}), route["metadata"]["name"]


def test_dedicated_tenant_route_lives_in_tenant_namespace(prod_by_hand):
    routes = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in manifests_of(prod_by_hand, "HTTPRoute")}
    assert set(routes) == {("vllm", "llama-70b"), ("vllm", "qwen-7b"), ("vllm", "llama-8b"),
                           ("tenant-analytics", "analytics-qwen-7b"), ("vllm", "https-redirect")}
    dedicated = routes[("tenant-analytics", "analytics-qwen-7b")]
    assert dedicated["spec"]["rules"][2]["matches"][0]["path"]["value"] == "/analytics/qwen-7b/v1"
    assert dedicated["spec"]["parentRefs"] == [{"name": "vllm", "namespace": "vllm", "sectionName": "https"}]
    assert dedicated["spec"]["hostnames"] == ["llm.acme.example"]


def test_health_check_and_timeout_per_backend(prod_by_hand):
    plan = prod_by_hand
    services = {s["metadata"]["name"] for s in manifests_of(plan, "Service", "vllm")}
    checks = {h["spec"]["targetRef"]["name"]: h for h in manifests_of(plan, "HealthCheckPolicy", "vllm")}
    assert set(checks) == services
    http_check = checks["llama-8b-short"]["spec"]["default"]["config"]["httpHealthCheck"]
    assert http_check["portSpecification"] == "USE_FIXED_PORT" and http_check["port"] == 8000
    assert checks["llama-8b-short"]["spec"]["default"]["config"]["httpHealthCheck"]["requestPath"] == "/health"
    for policy in manifests_of(plan, "GCPBackendPolicy"):
        assert policy["spec"]["default"]["timeoutSec"] == 600


def test_routes_strip_client_copies_of_the_issuer_header(plans):
    for stack in ("dev", "prod"):
        for route in manifests_of(plans[stack], "HTTPRoute"):
            for rule in route["spec"]["rules"]:
                if rule.get("backendRefs"):
                    mods = [f["requestHeaderModifier"] for f in rule["filters"] if f["type"] == "RequestHeaderModifier"]
                    assert mods == [{"remove": ["x-vllm-gke-issuer", "x-vllm-gke-subject"]}], route["metadata"]["name"]


def test_a_canary_takes_its_weight_of_every_rule(prod_by_hand):
    routes = {r["metadata"]["name"]: r for r in manifests_of(prod_by_hand, "HTTPRoute")}
    for rule in routes["llama-8b"]["spec"]["rules"]:
        refs = {b["name"]: b["weight"] for b in rule["backendRefs"]}
        assert sum(refs.values()) == 100 and len(refs) == 2
        assert any(n.startswith("llama-8b-canary-") and w == 10 for n, w in refs.items())
    assert all("weight" not in b for r in routes["qwen-7b"]["spec"]["rules"] for b in r["backendRefs"])


def test_rollback_is_a_weight_and_removal_a_config_change(plan_variant):
    def rollback(values):
        by_hand(values)
        values["vllm-gke:models"][2]["canary"]["weight"] = 0
    plan = plan_variant("prod", rollback)
    route = next(r for r in manifests_of(plan, "HTTPRoute") if r["metadata"]["name"] == "llama-8b")
    weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}
    assert weights == {"llama-8b-long": 100, "llama-8b-canary-long": 0}  # warm, but serving nothing

    def remove(values):
        by_hand(values)
        del values["vllm-gke:models"][2]["canary"]
    plan = plan_variant("prod", remove)
    assert not [d for d in manifests_of(plan, "Deployment") if "canary" in d["metadata"]["name"]]


def test_canary_pods_never_join_the_stable_service(prod_by_hand):
    from tests.conftest import vllm_deployments

    deployments = {d["metadata"]["name"]: d for d in vllm_deployments(prod_by_hand, "vllm")}
    services = {s["metadata"]["name"]: s for s in manifests_of(prod_by_hand, "Service", "vllm")}
    stable_selector = services["llama-8b-short"]["spec"]["selector"]
    canary_labels = deployments["llama-8b-canary-short"]["spec"]["template"]["metadata"]["labels"]
    assert not all(canary_labels.get(k) == v for k, v in stable_selector.items())
    canary_args = deployments["llama-8b-canary-short"]["spec"]["template"]["spec"]["containers"][0]["args"]
    canary = prod_by_hand.config.model("llama-8b").canary_model()
    assert canary is not None and canary.revision == "0e9e39f249a16976918f6564b8830bc894c89659"
    assert canary_args[0] == model_dir(canary)
    # The same tenants may call it: authorization selects by model.
    assert canary_labels["vllm-gke.io/model"] == "llama-8b"


def test_load_balancer_ejects_failing_replicas_and_drains(prod_by_hand):
    checks = {h["spec"]["targetRef"]["name"]: h["spec"]["default"] for h in manifests_of(prod_by_hand, "HealthCheckPolicy")}
    assert checks["llama-8b-short"]["checkIntervalSec"] == 5 and checks["llama-8b-short"]["unhealthyThreshold"] == 2
    policies = {p["spec"]["targetRef"]["name"]: p["spec"]["default"] for p in manifests_of(prod_by_hand, "GCPBackendPolicy")}
    assert policies["llama-8b-short"]["maxRatePerEndpoint"] == 40
    assert "maxRatePerEndpoint" not in policies["llama-8b-long"]
    timeout = prod_by_hand.config.gateway.request_timeout_seconds
    assert all(p["connectionDraining"] == {"drainingTimeoutSec": 20 + timeout} for p in policies.values())


@pytest.mark.parametrize("stack", STACKS)
def test_a_stopping_replica_finishes_what_it_accepted(plans, stack):
    """vLLM 0.34 aborts unfinished requests on SIGTERM unless --shutdown-timeout is set (default 0,
    vllm/engine/arg_utils.py:1971); so: 20 s preStop while the load balancer detaches the endpoint,
    then vLLM drains for up to the gateway's request timeout, within the grace period; the load
    balancer keeps the detached endpoint's connections as long, and the sidecar outlives vLLM."""
    plan = plans[stack]
    timeout = plan.config.gateway.request_timeout_seconds
    for dep in vllm_deployments(plan):
        pod = dep["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        args = c["args"]
        assert args[args.index("--shutdown-timeout") + 1] == str(timeout)
        spot = pod["spec"]["nodeSelector"].get("cloud.google.com/compute-class") is not None or any(
            p.spot for p in plan.config.node_pools
            if pod["spec"]["nodeSelector"].get("vllm-gke.io/node-pool") == p.name)
        # Spot: GKE gives pods 15 s of the preemption notice; a longer preStop would be cut short
        # with vLLM never signalled.
        assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5" if spot else "20"], dep["metadata"]["name"]
        assert pod["spec"]["terminationGracePeriodSeconds"] >= 20 + timeout + 10
        proxy = json.loads(pod["metadata"]["annotations"]["proxy.istio.io/config"])
        assert proxy["proxyMetadata"]["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] == "true"
        assert pod["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"] == "true"
    for policy in manifests_of(plan, "GCPBackendPolicy"):
        default = policy["spec"]["default"]
        assert default["connectionDraining"]["drainingTimeoutSec"] >= min(3600, 20 + default["timeoutSec"])



@pytest.mark.parametrize("stack", STACKS)
def test_no_destination_rule_claims_limits_for_vllm_services(plans, prod_by_hand, stack):
    """No mesh client calls a vLLM Service (the load balancer and the picker are outside the mesh):
    a DestinationRule's connection limits and outlier detection there would limit nothing."""
    plan = prod_by_hand if stack == "prod" else plans[stack]  # prod's Flagger routes: test_flagger_routes.py
    services = {f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local"
                for s in manifests_of(plan, "Service") if s["spec"].get("selector", {}).get("app.kubernetes.io/name") == "vllm"
                or s["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm"}
    assert services
    hosts = {d["spec"]["host"] for d in manifests_of(plan, "DestinationRule")}
    assert not hosts & services


def test_a_dedicated_copy_runs_the_models_canary_too(plan_variant):
    """A tenant's dedicated replicas follow the model's config, canary included, on the tenant's pool."""
    from vllm_gke.components.model.capacity import gpu_slots_by_pool

    def canary(values):
        by_hand(values)
        values["vllm-gke:models"][1]["canary"] = {"revision": "v2", "weight": 20}
    plan = plan_variant("prod", canary)
    route = next(r for r in manifests_of(plan, "HTTPRoute", "tenant-analytics")
                 if r["metadata"]["name"] == "analytics-qwen-7b")
    weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]}
    assert weights == {"qwen-7b-short": 80, "qwen-7b-canary-short": 20}
    canaries = [d for d in manifests_of(plan, "Deployment", "tenant-analytics") if "canary" in d["metadata"]["name"]]
    assert len(canaries) == 2
    # Capacity counts both canaries (shared and dedicated) on the MIG pool: one replica per pool each.
    before = gpu_slots_by_pool(plan_variant("prod", by_hand).config)["a100-mig"]
    assert gpu_slots_by_pool(plan.config)["a100-mig"] == before + 4


def test_max_rate_per_endpoint_is_documented_as_a_capacity_not_a_cap():
    """GKE's traffic management: the target capacity "isn't a circuit breaker"; once every
    endpoint is at it, requests overfill them in proportion. The config's own description (the
    package schema's too) must not promise a cap."""
    doc = (REPO_ROOT / "components" / "provider" / "types.py").read_text()
    described = doc[doc.index("max_rate_per_endpoint: NotRequired[int]"):][:400]
    assert "not a cap" in described and "overfills" in described
    guide = (REPO_ROOT / "docs" / "guides" / "canary-and-resilience.md").read_text()
    assert "isn't a\ncircuit breaker" in guide or "isn't a circuit breaker" in guide


def _guarded_backends(plan) -> dict[tuple[str, str], set[str]]:
    """(namespace, Service or InferencePool name) -> the paths, as sent, the guard of the pods it
    selects admits: each route under each prefix it strips (the Gateway rewrites no path)."""
    from vllm_gke.infra.manifests import pod_templates

    admitted: list[tuple[str, dict, set[str]]] = []
    for doc in [*manifests_of(plan, "Deployment"), *manifests_of(plan, "LeaderWorkerSet")]:
        for _role, pod in pod_templates(doc):
            for c in pod["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in c.get("env") or []}
                if env.get("GKE_LLM_GUARD_CONFIG"):
                    cfg = json.loads(env["GKE_LLM_GUARD_CONFIG"])
                    admitted.append((doc["metadata"]["namespace"], pod["metadata"]["labels"],
                                     {p + r for p in cfg["pathPrefixes"] for r in cfg["routes"]}))
    out: dict[tuple[str, str], set[str]] = {}
    for kind, key in (("Service", ("spec", "selector")), ("InferencePool", ("spec", "selector", "matchLabels"))):
        for doc in manifests_of(plan, kind):
            selector = doc
            for k in key:
                selector = selector.get(k) or {}
            ns = doc["metadata"]["namespace"]
            paths = [p for n, labels, p in admitted if n == ns and selector and selector.items() <= labels.items()]
            if paths:
                out[(ns, doc["metadata"]["name"])] = set.intersection(*paths)
    return out


def _request(match, path=None):
    """A request holding for `match` (at `path`): its Exact header values, and for a pattern the first
    of "0" or a number written in it that the pattern matches whole."""
    from vllm_gke.policies.route_match import HttpRequest

    def value(h):
        if h["type"] == "Exact":
            return h["value"]
        return next(v for v in ["0", *re.findall(r"\d+", h["value"])] if re.fullmatch(h["value"], v))

    return HttpRequest(path or match["path"]["value"], headers={h["name"]: value(h) for h in match.get("headers") or []})


@pytest.mark.parametrize("stack", STACKS)
def test_every_route_the_guard_admits_has_a_gateway_path_and_back(plans, prod_by_hand, stack):
    """One surface: each tenant route a pool's guard admits is reachable through the Gateway at every
    prefix that routes to the pool (the guard strips exactly those), forwarded as sent; and every path a rule forwards to a
    pool is one its guard admits (an Exact path) or covers one (a prefix). Nothing the guard allows
    is unreachable, nothing the Gateway routes is refused by every pool behind it."""
    from vllm_gke.policies.route_match import forwarded_path, reach

    plan = prod_by_hand if stack == "prod" else plans[stack]  # prod's Flagger routes: test_flagger_routes.py
    routes = [r for r in manifests_of(plan, "HTTPRoute") if r["metadata"]["name"] != "https-redirect"]
    guarded = _guarded_backends(plan)
    checked = 0
    for route in routes:
        ns = route["metadata"]["namespace"]
        for rule in route["spec"]["rules"]:
            names = {b["name"] for b in rule.get("backendRefs") or []}
            if not names:
                continue
            allowed = set.intersection(*(guarded[(ns, n)] for n in names))
            for match in rule["matches"]:
                path = match["path"]
                request = _request(match)
                reached = reach(routes, request)
                assert reached is not None and reached.rule is rule, (route["metadata"]["name"], path)
                base = forwarded_path(reached, path["value"])
                if path["type"] == "Exact":
                    assert base in allowed, (route["metadata"]["name"], base)
                    checked += 1
                    continue
                # Every admitted path under the forwarded prefix reaches this rule, forwarded unchanged.
                under = {p for p in allowed if p == base or p.startswith(base.rstrip("/") + "/")}
                assert under, (route["metadata"]["name"], base, "covers no admitted path")
                for p in under:
                    sent = path["value"].rstrip("/") + p[len(base.rstrip("/")):]
                    hit = reach(routes, _request(match, sent))
                    assert hit is not None and hit.rule is rule and forwarded_path(hit, sent) == p, (sent, p)
                    checked += 1
    # ...and each admitted path of each routed pool is reached by some rule (none left unrouted).
    routed = {(r["metadata"]["namespace"], b["name"]) for r in routes for rule in r["spec"]["rules"]
              for b in rule.get("backendRefs") or []}
    for key in routed:
        reachable = set()
        for route in routes:
            if route["metadata"]["namespace"] != key[0]:
                continue
            for rule in route["spec"]["rules"]:
                if key[1] not in {b["name"] for b in rule.get("backendRefs") or []}:
                    continue
                for match in rule["matches"]:
                    base = forwarded_path(reach(routes, _request(match)), match["path"]["value"])
                    reachable |= {p for p in guarded[key] if p == base or p.startswith(base.rstrip("/") + "/")}
        assert reachable == guarded[key], (key, sorted(guarded[key] - reachable))
    assert checked


def test_the_contract_check_names_a_pool_whose_guard_would_not_strip_the_routes_prefix(prod_by_hand):
    """The other half of gateway_rewrites_no_path: a pool whose guard lacks the route's prefix would
    answer every tenant request 404."""
    import copy
    import dataclasses

    from vllm_gke.infra.contracts import gateway_rewrites_no_path

    plan = prod_by_hand
    assert gateway_rewrites_no_path(plan) == []
    broken = dataclasses.replace(plan, resources=copy.deepcopy(plan.resources))
    dep = next(r for r in broken.resources if r.props.get("kind") == "Deployment"
               and r.props["metadata"]["name"] == "qwen-7b-long" and r.props["metadata"]["namespace"] == "vllm")
    (env,) = [e for e in dep.props["spec"]["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "GKE_LLM_GUARD_CONFIG"]
    env["value"] = json.dumps({**json.loads(env["value"]), "pathPrefixes": ["/qwen-7b-evil"]})
    found = gateway_rewrites_no_path(broken)
    assert found and all("qwen-7b-long, whose guard strips no prefix" in p for p in found), found
