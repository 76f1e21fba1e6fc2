"""VllmService: the vLLM Deployment and what keeps it healthy, scaled and scraped."""

from __future__ import annotations

import json

import pytest

from tests.conftest import STACKS, manifests_of, vllm_deployments
from vllm_gke.components.model.specs import ModelSpec, NodePoolSpec, ServingPoolSpec
from vllm_gke.components.model.vllm_server import container_resources, vllm_args
from vllm_gke.components.model.vllm_versions import release
from vllm_gke.components.model.weights_layout import model_dir
from vllm_gke.components.model.weights_mount import claim_mount


def deployment(plan, name, namespace="vllm"):
    return next(m for m in vllm_deployments(plan, namespace) if m["metadata"]["name"] == name)


def test_two_pools_per_model(plans):
    names = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in vllm_deployments(plans["prod"])}
    assert names == {("vllm", f"{m}-{p}") for m in ("llama-70b", "qwen-7b", "llama-8b") for p in ("short", "long")} | {
        ("tenant-analytics", "qwen-7b-short"), ("tenant-analytics", "qwen-7b-long")}


def test_vllm_flags_from_config(plans):
    c = deployment(plans["prod"], "llama-70b-long")["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert args[0] == model_dir(plans["prod"].config.model("llama-70b"))
    pairs = dict(zip(args[1::2], args[2::2]))
    assert pairs["--served-model-name"] == "llama-70b"
    assert pairs["--tensor-parallel-size"] == "8"
    assert pairs["--max-model-len"] == "32768"
    assert pairs["--max-num-seqs"] == "12"
    assert pairs["--max-num-batched-tokens"] == "8192"
    assert pairs["--gpu-memory-utilization"] == "0.9"
    assert {"--enable-chunked-prefill", "--enable-prefix-caching"} <= set(args)
    assert c["command"] == ["python3", "/opt/vllm-gke/serve.py"]
    short = deployment(plans["prod"], "llama-70b-short")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert dict(zip(short[1::2], short[2::2]))["--max-model-len"] == "8192"


def test_quantisation_and_kv_flags():
    model = ModelSpec(name="m", source="hf://a/b", shape="llama-3-8b", node_pool="p", dtype="fp8",
                      kv_cache_dtype="fp8", enable_prefix_caching=False)
    args = vllm_args(model, ServingPoolSpec(), release("0.11.0"))
    assert args[args.index("--quantization") + 1] == "fp8"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert "--no-enable-prefix-caching" in args and "--dtype" not in args
    # 0.34 renamed the off switch; the real parser of each release is checked in test_vllm_flags.
    assert "--disable-prefix-caching" in vllm_args(model, ServingPoolSpec(), release("0.34.0"))


def test_weights_are_mounted_read_only_and_never_downloaded(plans):
    for plan in plans.values():
        for dep in vllm_deployments(plan):
            pod = dep["spec"]["template"]["spec"]
            (claim,) = [v for v in pod["volumes"] if v["name"] == "weights"]
            if plan.config.weights.backend == "filestore":
                share = plan.platform.store.share_identity
                assert claim["persistentVolumeClaim"] == {"claimName": f"model-weights-{share}", "readOnly": True}
            else:
                assert claim["csi"]["readOnly"] is True
            for c in pod["containers"] + pod["initContainers"]:
                # Whoever mounts the weights mounts them read-only; a P/D pool's routing sidecar and front
                # mount nothing.
                for mount in (m for m in c.get("volumeMounts") or [] if m["name"] == claim["name"]):
                    assert mount["readOnly"] is True
            assert any(m["name"] == claim["name"] for m in pod["containers"][0]["volumeMounts"])
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["HF_HUB_OFFLINE"] == "1"
            if plan.config.weights.backend == "gcs":  # the entrypoint waits: tests/test_gcs_weights.py
                assert ".vllm-gke-complete" in env["GKE_LLM_WEIGHTS_MARKERS"] and not pod["initContainers"]
            else:
                wait = pod["initContainers"][0]["command"][-1]
                assert ".vllm-gke-complete" in wait and "GKE_LLM_WEIGHTS_MARKERS" not in env


def test_probes_shm_and_gpu_limits(plans):
    pod = deployment(plans["dev"], "qwen-7b-short")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # Guaranteed QoS: requests equal limits (ephemeral storage, requested only, does not count)
    assert {k: v for k, v in c["resources"]["requests"].items() if k != "ephemeral-storage"} == c["resources"]["limits"]
    assert c["resources"]["requests"]["ephemeral-storage"] == "4Gi"  # compile caches (Filestore: no file cache)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    tp8 = deployment(plans["prod"], "llama-70b-short")["spec"]["template"]["spec"]["containers"][0]
    assert tp8["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_placement_on_mig_slice_and_spot_compute_class(plans):
    dev = deployment(plans["dev"], "qwen-7b-long")["spec"]["template"]["spec"]
    assert dev["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
                                   "cloud.google.com/gke-gpu-partition-size": "3g.20gb",
                                   "cloud.google.com/compute-class": "a100-mig"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in dev["tolerations"]
    prod = deployment(plans["prod"], "llama-70b-short")["spec"]["template"]["spec"]
    assert prod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
                                    "vllm-gke.io/node-pool": "a100-tp8"}


def test_pdb_scaled_object_and_pod_monitoring_per_pool(prod_by_hand):
    """Each pool's own objects, where the plan declares its Service (rollouts off; a Flagger pool's are
    Flagger's: tests/test_flagger_routes.py)."""
    plan = prod_by_hand
    deployments = vllm_deployments(plan)
    for kind in ("PodDisruptionBudget", "ScaledObject", "PodMonitoring", "Service"):
        per_model = [m for m in manifests_of(plan, kind)
                     if m["metadata"]["namespace"] not in ("vllm-gke-limits", "vllm-gke-telemetry", "vllm-gke-slo-metrics")]
        assert len(per_model) == len(deployments), kind
    so = next(h for h in manifests_of(plan, "ScaledObject") if h["metadata"]["name"] == "qwen-7b-short"
              and h["metadata"]["namespace"] == "vllm")["spec"]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (2, 6)
    queue, keep = so["triggers"]
    assert queue["metadata"]["query"].startswith("sum(vllm:num_requests_waiting{")
    assert keep["metadata"]["query"].startswith("clamp_max(sum(vllm:num_requests_running{")
    assert queue["metadata"]["threshold"] == str(plan.config.model("qwen-7b").short.queue_depth_target)
    assert "cooldownPeriod" not in so  # KEDA warns on it for a pool that never goes to zero
    for dep in deployments:
        assert "replicas" not in dep["spec"]  # KEDA owns it; pools with a floor start at one
    pm = manifests_of(plan, "PodMonitoring", "vllm")[0]
    assert pm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    # Every series carries the pod's Deployment and revision (what a Flagger pool's gates compare).
    assert pm["spec"]["targetLabels"]["fromPod"] == [{"from": "vllm-gke.io/workload", "to": "workload"},
                                                     {"from": "vllm-gke.io/revision", "to": "revision"}]


@pytest.mark.parametrize("machine,partition,gpus,cpu,mem", [
    ("a2-highgpu-1g", "3g.20gb", 1, "5", "34Gi"),
    ("a2-highgpu-8g", None, 8, "88", "568Gi"),
])
def test_container_resources_share_the_node(machine, partition, gpus, cpu, mem):
    res = container_resources(NodePoolSpec(name="p", machine_type=machine, gpu_partition_size=partition), gpus)
    assert res["limits"] == {"cpu": cpu, "memory": mem, "nvidia.com/gpu": str(gpus)}


@pytest.mark.parametrize("stack", STACKS)
def test_one_autoscaling_path_and_one_external_metrics_server(plans, stack):
    """KEDA scales every pool; the plan declares no APIService of its own (KEDA's chart registers
    the one v1beta1.external.metrics.k8s.io) and no HPA, and runs no custom metrics adapter,
    whose serving certificate could not be written to its read-only root filesystem."""
    plan = plans[stack]
    assert manifests_of(plan, "APIService") == []
    assert manifests_of(plan, "HorizontalPodAutoscaler") == []
    assert not [d for d in manifests_of(plan, "Deployment") if "metrics-stackdriver-adapter" in json.dumps(d)]
    (release,) = [r.props for r in plan.resources if r.type == "kubernetes:helm.sh/v3:Release"
                  and r.props["chart"] != "flagger"]
    assert release["chart"] == "keda" and release["values"].get("metricsServer", {}).get("enabled", True)


def test_a_guard_without_tenants_is_refused_at_the_component(plans):
    """VllmServiceArgs.guard_config is required: a guard config with no issuers refuses every request."""
    import dataclasses

    from vllm_gke.components.vllm_service import VllmService, VllmServiceArgs

    plan = plans["dev"]
    model = plan.config.models[0]
    args = dict(model=model, pool_name="short", pool=model.short, node_pool=plan.config.pool(model.node_pool),
                namespace="vllm", image=plan.config.server_image, weights=claim_mount("c"), provider=None)
    with pytest.raises(TypeError):
        VllmServiceArgs(**args)  # no default
    assert "guard_config" in {f.name for f in dataclasses.fields(VllmServiceArgs) if f.default is dataclasses.MISSING
                              and f.default_factory is dataclasses.MISSING}
    with pytest.raises(ValueError, match="guard_config has no issuers"):
        VllmService.__init__(object.__new__(VllmService), "x", VllmServiceArgs(**args, guard_config={}))
