"""TenantAuth: namespace per tenant, JWT per issuer, allow only a tenant's own models."""

from __future__ import annotations

import pytest

from tests.conftest import manifests_of
from vllm_gke.components.model.serving_api import (
    ISSUER_HEADER,
    SUBJECT_HEADER,
    TENANT_ROUTES,
    mesh_operations,
    tenant_routes,
)


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
    assert rule["outputClaimToHeaders"] == [{"header": ISSUER_HEADER, "claim": "iss"},
                                            {"header": SUBJECT_HEADER, "claim": "sub"}]
    # Read from the Authorization header only (not also a query parameter): the token the guard
    # sends on to a fallback model is the one Istio verified.
    assert all(r["spec"]["jwtRules"][0]["fromHeaders"] == [{"name": "Authorization", "prefix": "Bearer "}]
               for r in ras)
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
        # Exactly the guard's routes under the model's prefix (the sidecar sees the path as sent: the
        # Gateway rewrites none), method by method: no wildcard reaches an unguarded endpoint.
        assert rule["to"] == mesh_operations(tenant_routes(), [f"/{model}"])
        assert {p for op in rule["to"] for p in op["operation"]["paths"]} == {f"/{model}{r.path}" for r in TENANT_ROUTES}
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


# --- who the tenant is: its issuer, and on a shared public issuer only its listed subjects ------

GOOGLE = "https://accounts.google.com"
DEV_SUBJECT = "104476360121718219735"


def _tenant_docs(plan, tenant):
    return [m for m in plan.manifests() if m["kind"] in ("RequestAuthentication", "AuthorizationPolicy")
            and (m["metadata"].get("labels") or {}).get("vllm-gke.io/tenant") == tenant]


def test_a_listed_tenant_is_exactly_its_subjects_in_every_allow(plans):
    """dev trusts accounts.google.com, which mints a token for anyone and any audience: each of
    its ALLOW rules names exact `<iss>/<sub>` principals and requires the verified subject header."""
    allows = [d for d in _tenant_docs(plans["dev"], "dev-team") if d["kind"] == "AuthorizationPolicy"]
    assert len(allows) == 2  # its own namespace and the shared model
    for p in allows:
        (rule,) = p["spec"]["rules"]
        assert rule["from"] == [{"source": {"requestPrincipals": [f"{GOOGLE}/{DEV_SUBJECT}"]}}]
        assert {"key": f"request.headers[{SUBJECT_HEADER}]", "values": [DEV_SUBJECT]} in rule["when"]
    for ra in (d for d in _tenant_docs(plans["dev"], "dev-team") if d["kind"] == "RequestAuthentication"):
        assert {"header": SUBJECT_HEADER, "claim": "sub"} in ra["spec"]["jwtRules"][0]["outputClaimToHeaders"]


def test_the_mesh_admits_a_listed_subject_and_no_other_google_identity(plans):
    """Decided as Istio would on the emitted policies: another Google identity's valid token for
    the same audience is refused, with or without a forged subject header, whether or not the data
    plane overwrites client copies of claim headers."""
    from vllm_gke.policies.mesh_authz import Request, decide

    docs = plans["dev"].manifests()
    labels = {"vllm-gke.io/model": "qwen-7b"}

    def decision(subject, headers=None, claim_to_headers=True):
        return decide(docs, Request("vllm", "/qwen-7b/v1/chat/completions", "POST", labels, "127.0.0.6",
                                    token=(GOOGLE, subject), headers=headers or {}), claim_to_headers)

    assert decision(DEV_SUBJECT).allowed
    assert decision("999999999999999999999").status == 403
    forged = {ISSUER_HEADER: GOOGLE, SUBJECT_HEADER: DEV_SUBJECT}
    assert decision("999999999999999999999", forged, claim_to_headers=False).status == 403


def test_guard_config_names_the_listed_subjects(plans):
    import json

    for d in manifests_of(plans["dev"], "Deployment", "vllm"):
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            if "GKE_LLM_GUARD_CONFIG" in env:
                cfg = json.loads(env["GKE_LLM_GUARD_CONFIG"])
                assert cfg["subjectHeader"] == SUBJECT_HEADER
                assert cfg["issuers"][GOOGLE]["subjects"] == [DEV_SUBJECT]


@pytest.mark.parametrize("issuer", [
    GOOGLE, f"{GOOGLE}/", "https://login.microsoftonline.com/common/v2.0",
    "https://login.microsoftonline.com/consumers/v2.0", "https://sts.windows.net/common/",
    "https://token.actions.githubusercontent.com", "https://appleid.apple.com", "https://gitlab.com",
    "https://app.terraform.io", "https://agent.buildkite.com",
])
def test_a_shared_public_issuer_without_subjects_is_refused(dev_values, issuer):
    from tests.test_config import one_issue

    dev_values["vllm-gke:tenants"][0]["jwt"].pop("subjects")
    dev_values["vllm-gke:tenants"][0]["jwt"]["issuer"] = issuer
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:tenants[dev-team].jwt.subjects:") and "list the tenant's token subjects" in msg


def test_the_plan_exits_2_on_a_google_tenant_without_subjects(tmp_path):
    """What an operator sees: the key and the fix, exit 2, no traceback."""
    import yaml
    from typer.testing import CliRunner

    from vllm_gke.infra.cli import app
    from vllm_gke.infra.plan import STACKS_DIR

    doc = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    doc["config"]["vllm-gke:tenants"][0]["jwt"].pop("subjects")
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["plan", "--stack", "dev", "--stacks-dir", str(tmp_path), "--no-write"])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "vllm-gke:tenants[dev-team].jwt.subjects:" in out and "under jwt.subjects" in out
    assert "Traceback" not in result.output


def test_an_issuer_of_the_tenants_own_needs_no_list(dev_values):
    from vllm_gke.infra.config import parse

    jwt = dev_values["vllm-gke:tenants"][0]["jwt"]
    jwt.pop("subjects")
    for issuer in ("https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0",
                   "https://acme.eu.auth0.com/", "https://securetoken.google.com/acme-prod"):
        jwt["issuer"] = issuer
        assert parse(dev_values).tenants[0].jwt.subjects is None


@pytest.mark.parametrize("subjects,fault", [
    (["repo:acme/llm:ref:refs/heads/main"], "cannot be matched exactly"),  # Istio splits at the last '/'
    (["*"], "cannot be matched exactly"), (["1234*"], "cannot be matched exactly"),
    (["*1234"], "cannot be matched exactly"), ([""], "cannot be matched exactly"),
    (["a b"], "cannot be matched exactly"), (["1", "1"], "listed more than once"), ([], "at least 1"),
])
def test_subjects_the_mesh_cannot_match_exactly_are_refused(dev_values, subjects, fault):
    from tests.test_config import one_issue

    dev_values["vllm-gke:tenants"][0]["jwt"]["subjects"] = subjects
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:tenants[dev-team].jwt.subjects") and fault in msg


def test_an_issuer_with_a_trailing_slash_is_kept_verbatim_end_to_end(plan_variant):
    """Auth0's iss ends in '/': RequestAuthentication, principals and the guard's key carry it as
    the token does, so its tokens authenticate (a stripped issuer never matches them)."""
    import json

    from vllm_gke.policies.mesh_authz import Request, decide

    auth0 = "https://acme.eu.auth0.com/"

    def mutate(values):
        jwt = values["vllm-gke:tenants"][0]["jwt"]
        jwt.update(issuer=auth0, jwksUri="https://acme.eu.auth0.com/.well-known/jwks.json")
        jwt.pop("subjects")

    plan = plan_variant("dev", mutate)
    docs = _tenant_docs(plan, "dev-team")
    assert {r["issuer"] for d in docs if d["kind"] == "RequestAuthentication" for r in d["spec"]["jwtRules"]} == {auth0}
    for p in (d for d in docs if d["kind"] == "AuthorizationPolicy"):
        (rule,) = p["spec"]["rules"]
        assert rule["from"] == [{"source": {"requestPrincipals": [f"{auth0}/*"]}}]
        assert {"key": f"request.headers[{ISSUER_HEADER}]", "values": [auth0]} in rule["when"]
    guard = [json.loads(e["value"]) for d in manifests_of(plan, "Deployment", "vllm")
             for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env") or []
             if e["name"] == "GKE_LLM_GUARD_CONFIG"]
    assert guard and all(list(cfg["issuers"]) == [auth0] for cfg in guard)
    request = Request("vllm", "/qwen-7b/v1/chat/completions", "POST", {"vllm-gke.io/model": "qwen-7b"}, "127.0.0.6",
                      token=(auth0, "auth0|65f0c0ffee"))
    assert decide(plan.manifests(), request).allowed


def test_the_contract_check_names_a_guard_that_would_never_see_the_subject(plans):
    """Where no RequestAuthentication writes the verified sub, a listed tenant could never pass the guard."""
    import copy
    import dataclasses

    from vllm_gke.infra.contracts import istio_peer_and_claim_header

    plan = plans["dev"]
    assert istio_peer_and_claim_header(plan) == []
    broken = dataclasses.replace(plan, resources=copy.deepcopy(plan.resources))
    for r in broken.resources:
        if r.props.get("kind") == "RequestAuthentication":
            for rule in r.props["spec"]["jwtRules"]:
                rule["outputClaimToHeaders"] = [o for o in rule["outputClaimToHeaders"] if o["claim"] != "sub"]
    assert any("writes the subject into x-vllm-gke-subject" in p for p in istio_peer_and_claim_header(broken))


def test_an_issuer_under_anothers_path_is_a_tenant_of_its_own(plan_variant):
    """Istio matches iss exactly, so `https://auth.acme.example/search/*` admits none of the tokens
    of an issuer under that path: both tenants are accepted, each reaches only its own models."""
    from vllm_gke.policies.mesh_authz import Request, decide

    under = "https://auth.acme.example/search/team"

    def mutate(values):
        values["vllm-gke:tenants"][1]["jwt"]["issuer"] = under  # support, beside search

    plan = plan_variant("prod", mutate)
    labels = next(d["spec"]["template"]["metadata"]["labels"] for d in manifests_of(plan, "Deployment", "vllm")
                  if d["metadata"]["name"] == "qwen-7b-short")  # support's, not search's

    def call(token):
        return decide(plan.manifests(), Request("vllm", "/qwen-7b/v1/chat/completions", "POST", labels, "127.0.0.6",
                                                token=token))

    assert call((under, "svc-1")).allowed
    assert call(("https://auth.acme.example/search", "team/svc-1")).status == 403
