"""Tenants of a Cloud Run model (cloudRun.models[]): the config rules, the guard's config and invoker
members (components/model/cloud_run_tenancy.py), and a stack where a tenant lists a Cloud Run model
planned with nothing GKE-side made for it."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_gke.components.model.cloud_run_tenancy import cloud_run_guard_config, id_token_audience, invoker_members
from vllm_gke.components.model.serving_api import ISSUER_HEADER, SUBJECT_HEADER, TENANT_HEADER
from vllm_gke.components.model.tenant_urls import tenant_urls
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.plan_text import url_lines

MODEL = "qwen-1-5b"
SEARCH_SA = "search-llm@acme-staging.iam.gserviceaccount.com"
SUPPORT_SA = "support-llm@acme-staging.iam.gserviceaccount.com"
STAGING_SUPPORT_SA = "support-llm@acme-llm-staging.iam.gserviceaccount.com"
CLOUD_RUN = {"hostname": "run.llm.staging.acme.example",
             "models": [{"name": MODEL, "source": "hf://Qwen/Qwen2.5-1.5B-Instruct", "shape": "qwen2.5-1.5b",
                         "maxModelLen": 8192, "gpu": "nvidia-l4", "minInstances": 0, "maxInstances": 2}]}


def staging(stack_values: dict[str, Any], auth: str = "jwt", callers: tuple[str, ...] = ("search",)) -> dict[str, Any]:
    """Staging with a Cloud Run model the `callers` list (under auth iam, each with its own account)."""
    values = copy.deepcopy(stack_values["staging"])
    section = copy.deepcopy(CLOUD_RUN)
    section["models"][0]["auth"] = auth
    values["vllm-gke:cloudRun"] = section
    for t in values["vllm-gke:tenants"]:
        t["models"] = [m for m in t["models"] if m != MODEL]  # the stack's own callers, replaced by `callers`
        t.pop("cloudRunInvokers", None)
        if t["name"] in callers:
            t["models"] = [*t["models"], MODEL]
            if auth == "iam":
                t["cloudRunInvokers"] = [SEARCH_SA if t["name"] == "search" else SUPPORT_SA]
    return values


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


def test_auth_is_iam_unless_a_model_says_jwt(stack_values):
    """Secure by default: Cloud Run's invoker check verifies the caller before any instance starts."""
    values = staging(stack_values, auth="iam")
    del values["vllm-gke:cloudRun"]["models"][0]["auth"]
    assert parse(values).cloud_run_models[0].auth == "iam"
    # The staging stack runs it so: its caller names its account, which is the service's one invoker.
    cfg = parse(copy.deepcopy(stack_values["staging"]))
    (model,) = cfg.cloud_run_models
    assert model.auth == "iam" and invoker_members(cfg, model) == [f"serviceAccount:{STAGING_SUPPORT_SA}"]
    assert cloud_run_guard_config(cfg, model)["cloudRun"]["accounts"] == {STAGING_SUPPORT_SA: "support"}


def test_a_tenant_may_list_a_cloud_run_model(stack_values):
    cfg = parse(staging(stack_values, auth="jwt"))
    assert MODEL in next(t for t in cfg.tenants if t.name == "search").models


def test_an_undeclared_model_is_still_refused_naming_both_places(stack_values):
    values = staging(stack_values)
    values["vllm-gke:tenants"][0]["models"].append("nowhere")
    (problem,) = problems(values)
    assert "'nowhere' is not declared" in problem and "cloudRun.models" in problem and MODEL in problem


def test_a_cap_over_what_the_cloud_run_model_serves_is_refused(stack_values):
    values = staging(stack_values)
    values["vllm-gke:cloudRun"]["models"][0]["maxModelLen"] = 1024
    (problem,) = problems(values)
    assert "tenants[search].maxTokens" in problem and "2048 exceeds" in problem and MODEL in problem


def test_a_dedicated_copy_of_a_cloud_run_model_is_refused_with_the_reason(stack_values):
    values = staging(stack_values)
    search = values["vllm-gke:tenants"][0]
    search["dedicated"] = {"models": [MODEL], "nodePool": "l4"}
    found = problems(values)
    assert any("tenants[search].dedicated.models" in p and "runs on Cloud Run" in p and "no dedicated" in p
               for p in found), found


def test_iam_needs_each_calling_tenant_to_name_its_accounts(stack_values):
    values = staging(stack_values, auth="iam")
    del values["vllm-gke:tenants"][0]["cloudRunInvokers"]
    (problem,) = problems(values)
    assert "tenants[search].cloudRunInvokers" in problem and "auth iam" in problem


def test_accounts_granted_nothing_are_refused(stack_values):
    values = staging(stack_values, auth="jwt")
    values["vllm-gke:tenants"][0]["cloudRunInvokers"] = [SEARCH_SA]
    (problem,) = problems(values)
    assert "tenants[search].cloudRunInvokers" in problem and "granted nothing" in problem


def test_an_account_is_one_tenants(stack_values):
    values = staging(stack_values, auth="iam", callers=("search", "support"))
    values["vllm-gke:tenants"][1]["cloudRunInvokers"] = [SEARCH_SA]
    (problem,) = problems(values)
    assert "tenants[support].cloudRunInvokers" in problem and f"'{SEARCH_SA}' is also tenant 'search''s" in problem


@pytest.mark.parametrize("email", ["Search@acme.iam.gserviceaccount.com", "someone@gmail.com", "allUsers",
                                   "search@acme.iam.gserviceaccount.com.evil.example"])
def test_an_invoker_is_a_service_accounts_email(stack_values, email):
    values = staging(stack_values, auth="iam")
    values["vllm-gke:tenants"][0]["cloudRunInvokers"] = [email]
    (problem,) = problems(values)
    assert "cloudRunInvokers" in problem and "is not a service account's email" in problem


def test_the_guard_config_jwt(stack_values):
    cfg = parse(staging(stack_values, callers=("search", "support")))
    guard = cloud_run_guard_config(cfg, cfg.cloud_run_models[0])
    # What the GKE guard enforces, per tenant: caps, limits, salts, usage counters named by the model.
    support = guard["issuers"]["https://auth.acme.example/support"]
    assert support == {"tenant": "support", "maxTokens": 1024, "requestsPerMinute": 300, "cacheSalt": "tenant-support",
                       "priority": -1}
    assert guard["model"] == MODEL and guard["cacheSaltRoutes"] and "/v1/chat/completions" in guard["routes"]
    # No sidecar to trust, and the identity the guard verifies itself.
    assert guard["trustedPeers"] == []
    identity = guard["cloudRun"]
    assert identity["auth"] == "jwt" and set(identity["refusedHeaders"]) == {ISSUER_HEADER, SUBJECT_HEADER, TENANT_HEADER}
    assert identity["tenants"]["search"] == {"issuer": "https://auth.acme.example/search", "subjects": None,
                                             "jwksUri": "https://auth.acme.example/search/.well-known/jwks.json",
                                             "audiences": ["llm.staging.acme.example"]}
    assert identity["tenantPrefixes"] == {f"/search/{MODEL}": "search", f"/support/{MODEL}": "support"}
    assert set(guard["pathPrefixes"]) == {f"/{MODEL}", f"/search/{MODEL}", f"/support/{MODEL}"}
    assert invoker_members(cfg, cfg.cloud_run_models[0]) == []
    # globalLimits on: the store over the VPC (cloud_run_store.py), over TLS.
    values = staging(stack_values)
    values["vllm-gke:globalLimits"] = {"enabled": True}
    cfg = parse(values)
    assert cloud_run_guard_config(cfg, cfg.cloud_run_models[0])["globalLimits"]["tlsEnv"]


def test_the_guard_config_iam_and_the_invokers(stack_values):
    cfg = parse(staging(stack_values, auth="iam", callers=("search", "support")))
    model = cfg.cloud_run_models[0]
    identity = cloud_run_guard_config(cfg, model)["cloudRun"]
    assert identity["auth"] == "iam" and identity["accounts"] == {SEARCH_SA: "search", SUPPORT_SA: "support"}
    assert "tenants" not in identity
    assert invoker_members(cfg, model) == [f"serviceAccount:{SEARCH_SA}", f"serviceAccount:{SUPPORT_SA}"]


def test_a_tenant_calling_a_cloud_run_model_gets_nothing_gke_side_for_it(stack_values, plan_variant):
    """Every GKE object a tenant's models make - its mesh policies, routes, guard configs, the identity
    extension's prefixes, fallback routes - is made for its GKE models alone: the model is named only by
    the Cloud Run tier's resources and the loader Jobs that write (and prune) its weights in the bucket."""
    plan = plan_variant("staging", lambda v: v.update(staging(stack_values, callers=("search", "support"))))
    naming = {r.name for r in plan.resources if MODEL in r.name or MODEL in json.dumps(r.props, default=str)}
    # The Cloud Run tier's monitoring names it too: its dashboard and the SLOs of its service (vllm-<cluster>-run-<model>).
    # and the Cloud Run tier's alert policies (their queries select its services).
    run_alerts = {r.name for r in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")
                  if "Cloud Run" in str(r.props.get("displayName"))}
    run_monitoring = {n for n in naming if n == "observability-run-dashboard" or f"-run-{MODEL}" in n} | run_alerts
    gke = {n for n in naming if not n.startswith("cloud-run")} - run_monitoring - {f"weights-load-{MODEL}",
                                                                                    f"weights-prune-{MODEL}"}
    assert not gke, gke
    assert {f"cloud-run-{MODEL}", f"weights-load-{MODEL}"} <= naming
    # The tenants' GKE models still have theirs.
    assert plan.kube("AuthorizationPolicy", "allow-search-llama-8b", "vllm")


def test_iam_tokens_are_minted_for_the_models_base_url_which_the_plan_shows(stack_values):
    """Under iam Cloud Run checks the token's aud against the service's custom audience (its run.app URL is
    off): one per model, the model's base on the Cloud Run load balancer, printed beside each tenant's URL."""
    cfg = parse(staging(stack_values, auth="iam", callers=("search", "support")))
    model = cfg.cloud_run_models[0]
    audience = f"https://run.llm.staging.acme.example/{MODEL}"
    assert id_token_audience(cfg, model) == audience
    urls = {u.tenant: u for u in tenant_urls(cfg) if u.model == MODEL}
    assert {u.audience for u in urls.values()} == {audience} and urls["search"].url == f"{audience}/v1"
    (line,) = [ln for ln in url_lines(SimpleNamespace(urls=[urls["search"]])) if MODEL in ln]  # type: ignore[arg-type]
    assert line.endswith(f"(cloud run, Google ID token for audience {audience})")
    # jwt: no invoker check reads an audience; nothing is shown.
    cfg = parse(staging(stack_values, auth="jwt"))
    assert id_token_audience(cfg, cfg.cloud_run_models[0]) is None
    assert all(u.audience == "" for u in tenant_urls(cfg))


def test_without_a_hostname_the_audience_is_a_fixed_name_not_the_address(stack_values):
    """An internal plain-HTTP load balancer without cloudRun.hostname: its address is known only once
    made (and changes if re-made), so the audience is the stack's and model's name."""
    values = staging(stack_values, auth="iam")
    values["vllm-gke:gateway"] = {"className": "gke-l7-rilb"}
    del values["vllm-gke:cloudRun"]["hostname"]
    cfg = parse(values)
    assert id_token_audience(cfg, cfg.cloud_run_models[0]) == f"vllm-staging-run/{MODEL}"
