"""The emitted Istio policies as a request sees them: probes and scrapes pass without a JWT from
their sources only; everything else needs a tenant's verified token for a model it may call."""

from __future__ import annotations

import pytest

from tests.conftest import STACKS, vllm_deployments
from vllm_gke.policies.mesh_authz import Request, decide, match_string, normalize_path

HEALTH_CHECKER = "35.191.3.4"      # Google's health-check range
PROXY_ONLY = "10.129.0.7"          # the proxy-only subnet (Envoy-based load balancers)
POD = "10.20.1.2"                  # a pod, e.g. a Managed Prometheus collector
INTERNET = "203.0.113.9"
SOURCES = (HEALTH_CHECKER, PROXY_ONLY, POD, INTERNET)
GPU_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models")
# The Gateway rewrites no path: the sidecar sees /<prefix>/v1/... as the client sent it.
PREFIXED_PATHS = ("/qwen-7b/v1/chat/completions", "/llama-8b/v1/completions", "/search/llama-8b/v1/chat/completions",
                  "/analytics/qwen-7b/v1/chat/completions", "/dev-team/qwen-7b/v1/models")


def workloads(plan):
    for dep in vllm_deployments(plan):
        yield dep["metadata"]["namespace"], dep["spec"]["template"]["metadata"]["labels"], dep["metadata"]["name"]


def ask(plan, namespace, labels, path, method="GET", source=POD, token=None, valid=True):
    return decide(plan.manifests(), Request(namespace, path, method, labels, source, token, valid))


@pytest.mark.parametrize("stack", STACKS)
def test_load_balancer_health_checks_pass_without_a_jwt(plans, stack):
    plan = plans[stack]
    for ns, labels, name in workloads(plan):
        for source in (HEALTH_CHECKER, PROXY_ONLY):
            decision = ask(plan, ns, labels, "/health", source=source)
            assert decision.allowed, (name, source, decision)
        assert not ask(plan, ns, labels, "/health", source=INTERNET).allowed, name
        assert not ask(plan, ns, labels, "/health", method="POST", source=HEALTH_CHECKER).allowed, name


@pytest.mark.parametrize("stack", STACKS)
def test_metrics_scrapes_pass_from_the_cluster_only(plans, stack):
    plan = plans[stack]
    for ns, labels, name in workloads(plan):
        assert ask(plan, ns, labels, "/metrics", source=POD).allowed, name
        assert not ask(plan, ns, labels, "/metrics", source=HEALTH_CHECKER).allowed, name
        assert not ask(plan, ns, labels, "/metrics", source=INTERNET).allowed, name


@pytest.mark.parametrize("stack", STACKS)
def test_nothing_else_passes_without_a_jwt(plans, stack):
    plan = plans[stack]
    for ns, labels, name in workloads(plan):
        for path in (*GPU_PATHS, *PREFIXED_PATHS, "/", "/version", "/health/../v1/completions",
                     "/metrics/../v1/chat/completions", "/health/../qwen-7b/v1/completions"):
            for source in SOURCES:
                for method in ("GET", "POST"):
                    decision = ask(plan, ns, labels, path, method, source)
                    assert not decision.allowed and decision.status == 403, (name, path, source, method)


def test_tenants_reach_only_their_models(plans):
    plan = plans["prod"]
    search = ("https://auth.acme.example/search", "svc-1")
    analytics = ("https://auth.acme.example/analytics", "svc-2")
    labels = {(ns, name): lbl for ns, lbl, name in workloads(plan)}

    def call(namespace, deployment, token, prefix=None):
        # As the Gateway forwards it: the shared /<model>/v1, a dedicated copy's /<tenant>/<model>/v1.
        model = labels[(namespace, deployment)]["vllm-gke.io/model"]
        prefix = prefix if prefix is not None else (
            f"/{namespace.removeprefix('tenant-')}/{model}" if namespace.startswith("tenant-") else f"/{model}")
        return ask(plan, namespace, labels[(namespace, deployment)], f"{prefix}/v1/chat/completions", "POST",
                   PROXY_ONLY, token)

    assert call("vllm", "llama-70b-short", search).allowed
    assert call("vllm", "llama-8b-long", search).allowed
    assert call("vllm", "qwen-7b-short", search).status == 403  # search may not call qwen-7b
    # analytics has only dedicated replicas: the shared namespace does not trust its issuer at all.
    assert call("vllm", "qwen-7b-short", analytics).status == 401
    for pool in ("qwen-7b-short", "qwen-7b-long"):
        assert call("tenant-analytics", pool, analytics).allowed
        assert call("tenant-analytics", pool, search).status == 401
        # Only under the tenant's own prefix: not the shared one, not unprefixed, not another tenant's.
        for other in ("/qwen-7b", "", "/search/qwen-7b", "/analytics/qwen-7b-evil", "/analytics"):
            assert call("tenant-analytics", pool, analytics, other).status == 403, other
    # A model's prefix admits nothing on another model's pods, nor unprefixed.
    assert call("vllm", "llama-70b-short", search, "/llama-8b").status == 403
    assert call("vllm", "llama-70b-short", search, "").status == 403


def test_a_forged_or_foreign_token_is_rejected(plans):
    plan = plans["dev"]
    ns, labels, _ = next(workloads(plan))
    issuer, listed = "https://accounts.google.com", "104476360121718219735"  # dev's jwt.subjects
    path = f"/{labels['vllm-gke.io/model']}/v1/completions"
    assert ask(plan, ns, labels, path, "POST", PROXY_ONLY, (issuer, listed)).allowed
    assert ask(plan, ns, labels, path, "POST", PROXY_ONLY, (issuer, listed), valid=False).status == 401
    # Anyone can get a Google token for dev's audience: one of another subject is not the tenant.
    assert ask(plan, ns, labels, path, "POST", PROXY_ONLY, (issuer, "me")).status == 403
    assert ask(plan, ns, labels, path, "POST", PROXY_ONLY, ("https://evil.example", "me")).status == 401


@pytest.mark.parametrize("claim_to_headers", [True, False])
def test_one_tenants_token_never_passes_as_anothers(plans, claim_to_headers):
    """The guard takes the tenant from the issuer header. Where the data plane writes it from the
    verified claim (istiod), a forged copy is replaced; where it would not (outputClaimToHeaders
    unsupported), the mesh itself refuses a header that is not the token's own issuer."""
    plan = plans["prod"]
    search, support = "https://auth.acme.example/search", "https://auth.acme.example/support"
    labels = {(ns, name): lbl for ns, lbl, name in workloads(plan)}["vllm", "llama-8b-short"]

    def call(header):
        request = Request("vllm", "/llama-8b/v1/chat/completions", "POST", labels, PROXY_ONLY, (search, "svc-1"),
                          headers={} if header is None else {"x-vllm-gke-issuer": header})
        return decide(plan.manifests(), request, claim_to_headers=claim_to_headers)

    assert call(search).allowed
    assert call(support).allowed is claim_to_headers  # rewritten to search's own issuer, or refused
    assert call(None).allowed is claim_to_headers
    # Without a token a forged header opens nothing, whatever the data plane does.
    forged = Request("vllm", "/llama-8b/v1/chat/completions", "POST", labels, PROXY_ONLY, None,
                     headers={"x-vllm-gke-issuer": search})
    assert decide(plan.manifests(), forged, claim_to_headers=claim_to_headers).status == 403


def test_evaluator_semantics():
    assert match_string("https://a/*", "https://a/x") and not match_string("https://a/*", "https://ab/x")
    assert match_string("*.json", "x.json") and match_string("*", "anything")
    assert normalize_path("/a/../b?x=1") == "/b" and normalize_path("//v1//x") == "/v1/x"
    ns = {"metadata": {"name": "p", "namespace": "n"}}
    allow_all = {**ns, "kind": "AuthorizationPolicy", "spec": {"rules": [{}]}}
    deny_post = {**ns, "kind": "AuthorizationPolicy", "spec": {"action": "DENY", "rules": [
        {"to": [{"operation": {"methods": ["POST"]}}]}]}}
    deny_all = {**ns, "kind": "AuthorizationPolicy", "spec": {}}
    get, post = Request("n", "/x"), Request("n", "/x", "POST")
    assert decide([], get).allowed                      # no policy: allow
    assert not decide([deny_all], get).allowed          # ALLOW with no rules: nothing matches
    assert decide([allow_all, deny_post], get).allowed
    assert not decide([allow_all, deny_post], post).allowed  # DENY before ALLOW
    other_ns = Request("m", "/x")
    assert decide([deny_all], other_ns).allowed          # a policy applies only in its namespace


def test_a_tenant_token_opens_only_the_guarded_routes(plans):
    plan = plans["prod"]
    search = ("https://auth.acme.example/search", "svc-1")
    labels = {(ns, name): lbl for ns, lbl, name in workloads(plan)}[("vllm", "llama-8b-short")]
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/embeddings", "POST"), ("/v1/models", "GET")):
        assert ask(plan, "vllm", labels, f"/llama-8b{path}", method, PROXY_ONLY, search).allowed, path
    for path, method in (("/collective_rpc", "POST"), ("/v1/load_lora_adapter", "POST"), ("/sleep", "POST"),
                         ("/v1/chat/completions", "GET"), ("/docs", "GET"), ("/v1/completions/../../sleep", "POST"),
                         ("/v1/completions/../../../sleep", "POST"), ("/v1/models/x", "GET"), ("/health", "GET")):
        assert ask(plan, "vllm", labels, f"/llama-8b{path}", method, PROXY_ONLY, search).status == 403, path
    # Unprefixed, or under another prefix, the same routes are refused (the guard strips only its pool's).
    for path in ("/v1/chat/completions", "/llama-8b-evil/v1/chat/completions", "/llama-70b/v1/chat/completions",
                 "/search/llama-8b/v1/chat/completions", "/llama-8b/llama-8b/v1/chat/completions"):
        assert ask(plan, "vllm", labels, path, "POST", PROXY_ONLY, search).status == 403, path


def test_narrowing_to_one_token_or_workload_never_changes_a_decision(plans):
    """for_token and applicable only drop what cannot bear on the request: every decision on the
    narrowed policies equals the decision on all of them."""
    from vllm_gke.policies.mesh_authz import applicable, for_token

    for stack in ("staging", "prod"):
        docs = plans[stack].manifests()
        issuers = sorted({r["issuer"] for d in docs if d["kind"] == "RequestAuthentication"
                          for r in d["spec"]["jwtRules"]} | {"https://unknown.example"})
        workloads = {(d["metadata"]["namespace"], tuple(sorted(d["spec"]["template"]["metadata"]["labels"].items())))
                     for d in docs if d["kind"] == "Deployment"}
        for ns, labels in sorted(workloads):
            narrowed = applicable(docs, ns, dict(labels))
            for issuer in issuers:
                mine = for_token(narrowed, issuer, "u")
                model = dict(labels).get("vllm-gke.io/model", "")
                for path, headers in ((f"/{model}/v1/completions", {}), (f"/{model}/v1/models", {}),
                                      (f"/search/{model}/v1/completions",
                                       {"x-llm-d-inference-objective": f"search.{model}"}),
                                      ("/v1/completions", {}), ("/health", {})):
                    for token in ((issuer, "u"), None):
                        request = Request(ns, path, "POST" if "completions" in path else "GET", dict(labels),
                                          token=token, headers=headers)
                        expected = decide(docs, request)
                        assert decide(narrowed, request).allowed == expected.allowed, (ns, labels, path)
                        if token is not None:
                            assert decide(mine, request).allowed == expected.allowed, (ns, labels, issuer, path)


@pytest.mark.parametrize("pattern,token,matches", [
    # generator.go: split at the last '/', iss and sub matched apart.
    ("https://a/*", ("https://a", "x"), True),
    ("https://a/*", ("https://a/b", "x"), False),  # the issuer is exact: no path-prefix match
    ("https://a.auth0.com//*", ("https://a.auth0.com/", "auth0|1"), True),  # a trailing '/' kept
    ("https://a.auth0.com//*", ("https://a.auth0.com", "auth0|1"), False),
    ("https://accounts.google.com/123", ("https://accounts.google.com", "123"), True),
    ("https://accounts.google.com/123", ("https://accounts.google.com", "1234"), False),
    ("https://accounts.google.com/12*", ("https://accounts.google.com", "1234"), True),  # sub prefix
    ("*/123", ("https://any.example", "123"), True), ("*.example/123", ("https://a.example", "123"), True),
    ("*", ("https://a", "x"), True), ("*x", ("https://a", "ax"), True),
    ("https://a/b/c", ("https://a", "b/c"), False),  # a sub holding '/' is never matched exactly
])
def test_request_principals_match_as_istio_splits_them(pattern, token, matches):
    from vllm_gke.policies.mesh_authz import match_request_principal

    assert match_request_principal(pattern, token) is matches
