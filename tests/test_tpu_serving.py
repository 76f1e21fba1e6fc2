"""TPU serving: node pools of TPU hosts and slices, vLLM's TPU build on them, capacity per
chip, TPU list prices, TPU charts - the rest (weights, routing, tenants, guard) as on GPUs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import manifests_of, props_of
from tests.test_config import issues
from vllm_gke.components.model.capacity import pool_capacity
from vllm_gke.components.model.cold_start import (
    ENGINE_START_S,
    IMAGE_START_S,
    RAY_JOIN_S,
    cold_start_seconds,
    read_mib_s,
    xla_compile_seconds,
)
from vllm_gke.components.model.serving_pool import startup_failure_threshold
from vllm_gke.components.model.specs import ModelSpec, NodePoolSpec
from vllm_gke.components.model.specs.models import CustomShape
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import (
    RAY_HEALTH_ENV,
    XLA_CACHE_DIR,
    XLA_CACHE_ENV,
    XLA_CACHE_HOST_ROOT,
    XLA_CACHE_MAX_ENV,
    XLA_CACHE_MAX_GI,
)
from vllm_gke.components.model.vllm_versions import TPU_RELEASES
from vllm_gke.infra.cost import cost_report

NODE_POOL = "gcp:container/nodePool:NodePool"


def _pools(plan) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in props_of(plan, NODE_POOL)}


def _server(plan, name: str) -> dict[str, Any]:
    (dep,) = [d for d in manifests_of(plan, "Deployment") if d["metadata"]["name"] == name]
    return dep


def test_tpu_pools_are_zonal_tainted_and_multi_host_slices_are_compact(plans):
    pools = _pools(plans["frontier"])
    single, multi = pools["v6e-single"], pools["v6e-4x4"]
    for pool in (single, multi):
        assert "guestAccelerators" not in pool["nodeConfig"]  # the machine type carries the chips
        assert pool["nodeLocations"] == ["us-east5-b"]
        assert {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"} in pool["nodeConfig"]["taints"]
        # TPU VMs boot from Hyperdisk Balanced on v6e (no pd-ssd; storage-options-compute).
        assert pool["nodeConfig"]["diskType"] == "hyperdisk-balanced"
    assert single["nodeConfig"]["machineType"] == "ct6e-standard-1t" and "placementPolicy" not in single
    # A 4x4 slice of 4-chip hosts: four nodes made, repaired and scaled as one.
    assert multi["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert multi["autoscaling"]["maxNodeCount"] == 4 and multi["autoscaling"]["minNodeCount"] == 0
    # GPU pools keep pd-ssd; v5e and v5p hosts take Balanced PD.
    assert pools["h100-hosts"]["nodeConfig"]["diskType"] == "pd-ssd"
    assert NodePoolSpec(name="p", machine_type="ct5lp-hightpu-4t").machine.boot_disk_type == "pd-balanced"


def test_the_tpu_model_runs_the_tpu_build_on_its_chips(plans):
    cfg = plans["frontier"].config
    dep = _server(plans["frontier"], "llama-8b-tpu-short")
    pod = dep["spec"]["template"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    assert cfg.tpu_server_image is not None and vllm["image"] == cfg.tpu_server_image.uri
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "1x1"
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    limits, requests = vllm["resources"]["limits"], vllm["resources"]["requests"]
    assert limits["google.com/tpu"] == requests["google.com/tpu"] == "1" and "nvidia.com/gpu" not in limits
    # Its command line parses with the TPU build's real parser, the guard loaded as on GPUs.
    assert check_argv(vllm["args"], load_snapshot(TPU_RELEASES[cfg.tpu_vllm_version].snapshot)) == []
    assert vllm["args"][vllm["args"].index("--middleware") + 1] == "vllm_gke_guard.GuardMiddleware"
    # The GPU model beside it keeps the CUDA image.
    (group,) = [d for d in manifests_of(plans["frontier"], "LeaderWorkerSet") if d["metadata"]["name"].startswith("llama-405b")]
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["image"] == cfg.server_image.uri


def test_the_tpu_build_snapshot_is_vllm_with_the_same_serving_surface():
    tpu, cuda = load_snapshot("tpu-0.32.0"), load_snapshot("0.34.0")
    assert tpu["build"] == "tpu" and tpu["version"] == "0.32.0"
    assert {r["path"] for r in tpu["routes"]} == {r["path"] for r in cuda["routes"]}
    rel = TPU_RELEASES["0.32.0"]
    metrics = {m["name"] for m in tpu["metrics"]}
    assert {rel.queue_metric, rel.running_metric, rel.kv_cache_metric} <= metrics
    for flag in (rel.disable_prefix_caching, rel.disable_chunked_prefill, rel.shutdown_timeout_flag,
                 rel.histogram_buckets_flag, "--otlp-traces-endpoint", "--middleware"):
        assert flag in tpu["flags"], flag
    # 0.32's off switches are --no-enable-*, not 0.34's --disable-*.
    assert "--disable-prefix-caching" not in tpu["flags"]


def test_extra_args_are_checked_by_the_parser_of_the_build_that_runs_them(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    by_name = {m["name"]: m for m in values["vllm-gke:models"]}
    # A 0.34 flag: fine on the H100 model, refused on the TPU one (0.32's parser lacks it).
    by_name["llama-405b"]["extraArgs"] = ["--max-num-inflight-kv-loads=2"]
    by_name["llama-8b-tpu"]["extraArgs"] = ["--max-num-inflight-kv-loads=2"]
    found = issues(values)
    assert len(found) == 1 and found[0].startswith("vllm-gke:models[llama-8b-tpu].extraArgs:")
    assert "vLLM TPU 0.32.0's parser" in found[0]


def test_a_tpu_model_needs_the_tpu_image_built_on_the_tpu_release(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    del values["vllm-gke:tpuServerImage"]
    (msg,) = issues(values)
    assert msg.startswith("vllm-gke:tpuServerImage:") and "v6e-single" in msg and "VLLM_IMAGE=vllm/vllm-tpu" in msg
    values = copy.deepcopy(stack_values["frontier"])
    values["vllm-gke:tpuServerImage"]["tag"] = "v0.34.0-gke.1"
    (msg,) = issues(values)
    assert msg.startswith("vllm-gke:tpuServerImage.tag:") and "vLLM TPU 0.32.0" in msg


@pytest.mark.parametrize("change,key,words", [
    (lambda p: p.update(tpuTopology="3x3"), "nodePools[v6e-4x4]", ("3x3", "2x2, 2x4, 4x4")),
    (lambda p: p.update(maxNodes=8), "nodePools[v6e-4x4]", ("maxNodes to 4", "minNodes to 0 or 4")),
    (lambda p: p.update(tpuZone="us-east5-c"), "nodePools[v6e-4x4].tpuZone", ("us-east5-c", "cluster's zones")),
    (lambda p: p.update(gpuPartitionSize="1g.10gb"), "nodePools[v6e-4x4].gpuPartitionSize", ("tpu-v6e-slice",)),
])
def test_bad_tpu_pools_are_refused_with_the_key_and_the_fix(stack_values, change, key, words):
    values = copy.deepcopy(stack_values["frontier"])
    change(next(p for p in values["vllm-gke:nodePools"] if p["name"] == "v6e-4x4"))
    found = issues(values)
    assert any(i.startswith(f"vllm-gke:{key}") and all(w in i for w in words) for i in found), found


def test_a_tpu_replica_takes_its_whole_slice(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-tpu")
    model["tensorParallelSize"] = 8
    found = issues(values)
    assert any(i.startswith("vllm-gke:models[llama-70b-tpu].tensorParallelSize:") and "4x4 slice of 16" in i
               and "set tensorParallelSize to 16" in i for i in found), found
    model["tensorParallelSize"], model["pipelineParallelSize"] = 8, 2
    found = issues(values)
    assert any(i.startswith("vllm-gke:models[llama-70b-tpu].pipelineParallelSize:") for i in found), found


def test_a_tpu_pool_that_does_not_fit_says_what_helps_on_tpus(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-tpu")
    model["short"]["maxNumSeqs"] = 64
    (msg,) = issues(values)
    assert msg.startswith("vllm-gke:models[llama-70b-tpu].short:") and "larger slice (tpuTopology" in msg
    assert "MIG" not in msg


def test_tpu_capacity_is_per_chip():
    model = ModelSpec(name="m", source="hf://a/b", shape="llama-3-70b", node_pool="p", tensor_parallel_size=8,
                      max_model_len=4096)
    v6e = pool_capacity(model, "short", model.short, NodePoolSpec(name="p", machine_type="ct6e-standard-8t"))
    assert v6e.gpu_memory_gb == 32 and v6e.weights_per_gpu_gb == pytest.approx(70.6 * 2 / 8)
    assert v6e.accelerator == "tpu-v6e-slice" and v6e.devices == 8 and v6e.hosts == 1
    # v5p: its two TensorCores are one megacore JAX device with the chip's 95 GB (tpu-inference
    # utils.py:278-296), so a 4-chip host is 4 devices and a pod asks for 4 chips.
    v5p_pool = NodePoolSpec(name="p", machine_type="ct5p-hightpu-4t")
    v5p = pool_capacity(model.model_copy(update={"tensor_parallel_size": 4}), "short", model.short, v5p_pool)
    assert v5p.gpu_memory_gb == 95 and v5p_pool.slices_per_node == 4
    from vllm_gke.components.model.vllm_server import container_resources

    assert container_resources(v5p_pool, 4)["limits"]["google.com/tpu"] == "4"


def test_tpu_hosts_are_priced_by_their_chips(plans):
    report = cost_report(plans["frontier"].config, "ZONAL", 1280)
    pools = {p.pool: p for p in report.pools}
    assert pools["v6e-single"].hour_price == pytest.approx(2.70)
    assert pools["v6e-4x4"].hour_price == pytest.approx(10.80)
    # One always-on v6e chip at baseline; the 4x4 slice and the H100s are at zero.
    assert (pools["v6e-single"].baseline_nodes, pools["v6e-4x4"].baseline_nodes, pools["h100-hosts"].baseline_nodes) \
        == (1, 0, 0)
    assert report.throughput_source == "roofline" and report.baseline_tokens_per_second > 0


def test_gptq_is_refused_on_tpus_and_tensor_parallelism_must_fit_the_kv_heads(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    next(m for m in values["vllm-gke:models"] if m["name"] == "llama-8b-tpu")["dtype"] = "gptq"
    assert any(i.startswith("vllm-gke:models[llama-8b-tpu].dtype:") and "gptq" in i for i in issues(values))
    problems: list[str] = []
    from vllm_gke.components.model.config_rules import check_fit

    # 2 KV heads over 4 ranks are replicated (12 query heads split): fine; 6 over 4 cannot be split: refused.
    replicated = ModelSpec(name="m", source="hf://a/b", shape="qwen2.5-1.5b", node_pool="p", tensor_parallel_size=4)
    check_fit(lambda k, p: problems.append(f"{k}: {p}"), "m", replicated,
              NodePoolSpec(name="p", machine_type="a3-highgpu-8g"))
    assert problems == []
    custom = ModelSpec(name="m", source="hf://a/b", node_pool="p", tensor_parallel_size=4,
                       shape=CustomShape(params_billion=7, layers=28, kv_heads=6, head_dim=128))
    check_fit(lambda k, p: problems.append(f"{k}: {p}"), "m", custom, NodePoolSpec(name="p", machine_type="a3-highgpu-8g"))
    assert any("6 KV heads" in p for p in problems), problems
    # Qwen2.5 7B's 28 query heads do not split 8 ways (vLLM refuses): refused here too.
    problems.clear()
    qwen_7b = ModelSpec(name="m", source="hf://a/b", shape="qwen2.5-7b", node_pool="p", tensor_parallel_size=8)
    check_fit(lambda k, p: problems.append(f"{k}: {p}"), "m", qwen_7b, NodePoolSpec(name="p", machine_type="a3-highgpu-8g"))
    assert any("28 attention heads" in p for p in problems), problems


def test_the_dashboard_charts_tpus_only_where_models_run_on_them(plans):
    def titles(plan) -> set[str]:
        board = plan.platform.observability.dashboard_definition
        return {t["widget"]["title"] for t in board["mosaicLayout"]["tiles"]}

    assert "TPU TensorCore utilisation (%)" in titles(plans["frontier"])
    board = plans["frontier"].platform.observability.dashboard_definition
    queries = [d["timeSeriesQuery"].get("prometheusQuery", "") for t in board["mosaicLayout"]["tiles"]
               for d in t["widget"]["xyChart"]["dataSets"] if "TPU" in t["widget"]["title"]]
    # The accelerator metric types carry the GPUs' too: only the TPUs' are charted.
    assert queries and all('make="cloud-tpu"' in q for q in queries)
    assert "TPU HBM bandwidth utilisation (%)" in titles(plans["frontier"])
    assert not any("TPU" in t for t in titles(plans["prod"]))

    assert not plans["prod"].config.has_tpu_models and plans["frontier"].config.has_tpu_models


def test_the_readmes_options_table_is_what_the_plan_prints(plans):
    """The README's rows for the frontier 70B are the options table's (a stale figure fails)."""
    import re

    from tests.conftest import REPO_ROOT
    from vllm_gke.infra.accelerator_options import model_options, stack_options
    from vllm_gke.infra.report import verdicts

    plan = plans["frontier"]
    cfg = plan.config
    options = {(o.accelerator, False): o for o in model_options(cfg.model("llama-70b-tpu"))}
    options |= {(o.accelerator, True): o for o in stack_options(cfg, verdicts(plan).cost.replicas)
                if o.model == "llama-70b-tpu"}
    rows = re.findall(r"^\| (\S+)( \(this stack\))? \| (.+?) \| (\d+) x (\d+) \| (\d+) \| ([\d,]+) \| ([\d.]+) \| "
                      r"([\d.]+) \|$", (REPO_ROOT / "README.md").read_text(), re.M)
    assert len(rows) >= 3 and sum(bool(r[1]) for r in rows) == 1
    for acc, here, machine, tp, pp, hosts, tps, usd_h, usd_m in rows:
        o = options[(acc, bool(here))]
        assert (o.machine_type + (f" {o.topology}" if o.topology else ""), o.tensor_parallel, o.pipeline_parallel,
                o.hosts) == (machine, int(tp), int(pp), int(hosts))
        assert f"{o.tokens_per_second:,.0f}" == tps and f"{o.usd_per_hour:.2f}" == usd_h
        assert f"{o.usd_per_million_tokens(cfg.cost.target_utilization):.2f}" == usd_m


def test_a_tpu_start_budgets_the_xla_compile_and_the_ray_joins(plans):
    """A TPU replica's probe waits for the weights, the engine, the XLA compile and, across hosts, the
    Ray joins; a GPU replica's for the first two alone."""
    cfg = plans["frontier"].config

    def base(model):
        return IMAGE_START_S + (model.weights_gb + model.lora_gb()) * 1e9 / (read_mib_s(cfg) * 1024 ** 2) + ENGINE_START_S

    one, group, gpu = (cfg.model(n) for n in ("llama-8b-tpu", "llama-70b-tpu", "llama-405b"))
    assert cold_start_seconds(cfg, one) == pytest.approx(base(one) + xla_compile_seconds(one))
    assert cold_start_seconds(cfg, group) == pytest.approx(base(group) + xla_compile_seconds(group) + RAY_JOIN_S)
    assert cold_start_seconds(cfg, gpu) == pytest.approx(base(gpu))
    # at least 10 minutes; the 70B's 141 GB about half an hour (tpu-inference's 90 min for ~400 GB)
    assert xla_compile_seconds(one) == 600 and 1500 < xla_compile_seconds(group) < 2100
    docs = {d["metadata"]["name"]: d for d in plans["frontier"].manifests() if d["kind"] == "LeaderWorkerSet"}
    leader = docs["llama-70b-tpu-short-group"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    probe = leader["containers"][0]["startupProbe"]
    assert probe["failureThreshold"] == startup_failure_threshold(cold_start_seconds(cfg, group))
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 1.5 * cold_start_seconds(cfg, group)


def test_the_xla_cache_outlives_a_recreated_group(plans):
    """vLLM TPU's compile cache (VLLM_XLA_CACHE_PATH) is on the node, not the pod's home emptyDir that a
    recreated group loses; every TPU pod of a group (leader and workers) mounts it, no GPU pod does. Each
    serving pool has its own directory under its namespace (no pod can plant executables another pool
    or tenant loads), bounded so JAX evicts and locks."""
    plan = plans["frontier"]
    dirs: dict[str, str] = {}
    for d in plan.manifests():
        if d["kind"] == "LeaderWorkerSet":
            group = d["spec"]["leaderWorkerTemplate"]
            pods = [group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]]
        elif d["kind"] == "Deployment" and (d["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "vllm":
            pods = [d["spec"]["template"]["spec"]]
        else:
            continue
        for pod in pods:
            c = pod["containers"][0]
            env = {e["name"]: e.get("value") for e in c["env"]}
            host = [v["hostPath"] for v in pod["volumes"] if "hostPath" in v]
            if "google.com/tpu" in c["resources"]["limits"]:
                assert env[XLA_CACHE_ENV] == XLA_CACHE_DIR
                assert env[XLA_CACHE_MAX_ENV] == str(XLA_CACHE_MAX_GI * 1024 ** 3)
                pool = d["metadata"]["name"].removesuffix("-group")
                path = f"{XLA_CACHE_HOST_ROOT}/{d['metadata']['namespace']}/{pool}"
                assert host == [{"path": path, "type": "DirectoryOrCreate"}]
                assert {"name": "xla-cache", "mountPath": XLA_CACHE_DIR} in c["volumeMounts"]
                dirs[d["metadata"]["name"]] = path
            else:
                assert XLA_CACHE_ENV not in env and host == []
    # The 8B's short and long pools and the 70B's group: three directories, none shared.
    assert len(set(dirs.values())) == len(dirs) == 3, dirs


def test_a_tpu_group_tells_ray_not_to_call_a_compiling_host_dead(plans):
    docs = {d["metadata"]["name"]: d for d in plans["frontier"].manifests() if d["kind"] == "LeaderWorkerSet"}
    group = docs["llama-70b-tpu-short-group"]["spec"]["leaderWorkerTemplate"]
    for pod in (group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        settings = {k: int(env[k]) for k, _ in RAY_HEALTH_ENV}
        # dead only after 10 minutes of missed checks at the least (Ray's default: 20 s)
        assert settings["RAY_health_check_failure_threshold"] * settings["RAY_health_check_period_ms"] >= 600_000
    gpu = docs["llama-405b-short-group"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert not any(e["name"].startswith("RAY_") for e in gpu["containers"][0]["env"])


def test_a_tpu_nodes_disk_holds_each_serving_pools_xla_cache(stack_values):
    """A TPU node keeps one bounded XLA cache directory per serving pool that ran on it (a hostPath no pod
    requests): frontier's v6e-single, with the assistant tenant's own copy of the 8B beside the shared one,
    holds four (short and long of each), 40 GiB beside a replica's 4 GiB of scratch."""
    from vllm_gke.infra.config import parse

    values = copy.deepcopy(stack_values["frontier"])
    pool = next(p for p in values["vllm-gke:nodePools"] if p["name"] == "v6e-single")
    pool.update(maxNodes=8, diskSizeGb=100)  # 40 GB for pods
    assistant = next(t for t in values["vllm-gke:tenants"] if t["name"] == "assistant")
    assistant["dedicated"] = {"models": ["llama-8b-tpu"], "nodePool": "v6e-single"}
    (msg,) = issues(values)
    assert msg.startswith("vllm-gke:nodePools[v6e-single].diskSizeGb")
    assert f"plus {4 * XLA_CACHE_MAX_GI} GiB for the XLA caches of its 4 serving pools" in msg
    assert "raise diskSizeGb to 104 or more" in msg
    pool["diskSizeGb"] = 104
    parse(values)
