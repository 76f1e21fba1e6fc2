"""KV-cache offload to host memory (models[].kvOffload): vLLM 0.34's native backend on the server's
command line (parsed and resolved by the real vLLM where VLLM_PYTHON names it), the host memory it
takes sized from the node after GKE's reservations and the other replicas, the refusals (a size that
does not fit, lmcache, TPUs, with disaggregation), and the host tier in the plan's capacity table."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT, vllm_deployments
from vllm_gke.components.model import kv_offload as ko
from vllm_gke.components.model import picker_prefix as pp
from vllm_gke.components.model.capacity import pool_capacity
from vllm_gke.components.model.node_shapes import kernel_reserved_mi, node_free, node_shape
from vllm_gke.components.model.specs import KvOffloadSpec, ModelSpec, NodePoolSpec, ServingPoolSpec, extra_arg_problem
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import container_resources, vllm_args
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.contracts import kv_offload as kvc
from vllm_gke.infra.kv_offload_text import offload_lines
from vllm_gke.infra.plan import Plan, read_stack_config, run_program
from vllm_gke.infra.report import verdicts

H100 = NodePoolSpec(name="h100", machine_type="a3-highgpu-8g", disk_size_gb=400)
MODEL = ModelSpec(name="llama-70b-offload", source="hf://meta-llama/Llama-3.3-70B-Instruct", shape="llama-3-70b",
                  node_pool="h100", tensor_parallel_size=4, max_model_len=16384, kv_offload=KvOffloadSpec())
# Llama 3 70B: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes.
LLAMA_70B_TOKEN = 2 * 80 * 8 * 128 * 2
GIB = 1024 ** 3


def sized(size: float | None, backend: str = "native", model: ModelSpec = MODEL) -> ModelSpec:
    return model.model_copy(update={"kv_offload": KvOffloadSpec(backend=backend, size_gb=size)})


# a3-highgpu-8g's allocatable as the kubelet reports it: 1872 GiB less the kernel's 1/64 + 80 MiB and
# COS's correction (0.175%, at most 248 MiB: kubernetes/autoscaler gce/gce_reserved.go
# CalculateKernelReserved) less GKE's kube-reserved (44.2 GiB by its tiers) and the 100 MiB eviction threshold.
A3_ALLOC_MI = 1872 * 1024 - (1872 * 1024 // 64 + 80 + 248) - (round(44.2 * 1024) + 100)
ENVOY_MI, GKE_PODS_MI = 128, 520


def test_the_node_counts_the_kernels_memory_before_gke_reserves():
    shape = node_shape("a3-highgpu-8g", 400)
    assert shape.memory_mi == 1872 * 1024 - 30_280 and shape.alloc_memory_mi == A3_ALLOC_MI
    assert round(A3_ALLOC_MI / 1024, 1) == 1798.1
    # Small machines: 0.175% below the cap, and 8 MiB more at 8 GiB or less (16 MiB: 256 + 80 + 28.7).
    assert node_shape("e2-standard-4", 100).memory_mi == 16 * 1024 - 365
    assert kernel_reserved_mi(4) == math.ceil(64 + 80 + 8 + 0.00175 * 4096)
    assert kernel_reserved_mi(2) == math.ceil(32 + 16 + 8 + 3.584)  # no IO TLB at 3 GiB or less


def test_allocatable_is_near_gkes_documented_node():
    # GKE's plan-node-sizes page: a 4-vCPU, 16 GiB node reports 13498416Ki allocatable memory (13,182 MiB).
    # The autoscaler's model (COS term included) says 13,257: 75 MiB (0.6%) over, 104 without the COS term.
    documented = 13_498_416 / 1024
    model = node_shape("e2-standard-4", 100).alloc_memory_mi
    assert 0 <= model - documented < 80


def test_default_offload_pods_fit_a_real_node_beside_each_other():
    # Two TP-4 pods on an a3-highgpu-8g, each its server container and Envoy, beside GKE's pods.
    res = ko.offload_resources(container_resources(H100, 4), MODEL, H100)
    pod_mi = int(res["requests"]["memory"].removesuffix("Gi")) * 1024 + ENVOY_MI
    assert 2 * pod_mi + GKE_PODS_MI <= A3_ALLOC_MI
    # The server asks its need and a tenth, not all its room: the node keeps room for what the estimate
    # and GKE_PER_NODE_MEMORY_MI miss (GPU-node DaemonSets).
    tier = ko.host_tier(MODEL, H100)
    assert tier is not None and tier.server_gib == math.ceil(tier.need_gib * 1.1) == 198
    assert A3_ALLOC_MI - (2 * pod_mi + GKE_PODS_MI) > 100 * 1024
    # A stated size at the largest the check accepts fits too; one GiB more is refused.
    room = tier.free_per_pod_gib
    at_most = sized(room)
    assert ko.offload_problems(at_most, H100) == []
    pod_mi = int(ko.offload_resources(container_resources(H100, 4), at_most, H100)["requests"]["memory"][:-2]) * 1024
    assert 2 * (pod_mi + ENVOY_MI) + GKE_PODS_MI <= A3_ALLOC_MI
    assert ko.offload_problems(sized(room + 1), H100) != []


@pytest.mark.parametrize("machine", ["a3-highgpu-8g", "a3-megagpu-8g", "a2-ultragpu-8g", "a2-highgpu-8g",
                                     "a2-megagpu-16g", "g2-standard-96"])
def test_a_whole_node_replica_fits_its_node(machine: str):
    pool = NodePoolSpec(name="x", machine_type=machine, disk_size_gb=400)
    model = MODEL.model_copy(update={"node_pool": "x", "tensor_parallel_size": 8})
    res = ko.offload_resources(container_resources(pool, 8), model, pool)
    shape = node_shape(machine, 400)
    pods = shape.devices // 8
    assert pods * (int(res["requests"]["memory"].removesuffix("Gi")) * 1024 + ENVOY_MI) + GKE_PODS_MI \
        <= shape.alloc_memory_mi
    assert ko.offload_problems(model, pool) == []


def test_default_size_is_what_the_node_leaves_beside_the_servers_need():
    # The server's need, not its 792 GiB proportional share: Llama 70B's 131 GiB of weights, 6 GiB a
    # GPU worker, 8 for the front end, /dev/shm's 16.
    need = 70.6 * 2 * 1e9 / GIB + 4 * 6 + 8 + 16
    room = node_free("a3-highgpu-8g", 400)[1] / 1024 / 2 - ko.OTHER_CONTAINERS_GIB
    tier = ko.host_tier(MODEL, H100)
    assert tier is not None and tier.need_gib == pytest.approx(need, abs=0.01)
    assert tier.size_gib == math.floor(0.9 * (room - need)) == 646
    # Whole 16-token chunks of 16 x 320 KiB: several times the GPU's 435,791 tokens.
    assert tier.tokens == 646 * GIB // (16 * LLAMA_70B_TOKEN) * 16 == 2_116_800
    gpu = pool_capacity(MODEL, "short", MODEL.short, H100).tokens_fit
    assert tier.tokens >= 4 * gpu
    # The server is given its need and a tenth (within its room), less than its plain share.
    assert need < tier.server_gib == math.ceil(need * 1.1) < math.floor(room) - 646 < 792


def test_argv_resources_and_shm_carry_the_tier():
    assert ko.offload_args(MODEL, H100) == ["--kv-offloading-backend", "native", "--kv-offloading-size", "646"]
    res = ko.offload_resources(container_resources(H100, 4), MODEL, H100)
    # Request == limit (Guaranteed QoS), both raised by the pinned buffer; the rest unchanged.
    assert res["requests"]["memory"] == res["limits"]["memory"] == "844Gi"
    assert res["limits"]["nvidia.com/gpu"] == "4"
    # vLLM checks /dev/shm holds the whole buffer before creating it.
    assert ko.shm_size(16, MODEL, H100) == "662Gi"
    plain = MODEL.model_copy(update={"kv_offload": None})
    assert ko.offload_args(plain, H100) == [] and ko.shm_size(16, plain, H100) == "16Gi"
    assert ko.offload_resources(container_resources(H100, 4), plain, H100) == container_resources(H100, 4)


def test_a_stated_size_is_used_as_is_and_its_tokens_follow():
    model = sized(64)
    assert ko.offload_args(model, H100)[-1] == "64"
    assert ko.host_tier(model, H100).tokens == 64 * GIB // (16 * LLAMA_70B_TOKEN) * 16  # type: ignore[union-attr]
    assert ko.offload_problems(model, H100) == []


def test_across_hosts_each_pod_holds_its_share_and_shm_the_whole():
    # 405B at TP 8 x PP 2 over two a3-highgpu-8g: vLLM's size is the replica's, over all 16 workers.
    model = ModelSpec(name="big", source="hf://meta-llama/Llama-3.1-405B-Instruct", shape="llama-3.1-405b",
                      node_pool="h100", tensor_parallel_size=8, pipeline_parallel_size=2, multi_host=True,
                      dtype="fp8", kv_offload=KvOffloadSpec(size_gb=200))
    tier = ko.host_tier(model, H100)
    assert tier is not None and tier.hosts == 2 and tier.pod_gib == 100
    server = math.ceil(tier.need_gib * 1.1)  # its need and a tenth, below its 1584 GiB plain share
    assert server < 1584 and ko.offload_resources(container_resources(H100, 8), model, H100)["limits"]["memory"] == \
        f"{server + 100}Gi"
    assert ko.shm_size(16, model, H100) == "216Gi"


def test_host_bytes_count_each_rank_where_kv_heads_replicate():
    # 8 KV heads over TP 16 ranks: each rank keeps a head, so the host holds 16 heads' worth a token.
    wide = MODEL.model_copy(update={"tensor_parallel_size": 16})
    assert ko.host_bytes_per_token(wide) == 2 * LLAMA_70B_TOKEN
    assert ko.host_bytes_per_token(MODEL) == LLAMA_70B_TOKEN


def test_capacity_rows_carry_the_host_tier_and_not_a_larger_batch():
    pool = ServingPoolSpec(max_num_seqs=64, context_tokens=4096)
    plain = pool_capacity(MODEL.model_copy(update={"kv_offload": None}), "short", pool, H100)
    offload = ko.with_host_tier(pool_capacity(MODEL, "short", pool, H100), MODEL, H100)
    assert (plain.host_kv_tokens, offload.host_kv_tokens, offload.host_kv_gib) == (0, 2_116_800, 646)
    # Offload does not raise what runs at once: the GPU's tokens and sequences are the plain pool's.
    assert (offload.tokens_fit, offload.seqs_fit, offload.decode_tokens_s) == \
        (plain.tokens_fit, plain.seqs_fit, plain.decode_tokens_s)
    assert ko.with_host_tier(plain, MODEL.model_copy(update={"kv_offload": None}), H100) is plain


def test_an_unknown_backend_is_refused_by_the_spec():
    with pytest.raises(ValueError, match="use native"):
        KvOffloadSpec(backend="mooncake")
    assert KvOffloadSpec().backend == "native" and KvOffloadSpec(backend="lmcache").backend == "lmcache"


def test_the_vllm_flags_are_the_platforms_own():
    assert "models[].kvOffload" in (extra_arg_problem("--kv-offloading-size") or "")
    assert "models[].kvOffload" in (extra_arg_problem("--kv_offloading_backend=native") or "")


def test_problems_name_the_key_and_the_fix(monkeypatch: pytest.MonkeyPatch):
    (key, text), = ko.offload_problems(sized(800), H100)
    assert key == "sizeGb" and "at most 717" in text and "leave it unset for 646" in text
    (key, text), = ko.offload_problems(sized(None, "lmcache"), H100)
    assert key == "backend" and "LMCacheMPConnector" in text and "use backend: native" in text
    tpu = NodePoolSpec(name="v6e", machine_type="ct6e-standard-4t", tpu_topology="2x2")
    (key, text), = ko.offload_problems(MODEL.model_copy(update={"node_pool": "v6e"}), tpu)
    assert key == "backend" and "TPU" in text
    # A node with no memory left beside its replicas (here: other containers that take what a
    # g2-standard-4 leaves its server): the default has nothing to offer.
    l4 = NodePoolSpec(name="l4", machine_type="g2-standard-4")
    small = ModelSpec(name="q", source="hf://Qwen/Qwen2.5-1.5B-Instruct", shape="qwen2.5-1.5b", node_pool="l4",
                      kv_offload=KvOffloadSpec())
    assert ko.offload_problems(small, l4) == [] and ko.host_tier(small, l4).size_gib == 2  # type: ignore[union-attr]
    monkeypatch.setattr(ko, "OTHER_CONTAINERS_GIB", 4.0)
    (key, text), = ko.offload_problems(small, l4)
    assert key == "sizeGb" and "nothing left for a host tier" in text


@pytest.fixture(scope="module")
def tuned() -> dict[str, Any]:
    return read_stack_config("tuned")


def _offload_model(values: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-offload")


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


def test_the_stack_refuses_a_size_the_node_cannot_hold(tuned):
    values = copy.deepcopy(tuned)
    _offload_model(values)["kvOffload"] = {"backend": "native", "sizeGb": 800}
    (problem,) = [p for p in _problems(values) if "kvOffload" in p]
    assert "models[llama-70b-offload].kvOffload.sizeGb" in problem and "lower sizeGb to at most 717" in problem


def test_the_stack_refuses_lmcache_with_the_reason(tuned):
    values = copy.deepcopy(tuned)
    _offload_model(values)["kvOffload"] = {"backend": "lmcache"}
    (problem,) = [p for p in _problems(values) if "kvOffload" in p]
    assert "models[llama-70b-offload].kvOffload.backend" in problem and "LMCache server" in problem


def test_cli_exits_2_on_a_size_that_does_not_fit(tmp_path: Path, tuned):
    values = copy.deepcopy(tuned)
    _offload_model(values)["kvOffload"] = {"sizeGb": 4000}
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "bad", "--stacks-dir",
                             str(tmp_path), "--no-write"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "kvOffload.sizeGb" in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def tuned_plan(tuned) -> Plan:
    return run_program("tuned", tuned)


def _vllm_container(plan: Plan, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (d,) = [d for d in vllm_deployments(plan) if d["metadata"]["name"] == f"{name}-short"]
    spec = d["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "vllm"), spec


def test_the_tuned_stack_serves_the_offload_variant_beside_the_plain_one(tuned_plan: Plan):
    offload, spec = _vllm_container(tuned_plan, "llama-70b-offload")
    plain, plain_spec = _vllm_container(tuned_plan, "llama-70b")
    assert offload["args"][-4:] == ["--kv-offloading-backend", "native", "--kv-offloading-size", "646"]
    assert "--kv-offloading-size" not in plain["args"]
    assert offload["resources"]["limits"]["memory"] == "844Gi" == offload["resources"]["requests"]["memory"]
    assert plain["resources"]["limits"]["memory"] == "792Gi"
    (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["sizeLimit"] == "662Gi"
    assert check_argv(offload["args"], load_snapshot("0.34.0")) == []


def test_the_plan_shows_the_host_tier_and_what_it_does_not_do(tuned_plan: Plan):
    v = verdicts(tuned_plan)
    rows = {r.model: r for r in v.capacity if r.pool == "short" and not r.tenant}
    assert rows["llama-70b-offload"].host_kv_tokens == 2_116_800 and rows["llama-70b"].host_kv_tokens == 0
    (line,) = offload_lines(tuned_plan.config, v)
    reach = 2_116_800 - rows["llama-70b-offload"].tokens_fit
    assert "2,116,800 tokens" in line and "the running batch stays 64" in line and "$0 more" in line
    assert "LMCache instead" in line and f"adds {reach:,} tokens of prefix reach" in line and "mirrors the GPU" in line


def test_the_plan_warns_when_the_tier_is_no_larger_than_the_gpus(tuned_plan: Plan):
    # 64 GiB holds 209,712 tokens, fewer than the GPU's: vLLM mirrors new blocks there, so no reach.
    cfg = tuned_plan.config
    small = [sized(64, model=m) if m.name == "llama-70b-offload" else m for m in cfg.models]
    cfg = cfg.model_copy(update={"models": small})
    v = verdicts(tuned_plan)
    rows = [ko.with_host_tier(r, cfg.model(r.model), cfg.pool(r.node_pool)) for r in v.capacity]
    line, warning = offload_lines(cfg, replace(v, capacity=rows))
    assert "adds -" in line and warning.startswith("warning: llama-70b-offload") and "preemption recovery only" in warning


def test_the_precise_prefix_index_counts_the_host_tiers_blocks():
    # vLLM publishes the CPU tier's BlockStored on the same stream; llm-d-router indexes a (pod, cpu) entry.
    plain = pp.pool_blocks(MODEL.model_copy(update={"kv_offload": None}), H100)
    tier = ko.host_tier(MODEL, H100)
    assert tier is not None
    assert pp.pool_blocks(MODEL, H100) == MODEL.short.max_replicas * (
        (pool_capacity(MODEL, "short", MODEL.short, H100).tokens_fit + tier.tokens) // pp.BLOCK_SIZE_TOKENS) > plain


def test_the_batch_row_fails_when_the_table_counts_host_tokens(tuned_plan: Plan, monkeypatch: pytest.MonkeyPatch):
    assert kvc.offload_does_not_raise_the_batch(tuned_plan) == []
    real = kvc.capacity_report
    monkeypatch.setattr(kvc, "capacity_report", lambda cfg: [
        replace(r, tokens_fit=r.tokens_fit + r.host_kv_tokens, seqs_fit=r.seqs_fit + 1) for r in real(cfg)])
    assert any("counts host-tier tokens" in p for p in kvc.offload_does_not_raise_the_batch(tuned_plan))


def test_the_flag_row_counts_tokens_as_vllm_does():
    # The contract's count from the model's shape alone, against the fixed Llama 70B figure at 108 GiB
    # (vLLM's CPUOffloadingSpec: 22,118 chunks of 16 tokens, the test below runs it).
    assert kvc._vllm_host_tokens(108, MODEL) == 22_118 * 16 == ko.host_tokens(108, LLAMA_70B_TOKEN)
    # An fp8 KV cache: one byte an element, twice the tokens, as vLLM's page size makes them.
    fp8 = MODEL.model_copy(update={"kv_cache_dtype": "fp8"})
    assert kvc._vllm_host_tokens(108, fp8) == 2 * 22_118 * 16 == ko.host_tier(sized(108, model=fp8), H100).tokens  # type: ignore[union-attr]


def test_the_contract_rows_pass_at_the_largest_size_the_refusal_names(tuned):
    # The value "at most N" recommends, with an fp8 KV cache: every kvOffload row of the plan holds.
    values = copy.deepcopy(tuned)
    model = _offload_model(values)
    model["kvCacheDtype"] = "fp8"
    model["kvOffload"] = {"sizeGb": 4000}
    (problem,) = [p for p in _problems(values) if "kvOffload" in p]
    model["kvOffload"]["sizeGb"] = at_most = int(problem.split("at most ")[1].split(",")[0])
    plan = run_program("tuned", values)
    (c, _spec) = _vllm_container(plan, "llama-70b-offload")
    assert c["args"][-1] == str(at_most) and "fp8" in c["args"]
    assert [p for row in kvc.ROWS for p in row.check(plan)] == []


# The server's argv as `vllm serve` parses it, resolved into vLLM's own engine config (the platform
# stubbed to CPU: this machine has no GPU): the offloading connector, its bytes and its role.
ENGINE_CONFIG = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.check_and_update_config = classmethod(lambda cls, c: None)
platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser())
args = parser.parse_args(json.loads(sys.argv[1]))
args.model = args.model_tag
validate_parsed_serve_args(args)
vc = AsyncEngineArgs.from_cli_args(args).create_engine_config()
k = vc.kv_transfer_config
print(json.dumps({"size": vc.cache_config.kv_offloading_size, "backend": vc.cache_config.kv_offloading_backend,
                  "connector": k.kv_connector, "role": k.kv_role, "extra": k.kv_connector_extra_config}))
"""


def vllm_python() -> str:
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the KV-offload flags against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    return python


def test_vllm_0_34_resolves_the_argv_into_its_offloading_connector(tmp_path: Path):
    python = vllm_python()
    model_dir = tmp_path / "model"
    subprocess.run([python, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO_ROOT,
                   check=True, capture_output=True)
    # The fake model is tiny and one CPU serves it: tensor parallel 1, the tier as the platform writes it.
    model = MODEL.model_copy(update={"tensor_parallel_size": 1, "max_model_len": 256})
    argv = [str(model_dir), *vllm_args(model, ServingPoolSpec(max_num_seqs=4))[1:], *ko.offload_args(MODEL, H100)]
    argv = [a for a in argv if not a.startswith("--middleware") and a != "vllm_gke_guard.GuardMiddleware"]
    out = subprocess.run([python, "-c", ENGINE_CONFIG, json.dumps(argv)], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["size"], got["backend"], got["connector"], got["role"]) == (646, "native", "OffloadingConnector",
                                                                            "kv_both")
    assert got["extra"]["cpu_bytes_to_use"] == 646 * GIB


# vLLM's own CPU spec at world size 4 with Llama 70B's per-worker block (80 layers x 2 KV heads x 128 x
# 2 bytes x K and V x 16 tokens): the chunks it makes of a size, in tokens.
CPU_SPEC = """
import json, sys
from vllm.v1.kv_offload.config import *
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
size, world, block = json.loads(sys.argv[1])
cfg = OffloadingConfig(
    groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l",), group_id=0),),
    worker_kv_bytes_per_block=block, enable_kv_cache_events=False, extra_config={"cpu_bytes_to_use": size * 2 ** 30},
    engine_id="x", model=OffloadingModelConfig(name="m", dtype="bfloat16"),
    cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
    parallel=OffloadingParallelConfig(rank=0, world_size=world, tp_size=world, pp_size=1, pcp_size=1, dcp_size=1,
                                      data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                      is_parallelism_agnostic=False))
print(json.dumps(CPUOffloadingSpec(cfg).num_chunks * 16))
"""


@pytest.mark.parametrize(("size", "dtype"), [(108, "auto"), (646, "auto"), (108, "fp8")])
def test_vllm_0_34_holds_the_tokens_the_plan_says(size: int, dtype: str):
    python = vllm_python()
    model = MODEL.model_copy(update={"kv_cache_dtype": dtype})
    tier = ko.host_tier(sized(size, model=model), H100)
    assert tier is not None and tier.size_gib == size
    per_worker_block = 80 * 2 * 2 * 128 * (1 if dtype == "fp8" else 2) * 16  # vLLM's page size: fp8 is a byte
    out = subprocess.run([python, "-c", CPU_SPEC, json.dumps([size, 4, per_worker_block])], capture_output=True,
                         text=True, cwd=REPO_ROOT, env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    vllm_tokens = json.loads(out.stdout.strip().splitlines()[-1])
    assert vllm_tokens == tier.tokens == kvc._vllm_host_tokens(size, model)
    if size == 108:
        assert vllm_tokens == 353_888 * (2 if dtype == "fp8" else 1)  # the reviewer's probe


def test_the_options_leave_out_tpus_for_offload_and_disaggregation(tuned):
    # vLLM's native offloading and the NIXL hand-off are refused on TPU pools: no TPU option is offered.
    from vllm_gke.infra.accelerator_options import model_options, refused_here
    cfg = parse(tuned)
    tpu = NodePoolSpec(name="v6e", machine_type="ct6e-standard-4t", tpu_topology="2x2")
    assert any(o.accelerator.startswith("tpu") for o in model_options(cfg.model("llama-70b")))
    for name in ("llama-70b-offload", "llama-70b-pd"):
        assert refused_here(cfg.model(name), tpu) and not refused_here(cfg.model("llama-70b"), tpu)
    assert not any(o.accelerator.startswith("tpu") for o in model_options(cfg.model("llama-70b-offload")))
    # A host tier the machine cannot hold is refused there too.
    assert refused_here(sized(4000), H100) and not refused_here(MODEL, H100)
