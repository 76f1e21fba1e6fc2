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
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import STACKS
from tests.k8s_cluster import (
    CONTROL_PLANE,
    CRD_FILES,
    CRDS,
    ControlPlane,
    apply_stack,
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
        cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
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
        assert d["status"].get("availableReplicas", 0) == so["spec"].get("minReplicaCount", 0), target


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


def test_every_node_drains_through_the_eviction_api(cluster):
    """As GKE's upgrade drains: each node in turn, every PodDisruptionBudget honoured, none holding
    a drain (GKE would wait up to an hour per node, then force it)."""
    cp, plan, docs = cluster
    for node in cp.get("nodes")["items"]:
        name = node["metadata"]["name"]
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
        cp.wait_until(f"{target} at zero", lambda: not [
            p for p in cp.get("pods", "-n", ns)["items"]
            if p["metadata"]["name"].startswith(f"{target}-") and "standby" not in p["metadata"]["name"]])
