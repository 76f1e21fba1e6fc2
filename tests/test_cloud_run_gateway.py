"""The Cloud Run models' load balancer: of the gateway's class, one serverless NEG per model, the GKE
routes' path scheme, 404 for anything else, HTTPS with a managed certificate where the gateway is
HTTPS, and the config rules that keep it reachable."""

from __future__ import annotations

import copy
from typing import Any, get_args

import pytest

from tests.conftest import props_of
from vllm_gke.components.model.cloud_run_gateway import (
    LB_OF_CLASS,
    cloud_run_prefix_tenants,
    cloud_run_prefixes,
)
from vllm_gke.components.model.specs import GatewaySpec
from vllm_gke.components.model.tenant_urls import tenant_urls
from vllm_gke.infra.config import ConfigError, parse

MODEL = "qwen-run"
CLOUD_RUN = {"hostname": "run.llm.staging.acme.example",
             "models": [{"name": MODEL, "source": "hf://Qwen/Qwen2.5-1.5B-Instruct", "shape": "qwen2.5-1.5b"}]}


def with_cloud_run(values: dict[str, Any], **section: Any) -> None:
    """The stack with one Cloud Run model (in place of the stack's own), called by its first tenant."""
    own = {m["name"] for m in (values.get("vllm-gke:cloudRun") or {}).get("models", [])}
    for t in values["vllm-gke:tenants"]:
        t["models"] = [m for m in t["models"] if m not in own]
    values["vllm-gke:cloudRun"] = {k: v for k, v in {**copy.deepcopy(CLOUD_RUN), **section}.items() if v is not None}
    values["vllm-gke:tenants"][0]["models"].append(MODEL)


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
        with_cloud_run(v, hostname=None)

    plan = plan_variant("staging", mutate)
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
                          (CloudRunBackend(MODEL, "europe-west4", f"g-run-{MODEL}", (f"/{MODEL}",)),))

    def body() -> None:
        CloudRunGateway("crg", CloudRunGatewayArgs(front, {MODEL: "svc"}, "p"))
        pulumi.export("ok", True)

    recorded = _under_mocks("p", "s", {"gcp:project": "p"}, body)
    of = {(r.type.split(":")[-1], r.name): r for r in recorded}
    assert of[("RegionNetworkEndpointGroup", "crg-neg-" + MODEL)].props["region"] == "europe-west4"
    backend = of[("BackendService", "crg-backend-" + MODEL)].props
    assert backend["loadBalancingScheme"] == "EXTERNAL_MANAGED" and "timeoutSec" not in backend
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
