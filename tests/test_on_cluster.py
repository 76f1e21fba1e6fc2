"""Every stack on the real control plane (../shared/k8s): what the scheduler and the controllers do
with what `pulumi up` would apply, on nodes shaped as GKE shapes each pool.

One control plane per stack (started in ~10 s): its nodes are every pool at the most nodes it may
reach (there is no cluster autoscaler here to add them), KEDA's part is played by scaling each
ScaledObject's target to its floor or ceiling. Each test leaves the cluster as it found it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import STACKS
from tests.k8s_cluster import (
    CONTROL_PLANE,
    CRD_FILES,
    CRDS,
    PAUSED,
    ControlPlane,
    apply_stack,
    crds_established,
    group_stand_ins,
    keda_floor,
    settle,
    unscheduled,
)


@pytest.fixture(scope="module", params=STACKS)
def cluster(request, plans) -> Iterator[tuple[ControlPlane, Any, list[dict[str, Any]]]]:
    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run these")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    stack = request.param
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix=f"k8s-{stack}-")))
    try:
        for name in CRD_FILES:
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        docs = apply_stack(cp, plans[stack])
        settle(cp)
        yield cp, plans[stack], docs
    finally:
        cp.down()


def _scaled(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "ScaledObject"]


def _workloads(cp: ControlPlane) -> list[dict[str, Any]]:
    return cp.get("deployments", "-A")["items"] + cp.get("leaderworkersets", "-A")["items"]


def test_every_pod_scheduled_and_every_job_complete(cluster):
    cp, plan, docs = cluster
    assert not unscheduled(cp)
    jobs = cp.get("jobs", "-A")["items"]
    assert jobs and all(j["status"].get("succeeded") for j in jobs)
    # every serving pool at its floor is up
    for so in _scaled(docs):
        target = so["spec"]["scaleTargetRef"]["name"]
        if target.endswith("-group"):
            continue  # no LeaderWorkerSet controller here: nothing makes its pods
        d = cp.get("deployment", target, "-n", so["metadata"]["namespace"])
        # A Flagger target (the canary) waits at 0 between rollouts: Flagger pauses its ScaledObject.
        paused = (so["metadata"].get("annotations") or {}).get(PAUSED)
        floor = int(paused) if paused is not None else so["spec"].get("minReplicaCount", 0)
        assert d["status"].get("availableReplicas", 0) == floor, target


def _roll_all(cp: ControlPlane, stamp: str) -> None:
    """A change to every Deployment's pod template (as a new image or flag would be), then wait."""
    patch = json.dumps({"spec": {"template": {"metadata": {"annotations": {"vllm-gke.io/test-rollout": stamp}}}}})
    for d in cp.get("deployments", "-A")["items"]:
        cp.kubectl("patch", "deployment", d["metadata"]["name"], "-n", d["metadata"]["namespace"],
                   "--type=merge", "-p", patch)
    settle(cp, timeout=180)


def test_rollout_at_the_floor_and_at_the_ceiling(cluster):
    cp, plan, docs = cluster
    _roll_all(cp, "floor")
    keda_floor(cp, docs, "maxReplicaCount")
    try:
        settle(cp, timeout=180)
        _roll_all(cp, "ceiling")
    finally:
        keda_floor(cp, docs)
        settle(cp, timeout=180)


def test_canaries_at_their_ceilings_fit_beside_the_primaries_at_theirs(cluster):
    """Every Flagger pool rolling out at once (a change to what they share, the image or the tenants)
    at peak: each primary at its ceiling and each canary at the plan's (capacity.canary_room), and
    every pod finds a node. Flagger's part is played by tests/k8s_cluster.py flagger_stand_ins."""
    cp, plan, docs = cluster
    canaries = [d for d in docs if d["kind"] == "Canary"]
    assert bool(canaries) == plan.config.rollouts.enabled
    unpaused = [{**so, "metadata": {k: v for k, v in so["metadata"].items() if k != "annotations"}}
                for so in _scaled(docs)]
    keda_floor(cp, unpaused, "maxReplicaCount")
    try:
        settle(cp, timeout=240)
        assert not unscheduled(cp)
        for c in canaries:
            d = cp.get("deployment", c["spec"]["targetRef"]["name"], "-n", c["metadata"]["namespace"])
            so = next(s for s in unpaused if s["metadata"]["name"] == c["spec"]["autoscalerRef"]["name"]
                      and s["metadata"]["namespace"] == c["metadata"]["namespace"])
            assert d["status"].get("availableReplicas", 0) == so["spec"]["maxReplicaCount"] >= 1
    finally:
        keda_floor(cp, docs)
        settle(cp, timeout=180)


def test_every_node_drains_through_the_eviction_api(cluster):
    """As GKE's upgrade drains: each node in turn, every PodDisruptionBudget honoured, none holding
    a drain (GKE would wait up to an hour per node, then force it)."""
    cp, plan, docs = cluster
    for node in cp.get("nodes")["items"]:
        _drain(cp, node["metadata"]["name"])


def _drain(cp: ControlPlane, name: str) -> None:
    """As GKE's upgrade drains a node (evictions through the API), then back in service."""
    done = cp.kubectl("drain", name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s",
                      check=False, timeout=90)
    cp.kubectl("uncordon", name)
    assert done.returncode == 0, f"drain {name}: {done.stderr[-600:]}"
    settle(cp, timeout=120)


def test_loaders_run_again_beside_the_servers(cluster):
    """A new revision or source re-runs the loader Jobs while every server, controller and the
    picker run: they must find room on the system pool."""
    cp, plan, docs = cluster
    loaders = [d for d in docs if d["kind"] == "Job" and d["metadata"]["namespace"] == "vllm-gke-system"]
    assert loaders
    for job in loaders:
        cp.kubectl("delete", "job", job["metadata"]["name"], "-n", "vllm-gke-system", "--wait=true")
    cp.apply(loaders)
    settle(cp)


def test_scale_from_zero_and_back(cluster):
    cp, plan, docs = cluster
    sleepy = [so for so in _scaled(docs) if so["spec"].get("minReplicaCount", 0) == 0
              and not so["spec"]["scaleTargetRef"]["name"].endswith("-group")]
    if not sleepy:
        pytest.skip(f"{plan.stack} has no pool that scales to zero")
    for so in sleepy:
        ns, target = so["metadata"]["namespace"], so["spec"]["scaleTargetRef"]["name"]
        cp.kubectl("scale", "deployment", target, "-n", ns, "--replicas=1")
        settle(cp)
        cp.kubectl("scale", "deployment", target, "-n", ns, "--replicas=0")
        cp.wait_until(f"{target} at zero", lambda ns=ns, target=target: not [
            p for p in cp.get("pods", "-n", ns)["items"]
            if p["metadata"]["name"].startswith(f"{target}-") and "standby" not in p["metadata"]["name"]])


def _can(cp: ControlPlane, sa: str, verb: str, group: str, resource: str, namespace: str = "",
         name: str = "") -> bool:
    """A SubjectAccessReview as the API server answers it for the Job's service account (the
    group spelled out: kubectl auth can-i guesses it from CRDs that may not be installed here)."""
    ns, account = sa.split("/")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{ns}:{account}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace,
                               "name": name}}}
    out = cp.kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(review)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


# What each Job that calls the API does (its kubectl command line in the plan), and what it must not.
JOB_ACCESS = {
    "mesh-ready": ("vllm-gke-mesh-check/mesh-ready", "controlplanerevision/", [
        ("get", "mesh.cloud.google.com", "controlplanerevisions", "istio-system", "asm-managed"),
        ("list", "mesh.cloud.google.com", "controlplanerevisions", "istio-system", ""),
        ("watch", "mesh.cloud.google.com", "controlplanerevisions", "istio-system", ""),
    ], [
        ("delete", "mesh.cloud.google.com", "controlplanerevisions", "istio-system", "asm-managed"),
        ("get", "", "secrets", "istio-system", ""),
        ("list", "", "pods", "vllm", ""),
        ("get", "apiextensions.k8s.io", "customresourcedefinitions", "", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ]),
    "lws-webhook-ready": ("lws-system/lws-webhook-ready", "--dry-run=server", [
        ("create", "leaderworkerset.x-k8s.io", "leaderworkersets", "lws-system", ""),
    ], [
        ("create", "leaderworkerset.x-k8s.io", "leaderworkersets", "vllm", ""),
        ("delete", "leaderworkerset.x-k8s.io", "leaderworkersets", "lws-system", ""),
        ("get", "", "secrets", "lws-system", ""),
        ("create", "", "pods", "lws-system", ""),
    ]),
}


def test_jobs_that_call_the_api_may_do_exactly_that(cluster):
    cp, plan, docs = cluster
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    checked = 0
    for name, (sa, used, allowed, denied) in JOB_ACCESS.items():
        if name not in jobs:
            continue
        pod = jobs[name]["spec"]["template"]["spec"]
        assert f"{pod['serviceAccountName']}" == sa.split("/")[1]
        assert any(used in arg for c in pod["containers"] for arg in c.get("args", [])), name
        for verb, group, resource, ns, obj in allowed:
            assert _can(cp, sa, verb, group, resource, ns, obj), (name, verb, resource, ns)
        for verb, group, resource, ns, obj in denied:
            assert not _can(cp, sa, verb, group, resource, ns, obj), (name, "may", verb, resource, ns)
        checked += 1
    assert checked >= 1
    # Every other Job's identity may do nothing with the API: no binding names it.
    bound = {f"{s.get('namespace')}/{s['name']}" for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             for s in d.get("subjects") or []}
    for name, job in jobs.items():
        if name not in JOB_ACCESS:
            sa = f"{job['metadata']['namespace']}/{job['spec']['template']['spec'].get('serviceAccountName', 'default')}"
            assert sa not in bound, name
            assert not _can(cp, sa, "list", "", "pods", job["metadata"]["namespace"]), name


def test_the_two_pickers_never_share_a_node(cluster):
    """minDomains 2: on a system pool down to one node the second replica waits for another."""
    cp, plan, docs = cluster
    pickers = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-epp")]
    if not pickers:
        pytest.skip(f"{plan.stack} has no endpoint picker")
    system = [n["metadata"]["name"] for n in cp.get("nodes", "-l", "cloud.google.com/gke-nodepool=system")["items"]]
    for name in system[1:]:
        cp.kubectl("cordon", name)
    try:
        for d in pickers:
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            cp.kubectl("rollout", "restart", "deployment", name, "-n", ns)
            sel = ",".join(f"{k}={v}" for k, v in d["spec"]["selector"]["matchLabels"].items())
            cp.wait_until(f"{name}'s new pods placed", lambda ns=ns, sel=sel: [
                p for p in cp.get("pods", "-n", ns, "-l", sel)["items"]
                if not p["metadata"].get("deletionTimestamp")])
        time.sleep(3)  # the scheduler's second try for the Pending one
        for d in pickers:
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            sel = ",".join(f"{k}={v}" for k, v in d["spec"]["selector"]["matchLabels"].items())
            pods = [p for p in cp.get("pods", "-n", ns, "-l", sel)["items"]
                    if not p["metadata"].get("deletionTimestamp")]
            nodes = [p["spec"].get("nodeName") for p in pods]
            assert len({n for n in nodes if n}) == len([n for n in nodes if n]), (name, nodes)
    finally:
        for name in system[1:]:
            cp.kubectl("uncordon", name)
        settle(cp, timeout=120)


def test_multi_host_groups_schedule_and_drain_at_their_ceiling(cluster):
    """Each LeaderWorkerSet's groups as its controller makes them (a leader StatefulSet and one of
    workers per group), at the ceiling: every host of every group finds a node of its pool, and every
    node drains with the group's budget (one pod, so one group, at a time) never holding it."""
    cp, plan, docs = cluster
    sets = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    if not sets:
        pytest.skip(f"{plan.stack} runs no multi-host group")
    ceiling = {so["spec"]["scaleTargetRef"]["name"]: so["spec"]["maxReplicaCount"] for so in _scaled(docs)}
    stand_ins = [s for lws in sets for s in group_stand_ins(lws, ceiling[lws["metadata"]["name"]])]
    cp.apply(stand_ins)
    try:
        settle(cp, timeout=120)
        hosts = sum(int(lws["spec"]["leaderWorkerTemplate"]["size"]) * ceiling[lws["metadata"]["name"]] for lws in sets)
        pods = [p for p in cp.get("pods", "-n", "vllm", "-l", "leaderworkerset.sigs.k8s.io/name")["items"]]
        assert len(pods) == hosts and all(p["spec"].get("nodeName") for p in pods)
        group_nodes = sorted({p["spec"]["nodeName"] for p in pods})
        for name in group_nodes:
            _drain(cp, name)
    finally:
        for s in stand_ins:
            cp.kubectl("delete", "statefulset", s["metadata"]["name"], "-n", s["metadata"]["namespace"], check=False)
