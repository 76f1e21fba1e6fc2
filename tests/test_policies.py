"""Every policy fails on a plan that breaks it (with its message) and passes on the shipped stacks."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest

from tests.conftest import STACKS
from tests.test_cloud_run_policies import CLOUD_RUN_CASES
from vllm_gke.policies.rules import POLICIES, POLICY_NAMES, Resource, evaluate, resolve_levels


def resources(plan) -> list[Resource]:
    return [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in plan.policy_resources()]


def kind(rs: list[Resource], k: str, name: str | None = None, namespace: str | None = None) -> Resource:
    """The one resource of that kind (and name, namespace): an ambiguous lookup fails rather than
    picking whichever the mock runtime happened to register first."""
    (found,) = [r for r in rs if r.props.get("kind") == k and (name is None or r.props["metadata"]["name"] == name)
                and (namespace is None or r.props["metadata"].get("namespace") == namespace)]
    return found


def vllm_container(rs: list[Resource]) -> dict[str, Any]:
    dep = kind(rs, "Deployment", "qwen-7b-short")
    return dep.props["spec"]["template"]["spec"]["containers"][0]


def violations_of(rs, policy):
    return [v for v in evaluate(rs) if v.policy == policy]


# frontier is a prod stack without rollouts: its pools roll in place, which the advisory
# prod-rollouts-gated says of each (tests/test_rollout_policies.py).
SHIPPED_ADVISORIES = {"frontier": {"prod-rollouts-gated"}}


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_pass_every_policy(plans, stack):
    found = evaluate(resources(plans[stack]))
    assert [v for v in found if v.policy not in SHIPPED_ADVISORIES.get(stack, set())] == []
    assert all(v.level == "advisory" for v in found)


def _untaint(rs):
    pool = next(r for r in rs if r.type == "gcp:container/nodePool:NodePool" and r.props["name"] == "a100-mig")
    pool.props["nodeConfig"]["taints"] = []


def _bad_mig(rs):
    pool = next(r for r in rs if r.type == "gcp:container/nodePool:NodePool" and r.props["name"] == "a100-mig")
    pool.props["nodeConfig"]["guestAccelerators"][0]["gpuPartitionSize"] = "1g.10gb"


def _writable_weights(rs):
    dep = kind(rs, "Deployment", "qwen-7b-short")
    vol = next(v for v in dep.props["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights")
    vol["persistentVolumeClaim"]["readOnly"] = False


def _downloads_weights(rs):
    c = vllm_container(rs)
    c["args"][0] = "Qwen/Qwen2.5-7B-Instruct"
    c["env"] = [e for e in c["env"] if e["name"] != "HF_HUB_OFFLINE"]


def _tenant_without_authn(rs):
    rs[:] = [r for r in rs if not (r.props.get("kind") == "RequestAuthentication"
                                   and r.props["metadata"]["namespace"] == "tenant-dev-team")]


def _external_gateway_open(rs):
    kind(rs, "Gateway").props["spec"]["gatewayClassName"] = "gke-l7-regional-external-managed"
    rs[:] = [r for r in rs if not (r.props.get("kind") == "AuthorizationPolicy"
                                   and r.props["metadata"]["name"] == "deny-all"
                                   and r.props["metadata"]["namespace"] == "vllm")]


def _latest_image(rs):
    vllm_container(rs)["image"] = "vllm/vllm-openai:latest"


def _no_limits(rs):
    del vllm_container(rs)["resources"]["limits"]


def _secret_literal(rs):
    vllm_container(rs)["env"].append({"name": "HF_TOKEN", "value": "hf_abc"})
    rs.append(Resource("kubernetes:core/v1:Secret", "leak",
                       {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "leak", "namespace": "vllm"},
                        "stringData": {"token": "hf_abc"}}))


def _no_cap(rs):
    env = next(e for e in vllm_container(rs)["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG")
    cfg = json.loads(env["value"])
    for entry in cfg["issuers"].values():
        del entry["maxTokens"]
    env["value"] = json.dumps(cfg)


def _no_autoscaler(rs):
    rs[:] = [r for r in rs if r.props.get("kind") != "ScaledObject"]


def _http_external_gateway(rs):
    gw = kind(rs, "Gateway")
    gw.props["spec"]["gatewayClassName"] = "gke-l7-regional-external-managed"


def _open_completions(rs):
    policy = kind(rs, "AuthorizationPolicy", "allow-lb-health-checks", namespace="vllm")
    policy.props["spec"]["rules"][0]["to"][0]["operation"]["paths"].append("/v1/*")


def _privileged(rs):
    vllm_container(rs)["securityContext"] = {"allowPrivilegeEscalation": True}


def _public_control_plane(rs):
    cluster = next(r for r in rs if r.type == "gcp:container/cluster:Cluster")
    del cluster.props["masterAuthorizedNetworksConfig"]


def _no_health_check(rs):
    rs.remove(next(r for r in rs if r.props.get("kind") == "HealthCheckPolicy"
                   and r.props["spec"]["targetRef"]["name"] == "qwen-7b-short"))


def _pool_fails_open(rs):
    pool = kind(rs, "InferencePool", "llama-8b")
    pool.props["spec"]["endpointPickerRef"]["failureMode"] = "FailOpen"


def _objective_from_the_client(rs):
    """The route no longer requires the tenant's objective: any client's value would reach the picker."""
    route = kind(rs, "HTTPRoute", "llama-8b.search")
    for rule in route.props["spec"]["rules"]:
        for m in rule["matches"]:
            m["headers"] = [h for h in m.get("headers", []) if h["name"] != "x-llm-d-inference-objective"]


def _store_open_to_any_source(rs):
    policy = kind(rs, "AuthorizationPolicy", "allow-vllm-guards")
    policy.props["spec"]["rules"][0]["from"] = [{"source": {"ipBlocks": ["10.20.0.0/14"]}}]


def _adapter_for_everyone(rs):
    dep = kind(rs, "Deployment", "llama-8b-short")
    env = dep.props["spec"]["template"]["spec"]["containers"][0]["env"]
    guard_env = next(e for e in env if e["name"] == "GKE_LLM_GUARD_CONFIG")
    cfg = json.loads(guard_env["value"])
    for entry in cfg["issuers"].values():
        del entry["models"]
    guard_env["value"] = json.dumps(cfg)


def _no_standby(rs):
    rs.remove(kind(rs, "Deployment", "mistral-7b-long-standby"))


def _unpopulated_disk(rs):
    rs.remove(kind(rs, "GCPDataSource", namespace="vllm", name=next(
        r.props["metadata"]["name"] for r in rs if r.props.get("kind") == "GCPDataSource")))


@pytest.fixture(scope="module")
def hyperdisk_plan():
    from tests.test_hyperdisk_weights import hyperdisk_values
    from vllm_gke.infra.plan import run_program

    return run_program("staging", hyperdisk_values())


def _unrouted_burn_alerts(rs):
    for r in rs:
        if r.type == "gcp:monitoring/alertPolicy:AlertPolicy":
            r.props["notificationChannels"] = []


def _every_request_traced(rs):
    for r in rs:
        if r.props.get("kind") == "Deployment":
            for c in r.props["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env") or []:
                    if e["name"] == "OTEL_TRACES_SAMPLER":
                        e["value"] = "parentbased_always_on"


def _scheduled_load_test(rs):
    next(r for r in rs if r.props.get("kind") == "CronJob").props["spec"]["suspend"] = False


# Policies about Inference Gateway pools judge the staging stack, whose llama-8b uses one; the
# shared limit store is prod's.
def _events_to_another_picker(rs):
    """The KV-events policy admits another model's picker too: the events are the pool's picker's alone."""
    policy = next(r for r in rs if r.type.endswith("NetworkPolicy") and r.name.endswith("-kv-events"))
    policy.props["spec"]["ingress"][1]["from"].append(
        {"podSelector": {"matchLabels": {"inferencepool": "mistral-7b-epp", "app.kubernetes.io/name": "vllm-gke-epp"}}})


STAGING_CASES = {"inference-pools-served", "tenant-priorities-bound", "scale-to-zero-answered", "kv-events-private"}
PROD_CASES = {"limit-store-mesh-only", "lora-adapters-scoped", "traces-private", "load-tests-on-demand",
              "prod-rollouts-gated", "rollout-gates-hold-slos"}
# Groups across hosts are the frontier stack's.
FRONTIER_CASES = {"group-workers-closed"}


def _group_ports_open_to_all(rs):
    """The group's NetworkPolicy admits anyone on the unmeshed ports (NCCL, Ray)."""
    for r in rs:
        if r.props.get("kind") == "NetworkPolicy" and "-group-group" in r.props["metadata"]["name"]:
            r.props["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]


# No shipped stack uses Hyperdisk ML: its policy judges staging on that backend.
HYPERDISK_CASES = {"hyperdisk-weights-populated"}

def _any_google_identity(rs):
    """dev's tenant admitted as every subject of accounts.google.com, i.e. anyone with a Google token."""
    allow = kind(rs, "AuthorizationPolicy", "allow-dev-team-qwen-7b")
    allow.props["spec"]["rules"][0]["from"] = [{"source": {"requestPrincipals": ["https://accounts.google.com/*"]}}]


def _no_canary(rs):
    rs.remove(kind(rs, "Canary", "llama-70b-short"))


def _loose_ttft_gate(rs):
    for m in kind(rs, "Canary", "llama-8b-short").props["spec"]["analysis"]["metrics"]:
        if m["name"].endswith("-seconds"):
            m["thresholdRange"]["max"] = 5


CASES: dict[str, tuple[Callable, str]] = {
    "inference-pools-served": (_pool_fails_open, "fails open"),
    "tenant-priorities-bound": (_objective_from_the_client, "without requiring the x-llm-d-inference-objective"),
    "limit-store-mesh-only": (_store_open_to_any_source, "other than their mesh identity"),
    "kv-events-private": (_events_to_another_picker, "admit more than its pool's endpoint picker's pods"),
    "lora-adapters-scoped": (_adapter_for_everyone, "every tenant could use every adapter"),
    "scale-to-zero-answered": (_no_standby, "no standby sits behind its Service"),
    "hyperdisk-weights-populated": (_unpopulated_disk, "has no GCPDataSource to fill it"),
    "gpu-node-pools-tainted": (_untaint, "has no nvidia.com/gpu NO_SCHEDULE taint"),
    "mig-partition-valid": (_bad_mig, "'1g.10gb' is not a MIG profile of nvidia-tesla-a100"),
    "weights-read-only": (_writable_weights, "must be mounted readOnly"),
    "tenant-namespaces-authenticated": (_tenant_without_authn, "'tenant-dev-team' has no RequestAuthentication"),
    "external-gateway-authenticated": (_external_gateway_open, "has no deny-all AuthorizationPolicy"),
    "images-pinned": (_latest_image, "'vllm/vllm-openai:latest' is not pinned"),
    "resource-limits": (_no_limits, "has no cpu/memory limit"),
    "no-secret-literals": (_secret_literal, "env HF_TOKEN of container 'vllm' is a literal"),
    "max-tokens-cap": (_no_cap, "has no positive maxTokens cap"),
    "vllm-autoscaled": (_no_autoscaler, "has no KEDA ScaledObject"),
    "external-gateway-https-only": (_http_external_gateway, "has no HTTPS listener"),
    "serving-paths-authenticated": (_open_completions, "is allowed without a JWT"),
    "public-issuers-pinned-to-subjects": (_any_google_identity, "any subject of 'https://accounts.google.com'"),
    "pods-hardened": (_privileged, "allowPrivilegeEscalation is not false"),
    "control-plane-restricted": (_public_control_plane, "public endpoint accepts any source address"),
    "vllm-backends-resilient": (_no_health_check, "without a HealthCheckPolicy"),
    "serving-held-to-slos": (_unrouted_burn_alerts, "has no fast-burn alert"),
    "traces-private": (_every_request_traced, "every request is recorded"),
    "load-tests-on-demand": (_scheduled_load_test, "is a load test on a schedule"),
    "group-workers-closed": (_group_ports_open_to_all, "no NetworkPolicy limits its pods' unmeshed ports"),
    "prod-rollouts-gated": (_no_canary, "no Flagger Canary targets it"),
    "rollout-gates-hold-slos": (_loose_ttft_gate, "looser than the SLO"),
    # The Cloud Run models' (tests/test_cloud_run_policies.py), on staging's.
    **CLOUD_RUN_CASES,
}
STAGING_CASES |= set(CLOUD_RUN_CASES)


def test_a_trace_collector_any_pod_may_write_to_is_caught(plans):
    rs = resources(plans["prod"])
    allow = next(r for r in rs if r.props.get("kind") == "AuthorizationPolicy"
                 and r.props["metadata"]["name"] == "allow-vllm-servers")
    allow.props["spec"]["rules"][0]["from"] = [{"source": {"namespaces": ["vllm"]}}]
    assert any("any pod could write into the platform's traces" in v.message for v in violations_of(rs, "traces-private"))


def test_traces_sent_out_of_the_cluster_are_caught(plans):
    rs = resources(plans["prod"])
    args = kind(rs, "Deployment", "llama-8b-long").props["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--otlp-traces-endpoint") + 1] = "https://collector.example.com/v1/traces"
    assert any("outside the cluster's collector" in v.message for v in violations_of(rs, "traces-private"))


def test_a_burn_rate_over_more_than_a_day_is_caught(plans):
    rs = resources(plans["dev"])
    policy = next(r for r in rs if r.type == "gcp:monitoring/alertPolicy:AlertPolicy"
                  and "select_slo_burn_rate" in str(r.props["conditions"]))
    cond = policy.props["conditions"][0]["conditionThreshold"]
    cond["filter"] = cond["filter"].rsplit('"', 2)[0] + '"259200s")'
    assert any("over a day" in v.message for v in violations_of(rs, "serving-held-to-slos"))


def test_every_policy_has_a_failing_case():
    assert set(CASES) == set(POLICY_NAMES)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_policy_fails_on_a_bad_plan(plans, policy, request):
    plan = request.getfixturevalue("hyperdisk_plan") if policy in HYPERDISK_CASES else \
        plans["staging" if policy in STAGING_CASES else "prod" if policy in PROD_CASES
              else "frontier" if policy in FRONTIER_CASES else "dev"]
    rs = resources(plan)
    assert violations_of(rs, policy) == []
    before = {(v.policy, v.message) for v in evaluate(rs)}  # a shipped stack's advisories (frontier's)
    break_it, message = CASES[policy]
    break_it(rs)
    found = violations_of(rs, policy)
    assert found, policy
    assert any(message in v.message for v in found), [v.message for v in found]
    # breaking one rule trips only that rule, save for rules that judge the same fact
    also = {"no-secret-literals": {"weights-read-only"},
            "external-gateway-authenticated": {"external-gateway-https-only"}}
    others = {v.policy for v in evaluate(rs) if (v.policy, v.message) not in before} - {policy}
    assert others <= also.get(policy, set()), others


def test_downloading_server_is_caught(plans):
    rs = resources(plans["dev"])
    _downloads_weights(rs)
    messages = [v.message for v in violations_of(rs, "weights-read-only")]
    assert any("is not a local path" in m for m in messages)
    assert any("HF_HUB_OFFLINE=1" in m for m in messages)


def test_secret_resources_and_static_kubeconfig_are_caught(plans):
    rs = resources(plans["dev"])
    provider = next(r for r in rs if r.type == "pulumi:providers:kubernetes")
    kc = json.loads(provider.props["kubeconfig"])
    kc["users"][0]["user"] = {"token": "ya29.abc"}
    provider.props["kubeconfig"] = json.dumps(kc)
    rs.append(Resource("gcp:secretmanager/secretVersion:SecretVersion", "hf", {"secretData": "hf_abc"}))
    messages = [v.message for v in violations_of(rs, "no-secret-literals")]
    assert any("static credential" in m for m in messages)
    assert any("puts the secret's value in Pulumi state" in m for m in messages)


def test_unauthenticated_allow_is_found_by_evaluating_the_mesh(prod_by_hand):
    rs = resources(prod_by_hand)
    policy = kind(rs, "AuthorizationPolicy", "allow-search-llama-8b")
    del policy.props["spec"]["rules"][0]["from"]
    messages = [v.message for v in violations_of(rs, "serving-paths-authenticated")]
    assert messages and all("llama-8b" in m for m in messages)
    # Found at the path the Gateway forwards (/<model>/v1/..., no rewrite), which is what it opened.
    assert any("/llama-8b/v1/completions from " in m and "without a JWT" in m for m in messages)


def test_tenant_route_on_the_http_listener_of_an_external_gateway(prod_by_hand):
    rs = resources(prod_by_hand)
    route = kind(rs, "HTTPRoute", "llama-8b")
    route.props["spec"]["parentRefs"][0]["sectionName"] = "http"
    messages = [v.message for v in violations_of(rs, "external-gateway-https-only")]
    assert any("through a plain HTTP listener" in m for m in messages)
    gw = kind(rs, "Gateway")
    gw.props["spec"]["listeners"][1]["allowedRoutes"] = {"namespaces": {"from": "All"}}
    assert any("admits routes from 'All'" in v.message for v in violations_of(rs, "external-gateway-https-only"))


def test_scaled_objects_without_keda_or_custom_metric_hpas_are_flagged(plans):
    rs = resources(plans["dev"])
    rs[:] = [r for r in rs if not (r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "keda")]
    (v,) = violations_of(rs, "vllm-autoscaled")
    assert "no KEDA chart is installed" in v.message
    rs = resources(plans["dev"])
    rs.append(Resource("kubernetes:autoscaling/v2:HorizontalPodAutoscaler", "hpa", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "qwen-7b-short", "namespace": "vllm"},
        "spec": {"scaleTargetRef": {"name": "qwen-7b-short"}, "metrics": [{"type": "Pods"}]}}))
    (v,) = violations_of(rs, "vllm-autoscaled")
    assert "no custom.metrics.k8s.io API" in v.message


def test_enforcement_levels_are_configurable(plans):
    rs = resources(plans["dev"])
    _no_autoscaler(rs)
    assert {v.level for v in evaluate(rs)} == {"advisory"}
    assert {v.level for v in evaluate(rs, {"vllm-autoscaled": "mandatory"})} == {"mandatory"}
    assert {v.level for v in evaluate(rs, {"all": "mandatory"})} == {"mandatory"}
    assert evaluate(rs, {"vllm-autoscaled": {"enforcementLevel": "disabled"}}) == []
    levels = resolve_levels({"all": "advisory", "images-pinned": "mandatory"})
    assert levels["images-pinned"] == "mandatory" and levels["resource-limits"] == "advisory"


@pytest.mark.parametrize("config,message", [
    ({"no-such-policy": "mandatory"}, "unknown policies in policy config: no-such-policy"),
    ({"images-pinned": "strict"}, "enforcement level 'strict' is not one of advisory, mandatory, disabled"),
])
def test_bad_policy_config(config, message):
    with pytest.raises(ValueError, match=message):
        resolve_levels(config)


def test_policies_have_descriptions_and_defaults():
    for p in POLICIES:
        assert p.description.endswith(".") and p.level in ("advisory", "mandatory")


def test_draining_shorter_than_a_request_is_flagged(prod_by_hand):
    rs = resources(prod_by_hand)
    policy = kind(rs, "GCPBackendPolicy", "qwen-7b-short", "vllm")
    policy.props["spec"]["default"]["connectionDraining"] = {"drainingTimeoutSec": 30}
    (v,) = violations_of(rs, "vllm-backends-resilient")
    assert "drains a detached endpoint for 30 s but lets a request run 600 s" in v.message


def test_a_gateway_backend_without_a_health_check_is_flagged(prod_by_hand):
    rs = resources(prod_by_hand)
    assert violations_of(rs, "vllm-backends-resilient") == []
    rs[:] = [r for r in rs if not (r.props.get("kind") == "HealthCheckPolicy"
                                   and r.props["spec"]["targetRef"]["name"] == "llama-8b-canary-short")]
    (v,) = violations_of(rs, "vllm-backends-resilient")
    assert "llama-8b-canary-short is a Gateway backend without a HealthCheckPolicy" in v.message


def test_inference_pool_needs_its_picker_health_check_and_a_proxy_only_subnet(plans):
    rs = resources(plans["staging"])
    rs.remove(kind(rs, "Deployment", "llama-8b-router-epp"))
    rs.remove(kind(rs, "HealthCheckPolicy", "llama-8b"))
    rs[:] = [r for r in rs if r.props.get("purpose") != "REGIONAL_MANAGED_PROXY"]
    messages = [v.message for v in violations_of(rs, "inference-pools-served")]
    assert any("no Deployment runs behind its endpoint picker Service 'llama-8b-epp'" in m for m in messages)
    assert any("has no HealthCheckPolicy" in m for m in messages)
    assert any("needs a proxy-only subnet" in m for m in messages)


def test_inference_pool_behind_a_global_gateway_is_caught(plans):
    rs = resources(plans["staging"])
    kind(rs, "Gateway").props["spec"]["gatewayClassName"] = "gke-l7-global-external-managed"
    messages = [v.message for v in violations_of(rs, "inference-pools-served")]
    assert any("only regional classes serve pools" in m for m in messages)


def test_an_objective_two_tenants_may_use_is_caught_by_evaluating_the_mesh(plans):
    """Without the objective condition in the mesh, support's token passes under search's
    objective by calling search's path (never shed, where support's own priority is -1)."""
    rs = resources(plans["staging"])
    del kind(rs, "AuthorizationPolicy", "allow-support-llama-8b").props["spec"]["rules"][0]["when"]
    messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
    assert any("objective 'search.llama-8b' admits the tokens of 2 issuers" in m for m in messages), messages


# One release: the move from bf329cd's routes (issue 39); drop next release.
def test_a_compat_match_passes_only_on_a_header_the_extension_strips(plans):
    """The picker routes' second match (bf329cd's client-sent x-gateway-inference-objective) is accepted
    only because the identity extension strips that header: on a header it keeps, or once it no longer
    strips that one, a client would choose its own priority and the route is refused."""
    def legacy_matches(rs):
        return [m for rule in kind(rs, "HTTPRoute", "llama-8b.support").props["spec"]["rules"]
                for m in rule["matches"] for h in m["headers"] if h["name"] == "x-gateway-inference-objective"]

    rs = resources(plans["staging"])
    assert legacy_matches(rs) and violations_of(rs, "tenant-priorities-bound") == []
    for m in legacy_matches(rs):
        for h in m["headers"]:
            if h["name"] == "x-gateway-inference-objective":
                h["name"] = "x-legacy-objective"  # not in the extension's strip list
    messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
    assert any("llama-8b.support" in m and "without requiring the x-llm-d-inference-objective" in m
               for m in messages), messages
    rs = resources(plans["staging"])
    for cm in (r for r in rs if r.props.get("kind") == "ConfigMap" and "identity.json" in r.props.get("data", {})):
        config = json.loads(cm.props["data"]["identity.json"])
        config["headers"]["strip"].remove("x-gateway-inference-objective")
        cm.props["data"]["identity.json"] = json.dumps(config)
    messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
    assert any("without requiring the x-llm-d-inference-objective" in m for m in messages), messages


def test_route_passing_picker_control_headers_is_caught(plans):
    """The picker's routes match on headers only the identity extension may set: without the
    extension, with one that fails open, runs on some requests only, or keeps a client's copy of
    a control header, a client could choose its own priority; a route may never strip or match
    what the picker itself sets."""
    rs = resources(plans["staging"])
    route = kind(rs, "HTTPRoute", "llama-8b.support")
    for rule in route.props["spec"]["rules"]:
        rule["filters"][0]["requestHeaderModifier"]["remove"].append("x-gateway-destination-endpoint")
    messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
    assert any("strips x-gateway-destination-endpoint, which the picker sets" in m for m in messages)

    def caught(change, expected):
        rs = resources(plans["staging"])
        change(rs)
        messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
        assert any("on headers a client could send" in m and expected in m for m in messages), messages

    def ext(rs):
        return kind(rs, "GCPRoutingExtension").props["spec"]

    def config(rs):
        return next(r for r in rs if r.type == "kubernetes:core/v1:ConfigMap" and "identity.json" in r.props.get("data", {}))

    caught(lambda rs: rs.remove(kind(rs, "GCPRoutingExtension")), "no GCPRoutingExtension")
    caught(lambda rs: ext(rs)["extensionChains"][0]["extensions"][0].update(failOpen=True), "fails open")
    caught(lambda rs: ext(rs)["extensionChains"][-1].update(matchCondition={"celExpressions": [
        {"celMatcher": "request.path.startsWith('/support')"}]}), "some requests only")
    caught(lambda rs: ext(rs)["extensionChains"][-1]["extensions"][0].update(failOpen=True), "fails open")

    def keep_rewrite(rs):
        data = json.loads(config(rs).props["data"]["identity.json"])
        data["headers"]["strip"].remove("x-gateway-model-name-rewrite")
        config(rs).props["data"]["identity.json"] = json.dumps(data)
    caught(keep_rewrite, "keeps the client's x-gateway-model-name-rewrite")


def test_route_objective_without_an_inference_objective_is_caught(plans):
    rs = resources(plans["staging"])
    rs.remove(kind(rs, "InferenceObjective", "support.llama-8b"))
    messages = [v.message for v in violations_of(rs, "tenant-priorities-bound")]
    assert any("no InferenceObjective of that name exists" in m for m in messages)


def test_policy_pack_header_names_match_the_components():
    from vllm_gke.components.model.serving_api import (
        FAIRNESS_HEADER,
        OBJECTIVE_HEADER,
        PICKER_SETS,
        REFUSED_AT_THE_PICKER,
        TENANT_HEADER,
    )
    from vllm_gke.policies import inference_gateway, rules

    assert (rules.OBJECTIVE_HEADER, rules.PICKER_SETS, rules.REFUSED_AT_THE_PICKER) == (
        OBJECTIVE_HEADER, PICKER_SETS, REFUSED_AT_THE_PICKER)
    assert (inference_gateway.FAIRNESS_HEADER, inference_gateway.TENANT_HEADER) == (FAIRNESS_HEADER, TENANT_HEADER)


def test_limit_store_without_strict_mtls_is_caught(plans):
    rs = resources(plans["prod"])
    (pa,) = [r for r in rs if r.props.get("kind") == "PeerAuthentication"
             and r.props["metadata"]["namespace"] == "vllm-gke-limits"]
    pa.props["spec"]["mtls"]["mode"] = "PERMISSIVE"
    messages = [v.message for v in violations_of(rs, "limit-store-mesh-only")]
    assert any("no STRICT PeerAuthentication in 'vllm-gke-limits'" in m for m in messages)


def test_adapter_fetched_from_outside_the_share_is_caught(plans):
    rs = resources(plans["prod"])
    args = kind(rs, "Deployment", "llama-8b-long").props["spec"]["template"]["spec"]["containers"][0]["args"]
    i = args.index("--lora-modules")
    args[i + 1] = "support-sql=acme-ml/llama-3.1-8b-support-sql-lora"
    messages = [v.message for v in violations_of(rs, "lora-adapters-scoped")]
    assert any("'support-sql=acme-ml/llama-3.1-8b-support-sql-lora' is not on a read-only mount" in m for m in messages)


def test_scaled_object_without_a_wake_trigger_is_caught(plans):
    rs = resources(plans["staging"])
    so = kind(rs, "ScaledObject", "mistral-7b-long")
    so.props["spec"]["triggers"] = so.props["spec"]["triggers"][1:]
    messages = [v.message for v in violations_of(rs, "scale-to-zero-answered")]
    assert any("nothing wakes the pool" in m for m in messages)


def test_hyperdisk_claims_need_read_only_their_own_identity_and_transfer_nodes(hyperdisk_plan):
    rs = resources(hyperdisk_plan)
    claim = next(r for r in rs if r.props.get("kind") == "PersistentVolumeClaim")
    claim.props["spec"]["accessModes"] = ["ReadWriteOnce"]
    source = next(r for r in rs if r.props.get("kind") == "GCPDataSource")
    source.props["spec"]["cloudStorage"]["serviceAccountName"] = "default"
    storage_class = kind(rs, "StorageClass")
    storage_class.props["volumeBindingMode"] = "WaitForFirstConsumer"
    rs.remove(next(r for r in rs if r.type == "gcp:container/nodePool:NodePool" and r.props["name"] == "hdml-transfer"))
    messages = [v.message for v in violations_of(rs, "hyperdisk-weights-populated")]
    for words in ("is not ReadOnlyMany", "default service account", "bind Immediate", "no such node pool"):
        assert any(words in m for m in messages), (words, messages)


def test_serving_without_slos_or_slow_burns_is_caught(plans):
    rs = resources(plans["dev"])
    no_slow = [r for r in rs if not (r.type == "gcp:monitoring/alertPolicy:AlertPolicy"
                                     and "slow burn" in r.props.get("displayName", "")
                                     or "sustained burn" in r.props.get("displayName", ""))]
    messages = [v.message for v in violations_of(no_slow, "serving-held-to-slos")]
    assert messages and all("has no slow-burn alert" in m for m in messages)
    bare = [r for r in rs if r.type != "gcp:monitoring/slo:Slo"]
    (v,) = violations_of(bare, "serving-held-to-slos")
    assert "declares no SLO" in v.message and "monitoring.slos.enabled" in v.message


def _tpu_leader(rs):
    lws = kind(rs, "LeaderWorkerSet", "llama-70b-tpu-short-group")
    return lws.props["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]


def test_root_is_allowed_to_tpu_containers_alone(plans):
    """frontier's TPU servers run as root, never privileged, with no capabilities, no escalation and a
    read-only root filesystem; the same settings on a GPU server, privileged on a TPU one, or the
    node's XLA cache in a GPU pod are refused."""
    rs = resources(plans["frontier"])
    for pod in (_tpu_leader(rs), kind(rs, "Deployment", "llama-8b-tpu-short").props["spec"]["template"]["spec"]):
        sc = pod["containers"][0]["securityContext"]
        assert sc["runAsUser"] == 0 and not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert violations_of(rs, "pods-hardened") == []
    gpu = kind(rs, "LeaderWorkerSet", "llama-405b-short-group").props["spec"]["leaderWorkerTemplate"]
    gpu_pod = gpu["leaderTemplate"]["spec"]
    gpu_pod["containers"][0]["securityContext"] = dict(_tpu_leader(rs)["containers"][0]["securityContext"])
    assert any("may run as root" in v.message for v in violations_of(rs, "pods-hardened"))

    rs = resources(plans["frontier"])
    _tpu_leader(rs)["containers"][0]["securityContext"]["privileged"] = True
    assert any("privileged" in v.message for v in violations_of(rs, "pods-hardened"))

    rs = resources(plans["frontier"])
    gpu_pod = kind(rs, "LeaderWorkerSet", "llama-405b-short-group").props["spec"]["leaderWorkerTemplate"][
        "leaderTemplate"]["spec"]
    cache = next(v for v in _tpu_leader(rs)["volumes"] if "hostPath" in v)
    gpu_pod["volumes"].append(dict(cache))
    gpu_pod["containers"][0]["volumeMounts"].append({"name": cache["name"], "mountPath": "/var/cache/x"})
    assert any("only TPU containers may mount a node directory" in v.message for v in violations_of(rs, "pods-hardened"))

    rs = resources(plans["frontier"])
    next(v for v in _tpu_leader(rs)["volumes"] if "hostPath" in v)["hostPath"]["path"] = "/var/lib/kubelet"
    assert any("/var/lib/kubelet" in v.message for v in violations_of(rs, "pods-hardened"))


@pytest.mark.parametrize("zero", ["0", 0, "0m", "0.0"])
def test_a_tpu_limit_of_zero_holds_no_chip(plans, zero):
    """google.com/tpu: "0" is a quantity of no chips: such a container earns neither root nor the node's
    XLA cache."""
    rs = resources(plans["frontier"])
    leader = _tpu_leader(rs)["containers"][0]
    leader["resources"]["limits"]["google.com/tpu"] = zero
    leader["resources"].get("requests", {}).pop("google.com/tpu", None)
    messages = [v.message for v in violations_of(rs, "pods-hardened")]
    assert any("may run as root" in m for m in messages)
    assert any("only TPU containers may mount a node directory" in m for m in messages)


@pytest.mark.parametrize("path", [
    "/var/lib/vllm-gke/xla-cache",  # the root: every pool's executables
    "/var/lib/vllm-gke/xla-cache/vllm",  # the namespace's: every pool's of it
    "/var/lib/vllm-gke/xla-cache/tenant-research/llama-70b-tpu-short",  # another namespace's
    "/var/lib/vllm-gke/xla-cache/vllm/../../kubelet",
    "/var/lib/vllm-gke/xla-cache/vllm/llama-70b-tpu-short/more",
])
def test_a_tpu_pod_mounts_only_its_own_pools_xla_cache(plans, path):
    """One node directory per namespace and serving pool: a TPU pod (root in its container) mounting a
    wider or another namespace's directory could plant executables another tenant's replica loads."""
    rs = resources(plans["frontier"])
    cache = next(v for v in _tpu_leader(rs)["volumes"] if "hostPath" in v)
    assert cache["hostPath"]["path"] == "/var/lib/vllm-gke/xla-cache/vllm/llama-70b-tpu-short"
    cache["hostPath"]["path"] = path
    (v,) = violations_of(rs, "pods-hardened")
    assert "llama-70b-tpu-short-group" in v.message and "in the pod's namespace (vllm)" in v.message
