"""The Cloud Run models' load balancer: of the gateway's class, one serverless NEG per model, the GKE
routes' path scheme, 404 for anything else, HTTPS with a managed certificate where the gateway is
HTTPS, and the config rules that keep it reachable."""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any, Optional, get_args

import pytest

from tests.conftest import props_of
from vllm_gke.components.model.cloud_run_gateway import (
    BEARER_JWT_EXPRESSION,
    LB_OF_CLASS,
    ArmorPolicy,
    cloud_run_prefix_tenants,
    cloud_run_prefixes,
)
from vllm_gke.components.model.specs import GatewaySpec
from vllm_gke.components.model.tenant_urls import tenant_urls
from vllm_gke.infra.config import ConfigError, parse

MODEL = "qwen-run"
CLOUD_RUN = {"hostname": "run.llm.staging.acme.example",
             "models": [{"name": MODEL, "source": "hf://Qwen/Qwen2.5-1.5B-Instruct", "shape": "qwen2.5-1.5b",
                         "auth": "jwt"}]}
INVOKER = "search-llm@acme-llm-staging.iam.gserviceaccount.com"
REGIONAL_POLICY = "gcp:compute/regionSecurityPolicy:RegionSecurityPolicy"
REGIONAL_BACKEND = "gcp:compute/regionBackendService:RegionBackendService"


def with_cloud_run(values: dict[str, Any], auth: str = "jwt", **section: Any) -> None:
    """The stack with one Cloud Run model (in place of the stack's own) of this auth (set here, not
    left to the default), called by its first tenant (through INVOKER under auth iam)."""
    own = {m["name"] for m in (values.get("vllm-gke:cloudRun") or {}).get("models", [])}
    for t in values["vllm-gke:tenants"]:
        t["models"] = [m for m in t["models"] if m not in own]
        t.pop("cloudRunInvokers", None)
    values["vllm-gke:cloudRun"] = {k: v for k, v in {**copy.deepcopy(CLOUD_RUN), **section}.items() if v is not None}
    values["vllm-gke:cloudRun"]["models"][0]["auth"] = auth
    values["vllm-gke:tenants"][0]["models"].append(MODEL)
    if auth == "iam":
        values["vllm-gke:tenants"][0]["cloudRunInvokers"] = [INVOKER]


def by_name(plan, type_: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in props_of(plan, type_)}


@pytest.fixture(scope="module")
def regional(stack_values):
    from vllm_gke.infra.plan import run_program

    values = copy.deepcopy(stack_values["staging"])
    with_cloud_run(values)
    return run_program("staging", values)


def test_every_gateway_class_has_a_load_balancer():
    classes = get_args(GatewaySpec.model_fields["class_name"].annotation)
    assert sorted(LB_OF_CLASS) == sorted(classes)
    assert LB_OF_CLASS["gke-l7-rilb"].scheme == "INTERNAL_MANAGED"
    assert not LB_OF_CLASS["gke-l7-global-external-managed"].regional


def test_prefixes_are_the_shared_and_each_callers(stack_values):
    values = copy.deepcopy(stack_values["staging"])
    with_cloud_run(values)
    values["vllm-gke:tenants"][1]["models"].append(MODEL)
    cfg = parse(values)
    assert cloud_run_prefixes(cfg, MODEL) == [f"/{MODEL}", f"/search/{MODEL}", f"/support/{MODEL}"]
    assert cloud_run_prefix_tenants(cfg, MODEL) == {f"/{MODEL}": None, f"/search/{MODEL}": "search",
                                                     f"/support/{MODEL}": "support"}


def test_regional_external_load_balancer(regional):
    (neg,) = props_of(regional, "gcp:compute/regionNetworkEndpointGroup:RegionNetworkEndpointGroup")
    assert (neg["networkEndpointType"], neg["region"]) == ("SERVERLESS", "us-central1")
    assert neg["cloudRun"]["service"] == regional.named("gcp:cloudrunv2/service:Service", "cloud-run-" + MODEL
                                                        ).props["name"]
    backend = by_name(regional, "gcp:compute/regionBackendService:RegionBackendService")[f"vllm-staging-run-{MODEL}"]
    assert backend["loadBalancingScheme"] == "EXTERNAL_MANAGED"
    # Google refuses a health check and a timeout on a serverless NEG's backend service.
    assert "healthChecks" not in backend and "timeoutSec" not in backend
    rules = by_name(regional, "gcp:compute/forwardingRule:ForwardingRule")
    assert {(r["portRange"], r["loadBalancingScheme"]) for n, r in rules.items() if "-run-" in n} == {
        ("443", "EXTERNAL_MANAGED"), ("80", "EXTERNAL_MANAGED")}
    https = regional.named("gcp:compute/forwardingRule:ForwardingRule", "cloud-run-gateway-https-rule")
    assert https.props["network"] and regional.waits_for(
        https, regional.named("gcp:compute/subnetwork:Subnetwork", "gke-proxy-subnet"))


def test_routes_both_path_forms_and_404s_the_rest(regional):
    url_map = by_name(regional, "gcp:compute/regionUrlMap:RegionUrlMap")["vllm-staging-run"]
    assert url_map["hostRules"] == [{"hosts": ["run.llm.staging.acme.example"], "pathMatcher": "models"}]
    (matcher,) = url_map["pathMatchers"]
    (rule,) = matcher["pathRules"]
    assert rule["paths"] == [f"/{MODEL}/v1", f"/{MODEL}/v1/*", f"/search/{MODEL}/v1", f"/search/{MODEL}/v1/*"]
    for default in (matcher["defaultRouteAction"], url_map["defaultRouteAction"]):
        assert default["faultInjectionPolicy"]["abort"] == {"httpStatus": 404, "percentage": 100}
    assert "urlRewrite" not in str(url_map)  # the guard strips the prefix, as on GKE
    assert url_map["headerAction"]["requestHeadersToRemoves"] == ["x-vllm-gke-issuer", "x-vllm-gke-subject"]


def test_https_with_a_managed_certificate_and_http_only_redirects(regional):
    certs = by_name(regional, "gcp:certificatemanager/certificate:Certificate")
    assert certs["vllm-staging-run"]["managed"]["domains"] == ["run.llm.staging.acme.example"]
    assert certs["vllm-staging-run"]["location"] == "us-central1"
    (proxy,) = props_of(regional, "gcp:compute/regionTargetHttpsProxy:RegionTargetHttpsProxy")
    assert proxy["certificateManagerCertificates"] == ["cloud-run-gateway-cert-id"]
    redirect = by_name(regional, "gcp:compute/regionUrlMap:RegionUrlMap")["vllm-staging-run-redirect"]
    assert redirect["defaultUrlRedirect"]["httpsRedirect"] is True and "pathMatchers" not in redirect
    (http,) = props_of(regional, "gcp:compute/regionTargetHttpProxy:RegionTargetHttpProxy")
    assert http["urlMap"] == "cloud-run-gateway-redirect-id"
    assert regional.platform.cloud_run_gateway.dns_authorization is not None


def test_tenant_urls_list_the_cloud_run_model(regional):
    (url,) = [u for u in tenant_urls(regional.config) if u.model == MODEL]
    assert (url.tenant, url.url, url.via) == ("search", f"https://run.llm.staging.acme.example/{MODEL}/v1", "cloud run")


def test_internal_class_plain_http_in_the_cluster_subnet(plan_variant):
    def mutate(v):
        v["vllm-gke:gateway"] = {"className": "gke-l7-rilb"}
        with_cloud_run(v, "iam", hostname=None)

    plan = plan_variant("staging", mutate)
    assert not props_of(plan, REGIONAL_POLICY)  # auth iam: no Cloud Armor policy (and none on an internal class)
    address = by_name(plan, "gcp:compute/address:Address")["vllm-staging-run"]
    assert (address["addressType"], address["purpose"]) == ("INTERNAL", "SHARED_LOADBALANCER_VIP")
    assert address["subnetwork"] == "gke-subnet-id"
    (rule,) = [r for n, r in by_name(plan, "gcp:compute/forwardingRule:ForwardingRule").items() if "-run-" in n]
    assert (rule["portRange"], rule["loadBalancingScheme"], rule["subnetwork"]) == ("80", "INTERNAL_MANAGED",
                                                                                    "gke-subnet-id")
    (proxy,) = props_of(plan, "gcp:compute/regionTargetHttpProxy:RegionTargetHttpProxy")
    assert proxy["urlMap"] == "cloud-run-gateway-url-map-id"
    assert not props_of(plan, "gcp:compute/regionTargetHttpsProxy:RegionTargetHttpsProxy")
    (url_map,) = props_of(plan, "gcp:compute/regionUrlMap:RegionUrlMap")
    assert url_map["hostRules"][0]["hosts"] == ["*"]


def test_global_class_takes_a_model_in_another_region():
    """No stack plans the global class (GKE's routes need a regional one), but the component takes it."""
    import pulumi

    from vllm_gke.components.cloud_run_gateway import CloudRunGateway, CloudRunGatewayArgs
    from vllm_gke.components.model.cloud_run_gateway import CloudRunBackend, CloudRunFront
    from vllm_gke.infra.plan import _under_mocks  # pyright: ignore[reportPrivateUsage]

    cls = "gke-l7-global-external-managed"
    front = CloudRunFront(cls, LB_OF_CLASS[cls], "run.example.com", True, "us-central1", "g-run",
                          (CloudRunBackend(MODEL, "europe-west4", f"g-run-{MODEL}", (f"/{MODEL}",),
                                           ArmorPolicy(f"g-run-{MODEL}", 120)),))

    def body() -> None:
        CloudRunGateway("crg", CloudRunGatewayArgs(front, {MODEL: "svc"}, "p"))
        pulumi.export("ok", True)

    recorded = _under_mocks("p", "s", {"gcp:project": "p"}, body)
    of = {(r.type.split(":")[-1], r.name): r for r in recorded}
    assert of[("RegionNetworkEndpointGroup", "crg-neg-" + MODEL)].props["region"] == "europe-west4"
    backend = of[("BackendService", "crg-backend-" + MODEL)].props
    assert backend["loadBalancingScheme"] == "EXTERNAL_MANAGED" and "timeoutSec" not in backend
    # The global class's backend service takes a global policy.
    policy = of[("SecurityPolicy", "crg-armor-" + MODEL)].props
    assert backend["securityPolicy"] == f"crg-armor-{MODEL}-id" and "region" not in policy
    assert [r["action"] for r in policy["rules"]] == ["throttle", "deny(403)"]
    assert ("GlobalAddress", "crg-ip") in of and ("URLMap", "crg-url-map") in of
    proxy = of[("TargetHttpsProxy", "crg-https")]
    assert proxy.props["certificateMap"].startswith("//certificatemanager.googleapis.com/")
    assert of[("CertificateMapEntry", "crg-cert-map-entry")].urn in proxy.dependencies
    assert {r.props["portRange"] for (t, _n), r in of.items() if t == "GlobalForwardingRule"} == {"443", "80"}


def test_no_cloud_run_no_load_balancer(plans):
    assert not props_of(plans["dev"], "gcp:compute/regionNetworkEndpointGroup:RegionNetworkEndpointGroup")
    assert plans["dev"].platform.cloud_run_gateway is None


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


@pytest.mark.parametrize("mutate, key, words", [
    (lambda v: v["vllm-gke:cloudRun"]["models"][0].update(region="europe-west4"),
     f"cloudRun.models[{MODEL}].region", "reaches serverless NEGs in its own region only"),
    (lambda v: v["vllm-gke:cloudRun"].pop("hostname"), "cloudRun.hostname", "set the DNS name"),
    (lambda v: v["vllm-gke:cloudRun"].update(hostname="llm.staging.acme.example"), "cloudRun.hostname",
     "need a name of their own"),
    (lambda v: (v["vllm-gke:cloudRun"]["models"][0].update(name="m" * 30), v["vllm-gke:cluster"].update(name="c" * 30)),
     f"cloudRun.models[{'m' * 30}].name", "exceed GCP's 63 characters"),
])
def test_config_rules(stack_values, mutate, key, words):
    values = copy.deepcopy(stack_values["staging"])
    with_cloud_run(values)
    parse(copy.deepcopy(values))  # valid before the change
    mutate(values)
    found = problems(values)
    assert any(key in p and words in p for p in found), found


# --- Cloud Armor in front of auth jwt models -------------------------------------------------------

def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _jwt(claims: Optional[dict[str, Any]] = None, signature: bytes = b"s" * 256, alg: str = "RS256") -> str:
    header = _b64(json.dumps({"alg": alg, "typ": "JWT", "kid": "k1"}).encode())
    payload = _b64(json.dumps(claims or {"iss": "https://idp.acme.example", "sub": "search", "aud": "llm",
                                         "exp": 1999999999}).encode())
    return f"{header}.{payload}.{_b64(signature)}"


def _passes(authorization: Optional[str]) -> bool:
    """The throttle rule's match, as Cloud Armor evaluates it: request.headers['authorization']
    .matches(<pattern>), a partial RE2 match (the pattern is RE2's and Python's common subset); no
    header: the expression does not match, and the default rule (deny) answers.

    Python's engine matches this pattern as RE2 does: its runs are of one class without the '.' that ends
    a segment, so nothing backtracks."""
    (pattern,) = re.findall(r"\.matches\('([^']*)'\)", BEARER_JWT_EXPRESSION)
    return authorization is not None and re.search(pattern, authorization) is not None


WELL_FORMED = {
    "RS256": "Bearer " + _jwt(),
    "ES256": "Bearer " + _jwt(signature=b"e" * 64, alg="ES256"),
    "a large payload": "Bearer " + _jwt({"sub": "search", "groups": ["g" * 40] * 60}),
    # Group-heavy claims (Entra ID, Keycloak): GKE and the guard (16 KB) take them, so the load balancer does too.
    "a 9 KB payload": "Bearer " + _jwt({"sub": "s" * 6800}),
    "a 4096-bit key's signature": "Bearer " + _jwt(signature=b"s" * 512, alg="RS512"),
}
MALFORMED = {
    "no header": None,
    "empty": "",
    "scheme only": "Bearer ",
    "lower-case scheme (the guard takes 'Bearer ' only)": "bearer " + _jwt(),
    "Basic credentials": "Basic " + _b64(b"user:password"),
    "an API key": "Bearer sk-0123456789abcdef0123456789abcdef",
    "two segments": "Bearer " + _jwt().rsplit(".", 1)[0],
    "unsigned (alg none)": "Bearer " + _jwt(signature=b"", alg="none"),
    "four segments": "Bearer " + _jwt() + ".xxxxxxxxxxxxxxxxxxxx",
    "base64 padding": "Bearer " + _jwt() + "==",
    "not base64url": "Bearer " + _jwt().replace("_", "/", 1).replace("-", "+", 1) + "+/",
    "two headers joined": "Bearer " + _jwt() + ", Bearer " + _jwt(),
    "trailing junk": "Bearer " + _jwt() + " x",
    "leading junk": "x Bearer " + _jwt(),
}


@pytest.mark.parametrize("case", WELL_FORMED)
def test_a_well_formed_bearer_jwt_passes_to_the_throttle(case):
    assert _passes(WELL_FORMED[case])


@pytest.mark.parametrize("case", MALFORMED)
def test_anything_else_meets_the_default_deny(case):
    assert not _passes(MALFORMED[case])


def test_the_pattern_stays_within_re2():
    """RE2 refuses a counted repeat above 1,000 (Cloud Armor would refuse the rule); the pattern counts none."""
    assert all(int(n) <= 1000 for n in re.findall(r"\{\d+,(\d+)\}", BEARER_JWT_EXPRESSION))


def test_a_jwt_model_gets_the_policy_with_both_rules(regional):
    (policy,) = props_of(regional, REGIONAL_POLICY)
    assert (policy["name"], policy["type"], policy["region"]) == (f"vllm-staging-run-{MODEL}", "CLOUD_ARMOR",
                                                                  "us-central1")
    backend = by_name(regional, REGIONAL_BACKEND)[f"vllm-staging-run-{MODEL}"]
    assert backend["securityPolicy"] == f"cloud-run-gateway-armor-{MODEL}-id"
    throttle, default = sorted(policy["rules"], key=lambda r: r["priority"])
    assert (throttle["action"], throttle["match"]["expr"]["expression"]) == ("throttle", BEARER_JWT_EXPRESSION)
    options = throttle["rateLimitOptions"]
    assert (options["enforceOnKey"], options["conformAction"], options["exceedAction"]) == ("IP", "allow", "deny(429)")
    # Twice what the guards admit of the model's one caller (search), across instances (globalLimits on).
    cfg = regional.config
    (search,) = [t for t in cfg.tenants if t.name == "search"]
    assert cfg.global_limits.enabled
    assert options["rateLimitThreshold"] == {"count": 2 * search.rate_limit.requests_per_minute, "intervalSec": 60}
    assert (default["priority"], default["action"]) == (2147483647, "deny(403)")
    assert default["match"] == {"versionedExpr": "SRC_IPS_V1", "config": {"srcIpRanges": ["*"]}}


def test_the_policy_passes_the_provider_schema(regional):
    from vllm_gke.infra.provider_schema import check_resource

    (policy,) = regional.of_type(REGIONAL_POLICY)
    assert check_resource(policy) == []


def test_without_global_limits_the_rate_counts_each_instance(plan_variant):
    def mutate(v):
        with_cloud_run(v)
        v["vllm-gke:globalLimits"] = {"enabled": False}
        v["vllm-gke:cloudRun"]["models"][0]["maxInstances"] = 3

    plan = plan_variant("staging", mutate)
    (policy,) = props_of(plan, REGIONAL_POLICY)
    (search,) = [t for t in plan.config.tenants if t.name == "search"]
    assert policy["rules"][0]["rateLimitOptions"]["rateLimitThreshold"]["count"] == \
        2 * 3 * search.rate_limit.requests_per_minute


def test_an_iam_model_gets_no_policy(plan_variant):
    plan = plan_variant("staging", lambda v: with_cloud_run(v, "iam"))
    assert not props_of(plan, REGIONAL_POLICY)
    assert "securityPolicy" not in by_name(plan, REGIONAL_BACKEND)[f"vllm-staging-run-{MODEL}"]


def test_the_plan_prices_what_a_forged_token_still_costs(regional):
    from vllm_gke.infra.cloud_run_plan import cloud_run_lines

    (line,) = [x for x in cloud_run_lines(regional.config) if "Cloud Armor" in x]
    assert f"{MODEL} (auth jwt)" in line and "a forged but well-formed token still" in line
    assert re.search(r"~\$\d+\.\d\d a wake-up \(~\d+ min billed", line), line


def test_jwt_on_the_internal_class_is_refused(stack_values):
    values = copy.deepcopy(stack_values["staging"])
    values["vllm-gke:gateway"] = {"className": "gke-l7-rilb"}
    with_cloud_run(values, "iam", hostname=None)
    parse(copy.deepcopy(values))  # valid with auth iam
    values["vllm-gke:cloudRun"]["models"][0]["auth"] = "jwt"
    values["vllm-gke:tenants"][0].pop("cloudRunInvokers")
    found = problems(values)
    assert any(f"cloudRun.models[{MODEL}].auth" in p and "use auth iam" in p for p in found), found


def _mutated(plan, mutate):
    import dataclasses

    copied = dataclasses.replace(plan, resources=copy.deepcopy(plan.resources))
    mutate(copied)
    return copied


def _rules(plan) -> list[dict[str, Any]]:
    (policy,) = plan.of_type(REGIONAL_POLICY)
    return sorted(policy.props["rules"], key=lambda r: r["priority"])


@pytest.mark.parametrize("mutate, words", [
    (lambda p: by_name(p, REGIONAL_BACKEND)[f"vllm-staging-run-{MODEL}"].pop("securityPolicy"), "no Cloud Armor policy"),
    (lambda p: p.of_type(REGIONAL_POLICY)[0].props.update(region="europe-west4"), "not CLOUD_ARMOR in us-central1"),
    (lambda p: _rules(p)[1].update(action="allow"), "must deny"),
    (lambda p: _rules(p)[0]["match"]["expr"].update(expression=BEARER_JWT_EXPRESSION.replace("'^", "'")),
     "anchor it"),
    (lambda p: _rules(p)[0]["match"]["expr"].update(expression=BEARER_JWT_EXPRESSION.replace("]+[.]", "]{1,4096}[.]", 1)),
     "RE2's 1000"),
    (lambda p: _rules(p)[0]["rateLimitOptions"].update(enforceOnKey="ALL"), "must be per IP"),
])
def test_the_contract_rows_catch_a_weakened_policy(regional, mutate, words):
    from vllm_gke.infra.contracts.cloud_run_gateway import (
        armor_rules_pass_only_whole_bearer_jwts,
        invoker_off_backends_carry_a_cloud_armor_policy,
    )

    def found(plan):
        return invoker_off_backends_carry_a_cloud_armor_policy(plan) + armor_rules_pass_only_whole_bearer_jwts(plan)

    assert found(regional) == []
    problems_found = found(_mutated(regional, mutate))
    assert any(words in p for p in problems_found), problems_found
