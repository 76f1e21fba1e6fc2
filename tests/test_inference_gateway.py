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
from vllm_gke.components.inference_objective_crd import CRD_URLS, LEGACY_CRD_URL
from vllm_gke.components.model.gateway_routes import at_most_regex
from vllm_gke.components.model.gcp_apis import required_apis
from vllm_gke.components.model.picker import EPP_IMAGE, grace_seconds
from vllm_gke.components.model.serving_api import (
    IDENTITY_STRIPS,
    OBJECTIVE_HEADER,
    PICKER_PATHS,
    PICKER_REENCODING_GROWTH,
    PICKER_SETS,
    REFUSED_AT_THE_PICKER,
    TENANT_HEADER,
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
    epp = one(plan, "Deployment", "llama-8b-router-epp")
    pod = epp["spec"]["template"]
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    (c,) = pod["spec"]["containers"]
    # No digest of it is published (the release workflow tags it): by tag.
    assert c["image"] == EPP_IMAGE.uri == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == "llama-8b"
    assert args[args.index("--pool-namespace") + 1] == "vllm"
    service = one(plan, "Service", "llama-8b-epp")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9090}


def test_pulumi_waits_for_the_pickers_leader_not_every_replica(plans):
    """Only the leader is ready (health.go:82-100): Pulumi's default wait for every replica of a
    Deployment would never end on the first `pulumi up`. Its RBAC comes first."""
    plan = plans["staging"]
    epp = plan.kube("Deployment", "llama-8b-router-epp")
    assert epp.props["metadata"]["annotations"]["pulumi.com/waitFor"] == "jsonpath={.status.readyReplicas}=1"
    # waitFor replaces the built-in Deployment await from pulumi-kubernetes 4.18.4 (#3329) on.
    from tests.conftest import REPO_ROOT

    assert '"pulumi-kubernetes>=4.18.4,<5"' in (REPO_ROOT / "pyproject.toml").read_text()
    # ...and not for its Service to have no unready address: the standby replica always is one.
    assert plan.kube("Service", "llama-8b-epp").props["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert plan.waits_for(epp, plan.kube("RoleBinding", "llama-8b-epp"))


def test_picker_is_highly_available_without_pprof_or_metric_flags_and_drains(plans):
    """Upstream's HA path (leader election: one ready leader, standbys that take over in seconds),
    no pprof beside unauthenticated /metrics, config changes roll it, no metric-name flag (fatal at
    v0.10.0: the extractor's built-in vllm names are what 0.34 exports), and a drain as long as the
    longest stream, within the grace period."""
    from vllm_gke.components.model.vllm_argv import load_snapshot
    from vllm_gke.infra.contracts.picker import METRIC_FLAGS, VLLM_ENGINE_METRICS

    plan = plans["staging"]
    epp = one(plan, "Deployment", "llama-8b-router-epp")
    assert epp["spec"]["replicas"] >= 2
    assert epp["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    pod = epp["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert "--ha-enable-leader-election" in args and "--enable-pprof=false" in args
    assert not set(METRIC_FLAGS) & set(args)
    assert set(VLLM_ENGINE_METRICS) <= {m["name"] for m in load_snapshot(plan.config.vllm_version)["metrics"]}
    assert (c["readinessProbe"]["grpc"]["service"], c["livenessProbe"]["grpc"]["service"]) == ("readiness", "liveness")
    assert args[args.index("--drain-timeout") + 1] == "600s"  # gateway.requestTimeoutSeconds
    digest = pod["metadata"]["annotations"]["vllm-gke.io/config-sha256"]
    config = one(plan, "ConfigMap", "llama-8b-router-epp")["data"]["default-plugins.yaml"]
    assert pod["spec"]["volumes"] == [{"name": "plugins-config", "configMap": {"name": "llama-8b-router-epp"}}]
    import hashlib
    assert digest == hashlib.sha256(config.encode()).hexdigest()[:16]


def test_picker_survives_rollouts_and_drains_with_one_ready_pod(plans):
    """Only the leader is Ready (health.go:82-100). A rollout must be free to stop the old leader, its
    one available pod (maxUnavailable 100%: with less the Deployment never scales it down and a new
    pod never gets the lease); the two never share a node, so one drain or node failure cannot take
    both under FailClose; and no budget: counting one Ready pod, any budget allows no eviction of the
    leader and would hold its node's drain for GKE's hour."""
    plan = plans["staging"]
    epp = one(plan, "Deployment", "llama-8b-router-epp")
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
    # The manager's stop (30 s), the drain (600 s), a stream begun at its end (600 s).
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace_seconds(600) == 1230


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


@pytest.mark.parametrize("stack,model,prefix", [("frontier", "llama-405b", "prefix-cache-scorer"),
                                                 ("staging", "llama-8b", "precise-prefix-scorer")])
def test_picker_scores_queue_kv_cache_and_prefix_cache(plans, stack, model, prefix):
    """The default weights; the prefix scorer approximate (frontier) or on vLLM's KV events (staging's
    prefixCache: precise, a prefix-cache-scorer named for its producer)."""
    config = one(plans[stack], "ConfigMap", f"{model}-router-epp")
    picker = yaml.safe_load(config["data"]["default-plugins.yaml"])
    assert (picker["apiVersion"], picker["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    (profile,) = picker["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, prefix: 3}
    names = {p.get("name", p["type"]): p["type"] for p in picker["plugins"]}
    assert set(weights) <= set(names) and names[prefix] == "prefix-cache-scorer"
    # The Responses and Messages APIs parse; no passthrough: an unknown path stays a 400.
    assert picker["requestHandler"]["parsers"] == [{"pluginRef": "openai-parser"}, {"pluginRef": "anthropic-parser"}]
    assert "passthrough-parser" not in {p["type"] for p in picker["plugins"]}


def test_picker_may_only_read_its_namespace(plans):
    plan = plans["staging"]
    role = one(plan, "Role", "llama-8b-epp")
    assert role["metadata"]["namespace"] == "vllm"
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    read = {"get", "watch", "list"}
    assert {k: v for k, v in verbs.items() if k[1] not in ("leases", "events")} == {
        ("llm-d.ai", "inferenceobjectives"): read, ("llm-d.ai", "inferencemodelrewrites"): read,
        # The v1.2.0 picker's group, while a stack moves (dropped with the old CRD).
        ("inference.networking.x-k8s.io", "inferenceobjectives"): read,
        ("inference.networking.k8s.io", "inferencepools"): read, ("", "pods"): read}
    # ...and write only what leader election needs, in its own namespace.
    assert verbs[("", "events")] == {"create", "patch"} and "create" in verbs[("coordination.k8s.io", "leases")]
    binding = one(plan, "RoleBinding", "llama-8b-epp")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-8b-epp", "namespace": "vllm"}]
    assert not [d for d in manifests_of(plan, "ClusterRoleBinding") if "epp" in d["metadata"]["name"]]


def test_each_tenant_gets_an_objective_with_its_priority(plans):
    docs = manifests_of(plans["staging"], "InferenceObjective")
    assert {d["apiVersion"] for d in docs} == {"llm-d.ai/v1alpha2"}
    objectives = {d["metadata"]["name"]: d["spec"] for d in docs}
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
    # No Service of llama-8b is a Gateway backend any more, so none has its own policies (the picker's
    # Service has its health check: test_picker_config).
    assert not [d for d in manifests_of(plan, "HealthCheckPolicy") if d["spec"]["targetRef"]["name"].startswith("llama")
                and d["spec"]["targetRef"]["kind"] == "Service" and d["spec"]["targetRef"]["name"] != "llama-8b-epp"]


def test_tenant_routes_require_what_the_identity_extension_set(plans):
    plan = plans["staging"]
    for tenant in ("search", "support"):
        route = one(plan, "HTTPRoute", f"llama-8b.{tenant}")
        to_pool = [r for r in route["spec"]["rules"] if r.get("backendRefs")]
        assert to_pool == route["spec"]["rules"]  # no refusing rule: the extension strips client copies
        assert {m["path"]["value"] for r in to_pool for m in r["matches"]} == {
            f"/{tenant}/llama-8b{p}" for p in PICKER_PATHS}
        for rule in to_pool:
            assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                            "name": "llama-8b"}]
            # One release: the move from bf329cd's routes (issue 39); drop next release (then one match).
            (match, compat) = rule["matches"]
            assert compat["path"] == match["path"] and compat["headers"][0] == {
                "type": "Exact", "name": "x-gateway-inference-objective", "value": f"{tenant}.llama-8b"}
            assert {"type": "Exact", "name": OBJECTIVE_HEADER, "value": f"{tenant}.llama-8b"} in match["headers"]
            assert {"type": "Exact", "name": TENANT_HEADER, "value": tenant} in match["headers"]
            (mod,) = [f["requestHeaderModifier"] for f in rule["filters"] if f["type"] == "RequestHeaderModifier"]
            assert "set" not in mod and set(mod["remove"]) == {"x-vllm-gke-issuer", "x-vllm-gke-subject"}
            # ...never what the picker sets: route filters may run after it (envoy#15012).
            assert not set(PICKER_SETS) & set(mod["remove"])
            assert not [h for h in match["headers"] if h["name"] in PICKER_SETS]
    # The shared /llama-8b/v1 route is gone: a tenant-less path could not carry a priority.
    assert not [d for d in manifests_of(plan, "HTTPRoute") if d["metadata"]["name"] == "llama-8b"]


def _reach(plan, path, method="POST", headers=None):
    return reach(manifests_of(plan, "HTTPRoute"), HttpRequest(path, method, headers or {}), listener="https")


def verified(tenant):
    """What the identity extension sets for a request it verified as `tenant`'s (llama-8b)."""
    return {OBJECTIVE_HEADER: f"{tenant}.llama-8b", TENANT_HEADER: tenant}


def test_only_a_request_the_extension_verified_reaches_the_pool(plans):
    """The picker reads the request before route filters apply (envoy#15012): only a request carrying
    what the identity extension set for the path's own tenant reaches the pool. Without it (no
    token: the extension set nothing), with another tenant's objective, or with the objective alone
    (the old client-sent header), the route matches nothing: 404 from the load balancer, no GPU."""
    plan = plans["staging"]
    body = {"content-length": "512"}
    path = "/support/llama-8b/v1/chat/completions"
    assert _reach(plan, path, headers={**verified("support"), **body}).backends[0]["kind"] == "InferencePool"
    for headers in ({}, {OBJECTIVE_HEADER: "support.llama-8b"}, {"x-gateway-inference-objective": "search.llama-8b"},
                    verified("search"), {**verified("support"), TENANT_HEADER: "search"}):
        assert _reach(plan, path, headers={**headers, **body}) is None, headers
    # One release: the move from bf329cd's routes (issue 39); drop next release. bf329cd's match (the
    # client-sent old header with the tenant's own objective, a bounded Content-Length on a body) still
    # reaches the pool until the identity extension runs; the extension strips that header, so the match
    # is dead after the move (the policy tenant-priorities-bound checks the strip list).
    old = {"x-gateway-inference-objective": "support.llama-8b"}
    assert "x-gateway-inference-objective" in IDENTITY_STRIPS
    assert _reach(plan, path, headers={**old, **body}).backends[0]["kind"] == "InferencePool"
    for length in ({}, {"content-length": "99999999999"}):
        assert _reach(plan, path, headers={**old, **length}) is None, length
    assert _reach(plan, "/support/llama-8b/v1/models", "GET", old).backends
    # The picker's own answer (x-gateway-destination-endpoint, with ClearRouteCache): should the
    # load balancer match the route again, the request still reaches the pool.
    assert _reach(plan, path, headers={**verified("support"), **body,
                                       "x-gateway-destination-endpoint": "10.0.0.1:8000"}).backends
    assert _reach(plan, "/support/llama-8b/v1/models", "GET", verified("support")).backends
    assert _reach(plan, "/support/llama-8b/v1/models", "GET", {}) is None


def test_the_identity_extension_fronts_the_gateway_failing_closed(plans):
    """GKE's body-based router's deployment (a GCPRoutingExtension on the Gateway), failing closed,
    on every request's headers; its config lists each tenant's picker URL with its objective."""
    plan = plans["staging"]
    (ext,) = manifests_of(plan, "GCPRoutingExtension")
    assert ext["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "vllm"}]
    # The picker's body routes (their cache_salt set), then every other request's headers.
    body_chain, chain = ext["spec"]["extensionChains"]
    assert "matchCondition" not in chain and "matchCondition" in body_chain
    (e,) = chain["extensions"]
    assert e["failOpen"] is False and e["supportedEvents"] == ["RequestHeaders"]
    assert e["backendRef"] == body_chain["extensions"][0]["backendRef"] == {
        "group": "", "kind": "Service", "name": "vllm-gke-identity", "port": 9004}
    cfg = json.loads(one(plan, "ConfigMap", "vllm-gke-identity")["data"]["identity.json"])
    assert cfg["prefixes"] == {f"/{t}/llama-8b": {
        "tenant": t, "objective": f"{t}.llama-8b", "cacheSalt": f"tenant-{t}", "maxBodyBytes": 1 << 20,
        "saltedPaths": ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"]}
        for t in ("search", "support")}
    assert set(cfg["headers"]["strip"]) >= {*REFUSED_AT_THE_PICKER, OBJECTIVE_HEADER, TENANT_HEADER}
    assert cfg["tenants"]["search"]["issuer"] == SEARCH
    # Only stacks with a picker run it.
    assert not manifests_of(plans["dev"], "GCPRoutingExtension") or any(
        m.routing == "inference-gateway" for m in plans["dev"].config.models)


def test_the_picker_gets_only_what_it_parses_and_bounded_bodies(plans):
    """The picker buffers a whole body and answers 400 to a path no parser claims: the chat batch,
    embeddings, score and rerank are not routed; chunked bodies and bodies over the limit neither."""
    plan = plans["staging"]
    own = verified("search")
    limit = picker_max_body_bytes(plan.config.model("llama-8b"))
    assert limit == max(1 << 20, 16384 * 16)
    base = "/search/llama-8b/v1"
    # Salted URLs: Envoy's full-duplex ext_proc removed Content-Length before the route is chosen;
    # the identity extension refused (413) a missing or larger one before (test_identity_extension).
    assert _reach(plan, f"{base}/completions", headers=own).backends
    for served in ("/responses", "/messages"):
        assert _reach(plan, f"{base}{served}", headers={**own, "content-length": "10"}).backends, served
    for other in ("/embeddings", "/chat/completions/batch", "/score", "/rerank", "/chat/completions/render",
                  "/responses/resp_1"):
        assert _reach(plan, f"{base}{other}", headers={**own, "content-length": "10"}) is None, other
    guard = json.loads({e["name"]: e.get("value") for e in one(plan, "Deployment", "llama-8b-short")["spec"][
        "template"]["spec"]["containers"][0]["env"]}["GKE_LLM_GUARD_CONFIG"])
    assert set(guard["routes"]) == set(PICKER_PATHS)
    assert guard["routes"]["/v1/responses"]["method"] == "POST"  # GET /v1/responses/{id}: 404 at the guard
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


def test_picker_needs_network_services_and_the_llm_d_crds_first(plans):
    plan = plans["staging"]
    assert "networkservices.googleapis.com" in required_apis(plan.config)
    assert "networkservices.googleapis.com" not in required_apis(plans["dev"].config)
    crds = [r for r in plan.of_type("kubernetes:yaml/v2:ConfigFile") if r.props["file"] in CRD_URLS]
    assert sorted(r.props["file"] for r in crds) == sorted(CRD_URLS)
    assert all("/llm-d/llm-d-router/v0.10.0/" in url for url in CRD_URLS)  # the release the picker image is
    # v1.2.0's objective CRD stays, under its old logical name (untouched by the move): a rollback needs it.
    assert plan.named("kubernetes:yaml/v2:ConfigFile", "inference-objective-crd-crd").props["file"] == LEGACY_CRD_URL
    api = plan.named("gcp:projects/service:Service", "apis-networkservices")
    for kind in ("InferencePool", "InferenceObjective", "Deployment"):
        for r in plan.kubernetes():
            if r.props.get("kind") == kind and (kind != "Deployment" or r.props["metadata"]["name"].endswith("-epp")):
                assert all(plan.waits_for(r, crd) for crd in crds) and plan.waits_for(r, api), r.name
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
    # The Cloud Run models' URLs are their load balancer's URL map's (tests/test_cloud_run_gateway.py), not HTTPRoutes.
    paths = {urlsplit(u.url).path for u in urls if u.via != "cloud run"}
    assert {next(p for p in paths if d == p or d.startswith(p + "/")) for d in declared} == paths
    picked = [u for u in urls if u.via == "endpoint picker"]
    assert all(urlsplit(u.url).path == f"/{u.tenant}/{u.model}/v1" for u in picked)
    # ...with no header of the client's: what the route requires, the identity extension sets from the token.
    for u in picked:
        assert u.header == ""
        assert _reach(plan, f"{urlsplit(u.url).path}/models", "GET",
                      {OBJECTIVE_HEADER: f"{u.tenant}.{u.model}", TENANT_HEADER: u.tenant}).backends
    assert bool(picked) == bool(url_notes(plan.config))
