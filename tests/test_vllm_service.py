"""VllmService: the vLLM Deployment and what keeps it healthy, scaled and scraped."""

from __future__ import annotations

from vllm_gke.components.vllm_versions import release

import pytest

from vllm_gke.components.specs import ModelSpec, NodePoolSpec, ServingPoolSpec
from vllm_gke.components.vllm_service import QUEUE_METRIC, container_resources, vllm_args
from tests.conftest import manifests_of, vllm_deployments


def deployment(plan, name, namespace="vllm"):
    return next(m for m in vllm_deployments(plan, namespace) if m["metadata"]["name"] == name)


def test_two_pools_per_model(plans):
    names = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in vllm_deployments(plans["prod"])}
    assert names == {("vllm", f"{m}-{p}") for m in ("llama-70b", "qwen-7b", "llama-8b") for p in ("short", "long")} | {
        ("tenant-analytics", "qwen-7b-short"), ("tenant-analytics", "qwen-7b-long"),
        ("vllm", "llama-8b-canary-short"), ("vllm", "llama-8b-canary-long")}


def test_vllm_flags_from_config(plans):
    c = deployment(plans["prod"], "llama-70b-long")["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert args[0] == "/models/llama-70b/main"
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
                assert claim["persistentVolumeClaim"] == {"claimName": "model-weights", "readOnly": True}
            else:
                assert claim["csi"]["readOnly"] is True
            for c in pod["containers"] + pod["initContainers"]:
                mount = next(m for m in c["volumeMounts"] if m["name"] == claim["name"])
                assert mount["readOnly"] is True
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["HF_HUB_OFFLINE"] == "1"
            wait = pod["initContainers"][0]["command"][-1]
            assert ".vllm-gke-complete" in wait


def test_probes_shm_and_gpu_limits(plans):
    pod = deployment(plans["dev"], "qwen-7b-short")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"] == c["resources"]["limits"]
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


def test_pdb_hpa_and_pod_monitoring_per_pool(plans):
    plan = plans["prod"]
    deployments = vllm_deployments(plan)
    for kind in ("PodDisruptionBudget", "HorizontalPodAutoscaler", "PodMonitoring", "Service"):
        per_model = [m for m in manifests_of(plan, kind)
                     if m["metadata"]["namespace"] not in ("custom-metrics", "vllm-gke-limits")]
        assert len(per_model) == len(deployments), kind
    hpa = next(h for h in manifests_of(plan, "HorizontalPodAutoscaler") if h["metadata"]["name"] == "qwen-7b-short"
               and h["metadata"]["namespace"] == "vllm")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == QUEUE_METRIC == "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
    for dep in deployments:
        assert "replicas" not in dep["spec"]  # the HPA owns it
    pm = manifests_of(plan, "PodMonitoring")[0]
    assert pm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]


@pytest.mark.parametrize("machine,partition,gpus,cpu,mem", [
    ("a2-highgpu-1g", "3g.20gb", 1, "5", "34Gi"),
    ("a2-highgpu-8g", None, 8, "88", "568Gi"),
])
def test_container_resources_share_the_node(machine, partition, gpus, cpu, mem):
    res = container_resources(NodePoolSpec(name="p", machine_type=machine, gpu_partition_size=partition), gpus)
    assert res["limits"] == {"cpu": cpu, "memory": mem, "nvidia.com/gpu": str(gpus)}


def test_hpa_metric_is_served_by_the_metrics_adapter(plans):
    plan = plans["dev"]
    apis = {a["metadata"]["name"]: a["spec"] for a in manifests_of(plan, "APIService")}
    assert set(apis) == {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io",
                         "v1beta1.external.metrics.k8s.io"}
    assert all(a["service"] == {"name": "custom-metrics-stackdriver-adapter", "namespace": "custom-metrics"}
               for a in apis.values())
    (sa,) = [s for s in manifests_of(plan, "ServiceAccount", "custom-metrics")]
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].startswith("vllm-dev-metrics@")
    binding = next(b for b in manifests_of(plan, "ClusterRoleBinding") if b["metadata"]["name"] == "external-metrics-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler",
                                    "namespace": "kube-system"}]
