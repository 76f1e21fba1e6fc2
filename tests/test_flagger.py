"""Flagger (components/flagger.py) under Pulumi's mocks: its chart's values, the PromQL frontend's
Google identity and who may reach it, the loadtester's least privilege (and, on the real control
plane of ../shared/k8s, that the webhooks' command does what it says with no more), the gates'
MetricTemplates and the Canary's webhooks against the shared CRDs, the rollback alert; and the
Flagger rows of the contracts table on a stack that rolls out by canary."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml

from tests.conftest import manifests_of
from tests.k8s_cluster import CONTROL_PLANE, ControlPlane
from tests.test_flagger_routes import _pool_of as pool_of
from tests.test_flagger_routes import _routes as flagger_routes
from vllm_gke.components.flagger import Flagger, FlaggerArgs
from vllm_gke.components.model.flagger_install import (
    CHART_PODS,
    FLAGGER_POD_LABELS,
    FLAGGER_RESOURCES,
    FRONTEND,
    FRONTEND_LABELS,
    LOADTESTER,
    LOADTESTER_LABELS,
    canary_failed_alert,
    canary_failed_query,
    loadtester_url,
    metrics_address,
)
from vllm_gke.components.model.gateway_routes import LENGTH_HINT_HEADER
from vllm_gke.components.model.picker import GMP_NAMESPACES
from vllm_gke.components.model.rollout_webhooks import LoadTestRef, load_test_webhooks, start_command
from vllm_gke.components.model.rollouts import (
    FLAGGER_NAMESPACE,
    WORKLOAD_LABEL,
    FlaggerPool,
    RolloutPlan,
    canary_spec,
    gates,
)
from vllm_gke.components.model.specs import MonitoringSpec, RolloutSpec
from vllm_gke.infra.contracts import flagger as flagger_contracts
from vllm_gke.infra.manifests import validate, validate_alert_policy
from vllm_gke.infra.mocks import PlannedResource
from vllm_gke.infra.plan import _under_mocks, manifest
from vllm_gke.policies.route_match import HttpRequest, reach

PROJECT, CLUSTER, POOL = "acme-llm", "llm", "acme-llm.svc.id.goog"
CHANNELS = ["projects/acme-llm/notificationChannels/1", "projects/acme-llm/notificationChannels/2"]
SEARCH = LoadTestRef("search-llama-8b", "vllm")
# Its variant whose every request goes to the long pool: what the long pool's canary starts.
SEARCH_LONG = LoadTestRef("search-llama-8b", "vllm", long=True)
NODES = "10.0.0.0/20"


def declare(rollouts: RolloutSpec | None = None, load_tests: tuple[LoadTestRef, ...] = (SEARCH, SEARCH_LONG),
            namespaces: tuple[str, ...] = ("vllm", "tenant-analytics")) -> list[PlannedResource]:
    """The component under mocks (default rollouts and monitoring, prod's load test)."""
    rollouts = rollouts or RolloutSpec()

    def body() -> None:
        provider = k8s.Provider("k8s", kubeconfig="{}")
        Flagger("flagger", FlaggerArgs(
            project=PROJECT, provider=provider, workload_pool=POOL, cluster_name=CLUSTER,
            frontend_gsa_name=f"{CLUSTER}-flagger-frontend", gates=gates(rollouts, MonitoringSpec()),
            canary_namespaces=namespaces, load_tests=load_tests, notification_channels=CHANNELS,
            metrics_sources=[NODES]))

    return _under_mocks("vllm-gke", "prod", {"gcp:project": PROJECT}, body)


@pytest.fixture(scope="module")
def recorded() -> list[PlannedResource]:
    return declare()


def docs(recorded: list[PlannedResource], kind: str) -> list[dict[str, Any]]:
    return [manifest(r) for r in recorded if r.custom and r.props.get("kind") == kind]


def doc(recorded: list[PlannedResource], kind: str, name: str, namespace: str = FLAGGER_NAMESPACE) -> dict[str, Any]:
    (found,) = [d for d in docs(recorded, kind) if d["metadata"]["name"] == name
                and d["metadata"].get("namespace") == namespace]
    return found


def of_type(recorded: list[PlannedResource], type_: str) -> list[PlannedResource]:
    return [r for r in recorded if r.type == type_]


# --- the chart -------------------------------------------------------------------------------------

def test_the_chart_is_pinned_on_the_gateway_api_querying_the_frontend(recorded):
    (release,) = of_type(recorded, "kubernetes:helm.sh/v3:Release")
    props = release.props
    assert (props["chart"], props["version"], props["repositoryOpts"], props["name"], props["namespace"]) == \
        ("flagger", "1.44.0", {"repo": "https://flagger.app"}, "flagger", FLAGGER_NAMESPACE)
    values = props["values"]
    assert values["meshProvider"] == "gatewayapi:v1"
    assert values["metricsServer"] == metrics_address() == f"http://{FRONTEND}.{FLAGGER_NAMESPACE}.svc.cluster.local:9090"
    # The workload label alone: the chart's default list (app, name, app.kubernetes.io/name) would
    # make Flagger rewrite app.kubernetes.io/name=vllm on every primary pod.
    assert values["selectorLabels"] == WORKLOAD_LABEL
    assert values["configTracking"] == {"enabled": False}
    assert values["prometheus"] == {"install": False}
    assert values["image"] == {"repository": "ghcr.io/fluxcd/flagger", "tag": "1.44.0"}


def test_flagger_runs_restricted_on_the_system_pool_within_what_the_system_pool_counts(recorded):
    (release,) = of_type(recorded, "kubernetes:helm.sh/v3:Release")
    values = release.props["values"]
    context = values["securityContext"]["context"]
    assert values["securityContext"]["enabled"] is True
    assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"] and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert values["nodeSelector"] == {"vllm-gke.io/role": "system"}
    # The system pool's sum counts the chart's pod at its requests.
    ((_, pods, cpu_m, mem_mi),) = CHART_PODS
    assert (pods, f"{cpu_m}m", f"{mem_mi}Mi") == (1, values["resources"]["requests"]["cpu"],
                                                  values["resources"]["requests"]["memory"]) == \
        (1, FLAGGER_RESOURCES["requests"]["cpu"], FLAGGER_RESOURCES["requests"]["memory"])


def test_the_metric_templates_wait_for_the_chart_that_installs_their_crd(recorded):
    (release,) = of_type(recorded, "kubernetes:helm.sh/v3:Release")
    templates = of_type(recorded, "kubernetes:flagger.app/v1beta1:MetricTemplate")
    assert templates and all(release.urn in t.dependencies for t in templates)


# --- the PromQL frontend ---------------------------------------------------------------------------

def test_the_frontend_reads_monitoring_as_its_own_google_account_and_nothing_else(recorded):
    (gsa,) = of_type(recorded, "gcp:serviceaccount/account:Account")
    email = f"{CLUSTER}-flagger-frontend@{PROJECT}.iam.gserviceaccount.com"
    assert gsa.props["accountId"] == f"{CLUSTER}-flagger-frontend"
    grants = [(r.props["role"], r.props["project"], r.props["member"])
              for r in of_type(recorded, "gcp:projects/iAMMember:IAMMember")]
    assert grants == [("roles/monitoring.viewer", PROJECT, f"serviceAccount:{email}")]
    (wi,) = of_type(recorded, "gcp:serviceaccount/iAMMember:IAMMember")
    assert (wi.props["role"], wi.props["member"]) == \
        ("roles/iam.workloadIdentityUser", f"serviceAccount:{POOL}[{FLAGGER_NAMESPACE}/{FRONTEND}]")
    ksa = doc(recorded, "ServiceAccount", FRONTEND)
    assert ksa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
    deployment = doc(recorded, "Deployment", FRONTEND)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == FRONTEND
    assert f"--query.project-id={PROJECT}" in pod["containers"][0]["args"]
    assert pod["containers"][0]["image"] == "gke.gcr.io/prometheus-engine/frontend:v0.15.3-gke.0"
    # It starts only once it may use its identity.
    (frontend,) = [r for r in recorded if r.props.get("kind") == "Deployment" and r.props["metadata"]["name"] == FRONTEND]
    assert wi.urn in frontend.dependencies
    service = doc(recorded, "Service", FRONTEND)
    assert service["spec"]["selector"] == FRONTEND_LABELS
    assert service["spec"]["ports"] == [{"name": "http", "port": 9090, "targetPort": "web"}]


def _admitted(recorded: list[PlannedResource], labels: dict[str, str], port: int) -> list[Any]:
    """Every peer some NetworkPolicy admits to pods of `labels` on `port` (policies add up; a pod
    no policy selects admits everything: None)."""
    selecting = [p for p in docs(recorded, "NetworkPolicy")
                 if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
    if not selecting:
        return [None]
    return [peer for p in selecting for rule in p["spec"].get("ingress") or []
            if not rule.get("ports") or any(x["port"] == port for x in rule["ports"])
            for peer in rule.get("from") or [None]]


def test_only_flaggers_pods_reach_the_frontend_and_the_loadtester(recorded):
    flagger = {"podSelector": {"matchLabels": FLAGGER_POD_LABELS}}
    assert _admitted(recorded, FRONTEND_LABELS, 9090) == [flagger]
    assert _admitted(recorded, LOADTESTER_LABELS, 8080) == [flagger]
    # Flagger's own pod serves /metrics to Managed Prometheus' collectors and the node subnet alone.
    assert _admitted(recorded, FLAGGER_POD_LABELS, 8080) == [
        *({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}} for n in GMP_NAMESPACES),
        {"ipBlock": {"cidr": NODES}}]
    # Any other pod of the namespace (the chart's, one added later) admits nothing.
    assert _admitted(recorded, {"app": "other"}, 80) == []


# --- the loadtester --------------------------------------------------------------------------------

def test_the_loadtester_may_start_the_load_tests_in_their_namespace_and_nothing_else():
    recorded = declare(load_tests=(SEARCH, LoadTestRef("batch", "vllm"), LoadTestRef("batch", "vllm", long=True),
                                   LoadTestRef("night", "tenant-a")))
    roles = {r["metadata"]["namespace"]: r for r in docs(recorded, "Role")}
    assert set(roles) == {"vllm", "tenant-a"}
    assert roles["vllm"]["rules"] == [
        {"apiGroups": ["batch"], "resources": ["cronjobs"],
         "resourceNames": ["loadtest-batch", "loadtest-batch-long", "loadtest-search-llama-8b"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "delete"],
         "resourceNames": ["loadtest-batch-canary", "loadtest-batch-long-canary", "loadtest-search-llama-8b-canary"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
    assert roles["tenant-a"]["rules"][0]["resourceNames"] == ["loadtest-night"]
    for binding in docs(recorded, "RoleBinding"):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LOADTESTER}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": LOADTESTER, "namespace": FLAGGER_NAMESPACE}]
    assert not docs(recorded, "ClusterRole") and not docs(recorded, "ClusterRoleBinding")


def test_the_loadtester_takes_tasks_of_the_canaries_namespaces_only(recorded):
    deployment = doc(recorded, "Deployment", LOADTESTER)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/fluxcd/flagger-loadtester:0.38.0"
    (flag,) = [a for a in container["command"] if a.startswith("-namespace-regexp=")]
    assert flag == "-namespace-regexp=^(tenant\\-analytics|vllm)$"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == LOADTESTER
    # kubectl's cache on the only writable volume (the root filesystem is read-only).
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["KUBECACHEDIR"].startswith("/tmp/") and container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert doc(recorded, "Service", LOADTESTER)["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    assert loadtester_url() == f"http://{LOADTESTER}.{FLAGGER_NAMESPACE}.svc.cluster.local/"


# --- what Flagger reads and calls, against the shared CRDs -----------------------------------------

def test_one_metric_template_per_gate_reading_the_frontend(recorded):
    want = {g.name: g.query for g in gates(RolloutSpec(), MonitoringSpec())}
    templates = docs(recorded, "MetricTemplate")
    assert {t["metadata"]["name"]: t["spec"]["query"] for t in templates} == want
    assert all(t["metadata"]["namespace"] == FLAGGER_NAMESPACE for t in templates)
    assert all(t["spec"]["provider"] == {"type": "prometheus", "address": metrics_address()} for t in templates)


def test_every_manifest_validates_against_kubernetes_and_the_shared_crds(recorded, crd_catalog):
    manifests = [manifest(r) for r in recorded if r.custom and r.type.startswith("kubernetes:")
                 and r.type != "kubernetes:helm.sh/v3:Release"]
    assert {d["kind"] for d in manifests} >= {"MetricTemplate", "PodMonitoring", "Deployment", "Role", "NetworkPolicy"}
    assert {f"{d['kind']}/{d['metadata']['name']}": validate(d, crd_catalog) for d in manifests} == \
        {f"{d['kind']}/{d['metadata']['name']}": [] for d in manifests}


def test_a_canary_with_the_load_test_webhooks_validates_against_the_shared_crd(crd_catalog):
    rollouts, monitoring = RolloutSpec(enabled=True), MonitoringSpec()
    plan = RolloutPlan("canary", canary_replicas=1, primary_max=3, max_weight=50, progress_deadline_seconds=1800,
                       analysis_seconds=360)
    pool = FlaggerPool(plan, rollouts, monitoring, "llama-8b", 8192, "https", "llm.acme.example",
                       webhooks=load_test_webhooks(SEARCH, loadtester_url()))
    spec = canary_spec("llama-8b-short", "short", 1, pool, "vllm", {"queue": "q", "keep": "k"})
    canary = {"apiVersion": "flagger.app/v1beta1", "kind": "Canary",
              "metadata": {"name": "llama-8b-short", "namespace": "vllm"}, "spec": spec}
    assert validate(canary, crd_catalog) == []
    hooks = spec["analysis"]["webhooks"]
    assert [(h["type"], h["url"], h["metadata"]["type"]) for h in hooks] == [
        ("pre-rollout", loadtester_url(), "bash"), ("rollout", loadtester_url(), "bash")]
    assert all(h["metadata"]["cmd"] == start_command(SEARCH) for h in hooks)
    # A misspelt webhook type is what the CRD refuses.
    broken = copy.deepcopy(canary)
    broken["spec"]["analysis"]["webhooks"][0]["type"] = "prerollout"
    assert validate(broken, crd_catalog)


def test_flaggers_metrics_are_scraped_and_a_rollback_pages_the_channels(recorded):
    monitoring = doc(recorded, "PodMonitoring", "flagger")
    assert monitoring["spec"]["selector"] == {"matchLabels": FLAGGER_POD_LABELS}
    assert monitoring["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    (alert,) = of_type(recorded, "gcp:monitoring/alertPolicy:AlertPolicy")
    assert alert.props["notificationChannels"] == CHANNELS
    (condition,) = alert.props["conditions"]
    query = condition["conditionPrometheusQueryLanguage"]["query"]
    assert query == canary_failed_query(CLUSTER)
    # The Canary's namespace is exported_namespace: `namespace` is Flagger's pod's.
    assert query == ('max by (exported_namespace, name) (flagger_canary_status{cluster="llm",'
                     'namespace="flagger-system"}) == 2')
    assert alert.props["severity"] == "ERROR"


def test_the_rollback_alert_is_a_valid_cloud_monitoring_policy():
    assert validate_alert_policy(canary_failed_alert(CLUSTER)) == []


# --- the contracts' Flagger rows -------------------------------------------------------------------

def test_prod_rolls_out_by_canary_with_flagger_as_the_component_installs_it(plans):
    """prod (rollouts.enabled): its Canaries, Flagger installed, the load test's webhooks on every
    Canary, and every Flagger row of the contracts table holding."""
    plan = plans["prod"]
    canaries = [d for d in plan.manifests() if d["kind"] == "Canary"]
    assert canaries and plan.of_type("kubernetes:helm.sh/v3:Release")
    assert all([w["type"] for w in c["spec"]["analysis"]["webhooks"]] == ["pre-rollout", "rollout"] for c in canaries)
    assert {c.check.__name__: c.check(plan) for c in flagger_contracts.ROWS} == \
        {c.check.__name__: [] for c in flagger_contracts.ROWS}


_FROM_CRONJOB = re.compile(r"create job (\S+) --from=cronjob/(\S+)")


def _started(canary: dict[str, Any]) -> set[tuple[str, str]]:
    """(Job, CronJob) each of the Canary's webhooks keeps running."""
    return {(m.group(1), m.group(2)) for w in canary["spec"]["analysis"]["webhooks"]
            if (m := _FROM_CRONJOB.search(w["metadata"]["cmd"]))}


def _requests(plan: Any, namespace: str, cron_name: str) -> list[HttpRequest]:
    """A typical request (2 KB: the load test's prompts are ~512 tokens) of each phase of a CronJob, as
    inference-perf sends it: its route's path, and the config's api.headers on every request."""
    crons = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in manifests_of(plan, "CronJob")}
    pod = crons[(namespace, cron_name)]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (config,) = [v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config"]
    (cm,) = [m for m in manifests_of(plan, "ConfigMap") if (m["metadata"]["namespace"], m["metadata"]["name"]) ==
             (namespace, config)]
    phases = [yaml.safe_load(text) for file, text in cm["data"].items() if file.endswith(".yaml")]
    return [HttpRequest(f"{urlsplit(c['server']['base_url']).path}/v1/completions",
                        headers={"content-length": "2048", **(c["api"].get("headers") or {})}) for c in phases]


def test_prods_long_canaries_start_the_variant_whose_requests_reach_the_long_pool(plans):
    """A long pool's canary starts loadtest-<name>-long, whose every request carries the length hint
    and so reaches the long pool (Flagger's route, as it completes it); a short pool's starts the
    plain one, whose typical request reaches the short pool. Without the variant a long canary saw
    the few plain requests past longRequestBytes: at night, no values, a rollback."""
    plan = plans["prod"]
    routes = flagger_routes(plan)
    for c in manifests_of(plan, "Canary"):
        ns, name = c["metadata"]["namespace"], c["metadata"]["name"]
        ((job, cron),) = _started(c)
        assert cron.endswith("-long") == name.endswith("-long") and job == f"{cron}-canary", name
        requests = _requests(plan, ns, cron)
        assert len(requests) >= 1
        for request in requests:
            assert (request.headers.get(LENGTH_HINT_HEADER) == "long") == name.endswith("-long"), (name, request)
            reached = reach(routes, request, "https")
            assert reached is not None and reached.route["metadata"]["namespace"] == ns, (name, request)
            assert pool_of(reached) == {name}, (name, request)


def test_prods_loadtester_may_start_exactly_what_the_canaries_start(plans):
    """In each namespace the loadtester's Role names the CronJobs and Jobs the Canaries there start,
    no more; and each started CronJob is one the plan declares."""
    plan = plans["prod"]
    started: dict[str, set[tuple[str, str]]] = {}
    for c in manifests_of(plan, "Canary"):
        started.setdefault(c["metadata"]["namespace"], set()).update(_started(c))
    roles = {r["metadata"]["namespace"]: r["rules"] for r in manifests_of(plan, "Role")
             if r["metadata"]["name"] == LOADTESTER}
    assert set(roles) == set(started)
    crons = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in manifests_of(plan, "CronJob")}
    for ns, pairs in started.items():
        named = {(tuple(r["resources"]), tuple(r["verbs"])): set(r.get("resourceNames") or ()) for r in roles[ns]}
        assert named == {(("cronjobs",), ("get",)): {cron for _, cron in pairs},
                         (("jobs",), ("get", "delete")): {job for job, _ in pairs},
                         (("jobs",), ("create",)): set()}, ns
        assert {(ns, cron) for _, cron in pairs} <= crons
    assert any(cron.endswith("-long") for pairs in started.values() for _, cron in pairs)


def test_the_contract_row_flags_a_long_canarys_variant_undeclared_or_not_granted(plans):
    """The row that holds each webhook to a planned CronJob the Role allows catches the long variant
    missing from the plan, or from the Role."""
    plan = plans["prod"]
    check = flagger_contracts.flagger_webhooks_start_the_load_test
    assert check(plan) == []
    undeclared = dataclasses.replace(plan, resources=[
        r for r in plan.resources if not (r.props.get("kind") == "CronJob" and r.props["metadata"]["name"] ==
                                          "loadtest-search-llama-8b-long")])
    assert {p.split(":")[0] for p in check(undeclared)} == {"Canary vllm/llama-8b-long"}
    assert all("which the plan does not declare" in p for p in check(undeclared))

    def without_long(r: PlannedResource) -> PlannedResource:
        if r.props.get("kind") != "Role" or r.props["metadata"]["name"] != LOADTESTER:
            return r
        rules = [{**rule, "resourceNames": [n for n in rule["resourceNames"] if "-long" not in n]}
                 if rule.get("resourceNames") else rule for rule in r.props["rules"]]
        return dataclasses.replace(r, props={**r.props, "rules": rules})

    ungranted = dataclasses.replace(plan, resources=[without_long(r) for r in plan.resources])
    assert {p.split(":")[0] for p in check(ungranted)} == {
        f"Canary {c['metadata']['namespace']}/{c['metadata']['name']}" for c in manifests_of(plan, "Canary")
        if c["metadata"]["name"].endswith("-long")}


def test_the_flagger_rows_pass_without_canaries_and_want_flagger_with_them(plans, plan_variant):
    """Rollouts off: no Canary, no Flagger, nothing to check; Canaries without Flagger: flagged."""
    off = plan_variant("prod", lambda v: v.update({"vllm-gke:rollouts": {"enabled": False}}))
    assert not [d for d in off.manifests() if d["kind"] in ("Canary", "MetricTemplate")]
    assert not off.of_type("kubernetes:helm.sh/v3:Release") or all(
        r.props.get("chart") != "flagger" for r in off.of_type("kubernetes:helm.sh/v3:Release"))
    assert all(c.check(off) == [] for c in flagger_contracts.ROWS)
    bare = dataclasses.replace(plans["prod"], resources=[
        r for r in plans["prod"].resources if not (r.type == "kubernetes:helm.sh/v3:Release" and r.props["chart"] == "flagger")])
    for check in (flagger_contracts.flagger_queries_the_frontend, flagger_contracts.flagger_tracks_no_config):
        assert any("no Flagger release" in p for p in check(bare)), check.__name__


# --- on the real control plane ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run these")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-flagger-")))
    try:
        yield cp
    finally:
        cp.down()


JOB = SEARCH.job


@pytest.fixture(scope="module")
def loadtester(cluster, recorded) -> dict[str, str]:
    """The loadtester's service account, Roles and Bindings as planned, a node, and the load test's
    CronJobs, plain and long-pool variant (a stand-in pod: no container runs here); the environment of a shell running as the
    loadtester's service account, with kubectl on its PATH."""
    cp = cluster
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                  for n in (FLAGGER_NAMESPACE, "vllm", "other")]
    cp.apply([*namespaces, *(d for d in map(manifest, recorded) if d.get("kind") in ("ServiceAccount", "Role", "RoleBinding")
                             and d["metadata"]["name"] == LOADTESTER)])
    crons = [{"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": ref.cron_job, "namespace": "vllm"},
              "spec": {"suspend": True, "schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                  "spec": {"restartPolicy": "Never",
                           "containers": [{"name": "t", "image": "registry.k8s.io/pause:3.10"}]}}}}}}
             for ref in (SEARCH, SEARCH_LONG)]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "n1", "annotations": {"kwok.x-k8s.io/node": "fake"},
        "labels": {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                   "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}
    cp.apply(crons)
    cp.kubectl("create", "-f", "-", stdin=json.dumps(node))
    token = cp.kubectl("-n", FLAGGER_NAMESPACE, "create", "token", LOADTESTER).stdout.strip()
    home = Path(cp.dir) / "loadtester"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "kubectl").symlink_to(cp.kubectl_bin)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "lt",
              "clusters": [{"name": "c", "cluster": {"server": cp.env["K8S_SERVER"], "insecure-skip-tls-verify": True}}],
              "users": [{"name": "lt", "user": {"token": token}}],
              "contexts": [{"name": "lt", "context": {"cluster": "c", "user": "lt"}}]}
    (home / "kubeconfig").write_text(json.dumps(config))
    return {"PATH": f"{home / 'bin'}:/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(home / "kubeconfig")}


def _can(cluster: ControlPlane, *args: str) -> bool:
    done = cluster.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{FLAGGER_NAMESPACE}:{LOADTESTER}",
                           check=False)
    return done.stdout.strip() == "yes"


def test_the_loadtester_may_start_the_load_test_and_nothing_more(cluster, loadtester):
    assert _can(cluster, "get", f"cronjobs/{SEARCH.cron_job}", "-n", "vllm")
    assert _can(cluster, "create", "jobs", "-n", "vllm")
    assert _can(cluster, "delete", f"jobs/{JOB}", "-n", "vllm")
    # The long pool's canary's: the variant and its Job.
    assert _can(cluster, "get", f"cronjobs/{SEARCH_LONG.cron_job}", "-n", "vllm")
    assert _can(cluster, "delete", f"jobs/{SEARCH_LONG.job}", "-n", "vllm")
    # Not Secrets (the tenants' tokens), not other objects, not other namespaces.
    for args in (("get", "secrets", "-n", "vllm"), ("list", "jobs", "-n", "vllm"), ("delete", "jobs/loader", "-n", "vllm"),
                 ("delete", f"jobs/{SEARCH_LONG.cron_job}", "-n", "vllm"), ("get", "cronjobs/loadtest-other-long", "-n", "vllm"),
                 ("get", "cronjobs/other", "-n", "vllm"), ("create", "pods", "-n", "vllm"),
                 ("create", "jobs", "-n", "other"), ("get", f"cronjobs/{SEARCH.cron_job}", "-n", "other"),
                 ("create", "jobs", "-n", FLAGGER_NAMESPACE), ("get", "secrets", "-n", FLAGGER_NAMESPACE)):
        assert not _can(cluster, *args), args


def _run(env: dict[str, str], ref: LoadTestRef = SEARCH) -> subprocess.CompletedProcess[str]:
    """The webhook's command as the loadtester runs it (bash -c), as its service account."""
    return subprocess.run(["bash", "-c", start_command(ref)], env=env, capture_output=True, text=True, timeout=120)


def _job(cluster: ControlPlane, name: str = JOB) -> dict[str, Any]:
    found = cluster.kubectl("-n", "vllm", "get", "job", name, "--ignore-not-found", "-o", "json").stdout
    return json.loads(found) if found.strip() else {}


def _finished(job: dict[str, Any]) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def test_the_webhook_keeps_one_load_test_job_running(cluster, loadtester):
    """Started where there is none, left alone while it runs, replaced once it has finished (failed
    or complete); each as the loadtester's service account alone."""
    cluster.rules([{"labels": {"job-name": JOB}, "hold": True}])
    first = _run(loadtester)
    assert first.returncode == 0, first.stderr
    uid = _job(cluster)["metadata"]["uid"]
    again = _run(loadtester)
    assert again.returncode == 0 and "is running" in again.stdout, again.stderr
    assert _job(cluster)["metadata"]["uid"] == uid
    cluster.rules([{"labels": {"job-name": JOB}, "completeAfter": 0, "exitCode": 3}])
    cluster.wait_until("the load test's Job to fail", lambda: _finished(_job(cluster)))
    replaced = _run(loadtester)
    assert replaced.returncode == 0, replaced.stderr
    second = _job(cluster)["metadata"]["uid"]
    assert second != uid
    cluster.rules([])
    cluster.wait_until("the second Job to finish", lambda: _finished(_job(cluster)))
    assert _run(loadtester).returncode == 0
    assert _job(cluster)["metadata"]["uid"] not in (uid, second)
    assert [j["metadata"]["name"] for j in cluster.get("jobs", "-n", "vllm")["items"]] == [JOB]


def test_the_webhook_passes_where_its_finished_job_was_deleted_first(cluster, loadtester):
    """The long variant's Job, finished: between the command's read of it and its delete, someone else
    deletes it (a person, the TTL controller). Its delete's NotFound passes (a failed webhook is a
    failed check) and the next Job starts, from the variant's CronJob, as the loadtester alone."""
    job = SEARCH_LONG.job
    cluster.rules([])
    assert _run(loadtester, SEARCH_LONG).returncode == 0
    cluster.wait_until("the long variant's Job to finish", lambda: _finished(_job(cluster, job)))
    uid = _job(cluster, job)["metadata"]["uid"]
    racing = Path(loadtester["HOME"]) / "racing"
    racing.mkdir()
    real = shlex.quote(cluster.kubectl_bin)
    # kubectl as the loadtester, the Job deleted (and gone) just before the command's own delete.
    (racing / "kubectl").write_text("\n".join([
        "#!/bin/bash",
        'if [[ " $* " == *" delete job "* ]]; then',
        f"  {real} -n vllm delete job {job} --wait=false >&2",
        f'  for i in $(seq 300); do [ -z "$({real} -n vllm get job {job} --ignore-not-found -o name)" ] && break; '
        "sleep 0.2; done",
        "fi",
        f'exec {real} "$@"', ""]))
    (racing / "kubectl").chmod(0o755)
    done = _run({**loadtester, "PATH": f"{racing}:/usr/bin:/bin"}, SEARCH_LONG)
    assert done.returncode == 0, done.stderr
    assert f'"{job}" deleted' in done.stderr  # the other party's delete came first
    assert _job(cluster, job)["metadata"]["uid"] != uid
    assert _job(cluster, job)["metadata"]["labels"]["job-name"] == job


def test_the_webhook_fails_where_the_loadtester_may_not_start_the_test(cluster, loadtester):
    """A load test in a namespace without the Role: the webhook fails (a failed check), and nothing
    is created there."""
    other = LoadTestRef("search-llama-8b", "other")
    done = subprocess.run(["bash", "-c", start_command(other)], env=loadtester, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "forbidden" in done.stderr.lower()
    assert cluster.get("jobs", "-n", "other")["items"] == []


def test_the_component_registers_its_outputs():
    """metrics_address and loadtester_url are the component's attributes."""
    seen: dict[str, Any] = {}

    def body() -> None:
        f = Flagger("flagger", FlaggerArgs(project=PROJECT, provider=k8s.Provider("k8s", kubeconfig="{}"),
                                           workload_pool=POOL, cluster_name=CLUSTER, frontend_gsa_name="llm-flagger-fe",
                                           gates=()))
        seen.update(metrics=f.metrics_address, url=f.loadtester_url)
        pulumi.export("x", 1)

    recorded = _under_mocks("vllm-gke", "prod", {}, body)
    assert seen == {"metrics": metrics_address(), "url": loadtester_url()}
    # No load test, no Role; no gate, no template.
    assert not [r for r in recorded if r.props.get("kind") in ("Role", "RoleBinding", "MetricTemplate")]
