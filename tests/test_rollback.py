"""A canary rolled back end to end (issue 38): the prod plan's Canary, its gates' MetricTemplates,
its target Deployment, ScaledObject and PodMonitoring on the real control plane (../shared/k8s),
Flagger v1.44.0's analysis emulated from its source (tests/flagger_analysis.py) reading them from
the API server, and every gate's query answered by a real Prometheus from recorded series
(tests/recorded_series.py).

One pool, eight rollouts side by side (a namespace each): a canary that serves as its primary does
is promoted step by step; the others are each rolled back by the gate that guards what it broke
(SCENARIOS), and by no other: its time to first token grown in body and tail (the ratio gates), in
its body alone (the SLO percentile's ratio), or past the SLO beside a slow primary (the seconds
gate), 5xx, refusals, inter-token latency, or no traffic at all - the HTTPRoute back at primary 100 /
canary 0, the canary scaled to zero and its ScaledObject paused, the Canary Failed - and the plan's
alert on flagger_canary_status fires for those and not for the promoted one.

The series are recorded once the canaries run (their pods' names and labels are the cluster's),
over 30 minutes at the PodMonitoring's interval, each canary serving as its revision does from its
first pod on; the analysis ticks once a (virtual) interval inside that window. Flagger's
queries carry no `time` (pkg/metrics/providers/prometheus.go:106-118): a proxy standing where the
plan's query endpoint is adds the virtual now, and nothing else (recorded_series.QueryProxy).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.flagger_analysis import (
    FAILED,
    INITIALIZED,
    PAUSED_REPLICAS,
    PROGRESSING,
    SUCCEEDED,
    ErrMultipleValuesReturned,
    ErrNoValuesFound,
    Flagger,
    FlaggerFlags,
    HttpGet,
    NotEmulated,
    PrometheusProvider,
    metric_model,
    query_url,
    render_query,
)
from tests.k8s_cluster import CONTROL_PLANE, CRDS, ControlPlane, gke_nodes
from tests.kube_api import KubeApi
from tests.recorded_series import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    GmpCluster,
    Lognormal,
    PodRecording,
    QueryClock,
    QueryProxy,
    RecordedPrometheus,
    Serving,
    gauge_openmetrics,
    gmp_target_labels,
    openmetrics,
    with_metric_labels,
)
from vllm_gke.components.model.serving_api import VERIFIED_HEADERS
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

STACK = "prod"
CRD_FILES = ("flagger-v1.44.0-crds.yaml", "gwapi-v1.6.1-httproutes.yaml", "keda-chart-v2.20.2-scaledobjects.yaml",
             "gmp-v0.17.2-podmonitorings.yaml")
PRIMARY = Serving(ttft=Lognormal(0.15, 0.6), itl=Lognormal(0.03, 0.35), errors=0.001)


@dataclass(frozen=True)
class Scenario:
    """A rollout: how its canary (the new revision) serves, how its primary does, and the gates the
    canary breaks (none: it is promoted). Flagger halts at the first of them in the Canary's order
    (scheduler_metrics.go:271-345 runs the metrics in turn and stops at a failed one)."""

    canary: Serving
    breaks: tuple[str, ...] = ()
    primary: Serving = PRIMARY


# The TTFT quantiles below are histogram_quantile's over vLLM's buckets (1.0, 2.5 around the SLO's 2 s),
# not the distributions' own.
SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario(PRIMARY),
    # Slower in body and tail, its p95 (1.3 s) within the SLO: only the comparisons with the primary see it.
    "slower": Scenario(replace(PRIMARY, ttft=Lognormal(0.4, 0.6)), ("vllm-ttft-p99-ratio", "vllm-ttft-p95-ratio")),
    # Slower in its body, not its tail (the primary's tail is long): p95 1.9x the primary's, p99 1.1x, 1.5 s.
    "body-slower": Scenario(replace(PRIMARY, ttft=Lognormal(0.7, 0.25)), ("vllm-ttft-p95-ratio",),
                            replace(PRIMARY, ttft=Lognormal(0.15, 1.0))),
    # The primary itself slow (p95 1.8 s, within the SLO's 2 s), the canary a little slower (2.1 s): within
    # every ratio (1.2x, 1.0x), over the SLO - the seconds gate alone stops it.
    "slow-primary": Scenario(replace(PRIMARY, ttft=Lognormal(0.75, 0.35)), ("vllm-ttft-p95-seconds",),
                             replace(PRIMARY, ttft=Lognormal(0.65, 0.35))),
    "errors": Scenario(replace(PRIMARY, errors=0.04), ("vllm-error-share-excess",)),
    # A lost adapter: 5% of its requests refused (a 4xx), none failed.
    "refusals": Scenario(replace(PRIMARY, refused=0.05), ("vllm-refused-share-excess",)),
    "itl": Scenario(replace(PRIMARY, itl=Lognormal(0.07, 0.35)), ("vllm-itl-p99-ratio",)),
    # No request reaches it (a night without its load test): every gate on it finds no value, and
    # nothing to judge is a failed check (ErrNoValuesFound: scheduler_metrics.go:316-325).
    "silent": Scenario(replace(PRIMARY, traffic=0.0)),
}
REQUESTS_PER_SECOND = 10.0  # each pod's; the gates compare distributions and shares, not volumes
RECORDING_SECONDS = 30 * 60
# GMP's scrape interval where a PodMonitoring's endpoint names none.
GMP_DEFAULT_INTERVAL = "60s"


def _tools() -> tuple[str, str]:
    """prometheus and promtool (Debian's package; .ci/run installs it), and the control plane."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    missing = [w for w, ok in (("prometheus", prom), ("promtool", tool), (str(CONTROL_PLANE), CONTROL_PLANE.exists()))
               if not ok]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs the rollback end to end: missing {', '.join(missing)}")
        pytest.skip(f"missing {', '.join(missing)}")
    assert prom is not None and tool is not None
    return prom, tool


# --- what the plan declares for one Flagger pool ---------------------------------------------------

@dataclass
class PoolPlan:
    canary: dict[str, Any]
    target: dict[str, Any]
    scaled_object: dict[str, Any]
    pod_monitoring: dict[str, Any]
    # The target's ServiceAccount, PersistentVolumeClaims and their PersistentVolumes.
    pod_needs: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    flags: FlaggerFlags
    flagger_release: dict[str, Any]
    flagger_pod_monitoring: dict[str, Any]
    alert: dict[str, Any]
    gmp: GmpCluster
    tenants: tuple[str, ...]
    model: str
    # The pool's PodMonitoring's scrape interval: a sample each.
    scrape_seconds: int


def _one(docs: list[dict[str, Any]], kind: str, namespace: Optional[str], name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
             and d["metadata"].get("namespace") == namespace]
    assert len(found) == 1, f"the plan declares {len(found)} {kind} {namespace}/{name}"
    return found[0]


def _flagger_parts(plan: Plan) -> tuple[dict[str, Any], FlaggerFlags, dict[str, Any]]:
    """Flagger's Helm release, the flags its values set (charts/flagger/templates/deployment.yaml:95-137
    at v1.44.0: each flag from its value, the binary's default where the value is empty), and the
    alert policy on flagger_canary_status."""
    releases = [r.props for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.props.get("chart") == "flagger"]
    assert len(releases) == 1, "the plan installs Flagger's chart once"
    values = releases[0].get("values") or {}
    default = FlaggerFlags()
    flags = FlaggerFlags(
        selector_labels=tuple((values.get("selectorLabels") or ",".join(default.selector_labels)).split(",")),
        include_label_prefix=tuple((values.get("includeLabelPrefix") or "").split(",")),
        mesh_provider=values.get("meshProvider") or default.mesh_provider,
        config_tracking=(values.get("configTracking") or {}).get("enabled", True))
    alerts = [r.props for r in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")
              if "flagger_canary_status" in json.dumps(r.props)]
    assert len(alerts) == 1, "the plan pages on flagger_canary_status once"
    return releases[0], flags, alerts[0]


def _accelerators(docs: list[dict[str, Any]], canary: dict[str, Any]) -> int:
    target = _one(docs, "Deployment", canary["metadata"]["namespace"], canary["spec"]["targetRef"]["name"])
    requests = [(c.get("resources") or {}).get("requests", {}) for c in target["spec"]["template"]["spec"]["containers"]]
    return sum(int(v) for r in requests for k, v in r.items() if k.startswith(("nvidia.com/", "google.com/tpu")))


def pool_plan(plan: Plan, docs: list[dict[str, Any]]) -> PoolPlan:
    """The prod plan's Canary of the fewest accelerators a replica (the cheapest nodes to simulate)."""
    canary = min((d for d in docs if d["kind"] == "Canary"),
                 key=lambda c: (_accelerators(docs, c), c["metadata"]["namespace"], c["metadata"]["name"]))
    ns, target_name = canary["metadata"]["namespace"], canary["spec"]["targetRef"]["name"]
    target = _one(docs, "Deployment", ns, target_name)
    pod = target["spec"]["template"]
    pms = [d for d in docs if d["kind"] == "PodMonitoring" and d["metadata"]["namespace"] == ns and all(
        pod["metadata"]["labels"].get(k) == v for k, v in d["spec"]["selector"]["matchLabels"].items())]
    assert len(pms) == 1, f"one PodMonitoring scrapes {ns}/{target_name}'s pods"
    claims = [_one(docs, "PersistentVolumeClaim", ns, v["persistentVolumeClaim"]["claimName"])
              for v in pod["spec"].get("volumes") or [] if "persistentVolumeClaim" in v]
    needs = [_one(docs, "ServiceAccount", ns, pod["spec"]["serviceAccountName"]), *claims,
             *(_one(docs, "PersistentVolume", None, c["spec"]["volumeName"]) for c in claims)]
    refs = {(m["templateRef"].get("namespace", ns), m["templateRef"]["name"]) for m in canary["spec"]["analysis"]["metrics"]}
    templates = [d for d in docs if d["kind"] == "MetricTemplate"
                 and (d["metadata"]["namespace"], d["metadata"]["name"]) in refs]
    release, flags, alert = _flagger_parts(plan)
    (flagger_pm,) = [d for d in docs if d["kind"] == "PodMonitoring" and d["metadata"]["namespace"] == release["namespace"]]
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    gmp = GmpCluster(cluster.props["project"], cluster.props["location"], cluster.props["name"])
    model = canary["metadata"]["labels"]["vllm-gke.io/model"]
    (endpoint,) = pms[0]["spec"]["endpoints"]
    return PoolPlan(canary, target, _one(docs, "ScaledObject", ns, canary["spec"]["autoscalerRef"]["name"]), pms[0],
                    needs, templates, flags, release, flagger_pm, alert, gmp,
                    tuple(t.name for t in plan.config.tenants if model in t.models), model,
                    go_duration(endpoint.get("interval", GMP_DEFAULT_INTERVAL)))


# --- the pool's rollouts on the control plane ---------------------------------------------------

def _in_namespace(doc: dict[str, Any], ns: str, suffix: str) -> dict[str, Any]:
    """A copy of a plan object in a rollout's own namespace (a PersistentVolume per rollout, as one
    binds one claim)."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "PersistentVolume":
        doc["metadata"]["name"] += f"-{suffix}"
    else:
        doc["metadata"]["namespace"] = ns
    if doc["kind"] == "PersistentVolumeClaim":
        doc["spec"]["volumeName"] += f"-{suffix}"
    return doc


def new_revision(target: dict[str, Any]) -> dict[str, Any]:
    """The target as `pulumi up` applies it after a change of the vLLM image: the same template with
    another digest in each of the server's containers."""
    doc = copy.deepcopy(target)
    spec = doc["spec"]["template"]["spec"]
    image = spec["containers"][0]["image"]
    for c in spec["containers"] + (spec.get("initContainers") or []):
        if c["image"] == image:
            c["image"] = image.split("@")[0] + "@sha256:" + "0123456789abcdef" * 4
    return doc


@dataclass
class Rollout:
    name: str
    namespace: str
    scenario: Scenario
    # What the cluster held after each tick (phase, weights, replicas: `observe`).
    history: list[dict[str, Any]] = field(default_factory=list)


def observe(api: KubeApi, pool: PoolPlan, r: Rollout) -> dict[str, Any]:
    name = pool.canary["metadata"]["name"]
    target = pool.target["metadata"]["name"]
    status = (api.get("Canary", r.namespace, name) or {}).get("status") or {}
    route = api.get("HTTPRoute", r.namespace, target)
    weights = {b["name"]: b.get("weight") for b in route["spec"]["rules"][0]["backendRefs"]} if route else {}
    dep = api.get("Deployment", r.namespace, target) or {"spec": {}}
    so = api.get("ScaledObject", r.namespace, pool.scaled_object["metadata"]["name"]) or {"metadata": {}}
    return {"phase": status.get("phase", ""), "failedChecks": status.get("failedChecks", 0),
            "canaryWeight": status.get("canaryWeight", 0), "route": weights, "targetReplicas": dep["spec"].get("replicas"),
            "paused": (so["metadata"].get("annotations") or {}).get(PAUSED_REPLICAS)}


def settle(api: KubeApi, namespaces: list[str], timeout: float = 120) -> None:
    """Until every Deployment in these namespaces is rolled out (what an analysis interval gives the
    Deployment controller and the kubelets here)."""
    deadline = time.monotonic() + timeout
    while True:
        pending = []
        for ns in namespaces:
            for d in api.list("Deployment", ns):
                st, want = d.get("status") or {}, d["spec"].get("replicas", 1)
                if (st.get("observedGeneration", 0) < d["metadata"]["generation"] or st.get("replicas", 0) != want
                        or st.get("updatedReplicas", 0) != want or st.get("availableReplicas", 0) != want):
                    pending.append(f"{ns}/{d['metadata']['name']}: {st}")
        if not pending:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Deployments not rolled out after {timeout:.0f} s: {pending}")
        time.sleep(0.5)


def bring_up(cp: ControlPlane, plan: Plan, pool: PoolPlan, rollouts: list[Rollout]) -> None:
    """The CRDs, the target's node pool, Flagger's templates and, per rollout, the plan's objects of
    the pool in its namespace with KEDA's part played (the target at its floor)."""
    for name in CRD_FILES:
        cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
    cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
    selector = pool.target["spec"]["template"]["spec"].get("nodeSelector") or {}
    pools = {n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] for n in gke_nodes(plan)
             if all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())}
    assert len(pools) == 1, f"one planned node pool carries {selector}: {pools}"
    # A node for each replica: a primary, a canary and the primary's surge per rollout.
    cp.apply(gke_nodes(plan, {**{p.props["name"]: 0 for p in plan.of_type("gcp:container/nodePool:NodePool")},
                              pools.pop(): 3 * len(rollouts)}))
    flagger_namespaces = {pool.flagger_release["namespace"], *(t["metadata"]["namespace"] for t in pool.templates)}
    namespaces = [*sorted(flagger_namespaces), *(r.namespace for r in rollouts)]
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces])
    cp.apply([*pool.templates, pool.flagger_pod_monitoring])
    for r in rollouts:
        objects = [*pool.pod_needs, pool.target, pool.scaled_object, pool.pod_monitoring, pool.canary]
        cp.apply([_in_namespace(d, r.namespace, r.name) for d in objects])
        floor = pool.scaled_object["spec"].get("minReplicaCount", 0)
        cp.kubectl("scale", "deployment", pool.target["metadata"]["name"], "-n", r.namespace, f"--replicas={floor}")


# --- the plan's addresses, as the cluster's DNS resolves them --------------------------------------

def service_at(plan_docs: list[dict[str, Any]], url: str) -> Optional[str]:
    """`namespace/name` of the plan's Service a `http://<name>.<namespace>.svc[.cluster.local][:port]`
    URL reaches (its port among the Service's), else None."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").removesuffix(".cluster.local")
    labels = host.split(".")
    if len(labels) != 3 or labels[2] != "svc":
        return None
    name, ns = labels[0], labels[1]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for d in plan_docs:
        if d["kind"] == "Service" and d["metadata"]["name"] == name and d["metadata"].get("namespace") == ns \
                and any(p["port"] == port for p in d["spec"]["ports"]):
            return f"{ns}/{name}"
    return None


def http_get_via(plan_docs: list[dict[str, Any]], proxy: QueryProxy, query_service: str) -> HttpGet:
    """Flagger's HTTP GET, the plan's query Service reached at the proxy; any other host does not resolve."""
    def get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        parts = urllib.parse.urlsplit(url)
        if service_at(plan_docs, url) != query_service:
            raise OSError(f"dial tcp: lookup {parts.hostname}: no such host")
        req = urllib.request.Request(urllib.parse.urlunsplit(("http", proxy.address, parts.path, parts.query, "")),
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
    return get


# --- one run: every rollout ticked through its analysis ------------------------------------------

def go_duration(text: str) -> int:
    """Seconds of a Go duration like 60s, 2m or 1m30s."""
    parts = re.findall(r"(\d+)(h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration this test reads: {text}"
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@dataclass
class Run:
    pool: PoolPlan
    rollouts: list[Rollout]
    flagger: Flagger
    prom: RecordedPrometheus
    proxy: QueryProxy
    clock: QueryClock
    api: KubeApi
    # The virtual time of each tick, and the recording's window.
    ticks: list[float]
    window: tuple[int, int]
    webhooks: list[tuple[str, dict[str, Any]]]


def record(run: Run, canary_start: int) -> str:
    """Every pod the pool's PodMonitoring (as the API server stored it) scrapes, with GMP's labels:
    each rollout's primary serving as its scenario's throughout, its canary from its start."""
    pool, (w0, w1) = run.pool, run.window
    target = pool.target["metadata"]["name"]
    recordings: list[PodRecording] = []
    for r in run.rollouts:
        pm = run.api.get("PodMonitoring", r.namespace, pool.pod_monitoring["metadata"]["name"])
        assert pm is not None
        seen = {"canary": 0, "primary": 0}
        for pod in run.api.list("Pod", r.namespace):
            labels = gmp_target_labels(pm, pod, pool.gmp)
            if labels is None or pod["metadata"].get("deletionTimestamp"):
                continue
            owner = pod["metadata"]["ownerReferences"][0]["name"].rsplit("-", 1)[0]  # the ReplicaSet's Deployment
            role = "canary" if owner == target else "primary"
            seen[role] += 1
            recordings.append(PodRecording(labels, REQUESTS_PER_SECOND, canary_start, w1, r.scenario.canary)
                              if role == "canary" else PodRecording(labels, REQUESTS_PER_SECOND, w0, w1, r.scenario.primary))
        assert seen["canary"] and seen["primary"], (f"{r.namespace}: GMP would scrape {seen} pods of each revision; "
                                                    f"{r.history}; {run.flagger.events}")
    return openmetrics(recordings, pool.tenants, pool.model, pool.scrape_seconds)


def flagger_series(run: Run) -> str:
    """Flagger's flagger_canary_status as GMP would store it: scraped from Flagger's pod (the chart's
    pod, charts/flagger/templates/deployment.yaml:30-35 and 88-90 at v1.44.0) under the plan's
    PodMonitoring in its namespace, its own `namespace` label then exported_namespace."""
    release = run.pool.flagger_release
    ns, name = release["namespace"], release["name"]
    pod = {"metadata": {"name": f"{name}-7d4b9c-x2x9z", "namespace": ns,
                        "labels": {"app.kubernetes.io/name": "flagger", "app.kubernetes.io/instance": name,
                                   "app.kubernetes.io/version": "1.44.0", "pod-template-hash": "7d4b9c"},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{name}-7d4b9c", "controller": True}]},
           "spec": {"nodeName": "system-node",
                    "containers": [{"name": "flagger", "ports": [{"name": "http", "containerPort": 8080}]}]},
           "status": {"phase": "Running"}}
    pm = run.api.get("PodMonitoring", ns, run.pool.flagger_pod_monitoring["metadata"]["name"])
    assert pm is not None
    target = gmp_target_labels(pm, pod, run.pool.gmp)
    assert target is not None, "the plan's PodMonitoring in Flagger's namespace scrapes no Flagger pod"
    every = go_duration(pm["spec"]["endpoints"][0].get("interval", "60s"))
    samples = run.flagger.recorder.samples("flagger_canary_status", run.window[0], run.window[1], every)
    return gauge_openmetrics("flagger_canary_status", [(with_metric_labels(target, lab), t, v) for lab, t, v in samples])


def tick(run: Run, k: int) -> None:
    """Tick k of every rollout at its virtual time, then what the cluster holds once it settled."""
    run.clock.now = run.ticks[k]
    for r in run.rollouts:
        run.flagger.advance(run.pool.canary["metadata"]["name"], r.namespace)
    settle(run.api, [r.namespace for r in run.rollouts])
    for r in run.rollouts:
        r.history.append(observe(run.api, run.pool, r))


def analyse(run: Run, cp: ControlPlane) -> None:
    """Ticks until every Canary is initialised (its primary made and ready, the target scaled to zero);
    then the new revision is applied and the next tick starts its analysis; the series are recorded
    once the canaries run; the ticks go on past promotion or rollback; Flagger's own series are
    recorded last."""
    k = 0
    while not all(r.history and r.history[-1]["phase"] == INITIALIZED for r in run.rollouts):
        assert k < 4, [r.history for r in run.rollouts]
        tick(run, k)
        k += 1
    cp.apply([_in_namespace(new_revision(run.pool.target), r.namespace, r.name) for r in run.rollouts])
    tick(run, k)
    assert all(r.history[-1]["phase"] == PROGRESSING for r in run.rollouts), run.flagger.events
    run.prom.stop()
    run.prom.backfill(record(run, canary_start=int(run.ticks[k])))
    run.prom.start()
    for later in range(k + 1, len(run.ticks)):
        tick(run, later)
    run.prom.stop()
    run.prom.backfill(flagger_series(run))
    run.prom.start()


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    prom_bin, promtool = _tools()
    plan = run_program(STACK, read_stack_config(STACK))
    docs = plan.manifests()
    pool = pool_plan(plan, docs)
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-rollback-")))
    prom = RecordedPrometheus(prom_bin, promtool)
    clock = QueryClock(0)
    proxy = QueryProxy(prom, clock)
    try:
        api = KubeApi(Path(cp.env["KUBECONFIG"]))
        ns = pool.canary["metadata"]["namespace"]
        rollouts = [Rollout(name, f"{ns}-{name}", scenario) for name, scenario in SCENARIOS.items()]
        bring_up(cp, plan, pool, rollouts)
        settle(api, [r.namespace for r in rollouts])
        (address,) = {t["spec"]["provider"]["address"] for t in pool.templates}
        query_service = service_at(docs, address)
        assert query_service is not None, f"the MetricTemplates' address {address} is no Service of the plan"
        webhooks: list[tuple[str, dict[str, Any]]] = []

        def webhook(url: str, payload: dict[str, Any]) -> int:
            if service_at(docs, url) is None:
                raise OSError(f"dial tcp: lookup {urllib.parse.urlsplit(url).hostname}: no such host")
            webhooks.append((url, payload))
            return 200  # the loadtester started (or found running) the load test

        analysis = pool.canary["spec"]["analysis"]
        steps = math.ceil(analysis["maxWeight"] / analysis["stepWeight"])
        w0 = int(time.time() - 3600) // pool.scrape_seconds * pool.scrape_seconds
        ticks = [w0 + 300.0 + k * go_duration(analysis["interval"]) for k in range(steps + 12)]
        assert ticks[-1] < w0 + RECORDING_SECONDS
        flagger = Flagger(api, pool.flags, lambda: clock.now, http_get_via(docs, proxy, query_service), webhook)
        result = Run(pool, rollouts, flagger, prom, proxy, clock, api, ticks, (w0, w0 + RECORDING_SECONDS), webhooks)
        prom.start()  # an empty TSDB until the canaries run: Flagger's availability check at initialization
        analyse(result, cp)
        yield result
    finally:
        proxy.close()
        prom.close()
        cp.down()


# --- what the cluster holds after each rollout ---------------------------------------------------

def rollout(run: Run, name: str) -> Rollout:
    return next(r for r in run.rollouts if r.name == name)


def events(run: Run, r: Rollout, prefix: str) -> list[str]:
    who = f"{r.namespace}/{run.pool.canary['metadata']['name']}"
    return [m for _, w, _, m in run.flagger.events if w == who and m.startswith(prefix)]


def images(dep: dict[str, Any]) -> list[str]:
    spec = dep["spec"]["template"]["spec"]
    return [c["image"] for c in spec["containers"] + (spec.get("initContainers") or [])]


def _names(run: Run) -> tuple[str, str, str]:
    target = run.pool.target["metadata"]["name"]
    return target, f"{target}-primary", f"{target}-canary"


# Flagger's halt on a metric (scheduler_metrics.go:316-345): its value past a bound, or no value.
HALT = re.compile(r"Halt (?:\S+ )?advancement (no values found for custom metric: )?([\w-]+)[ :]")


def halted_by(message: str) -> tuple[str, bool]:
    """The metric a halt names, and whether it found no value."""
    found = HALT.match(message)
    assert found is not None, f"not a halt on a metric: {message}"
    return found.group(2), bool(found.group(1))


def stopping_gate(run: Run, scenario: Scenario) -> tuple[str, bool]:
    """The metric that halts the canary, and whether for want of a value: the first in the Canary's
    order its canary breaks, or (no traffic) the first of all."""
    names = [m["name"] for m in run.pool.canary["spec"]["analysis"]["metrics"]]
    if scenario.canary.traffic == 0:
        return names[0], True
    return next(n for n in names if n in scenario.breaks), False


def failing(name: str) -> bool:
    return SCENARIOS[name].breaks != () or SCENARIOS[name].canary.traffic == 0


@pytest.mark.parametrize("name", [n for n in SCENARIOS if failing(n)])
def test_a_failing_canary_is_rolled_back(run, name):
    r, analysis = rollout(run, name), run.pool.canary["spec"]["analysis"]
    target, primary, canary = _names(run)
    failed = next((i for i, o in enumerate(r.history) if o["phase"] == FAILED), None)
    assert failed is not None, f"{name} never rolled back: {r.history}; {events(run, r, '')}"
    before, after = r.history[:failed], r.history[failed:]
    # It took the first step (Flagger judges none before it: scheduler.go:449-459), then each failed
    # check held its weight until the threshold.
    assert max(o["canaryWeight"] for o in before) >= analysis["stepWeight"]
    assert [o["failedChecks"] for o in before if o["failedChecks"]] == list(range(1, analysis["threshold"] + 1))
    assert len({o["canaryWeight"] for o in before if o["failedChecks"]}) == 1
    # Rolled back at once, and so it stays.
    assert after[0]["route"] == {primary: 100, canary: 0}
    assert after[0]["targetReplicas"] == 0 and after[0]["paused"] == "0"
    # Failed, its count of failed checks written back to 0 (rollback's SyncStatus: status.go:32-70).
    assert after[0]["failedChecks"] == 0
    assert all(o == after[0] for o in after)
    # Stopped by the gate that guards what broke, as often as the threshold asked.
    halts = events(run, r, "Halt ")
    assert [halted_by(h) for h in halts] == [stopping_gate(run, r.scenario)] * analysis["threshold"], halts
    assert events(run, r, "Rolling back ") == [f"Rolling back {run.pool.canary['metadata']['name']}.{r.namespace} "
                                              f"failed checks threshold reached {analysis['threshold']}"]
    # The primary still serves the revision before the change.
    kept = run.api.get("Deployment", r.namespace, primary)
    assert kept is not None
    assert images(kept) == images(run.pool.target)


def test_a_healthy_canary_is_promoted(run):
    r, analysis = rollout(run, "healthy"), run.pool.canary["spec"]["analysis"]
    target, primary, canary = _names(run)
    weights = [o["route"].get(canary) for o in r.history]
    steps = list(range(analysis["stepWeight"], analysis["maxWeight"] + 1, analysis["stepWeight"]))
    assert [w for i, w in enumerate(weights) if w and w != weights[i - 1]] == steps
    assert not events(run, r, "Halt ")
    # Flagger's Reconcile found each tick the route as SetRoutes left it (a rewrite would reset the weights).
    assert not events(run, r, "HTTPRoute ")
    last = r.history[-1]
    assert last["phase"] == SUCCEEDED and last["route"] == {primary: 100, canary: 0}
    assert last["targetReplicas"] == 0 and last["paused"] == "0"
    # The primary now runs the canary's template (Promote: deployment_controller.go:65-137).
    new, promoted = run.api.get("Deployment", r.namespace, target), run.api.get("Deployment", r.namespace, primary)
    assert new is not None and promoted is not None
    label = run.pool.flags.selector_labels[0]
    assert promoted["spec"]["template"]["spec"] == new["spec"]["template"]["spec"]
    assert promoted["spec"]["template"]["metadata"]["labels"] == {**new["spec"]["template"]["metadata"]["labels"],
                                                                  label: primary}
    assert images(promoted) == images(new_revision(run.pool.target)) != images(run.pool.target)
    # Each webhook called as its type says: pre-rollout before the first step, rollout before each
    # analysis - one for each step after the first and one for the promotion (scheduler.go:449-467).
    hooks = [h["type"] for h in analysis.get("webhooks") or []]
    called = [p["phase"] for _, p in run.webhooks if p["namespace"] == r.namespace]
    advances = len(events(run, r, "Advance "))
    assert called == ["Progressing"] * (hooks.count("pre-rollout") + hooks.count("rollout") * advances)


def _gate_values(run: Run, r: Rollout, at: float) -> dict[str, Optional[float]]:
    """Every gate of the rollout's Canary (as the API server holds it) at `at`: its query's value as
    the recorded Prometheus answers it (None: no value, as Flagger reads an empty or NaN result)."""
    cd = run.api.get("Canary", r.namespace, run.pool.canary["metadata"]["name"])
    assert cd is not None
    templates = {t["metadata"]["name"]: t for t in run.pool.templates}
    out: dict[str, Optional[float]] = {}
    for m in cd["spec"]["analysis"]["metrics"]:
        query = render_query(templates[m["templateRef"]["name"]]["spec"]["query"], metric_model(cd, m["interval"]))
        values = [float(v["value"][1]) for v in run.prom.query(query, at)]
        out[m["name"]] = values[-1] if values and not math.isnan(values[-1]) else None
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_canary_breaks_its_gates_alone(run, name):
    """At every tick Flagger judged it, the gates past their bound are the scenario's and no others: the
    slower canary within the SLO's seconds, the slow primary's canary within every ratio, the canary
    slower in its body within the p99 ratio. The silent canary: no gate has a value."""
    r, scenario = rollout(run, name), SCENARIOS[name]
    bounds = {m["name"]: m["thresholdRange"]["max"] for m in run.pool.canary["spec"]["analysis"]["metrics"]}
    judged = [t for t, w, _, m in run.flagger.events
              if w.startswith(r.namespace + "/") and m.startswith(("Halt ", "Advance ", "Copying "))]
    assert judged, events(run, r, "")
    for at in judged:
        values = _gate_values(run, r, at)
        if scenario.canary.traffic == 0:
            assert values == dict.fromkeys(bounds), (at, values)
            continue
        broken = {n for n, v in values.items() if v is None or v > bounds[n]}
        assert broken == set(scenario.breaks), (at, values)


def test_the_gates_read_the_recorded_clusters_series(run):
    """The gates' queries select the plan's cluster, which GMP writes on every series it collects there."""
    clusters = {c for t in run.pool.templates for c in re.findall(r'cluster="([^"]*)"', t["spec"]["query"])}
    assert clusters == {run.pool.gmp.cluster}
    for series in ("vllm_gke_tenant_requests_total", "vllm:time_to_first_token_seconds_bucket"):
        found = run.prom.query(f"count by (cluster) ({series})", run.ticks[-1])
        assert {s["metric"].get("cluster") for s in found} == clusters, series


def test_the_alert_pages_for_each_rollback_alone(run):
    """The plan's alert on flagger_canary_status, its PromQL condition evaluated on the series Flagger
    exported: it holds from the rollback on (for its duration), for the rolled back pools only."""
    (condition,) = run.pool.alert["conditions"]
    promql = condition["conditionPrometheusQueryLanguage"]
    every = go_duration(promql.get("evaluationInterval", "60s"))
    hold = go_duration(promql.get("duration", "0s"))
    scrape = go_duration(run.pool.flagger_pod_monitoring["spec"]["endpoints"][0].get("interval", "60s"))
    target = run.pool.target["metadata"]["name"]

    def firing(at: float) -> set[str]:
        return {s["metric"].get("exported_namespace", "?") for s in run.prom.query(promql["query"], at)
                if s["metric"].get("name") == target}

    for r in run.rollouts:
        failed = next((i for i, o in enumerate(r.history) if o["phase"] == FAILED), None)
        if failed is None:
            assert all(r.namespace not in firing(t) for t in run.ticks), r.name
            continue
        assert all(r.namespace not in firing(t) for t in run.ticks[:failed]), r.name
        start = run.ticks[failed] + scrape
        assert all(r.namespace in firing(start + k * every) for k in range(hold // every + 2)), r.name


def test_the_recorded_histograms_have_vllms_buckets():
    """The bounds recorded_series.py writes are the pinned vLLM's (VLLM_PYTHON: CONTRIBUTING.md)."""
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        if os.environ.get("CI") == "true":
            pytest.fail("CI checks the recorded buckets against the real vLLM: .ci/run sets VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON not set")
    out = subprocess.run([python, "-c", "import json; from vllm.v1.metrics import buckets as b; "
                          "print(json.dumps([b.TIME_TO_FIRST_TOKEN_BUCKETS, b.INTER_TOKEN_LATENCY_BUCKETS]))"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [list(TTFT_BUCKETS), list(ITL_BUCKETS)]


def test_the_route_flagger_writes_keeps_the_pools_matches_and_strips_verified_headers(run):
    """The HTTPRoute Flagger made from the plan's Canary (gateway_api.go:65-113), as the API server
    accepted it: the pool's matches, and the tenant identity a client could forge removed."""
    r = rollout(run, "healthy")
    route = run.api.get("HTTPRoute", r.namespace, run.pool.target["metadata"]["name"])
    assert route is not None
    (rule,) = route["spec"]["rules"]
    service = run.pool.canary["spec"]["service"]
    assert [m["path"]["value"] for m in rule["matches"]] == [m["uri"]["prefix"] for m in service["match"]]
    (strip,) = [f["requestHeaderModifier"] for f in rule["filters"] if f["type"] == "RequestHeaderModifier"]
    assert strip["remove"] == list(VERIFIED_HEADERS)


# --- the emulation's own pieces, against Flagger's semantics ---------------------------------------

def test_queries_render_flaggers_model_functions_and_refuse_the_rest():
    model = {"name": "c", "namespace": "ns", "target": "t", "service": "s", "ingress": "i", "route": "r", "interval": "2m"}
    assert render_query('x{a="{{ target }}-primary",n="{{namespace}}"}[{{ interval }}]', model) == 'x{a="t-primary",n="ns"}[2m]'
    assert render_query("a {{- target -}} b", model) == "atb"
    for action in ("{{ .target }}", "{{ variables }}", "{{ target | printf }}", "{{/* c */}}"):
        with pytest.raises(NotEmulated):
            render_query(action, model)


def test_query_results_as_flagger_reads_them():
    """prometheus.go:106-175: the last sample's value; none, or NaN, is ErrNoValuesFound; a matrix an error."""
    def provider(body: dict[str, Any], status: int = 200) -> PrometheusProvider:
        return PrometheusProvider("http://p:9090/prom", {}, lambda url, headers: (status, json.dumps(body).encode()))

    def vector(*values: str) -> dict[str, Any]:
        return {"data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, v]} for v in values]}}

    assert provider(vector("0.5", "1.5")).run_query("q") == 1.5
    for empty in (vector(), vector("NaN")):
        with pytest.raises(ErrNoValuesFound):
            provider(empty).run_query("q")
    with pytest.raises(ErrMultipleValuesReturned):
        provider({"data": {"result": [{"metric": {}, "values": [[1, "1"]]}]}}).run_query("q")
    with pytest.raises(RuntimeError):
        provider(vector("1"), 503).run_query("q")
    assert query_url("http://p:9090/prom", "a  b\n c") == "http://p:9090/prom/api/v1/query?query=a+b+c"
