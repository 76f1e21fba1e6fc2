"""The swapping models on the real control plane (tests/k8s_cluster.py): the tuned stack's time-shared
L4 pool as one simulated node, shaped and labelled as GKE makes a time-shared node (each GPU offered as
maxSharedClientsPerGpu units), and what the scheduler does with the three servers that share it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.k8s_cluster import CONTROL_PLANE, CRD_FILES, CRDS, ControlPlane, apply_stack, crds_established, gke_nodes
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

SWAPPING = ("qwen-1-5b", "qwen-7b", "mistral-7b")
POOL = "l4-shared"


@pytest.fixture(scope="module")
def tuned() -> Plan:
    return run_program("tuned", read_stack_config("tuned"))


@pytest.fixture(scope="module")
def cluster(tuned) -> Iterator[ControlPlane]:
    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run these")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-swap-")))
    try:
        for name in CRD_FILES:
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        apply_stack(cp, tuned)
        cp.wait_until("the swapping servers placed", lambda: len(_placed(cp)) == len(SWAPPING), timeout=180)
        yield cp
    finally:
        cp.down()


def _servers(cp: ControlPlane) -> list[dict[str, Any]]:
    pods = cp.get("pods", "-n", "vllm")["items"]
    return [p for p in pods if (p["metadata"].get("labels") or {}).get("vllm-gke.io/model") in SWAPPING]


def _placed(cp: ControlPlane) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in _servers(cp) if p["spec"].get("nodeName")}


def test_a_time_shared_node_offers_each_gpu_to_its_clients(tuned):
    (node,) = [n for n in gke_nodes(tuned) if n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == POOL]
    labels = node["metadata"]["labels"]
    assert labels["cloud.google.com/gke-gpu-sharing-strategy"] == "time-sharing"
    assert labels["cloud.google.com/gke-max-shared-clients-per-gpu"] == "3"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "3"  # one L4, three clients


def test_the_three_servers_share_the_one_gpu_node(cluster):
    placed = _placed(cluster)
    assert len(placed) == 3 and len(set(placed.values())) == 1, placed
    (node,) = set(placed.values())
    assert cluster.get("node", node)["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == POOL
    for pod in _servers(cluster):
        (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_fourth_server_waits_for_a_shared_client(cluster):
    """The GPU holds maxSharedClientsPerGpu servers: one more (a second qwen-7b) is not scheduled there."""
    cluster.kubectl("scale", "deployment", "qwen-7b-short", "-n", "vllm", "--replicas=2")
    try:
        cluster.wait_until("a fourth server", lambda: len(_servers(cluster)) == 4, timeout=60)
        pending = [p for p in _servers(cluster) if not p["spec"].get("nodeName")]
        assert len(pending) == 1, [p["metadata"]["name"] for p in pending]
        cluster.wait_until("its FailedScheduling", lambda: any(
            "nvidia.com/gpu" in e["message"] for e in cluster.get(
                "events", "-n", "vllm", "--field-selector",
                f"reason=FailedScheduling,involvedObject.name={pending[0]['metadata']['name']}")["items"]), timeout=60)
    finally:
        cluster.kubectl("scale", "deployment", "qwen-7b-short", "-n", "vllm", "--replicas=1")
