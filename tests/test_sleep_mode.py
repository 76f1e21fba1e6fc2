"""Model swapping on a time-shared GPU (models[].sleepMode, nodePools[].gpuSharing): the config
rules, the node pool GKE builds, the pods' placement and flags, and the plan's figures."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, props_of, vllm_deployments
from vllm_gke.components.model import sleep_mode
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import vllm_args
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

SWAPPING = ("qwen-1-5b", "qwen-7b", "mistral-7b")


@pytest.fixture(scope="module")
def tuned_values() -> dict[str, Any]:
    return read_stack_config("tuned")


@pytest.fixture(scope="module")
def tuned(tuned_values) -> Plan:
    return run_program("tuned", copy.deepcopy(tuned_values))


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


def shared_pool(values: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in values["vllm-gke:nodePools"] if p["name"] == "l4-shared")


def model(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in values["vllm-gke:models"] if m["name"] == name)


def test_the_tuned_stack_swaps_three_models_on_one_shared_l4(tuned_values):
    cfg = parse(copy.deepcopy(tuned_values))
    pool = cfg.pool("l4-shared")
    assert pool.gpu_sharing is not None and pool.gpu_sharing.max_shared_clients_per_gpu == 3
    assert pool.slices_per_node == 3  # GKE advertises each shared client as one nvidia.com/gpu
    assert [m.name for m in cfg.models if m.sleep_mode] == list(SWAPPING)


def test_a_shared_pool_declares_gke_time_sharing(tuned):
    pools = {p["name"]: p for p in props_of(tuned, "gcp:container/nodePool:NodePool")}
    (acc,) = pools["l4-shared"]["nodeConfig"]["guestAccelerators"]
    assert acc["gpuSharingConfig"] == {"gpuSharingStrategy": "TIME_SHARING", "maxSharedClientsPerGpu": 3}
    (h100,) = pools["h100"]["nodeConfig"]["guestAccelerators"]
    assert "gpuSharingConfig" not in h100


def test_sleeping_servers_select_shared_nodes_and_enable_sleep_mode(tuned):
    by_model = {d["metadata"]["labels"].get("app.kubernetes.io/instance", d["metadata"]["name"]): d
                for d in vllm_deployments(tuned)}
    swapping = [d for d in vllm_deployments(tuned) if any(n in d["metadata"]["name"] for n in SWAPPING)]
    assert len(swapping) == 3, sorted(by_model)
    for dep in swapping:
        pod = dep["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["cloud.google.com/gke-gpu-sharing-strategy"] == "time-sharing"
        assert pod["nodeSelector"]["cloud.google.com/gke-max-shared-clients-per-gpu"] == "3"
        (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
        assert "--enable-sleep-mode" in vllm["args"]
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
        env = {e["name"]: e for e in vllm["env"]}
        assert env[sleep_mode.NODE_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env[sleep_mode.HOLDER_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        guard = json.loads(env["GKE_LLM_GUARD_CONFIG"]["value"])
        assert guard["swap"]["level"] in (1, 2) and guard["globalLimits"]["host"]
    plain = [d for d in vllm_deployments(tuned) if d["metadata"]["name"].startswith("llama-70b-short")]
    for dep in plain:
        (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        assert "--enable-sleep-mode" not in vllm["args"]
        assert "swap" not in json.loads(next(e["value"] for e in vllm["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG"))


PARSE = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.config import ModelConfig
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
print(json.dumps({"sleep": args.enable_sleep_mode,
                  "backend": ModelConfig.__dataclass_fields__["sleep_mode_backend"].default}))
"""


def test_the_argv_parses_with_vllm_0_34(tuned_values):
    """--enable-sleep-mode in the release's parser snapshot, and read by the real parser as sleep mode
    on, with the cumem backend by default."""
    cfg = parse(copy.deepcopy(tuned_values))
    m = next(m for m in cfg.models if m.name == "qwen-7b")
    argv = vllm_args(m, m.short)
    assert "--enable-sleep-mode" in argv and check_argv(argv, load_snapshot("0.34.0")) == []
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the sleep-mode flag against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    out = subprocess.run([python, "-c", PARSE, json.dumps(argv)], capture_output=True, text=True, cwd=REPO_ROOT,
                         env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"sleep": True, "backend": "cumem"}


def test_sleep_mode_needs_a_shared_pool(tuned_values):
    values = copy.deepcopy(tuned_values)
    del shared_pool(values)["gpuSharing"]
    found = problems(values)
    assert any("models[qwen-7b].sleepMode" in p and "no gpuSharing" in p for p in found), found


def test_every_model_on_a_shared_pool_sleeps(tuned_values):
    values = copy.deepcopy(tuned_values)
    del model(values, "qwen-7b")["sleepMode"]
    found = problems(values)
    assert any("models[qwen-7b].sleepMode" in p and "isolates no memory" in p for p in found), found


def test_a_shared_pool_has_one_gpu_per_node(tuned_values):
    values = copy.deepcopy(tuned_values)
    shared_pool(values)["machineType"] = "g2-standard-24"  # two L4s
    found = problems(values)
    assert any("nodePools[l4-shared].machineType" in p and "2 GPUs" in p for p in found), found


def test_the_lease_needs_the_limit_store(tuned_values):
    values = copy.deepcopy(tuned_values)
    values["vllm-gke:globalLimits"] = {"enabled": False}
    found = problems(values)
    assert any("globalLimits.enabled" in p and "lease" in p for p in found), found


def test_level_1_counts_the_sleeping_weights_against_the_node_memory(tuned_values):
    values = copy.deepcopy(tuned_values)
    shared_pool(values)["machineType"] = "g2-standard-16"  # 64 GB over 3 clients: 16 GiB a pod
    found = problems(values)
    assert any("models[qwen-7b].sleepMode.level" in p and "use level 2" in p for p in found), found
    assert not any("models[mistral-7b].sleepMode.level" in p for p in found), found  # level 2 holds none
    assert not any("models[qwen-1-5b].sleepMode.level" in p for p in found), found


def test_the_awake_model_fits_beside_the_sleeping_ones_residue(tuned_values):
    values = copy.deepcopy(tuned_values)
    model(values, "qwen-1-5b")["gpuMemoryUtilization"] = 0.9
    found = problems(values)
    # 24 GB: 0.9 of it, the awake server's own baseline and two sleepers' residue (1 GB each) do not fit.
    assert any("models[qwen-1-5b].gpuMemoryUtilization" in p and "0.87 or less" in p and "baseline" in p
               for p in found), found


def test_a_time_shared_pool_of_mig_partitions_is_refused(tuned_values):
    values = copy.deepcopy(tuned_values)
    values["vllm-gke:nodePools"].append({"name": "a100-mig", "machineType": "a2-highgpu-1g",
                                         "gpuPartitionSize": "1g.5gb", "gpuSharing": {"maxSharedClientsPerGpu": 2}})
    found = problems(values)
    assert any(".gpuPartitionSize" in p and "serialise" in p for p in found), found


def test_the_lease_outlives_the_pools_slowest_wake(tuned, tuned_values):
    cfg = parse(copy.deepcopy(tuned_values))
    slowest = max(sleep_mode.wake_seconds(cfg, m) for m in cfg.models if m.sleep_mode)
    want = sleep_mode.lease_seconds(cfg, "l4-shared")
    assert want >= slowest * sleep_mode.LEASE_MARGIN and want > sleep_mode.LEASE_SECONDS
    leases = {}
    for d in vllm_deployments(tuned):
        (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        guard = json.loads(next(e["value"] for e in c["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG"))
        if guard.get("swap"):
            leases[d["metadata"]["name"]] = guard["swap"]["leaseSeconds"]
    assert len(leases) == len(SWAPPING) and set(leases.values()) == {want}, leases


def test_the_plan_warns_when_a_wake_nears_the_wait(tuned_values):
    values = copy.deepcopy(tuned_values)
    text = "\n".join(sleep_mode.swap_lines(parse(copy.deepcopy(values))))
    assert "warning" not in text and "waits up to 120 s for its turn" in text
    model(values, "mistral-7b")["sleepMode"] = {"level": 2, "waitSeconds": 60}
    text = "\n".join(sleep_mode.swap_lines(parse(values)))
    assert "warning: mistral-7b wakes in ~" in text and "near its waitSeconds 60" in text and "level 1" in text


def test_the_package_vllm_service_refuses_sleep_mode_without_its_store_or_on_mig():
    from vllm_gke.components.provider import VllmService
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import read_stack_config, run_program

    model = {"name": "small", "source": "hf://Qwen/Qwen2.5-1.5B-Instruct", "shape": "qwen2.5-1.5b",
             "node_pool": "mig", "sleep_mode": {"level": 1}}
    args: Any = {"model": model, "pool_name": "short", "namespace": "vllm", "claim_name": "weights", "kubeconfig": "kc",
                 "project": "p", "node_pool": {"name": "mig", "machine_type": "a2-highgpu-1g",
                                               "gpu_partition_size": "1g.5gb",
                                               "gpu_sharing": {"max_shared_clients_per_gpu": 2}},
                 "image": {"repository": "r", "tag": "v0.34.0"},
                 "tenants": [{"name": "t", "jwt": {"issuer": "https://i.example", "jwks_uri": "https://i.example/jwks",
                                                   "audiences": ["a"]}, "models": ["small"]}]}
    with pytest.raises(InputError) as exc:
        declare: Any = lambda _c: VllmService("small-short", args)  # noqa: E731 (the package's own program)
        run_program("dev", read_stack_config("dev"), program=declare)
    found = {i.key: i.problem for i in exc.value.issues}
    assert "LimitStore" in found["VllmService.globalLimits"], found
    assert "MIG" in found["VllmService.nodePool.gpuPartitionSize"], found


def test_time_sharing_is_for_gpus_and_one_device_a_server(tuned_values):
    values = copy.deepcopy(tuned_values)
    values["vllm-gke:nodePools"].append({"name": "tpu", "machineType": "ct5lp-hightpu-1t",
                                         "gpuSharing": {"maxSharedClientsPerGpu": 2}})
    found = problems(values)
    assert any("nodePools[2]" in p or "TPU machine" in p for p in found), found
    values = copy.deepcopy(tuned_values)
    model(values, "qwen-7b")["tensorParallelSize"] = 2
    found = problems(values)
    assert any("models[qwen-7b].tensorParallelSize" in p and "one GPU per container" in p for p in found), found


def test_the_plan_shows_wake_against_cold_start_and_the_memory(tuned_values):
    cfg = parse(copy.deepcopy(tuned_values))
    rows = {r.model: r for r in sleep_mode.swap_rows(cfg)}
    assert set(rows) == set(SWAPPING)
    # Level 1: a PCIe copy of the weights, seconds; level 2: a read from the share, slower; both well
    # under the cold start, which reads the weights too and starts the engine.
    assert rows["qwen-7b"].wake_s < rows["mistral-7b"].wake_s < rows["mistral-7b"].cold_start_s
    assert rows["qwen-7b"].wake_s < 5 < rows["qwen-7b"].cold_start_s / 10
    qwen_7b = next(m for m in cfg.models if m.name == "qwen-7b")
    assert rows["qwen-7b"].host_gb == pytest.approx(qwen_7b.weights_gb + sleep_mode.HOST_OVERHEAD_GB)
    assert rows["mistral-7b"].host_gb == sleep_mode.HOST_OVERHEAD_GB
    text = "\n".join(sleep_mode.swap_lines(cfg))
    assert "pool l4-shared" in text and "qwen-7b: level 1" in text and "no concurrency across them" in text
    # The cost against a GPU each: one g2-standard-32 ($1.7344/h) for three, against three g2-standard-4 ($0.7068).
    assert "$1.73/h a shared GPU node against $2.12/h for a GPU each (3 x g2-standard-4): saves $0.39/h" in text
