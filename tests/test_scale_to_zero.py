"""Scale to zero (minReplicas 0): KEDA installed and authorised to read Managed Prometheus, a
ScaledObject per such pool, a standby that answers 503 with Retry-After and wakes the pool, the
node pool going to zero too."""

from __future__ import annotations

import copy
import http.client
import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from tests.conftest import STACKS, by_hand, manifests_of
from vllm_gke.components.keda import CHART_VERSION, GMP_AUTH, gmp_query_url
from vllm_gke.components.model.pods.standby import RETRY_AFTER_S, STANDBY_LABEL
from vllm_gke.components.standby import PROGRAM
from vllm_gke.infra.config import ConfigError, parse


def one(plan, kind, name):
    (found,) = [d for d in manifests_of(plan, kind) if d["metadata"]["name"] == name]
    return found


def test_keda_is_installed_pinned_with_its_google_identity(plans):
    plan = plans["staging"]
    (release,) = [r.props for r in plan.resources if r.type == "kubernetes:helm.sh/v3:Release"]
    assert (release["chart"], release["version"]) == ("keda", CHART_VERSION)
    assert release["repositoryOpts"]["repo"] == "https://kedacore.github.io/charts"
    assert release["values"]["podIdentity"]["gcp"]["enabled"] is True
    binding = plan.named("gcp:serviceaccount/iAMMember:IAMMember", "keda-wi").props
    assert binding["member"].endswith(".svc.id.goog[keda/keda-operator]")
    viewer = plan.named("gcp:projects/iAMMember:IAMMember", "keda-monitoring-viewer").props
    assert viewer["role"] == "roles/monitoring.viewer"
    auth = one(plan, "ClusterTriggerAuthentication", GMP_AUTH)
    assert auth["spec"] == {"podIdentity": {"provider": "gcp"}}
    # Every stack: KEDA scales every pool, not only those that may go to zero.
    assert [r.props["chart"] for r in plans["dev"].resources if r.type == "kubernetes:helm.sh/v3:Release"] == ["keda"]


def test_pool_at_zero_is_woken_kept_and_scaled_by_keda(plans):
    plan = plans["staging"]
    so = one(plan, "ScaledObject", "mistral-7b-long")["spec"]
    assert so["scaleTargetRef"]["name"] == "mistral-7b-long"
    assert (so["minReplicaCount"], so["maxReplicaCount"], so["cooldownPeriod"]) == (0, 1, 900)
    wake, queue, keep = so["triggers"]
    for t in (wake, queue, keep):
        assert t["type"] == "prometheus" and t["authenticationRef"] == {"name": GMP_AUTH,
                                                                       "kind": "ClusterTriggerAuthentication"}
        assert t["metadata"]["serverAddress"] == gmp_query_url("acme-llm-staging")
        assert t["metadata"]["activationThreshold"] == "0"
    assert "vllm_gke_standby_waking" in wake["metadata"]["query"]
    assert "vllm_gke_standby_requests_total" in wake["metadata"]["query"] and "mistral-7b-long-standby" in \
        wake["metadata"]["query"]
    assert "vllm:num_requests_waiting" in queue["metadata"]["query"] and queue["metadata"]["threshold"] == "8"
    assert "vllm:num_requests_running" in keep["metadata"]["query"]
    # A pool with a floor: no wake trigger; the keep trigger too, so that KEDA knows when it was
    # last active should it be switched to zero (a switched idle pool goes at once, a busy one
    # after cooldownSeconds of nothing).
    short = one(plan, "ScaledObject", "mistral-7b-short")["spec"]
    assert short["minReplicaCount"] == 1 and [t["metadata"]["query"] for t in short["triggers"]] == [
        t["metadata"]["query"].replace("mistral-7b-long", "mistral-7b-short") for t in (queue, keep)]


def test_standby_is_selected_by_the_pools_service_and_in_the_mesh(plans):
    plan = plans["staging"]
    standby = one(plan, "Deployment", "mistral-7b-long-standby")
    labels = standby["spec"]["template"]["metadata"]["labels"]
    assert labels[STANDBY_LABEL] == "true"
    service = one(plan, "Service", "mistral-7b-long")
    assert service["spec"]["selector"].items() <= labels.items()
    # The headless readiness Service selects the vLLM pods only.
    ready = one(plan, "Service", "mistral-7b-long-ready")
    assert ready["spec"]["clusterIP"] == "None" and ready["spec"]["publishNotReadyAddresses"] is False
    assert not ready["spec"]["selector"].items() <= labels.items()
    vllm_labels = one(plan, "Deployment", "mistral-7b-long")["spec"]["template"]["metadata"]["labels"]
    assert ready["spec"]["selector"].items() <= vllm_labels.items()
    # Meshed (no opt-out): only a tenant's JWT reaches it, so only tenants wake GPUs.
    assert "sidecar.istio.io/inject" not in labels
    (c,) = standby["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "--ready-host" in c["command"]


def test_a_pool_declares_its_standby_aliased_to_where_the_platform_declared_it(plans):
    """VllmService makes its own standby (its child, waiting for what the pool waits for); a stack
    whose Platform (or, before that, the stack program) declared it keeps it: aliased to the
    Platform and to the stack root, under the same name."""
    plan = plans["staging"]
    by_urn = {r.urn: r for r in plan.resources}
    (platform,) = [r for r in plan.resources if r.type == "vllm-gke:index:Platform"]
    (standby,) = [r for r in plan.resources if r.type == "vllm-gke:index:Standby"]
    pool = by_urn[standby.parent]
    assert pool.type == "vllm-gke:index:VllmService" and standby.name == f"{pool.name}-standby"
    assert standby.alias_parents == (platform.urn, "")
    (deploy,) = [r for r in plan.resources if r.name == "mistral-7b-long-standby-deploy"]
    assert {r.urn for r in plan.resources if r.name == "keda-release"} <= deploy.dependencies


def test_node_pool_must_go_to_zero_when_every_pool_on_it_may(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    for which in ("short", "long"):
        values["vllm-gke:models"][0][which]["minReplicas"] = 0
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert any(str(i).startswith("vllm-gke:nodePools[a100-mig].minNodes:") and "so the GPU node goes too" in str(i)
               for i in exc.value.issues)
    values["vllm-gke:nodePools"][0]["minNodes"] = 0
    parse(values)


# --- the standby program, run against stand-ins ------------------------------------------------

@pytest.fixture
def standby():
    import importlib.util

    spec = importlib.util.spec_from_file_location("standby", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = {"ready": False}
    sb = module.Standby("mistral-7b", lambda: state["ready"], RETRY_AFTER_S, 420)
    server = ThreadingHTTPServer(("127.0.0.1", 0), sb.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], state
    server.shutdown()


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), data


def test_standby_answers_503_with_retry_after_in_openai_format_and_counts(standby):
    port, _state = standby
    # The path as the Gateway forwards it (no rewrite: /<prefix>/v1/...), and unprefixed.
    for path in ("/mistral-7b/v1/chat/completions", "/support/mistral-7b/v1/chat/completions?x=1",
                 "/v1/chat/completions"):
        status, headers, body = request(port, "POST", path, json.dumps({"model": "mistral-7b"}))
        assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S), path
        error = json.loads(body)["error"]
        assert error["code"] == "scaling_from_zero" and "about 7 min" in error["message"]
    request(port, "GET", "/mistral-7b/v1/models")
    _, _, metrics = request(port, "GET", "/metrics")
    assert b"vllm_gke_standby_requests_total 4" in metrics


def test_a_wake_stays_active_until_a_replica_serves(standby):
    """KEDA counts its cooldown from the last active poll: while the woken replica loads, clients
    may have stopped retrying, so the standby itself keeps the wake trigger up until one is ready."""
    port, state = standby
    assert b"vllm_gke_standby_waking 0" in request(port, "GET", "/metrics")[2]  # nobody asked
    request(port, "POST", "/v1/completions", json.dumps({"model": "mistral-7b"}))
    for _poll in range(3):  # no retries, still waking
        assert b"vllm_gke_standby_waking 1" in request(port, "GET", "/metrics")[2]
    state["ready"] = True
    assert b"vllm_gke_standby_waking 0" in request(port, "GET", "/metrics")[2]
    state["ready"] = False  # back at zero later: asleep until the next request
    assert b"vllm_gke_standby_waking 0" in request(port, "GET", "/metrics")[2]


def test_a_wake_that_never_serves_gives_up_after_twice_the_expected_wake():
    """A crash-looping or unschedulable replica must not keep its pool (and GPU node) awake for good."""
    module = standby_module()
    now = [1000.0]
    sb = module.Standby("m", lambda: False, RETRY_AFTER_S, 420)
    sb.clock = lambda: now[0]
    sb.count()
    now[0] += 839
    assert sb.waking()
    now[0] += 2
    assert not sb.waking()
    sb.count()  # a client asks again: a new wake
    assert sb.waking()


def test_standby_is_ready_only_while_the_pool_is_not(standby):
    port, state = standby
    assert request(port, "GET", "/health")[0] == 200
    state["ready"] = True
    assert request(port, "GET", "/health")[0] == 503
    _, _, metrics = request(port, "GET", "/metrics")
    assert b"vllm_gke_standby_requests_total 0" in metrics  # probes are not requests


def standby_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("standby", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_headless_lookup_reads_readiness_from_dns():
    module = standby_module()
    assert module.lookup("localhost") is True
    assert module.lookup("no-such-service.invalid") is False


@pytest.mark.parametrize("error", ["EAI_AGAIN", "EAI_FAIL"])
def test_a_dns_error_never_puts_the_standby_in_rotation(monkeypatch, error):
    """A timeout or SERVFAIL (EAI_AGAIN) says nothing about the pool: only NXDOMAIN/NODATA count
    as "no ready replica", and an error keeps the last definite answer."""
    import socket

    module = standby_module()

    def failing(host, port):
        raise socket.gaierror(getattr(socket, error), "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", failing)
    assert module.lookup("llama-8b-short-ready.vllm.svc.cluster.local.") is None
    answers = iter([None, True, None, False, None])
    watch = module.PoolWatch("h", look=lambda host: next(answers))
    seen = []
    for _ in range(5):
        watch.refresh()
        seen.append(watch.serving_ready())
    # unknown at start: serving; then up; an error keeps it up; down; an error keeps it down
    assert seen == [True, True, True, False, False]


def test_pulumi_never_waits_for_the_standby_or_its_pool_service_to_be_ready(plans):
    """The standby is unready while its pool serves, and the pool's Service selects it: Pulumi's
    default waits (every replica ready; no unready address) would fail any update made while the
    pool is awake. A changed program rolls the standby, old pod first."""
    import hashlib

    plan = plans["staging"]
    standby = one(plan, "Deployment", "mistral-7b-long-standby")
    assert standby["metadata"]["annotations"]["pulumi.com/waitFor"] == "jsonpath={.status.updatedReplicas}=1"
    assert standby["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert standby["spec"]["template"]["metadata"]["annotations"]["vllm-gke.io/program-sha256"] == \
        hashlib.sha256(PROGRAM.read_text().encode()).hexdigest()[:16]
    assert one(plan, "Service", "mistral-7b-long")["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert "annotations" not in one(plan, "Service", "mistral-7b-short")["metadata"]


def test_standby_probe_has_explicit_timeout_and_a_fully_qualified_host(plans):
    standby = one(plans["staging"], "Deployment", "mistral-7b-long-standby")
    (c,) = standby["spec"]["template"]["spec"]["containers"]
    probe = c["readinessProbe"]
    assert probe["timeoutSeconds"] >= 1 and probe["failureThreshold"] >= 2
    host = c["command"][c["command"].index("--ready-host") + 1]
    assert host == "mistral-7b-long-ready.vllm.svc.cluster.local."


def test_a_pool_at_zero_starts_there_and_keda_owns_the_count(plans):
    """The first `pulumi up` starts a pool that may go to zero at zero (no cold start paid for a
    pool nobody called); every vLLM Deployment leaves spec.replicas to KEDA on later updates."""
    plan = plans["staging"]
    long = plan.kube("Deployment", "mistral-7b-long", "vllm")
    assert long.props["spec"]["replicas"] == 0
    assert "replicas" not in plan.kube("Deployment", "mistral-7b-short", "vllm").props["spec"]
    for dep in plan.of_type("kubernetes:apps/v1:Deployment"):
        if dep.props["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm":
            assert "spec.replicas" in dep.ignore_changes, dep.name


@pytest.mark.parametrize("floor", [0, 1])
def test_changing_the_floor_updates_one_scaled_object_in_place(plan_variant, floor):
    """minReplicas 0 -> 1 on a pool at zero: the same ScaledObject (same URN) gets minReplicaCount 1,
    and KEDA's operator scales a target below its minimum up to it (keda v2.20.2
    pkg/scaling/executor/scale_scaledobjects.go:102-109). Had the pool moved to an HPA instead, the
    HPA would refuse to scale from 0 and KEDA, losing its ScaledObject, would leave it at 0."""
    def set_floor(values):
        (mistral,) = [m for m in values["vllm-gke:models"] if m["name"] == "mistral-7b"]
        mistral["long"]["minReplicas"] = floor

    plans_of = (plan_variant("staging"), plan_variant("staging", set_floor))
    after = plans_of[1]
    so_before, so_after = (p.kube("ScaledObject", "mistral-7b-long", "vllm") for p in plans_of)
    assert so_before.urn == so_after.urn
    assert so_after.props["spec"]["minReplicaCount"] == floor
    assert not after.of_type("kubernetes:autoscaling/v2:HorizontalPodAutoscaler")
    standby = [r for r in after.of_type("kubernetes:apps/v1:Deployment") if r.name.endswith("-standby-deploy")]
    assert bool(standby) == (floor == 0)


def test_a_tenants_own_pool_at_zero_answers_the_tenant(plan_variant):
    """A dedicated pool's standby lives in the tenant's namespace, whose allow policy selects the
    tenant label: without it the tenant's requests at zero would get the mesh's 403, not the 503."""
    from vllm_gke.policies.mesh_authz import Request, decide

    def analytics_long_to_zero(values):
        (qwen,) = [m for m in values["vllm-gke:models"] if m["name"] == "qwen-7b"]
        qwen["long"]["minReplicas"] = 0

    plan = plan_variant("prod", analytics_long_to_zero)
    standby = plan.kube("Deployment", "qwen-7b-long-standby", "tenant-analytics").props
    labels = standby["spec"]["template"]["metadata"]["labels"]
    # The path as the Gateway forwards it: /<tenant>/<model>/v1/... (no rewrite).
    path = "/analytics/qwen-7b/v1/completions"
    decision = decide(plan.manifests(), Request("tenant-analytics", path, "POST", labels,
                                                token=("https://auth.acme.example/analytics", "u")))
    assert decision.allowed, decision.reason
    # ...and a token of another tenant is still refused there.
    assert not decide(plan.manifests(), Request("tenant-analytics", path, "POST", labels,
                                                token=("https://auth.acme.example/search", "u"))).allowed


def test_shared_pool_standby_admits_the_models_tenants_only(plans):
    from vllm_gke.policies.mesh_authz import Request, decide

    plan = plans["staging"]
    labels = one(plan, "Deployment", "mistral-7b-long-standby")["spec"]["template"]["metadata"]["labels"]
    docs = plan.manifests()

    def status(token):
        return decide(docs, Request("vllm", "/mistral-7b/v1/chat/completions", "POST", labels, token=token)).status

    assert status(("https://auth.acme.example/support", "u")) == 200  # support may call mistral-7b
    assert status(("https://auth.acme.example/search", "u")) == 403   # search may not
    assert status(None) == 403                                        # nobody without a token wakes GPUs


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_disruption_budgets_select_vllm_pods_only(plans, stack):
    """A standby is never Ready while its pool serves: counted by the pool's PodDisruptionBudget it
    would leave no disruption allowed and block every drain. Each budget selects exactly its
    Deployment's pods, and no standby's."""
    plan = plans[stack]
    standbys = [d["spec"]["template"]["metadata"]["labels"] for d in manifests_of(plan, "Deployment")
                if STANDBY_LABEL in d["spec"]["template"]["metadata"]["labels"]]
    assert standbys or stack == "prod"
    for pdb in manifests_of(plan, "PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert not any(selector.items() <= labels.items() for labels in standbys), pdb["metadata"]["name"]
        (dep,) = [d for d in manifests_of(plan, "Deployment", pdb["metadata"]["namespace"])
                  if d["metadata"]["name"] == pdb["metadata"]["name"]]
        assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_a_canary_follows_its_pools_scaling_to_zero(plan_variant):
    """Beside a pool that may go to zero its canary may too (up to canary.replicas), with its own
    standby; beside a pool with a floor it keeps canary.replicas."""
    def long_to_zero(values):
        by_hand(values)
        (llama,) = [m for m in values["vllm-gke:models"] if m["name"] == "llama-8b"]
        llama["long"]["minReplicas"] = 0

    plan = plan_variant("prod", long_to_zero)
    long = plan.kube("ScaledObject", "llama-8b-canary-long", "vllm").props["spec"]
    assert (long["minReplicaCount"], long["maxReplicaCount"]) == (0, 1)
    assert "llama-8b-canary-long-standby" in long["triggers"][0]["metadata"]["query"]
    assert plan.kube("Deployment", "llama-8b-canary-long-standby", "vllm")
    assert plan.kube("Deployment", "llama-8b-canary-long", "vllm").props["spec"]["replicas"] == 0
    short = plan.kube("ScaledObject", "llama-8b-canary-short", "vllm").props["spec"]
    assert (short["minReplicaCount"], short["maxReplicaCount"]) == (1, 1)


def test_a_private_control_plane_reaches_kedas_metrics_server_and_webhook(plans, plan_variant):
    """GKE's own rule lets a private cluster's control plane reach nodes on 443 and 10250 only;
    KEDA's metrics server (6443) and admission webhook (9443) need one more, before the chart."""
    plan = plans["prod"]
    (rule,) = plan.of_type("gcp:compute/firewall:Firewall")
    assert rule.props["sourceRanges"] == [plan.config.cluster.master_cidr]
    assert rule.props["allows"] == [{"protocol": "tcp", "ports": ["6443", "9443"]}]
    assert rule.props["direction"] == "INGRESS"
    (release,) = [r for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.props["chart"] == "keda"]
    assert plan.waits_for(release, rule)
    public = plan_variant("dev", lambda v: v["vllm-gke:cluster"].update(privateNodes=False))
    assert not public.of_type("gcp:compute/firewall:Firewall")


def test_keda_accepts_only_what_it_serves(plans):
    """KEDA is outside the mesh: its namespace admits the control plane on the metrics server and
    webhook ports, and its own metrics server on the operator's gRPC port; nothing else."""
    for plan in plans.values():
        (policy,) = [p for p in manifests_of(plan, "NetworkPolicy", "keda")]
        spec = policy["spec"]
        assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress"]
        opened = {(r.get("from") is not None, p["port"]) for r in spec["ingress"] for p in r["ports"]}
        assert opened == {(False, 6443), (False, 9443), (True, 9666)}
        (grpc,) = [r for r in spec["ingress"] if r.get("from")]
        assert grpc["from"] == [{"podSelector": {}}]  # the namespace's own pods only


def test_a_cooldown_shorter_than_the_wake_is_refused(plan_variant, stack_values):
    """KEDA counts the cooldown from the scale-up (kedacore/keda v2.20.2 scale_scaledobjects.go:285-286):
    shorter than a node plus the cold start, the loading replica goes back to zero before it serves."""
    from vllm_gke.components.model.config_rules.scaling import wake_needed

    wake = wake_needed(parse(stack_values["frontier"]))["llama-405b"]
    assert wake > 1200  # 810 GB of weights: minutes of node, tens of minutes of load

    def short(values):
        values["vllm-gke:models"][0]["short"]["cooldownSeconds"] = wake - 60

    with pytest.raises(ConfigError) as err:
        plan_variant("frontier", short)
    (issue,) = err.value.issues
    assert issue.key == "vllm-gke:models[llama-405b].short.cooldownSeconds"
    assert f"set it to {wake} or more" in issue.problem


@pytest.mark.parametrize("stack", STACKS)
def test_keda_polls_only_where_it_scales_to_zero(plans, stack):
    """Above zero the HPA reads the metrics and KEDA's webhook warns that pollingInterval and
    cooldownPeriod are irrelevant (scaledobject_webhook.go:336-356)."""
    for so in manifests_of(plans[stack], "ScaledObject"):
        at_zero = so["spec"]["minReplicaCount"] == 0
        assert ("pollingInterval" in so["spec"]) == at_zero
        assert ("cooldownPeriod" in so["spec"]) == at_zero
