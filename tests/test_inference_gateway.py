"""routing: inference-gateway - an InferencePool per model, its endpoint picker, per-tenant
objectives bound to the tenant's token by the route, the mesh and the guard."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import STACKS, manifests_of
from vllm_gke.components.inference_objective_crd import CRD_URL
from vllm_gke.components.model.gateway_routes import at_most_regex
from vllm_gke.components.model.gcp_apis import required_apis
from vllm_gke.components.model.picker import EPP_IMAGE
from vllm_gke.components.model.serving_api import (
    OBJECTIVE_HEADER,
    PICKER_PATHS,
    PICKER_REENCODING_GROWTH,
    PICKER_SETS,
    REFUSED_AT_THE_PICKER,
    picker_max_body_bytes,
)
from vllm_gke.components.model.tenant_urls import tenant_urls, url_notes
from vllm_gke.policies.mesh_authz import Request, decide
from vllm_gke.policies.route_match import HttpRequest, reach

SEARCH = "https://auth.acme.example/search"
SUPPORT = "https://auth.acme.example/support"


def one(plan, kind, name):
    (found,) = [d for d in manifests_of(plan, kind) if d["metadata"]["name"] == name]
    return found


def test_one_pool_per_model_selected_by_the_inference_pool(plans):
    plan = plans["staging"]
    names = {d["metadata"]["name"] for d in manifests_of(plan, "Deployment")}
    assert "llama-8b-short" in names and "llama-8b-long" not in names
    assert {"mistral-7b-short", "mistral-7b-long"} <= names  # length routing is untouched
    pool = one(plan, "InferencePool", "llama-8b")
    assert pool["metadata"]["namespace"] == "vllm"
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "llama-8b-epp", "port": {"number": 9002},
                                                 "failureMode": "FailClose"}
    labels = one(plan, "Deployment", "llama-8b-short")["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    # ...and nothing else: not mistral's pods, not another pool's.
    for d in manifests_of(plan, "Deployment"):
        if d["metadata"]["name"] != "llama-8b-short":
            assert not selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_endpoint_picker_runs_the_pinned_upstream_picker_outside_the_mesh(plans):
    plan = plans["staging"]
    epp = one(plan, "Deployment", "llama-8b-epp")
    pod = epp["spec"]["template"]
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    (c,) = pod["spec"]["containers"]
    assert c["image"] == EPP_IMAGE.uri == "registry.k8s.io/gateway-api-inference-extension/epp:v1.2.0"
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == "llama-8b"
    assert args[args.index("--pool-namespace") + 1] == "vllm"
    service = one(plan, "Service", "llama-8b-epp")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9090}


def test_pulumi_waits_for_the_pickers_leader_not_every_replica(plans):
    """Only the leader is ready (health.go:65-67): Pulumi's default wait for every replica of a
    Deployment would never end on the first `pulumi up`. Its RBAC comes first."""
    plan = plans["staging"]
    epp = plan.kube("Deployment", "llama-8b-epp")
    assert epp.props["metadata"]["annotations"]["pulumi.com/waitFor"] == "jsonpath={.status.readyReplicas}=1"
    # waitFor replaces the built-in Deployment await from pulumi-kubernetes 4.18.4 (#3329) on.
    from tests.conftest import REPO_ROOT

    assert '"pulumi-kubernetes>=4.18.4,<5"' in (REPO_ROOT / "pyproject.toml").read_text()
    # ...and not for its Service to have no unready address: the standby replica always is one.
    assert plan.kube("Service", "llama-8b-epp").props["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert plan.waits_for(epp, plan.kube("RoleBinding", "llama-8b-epp"))


def test_picker_is_highly_available_without_pprof_and_reads_the_releases_metrics(plans):
    """Upstream's HA path (leader election: one ready leader, standbys that take over in seconds),
    no pprof beside unauthenticated /metrics, config changes roll it, and the metric names it
    scrapes are the ones the pinned vLLM exports (v1.2.0's default KV gauge is gone from 0.34)."""
    from vllm_gke.components.model.vllm_argv import load_snapshot
    from vllm_gke.components.model.vllm_versions import release

    plan = plans["staging"]
    epp = one(plan, "Deployment", "llama-8b-epp")
    assert epp["spec"]["replicas"] >= 2
    assert epp["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    pod = epp["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert "--ha-enable-leader-election" in args and "--enable-pprof=false" in args
    assert (c["readinessProbe"]["grpc"]["service"], c["livenessProbe"]["grpc"]["service"]) == ("readiness", "liveness")
    rel = release(plan.config.vllm_version)
    exported = {m["name"] for m in load_snapshot(rel.version)["metrics"]}
    for flag in ("--total-queued-requests-metric", "--kv-cache-usage-percentage-metric", "--lora-info-metric",
                 "--cache-info-metric"):
        assert args[args.index(flag) + 1] in exported, flag
    assert args[args.index("--kv-cache-usage-percentage-metric") + 1] == "vllm:kv_cache_usage_perc"
    digest = pod["metadata"]["annotations"]["vllm-gke.io/config-sha256"]
    config = one(plan, "ConfigMap", "llama-8b-epp")["data"]["default-plugins.yaml"]
    import hashlib
    assert digest == hashlib.sha256(config.encode()).hexdigest()[:16]


def test_picker_survives_rollouts_and_drains_with_one_ready_pod(plans):
    """Only the leader is Ready (health.go:65-67). A rollout must be free to stop the old leader, its
    one available pod (maxUnavailable 100%: with less the Deployment never scales it down and a new
    pod never gets the lease); the two never share a node, so one drain or node failure cannot take
    both under FailClose; and no budget: counting one Ready pod, any budget allows no eviction of the
    leader and would hold its node's drain for GKE's hour."""
    from vllm_gke.components.model.picker import SHUTDOWN_S

    plan = plans["staging"]
    epp = one(plan, "Deployment", "llama-8b-epp")
    assert epp["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}}
    pod = epp["spec"]["template"]
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["maxSkew"], spread["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname", 1, "DoNotSchedule")
    # A one-node domain satisfies maxSkew 1 with both on it: the system pool may shrink to one node.
    assert spread["minDomains"] == 2
    assert spread["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # Per revision, among nodes it tolerates (GPU/TPU nodes are tainted: they would be empty domains).
    assert spread["matchLabelKeys"] == ["pod-template-hash"] and spread["nodeTaintsPolicy"] == "Honor"
    # One Ready pod of two: minAvailable 1 and maxUnavailable 1 alike allow 0 disruptions.
    assert not [b for b in manifests_of(plan, "PodDisruptionBudget")
                if b["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()]
    # Stops within controller-runtime's 30 s and then releases the lease: a little more, not 130 s.
    assert SHUTDOWN_S < pod["spec"]["terminationGracePeriodSeconds"] <= SHUTDOWN_S + 30


def test_only_the_load_balancer_reaches_the_picker(plans):
    plan = plans["staging"]
    (netpol,) = [n for n in manifests_of(plan, "NetworkPolicy") if n["metadata"]["name"] == "llama-8b-epp"]
    spec = netpol["spec"]
    assert spec["podSelector"]["matchLabels"] == {"inferencepool": "llama-8b-epp"}
    ext_proc, metrics = spec["ingress"]
    assert {b["ipBlock"]["cidr"] for b in ext_proc["from"]} == {
        plan.config.cluster.proxy_only_cidr, "35.191.0.0/16", "130.211.0.0/22"}
    assert {p["port"] for p in ext_proc["ports"]} == {9002, 9003}
    assert {p["port"] for p in metrics["ports"]} == {9090} and all(metrics["from"])
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    assert cluster.props["datapathProvider"] == "ADVANCED_DATAPATH"  # Dataplane V2 enforces it


def test_picker_scores_queue_kv_cache_and_prefix_cache(plans):
    config = one(plans["staging"], "ConfigMap", "llama-8b-epp")
    picker = yaml.safe_load(config["data"]["default-plugins.yaml"])
    assert picker["kind"] == "EndpointPickerConfig"
    (profile,) = picker["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}
    assert {p["type"] for p in picker["plugins"]} == set(weights)


def test_picker_may_only_read_its_namespace(plans):
    plan = plans["staging"]
    role = one(plan, "Role", "llama-8b-epp")
    assert role["metadata"]["namespace"] == "vllm"
    verbs = {r: set(rule["verbs"]) for rule in role["rules"] for r in rule["resources"]}
    assert {r: v for r, v in verbs.items() if r not in ("leases", "events")} == {
        r: {"get", "watch", "list"} for r in ("inferenceobjectives", "inferencepools", "pods")}
    # ...and write only what leader election needs, in its own namespace.
    assert verbs["events"] == {"create", "patch"} and "create" in verbs["leases"]
    binding = one(plan, "RoleBinding", "llama-8b-epp")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-8b-epp", "namespace": "vllm"}]
    assert not [d for d in manifests_of(plan, "ClusterRoleBinding") if "epp" in d["metadata"]["name"]]


def test_each_tenant_gets_an_objective_with_its_priority(plans):
    objectives = {d["metadata"]["name"]: d["spec"] for d in manifests_of(plans["staging"], "InferenceObjective")}
    ref = {"name": "llama-8b", "group": "inference.networking.k8s.io"}
    assert objectives == {"search.llama-8b": {"poolRef": ref, "priority": 0},
                          "support.llama-8b": {"poolRef": ref, "priority": -1}}


def test_load_balancer_policies_target_the_pool(plans):
    plan = plans["staging"]
    target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-8b"}
    hc = [d for d in manifests_of(plan, "HealthCheckPolicy") if d["spec"]["targetRef"] == target]
    bp = [d for d in manifests_of(plan, "GCPBackendPolicy") if d["spec"]["targetRef"] == target]
    assert len(hc) == 1 and hc[0]["spec"]["default"]["config"]["httpHealthCheck"]["requestPath"] == "/health"
    assert len(bp) == 1 and bp[0]["spec"]["default"]["timeoutSec"] == 600
    # No Service of llama-8b is a Gateway backend any more, so none has its own policies.
    assert not [d for d in manifests_of(plan, "HealthCheckPolicy") if d["spec"]["targetRef"]["name"].startswith("llama")
                and d["spec"]["targetRef"]["kind"] == "Service"]


def test_tenant_routes_require_the_tenants_own_objective_and_set_it(plans):
    plan = plans["staging"]
    for tenant in ("search", "support"):
        route = one(plan, "HTTPRoute", f"llama-8b.{tenant}")
        to_pool = [r for r in route["spec"]["rules"] if r.get("backendRefs")]
        assert {m["path"]["value"] for r in to_pool for m in r["matches"]} == {
            f"/{tenant}/llama-8b{p}" for p in PICKER_PATHS}
        for rule in to_pool:
            assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                            "name": "llama-8b"}]
            (match,) = rule["matches"]
            assert {"type": "Exact", "name": OBJECTIVE_HEADER, "value": f"{tenant}.llama-8b"} in match["headers"]
            (mod,) = [f["requestHeaderModifier"] for f in rule["filters"] if f["type"] == "RequestHeaderModifier"]
            assert {h["name"]: h["value"] for h in mod["set"]} == {
                OBJECTIVE_HEADER: f"{tenant}.llama-8b", "x-gateway-inference-fairness-id": tenant}
            assert {"x-vllm-gke-issuer", *REFUSED_AT_THE_PICKER} <= set(mod["remove"])
            # ...but never what the picker sets: route filters may run after it (envoy#15012).
            assert not set(PICKER_SETS) & set(mod["remove"])
            assert not [h for h in match["headers"] if h["name"] in PICKER_SETS]
    # The shared /llama-8b/v1 route is gone: a tenant-less path could not carry a priority.
    assert not [d for d in manifests_of(plan, "HTTPRoute") if d["metadata"]["name"] == "llama-8b"]


def _reach(plan, path, method="POST", headers=None):
    return reach(manifests_of(plan, "HTTPRoute"), HttpRequest(path, method, headers or {}), listener="https")


def test_the_picker_sees_only_the_tenants_own_objective_whatever_the_filter_order(plans):
    """Route-level header changes may reach Envoy's ext_proc filter after the picker has read the
    request (envoy#15012): so only a request that already carries the tenant's own objective is
    routed to the pool, and one with another control header goes nowhere near it."""
    plan = plans["staging"]
    body = {"content-length": "512"}
    own = {OBJECTIVE_HEADER: "support.llama-8b", **body}
    path = "/support/llama-8b/v1/chat/completions"
    reached = _reach(plan, path, headers=own)
    assert reached.backends[0]["kind"] == "InferencePool"
    assert _reach(plan, path, headers={OBJECTIVE_HEADER: "search.llama-8b", **body}) is None  # search's priority
    assert _reach(plan, path, headers=body) is None  # no objective: the picker would give priority 0
    for header in REFUSED_AT_THE_PICKER:
        refused = _reach(plan, path, headers={**own, header: "other-model"})
        assert not refused.backends and refused.redirect["statusCode"] == 302, header
    # The picker's own answer (x-gateway-destination-endpoint, with ClearRouteCache): should the
    # load balancer match the route again, the request still reaches the pool.
    assert _reach(plan, path, headers={**own, "x-gateway-destination-endpoint": "10.0.0.1:8000"}).backends
    assert _reach(plan, "/support/llama-8b/v1/models", "GET", {OBJECTIVE_HEADER: "support.llama-8b"}).backends


def test_the_picker_gets_only_what_it_parses_and_bounded_bodies(plans):
    """The v1.2.0 picker buffers a whole body and answers 400 to anything but a chat or a
    single-prompt completion: other routes, chunked bodies and bodies over the limit are not routed."""
    plan = plans["staging"]
    own = {OBJECTIVE_HEADER: "search.llama-8b"}
    limit = picker_max_body_bytes(plan.config.model("llama-8b"))
    assert limit == max(1 << 20, 16384 * 16)
    base = "/search/llama-8b/v1"
    assert _reach(plan, f"{base}/completions", headers={**own, "content-length": str(limit)}).backends
    assert _reach(plan, f"{base}/completions", headers={**own, "content-length": str(limit + 1)}) is None
    assert _reach(plan, f"{base}/completions", headers=own) is None  # chunked: no Content-Length
    for other in ("/embeddings", "/responses", "/chat/completions/batch", "/messages", "/chat/completions/render"):
        assert _reach(plan, f"{base}{other}", headers={**own, "content-length": "10"}) is None, other
    guard = json.loads({e["name"]: e.get("value") for e in one(plan, "Deployment", "llama-8b-short")["spec"][
        "template"]["spec"]["containers"][0]["env"]}["GKE_LLM_GUARD_CONFIG"])
    assert set(guard["routes"]) == set(PICKER_PATHS)
    assert guard["maxBodyBytes"] == PICKER_REENCODING_GROWTH * limit  # the picker re-encodes (<>& grow 6x)


@given(limit=st.integers(0, 10**9), value=st.integers(0, 10**10))
def test_at_most_regex_matches_exactly_the_values_up_to_the_limit(limit, value):
    assert bool(re.fullmatch(at_most_regex(limit), str(value))) == (value <= limit)
    assert not re.fullmatch(at_most_regex(limit), "0" + str(value))


def test_mesh_admits_a_token_only_under_its_own_tenants_objective(plans):
    plan = plans["staging"]
    docs = plan.manifests()
    labels = one(plan, "Deployment", "llama-8b-short")["spec"]["template"]["metadata"]["labels"]

    def call(issuer, objective, tenant=None):
        # The sidecar sees the path as the client sent it: /<tenant>/llama-8b/v1/... (no rewrite).
        tenant = tenant or (objective or "search.").split(".")[0]
        headers = {OBJECTIVE_HEADER: objective} if objective else {}
        return decide(docs, Request("vllm", f"/{tenant}/llama-8b/v1/chat/completions", "POST", labels,
                                    token=(issuer, "u"), headers=headers)).status

    assert call(SEARCH, "search.llama-8b") == 200
    assert call(SUPPORT, "support.llama-8b") == 200
    assert call(SUPPORT, "search.llama-8b") == 403  # support on search's path: search's priority refused
    assert call(SEARCH, "support.llama-8b") == 403
    assert call(SEARCH, None) == 403  # around the load balancer, from inside the cluster
    # Each tenant only under its own prefix, even with its own objective; never unprefixed.
    assert call(SUPPORT, "support.llama-8b", tenant="search") == 403
    assert call(SEARCH, "search.llama-8b", tenant="support") == 403
    assert decide(docs, Request("vllm", "/v1/chat/completions", "POST", labels, token=(SEARCH, "u"),
                                headers={OBJECTIVE_HEADER: "search.llama-8b"})).status == 403


def test_guard_in_the_pool_knows_each_tenants_objective(plans):
    c = one(plans["staging"], "Deployment", "llama-8b-short")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    cfg = json.loads(env["GKE_LLM_GUARD_CONFIG"])
    assert cfg["objectiveHeader"] == OBJECTIVE_HEADER
    assert {i: e["objective"] for i, e in cfg["issuers"].items()} == {SEARCH: "search.llama-8b",
                                                                       SUPPORT: "support.llama-8b"}
    mistral = one(plans["staging"], "Deployment", "mistral-7b-short")["spec"]["template"]["spec"]["containers"][0]
    assert "objectiveHeader" not in json.loads({e["name"]: e.get("value") for e in mistral["env"]}["GKE_LLM_GUARD_CONFIG"])


def test_picker_needs_network_services_and_the_objective_crd_first(plans):
    plan = plans["staging"]
    assert "networkservices.googleapis.com" in required_apis(plan.config)
    assert "networkservices.googleapis.com" not in required_apis(plans["dev"].config)
    crd = plan.named("kubernetes:yaml/v2:ConfigFile", "inference-objective-crd-crd")
    assert crd.props["file"] == CRD_URL and "/v1.2.0/" in CRD_URL  # the release the picker image is
    api = plan.named("gcp:projects/service:Service", "apis-networkservices")
    for kind in ("InferencePool", "InferenceObjective"):
        for r in plan.kubernetes():
            if r.props.get("kind") == kind:
                assert plan.waits_for(r, crd) and plan.waits_for(r, api), r.name
    assert not [r for r in plans["dev"].resources if r.type == "kubernetes:yaml/v2:ConfigFile"]


def test_cluster_floor_version_reaches_gke(plans):
    (cluster,) = [r.props for r in plans["staging"].resources if r.type == "gcp:container/cluster:Cluster"]
    assert cluster["minMasterVersion"] == "1.34"
    (dev,) = [r.props for r in plans["dev"].resources if r.type == "gcp:container/cluster:Cluster"]
    assert "minMasterVersion" not in dev


@pytest.mark.parametrize("stack", STACKS)
def test_every_tenant_url_the_plan_prints_is_a_declared_route(plans, stack):
    """The plan's tenant URLs come from the same path function as the routes: each one is the
    prefix of an HTTPRoute in the namespace that serves it, and nothing else is routed."""
    from urllib.parse import urlsplit

    from vllm_gke.policies.flagger_objects import flagger_objects

    plan = plans[stack]
    urls = tenant_urls(plan.config)
    # Flagger's routes too, where pools roll out by canary (derived from the Canaries as Flagger writes them)
    routes = manifests_of(plan, "HTTPRoute") + [o for o in flagger_objects(manifests_of(plan, "Canary"), [])
                                                if o["kind"] == "HTTPRoute"]
    declared = {m["path"]["value"] for route in routes
                for rule in route["spec"]["rules"] if rule.get("backendRefs") for m in rule["matches"]}
    paths = {urlsplit(u.url).path for u in urls}
    assert {next(p for p in paths if d == p or d.startswith(p + "/")) for d in declared} == paths
    picked = [u for u in urls if u.via == "endpoint picker"]
    assert all(urlsplit(u.url).path == f"/{u.tenant}/{u.model}/v1" for u in picked)
    # ...and the header the route requires is the one printed.
    for u in picked:
        name, value = u.header.split(": ")
        assert _reach(plan, f"{urlsplit(u.url).path}/models", "GET", {name: value}).backends
    assert bool(picked) == bool(url_notes(plan.config))
