"""The system pool holds what may run there at once (tests/test_on_cluster.py schedules it for real)."""

from __future__ import annotations

import pytest

from vllm_gke.components.model.node_shapes import cpu_reserved_m, memory_reserved_mi, node_shape
from vllm_gke.infra.config import ConfigError
from vllm_gke.infra.system_pool import check_system_pool, system_demand


def test_allocatable_follows_gkes_reservations():
    # GKE's plan-node-sizes page: an e2-standard-4 node reports 3920m allocatable CPU.
    assert node_shape("e2-standard-4", 100).alloc_cpu_m == 3920
    assert cpu_reserved_m(96) == 60 + 10 + 10 + 230  # 6%, 1%, 0.5% x 2, 0.25% x 92
    # 25% of 4 GiB + 20% of 4 + 10% of 8 + 6% of 112 + 2% of 32, plus the 100 MiB eviction threshold
    assert memory_reserved_mi(160) == round((1 + 0.8 + 0.8 + 6.72 + 0.64) * 1024) + 100
    mig = node_shape("a2-highgpu-1g", 200, slices_per_gpu=2)
    assert (mig.devices, mig.device_resource) == (2, "nvidia.com/gpu")


def test_staging_loaders_beside_the_picker_need_more_than_one_system_node(plans):
    """The defect as found: staging's loader re-run found no CPU on its one e2-standard-4 (the
    config now also refuses a picker on one system node: tests/test_config_rules.py)."""
    with pytest.raises(ConfigError) as err:
        check_system_pool("e2-standard-4", 1, plans["staging"].manifests())
    (issue,) = err.value.issues
    assert issue.key == "vllm-gke:cluster.systemMaxNodes"
    # the picker's two replicas, its tokenizer's two (the render server, its own Deployment), the
    # standby and KEDA stay; a 2-CPU loader beside them never starts
    assert "Deployment vllm/llama-8b-router-epp 2000m, Deployment vllm/llama-8b-render 2000m" in issue.problem
    assert "the largest pod that comes and goes (" in issue.problem and "would never start" in issue.problem
    check_system_pool("e2-standard-4", 3, plans["staging"].manifests())  # more nodes hold it


def test_loaders_queue_but_one_too_large_for_any_node_is_refused(plan_variant):
    """Loaders come and go: ten of them queue on one node; one larger than a node never starts."""
    def many_models(values):
        base = values["vllm-gke:models"][0]
        values["vllm-gke:models"] += [{**base, "name": f"qwen-{i}"} for i in range(3)]
        values["vllm-gke:nodePools"][0]["maxNodes"] = 4
        values["vllm-gke:weights"]["capacityGb"] = 4096

    plan_variant("dev", many_models)  # four loaders on one e2-standard-4: they take turns

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "big", "namespace": "x"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {
               "requests": {"cpu": "4", "memory": "1Gi"}}}]}}}}
    with pytest.raises(ConfigError) as err:
        check_system_pool("e2-standard-4", 10, [job])  # ten nodes, but no one node holds 4 CPUs
    (issue,) = err.value.issues
    assert issue.key == "vllm-gke:cluster.systemMachineType" and "would never start" in issue.problem


def test_demand_counts_surges_sidecars_and_charts(plans):
    rows = {r.what: r for r in system_demand(plans["staging"].manifests())}
    picker = rows["Deployment vllm/llama-8b-router-epp"]
    assert (picker.pods, picker.steady) == (2, True)
    assert picker.cpu_m == 1000  # outside the mesh (label sidecar.istio.io/inject: "false"): no sidecar
    standby = rows["Deployment vllm/mistral-7b-long-standby"]
    assert standby.cpu_m == 50 + 100  # the standby and its mesh sidecar (Istio's default requests)
    surge = rows["Deployment vllm/llama-8b-router-epp (surge)"]
    assert (surge.pods, surge.steady) == (2, False)  # maxSurge 100%: both new pods at once
    render = rows["Deployment vllm/llama-8b-render"]  # precise prefix scoring's tokenizer, outside the mesh
    assert (render.pods, render.cpu_m, render.steady) == (2, 1000, True)
    assert rows["Deployment vllm/llama-8b-render (surge)"].pods == 1
    assert not rows["Job vllm-gke-system/load-llama-8b"].steady
    assert {"KEDA operator", "KEDA metrics server", "KEDA webhooks"} <= set(rows)
    assert "LeaderWorkerSet controller" not in rows  # staging runs no group
    assert "LeaderWorkerSet controller" in {r.what for r in system_demand(plans["frontier"].manifests())}
