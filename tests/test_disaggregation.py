"""Prefill/decode disaggregation, the model side (components/model/disaggregation.py): the spec, NIXL's
--kv-transfer-config per role (checked by the snapshot and by vLLM 0.34's own parser and config where
VLLM_PYTHON names it), the side-channel and UCX environment, the transport per machine, the sizing of
both pools against the aggregated pool, the config rules, the GPUs the prefill pool takes, the plan."""

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
from pydantic import ValidationError

from tests.conftest import REPO_ROOT, vllm_deployments
from vllm_gke.components.model import disaggregation as pd
from vllm_gke.components.model.capacity import gpu_slots_by_pool
from vllm_gke.components.model.specs import DisaggregationSpec, ModelSpec, NodePoolSpec
from vllm_gke.components.model.throughput import NET_EFFICIENCY
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import vllm_args
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

H100 = NodePoolSpec.model_validate({"name": "h100", "machineType": "a3-highgpu-8g", "minNodes": 1, "maxNodes": 4})


def model(load: dict[str, Any] | None = None, **disagg: Any) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "llama-70b-pd", "source": "hf://meta-llama/Llama-3.3-70B-Instruct", "shape": "llama-3-70b",
        "maxModelLen": 16384, "nodePool": "h100", "tensorParallelSize": 4, "routing": "inference-gateway",
        "short": {"minReplicas": 1, "maxReplicas": 2, "maxNumSeqs": 64, "contextTokens": 4096},
        "disaggregation": {"prefill": {"minReplicas": 1, "maxReplicas": 2, "maxNumSeqs": 16}, "load": load, **disagg}})


PROMPT_HEAVY: dict[str, Any] = {"promptTokensPerSecond": 8000, "outputTokensPerSecond": 1100}
OUTPUT_HEAVY: dict[str, Any] = {"promptTokensPerSecond": 1000, "outputTokensPerSecond": 4000}


def test_the_spec_defaults_and_refusals():
    spec = DisaggregationSpec()
    assert (spec.transport, spec.min_prompt_tokens, spec.prefill.min_replicas, spec.load) == ("auto", 256, 1, None)
    for bad in ({"prefill": {"minReplicas": 0}}, {"prefill": {"minReplicas": 3, "maxReplicas": 2}},
                {"transport": "infiniband"}, {"minPromptTokens": 0}, {"prefill": {"replicas": 2}},
                {"load": {"promptTokensPerSecond": 0, "outputTokensPerSecond": 1}}):
        with pytest.raises(ValidationError):
            DisaggregationSpec.model_validate(bad)


def _kv_config(argv: list[str]) -> dict[str, Any]:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_each_pool_gets_nixl_in_its_role_and_a_plain_model_none():
    m = model()
    decode, prefill = vllm_args(m, m.short), vllm_args(m, pd.prefill_pool(m))
    assert _kv_config(decode)["kv_role"] == "kv_consumer" and _kv_config(prefill)["kv_role"] == "kv_producer"
    for argv in (decode, prefill):
        cfg = _kv_config(argv)
        assert cfg["kv_connector"] == "NixlConnector"
        assert cfg["kv_connector_extra_config"] == {"backends": ["UCX"], "num_threads": 0}
        assert cfg["kv_load_failure_policy"] == "recompute"
        assert check_argv(argv, load_snapshot("0.34.0")) == []
    assert prefill[prefill.index("--max-num-seqs") + 1] == "16" and decode[decode.index("--max-num-seqs") + 1] == "64"
    plain = m.model_copy(update={"disaggregation": None})
    assert "--kv-transfer-config" not in vllm_args(plain, plain.short)


def test_the_env_puts_the_side_channel_on_the_pod_ip_and_tcp_on_a3():
    env = {e["name"]: e for e in pd.kv_transfer_env(model(), H100)}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(pd.NIXL_SIDE_CHANNEL_PORT) == "5600"
    assert env["UCX_TLS"]["value"] == "cuda_copy,tcp" and pd.transport(model(), H100) == "tcp"


def test_auto_takes_rdma_only_where_both_pools_have_it(monkeypatch: pytest.MonkeyPatch):
    rdma = H100.model_copy(update={"name": "rdma"})
    monkeypatch.setattr(pd, "rdma_ready", lambda p: p.name == "rdma")
    assert pd.transport(model(), rdma, rdma) == "rdma" and pd.transport(model(), rdma, H100) == "tcp"
    assert pd.transport(model(transport="tcp"), rdma, rdma) == "tcp" and pd.transport(model(), rdma) == "tcp"
    assert {e["name"]: e.get("value") for e in pd.kv_transfer_env(model(), rdma, rdma)}["UCX_TLS"] == pd.UCX_TLS["rdma"]
    assert not pd.rdma_ready(H100)  # GPUDirect-TCPX is not RDMA


def test_sizing_splits_the_load_by_the_roofline_and_costs_the_transfer():
    s = pd.pd_sizing(model(PROMPT_HEAVY), H100, H100)
    assert s.prefill_replicas == math.ceil(8000 / s.prefill_rate) and s.decode_replicas == math.ceil(1100 / s.decode_rate)
    assert s.aggregated_replicas == math.ceil(8000 / s.aggregated_prefill_rate + 1100 / s.decode_rate)
    assert s.gpus >= s.aggregated_gpus  # splitting never saves GPUs: it costs rounding and the transfer
    assert s.prompt_tokens == int(4096 * 8000 / 9100)
    kv = s.prompt_tokens * model().kv_bytes_per_token
    # UCX over TCP as measured, one stream a rank (4), under the replica's half of the 200 Gbps NIC
    assert s.transfer_s == pytest.approx(kv / min(4 * 0.59e9, 200 / 8 * 1e9 * NET_EFFICIENCY / 2))
    assert s.rdma_transfer_s == pytest.approx(kv / (4 * 50e9 * 0.85))  # each GPU's 400 Gbps NIC at 85%
    # prefills keep each of the N aggregated replicas busy P/(p N) of the time
    assert s.itl_stretch == pytest.approx(1 / (1 - 8000 / (s.aggregated_prefill_rate * s.aggregated_replicas)))
    assert (s.aggregated_replicas, round(s.itl_stretch, 2)) == (3, 2.28)
    assert s.usd_per_million(True) == pytest.approx(s.gpus / 8 * 88.2539 / (1100 * 3600) * 1e6)


def test_over_rdma_it_pays_for_prompt_heavy_load_and_not_for_output_heavy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pd, "rdma_ready", lambda p: True)
    heavy, light = pd.pd_sizing(model(PROMPT_HEAVY), H100, H100), pd.pd_sizing(model(OUTPUT_HEAVY), H100, H100)
    assert heavy.transport == "rdma" and heavy.pays and heavy.itl_stretch > 2
    from vllm_gke.infra.disaggregation_text import pd_lines

    assert "disaggregation pays: 2.28x faster output for +0 GPUs" in pd_lines(heavy)[-1]
    assert not light.pays and "little decode latency to win" in light.reasons_against[0]


def test_over_tcp_the_transfer_weighs_on_the_prefill():
    s = pd.pd_sizing(model(PROMPT_HEAVY), H100, H100)
    assert s.transport == "tcp" and s.transfer_s > pd.PAYS_TRANSFER_SHARE * s.prefill_s > 10 * s.rdma_transfer_s
    assert not s.pays and s.reasons_against == [r for r in s.reasons_against if "KV transfer over tcp" in r]


def test_prompts_under_the_threshold_stay_on_the_decode_pod():
    s = pd.pd_sizing(model(PROMPT_HEAVY, minPromptTokens=8192), H100, H100)
    assert not s.pays and "under minPromptTokens (8,192)" in s.reasons_against[0]


def test_tcp_scales_by_ranks_up_to_the_replicas_share_of_the_nic():
    g2 = NodePoolSpec.model_validate({"name": "l4", "machineType": "g2-standard-4", "minNodes": 1, "maxNodes": 1})
    nic = g2.machine.nic_gbps / 8 * 1e9 * NET_EFFICIENCY
    assert pd.link_bytes_s(g2.machine, "tcp", 1) == pytest.approx(min(0.59e9, nic))
    assert pd.link_bytes_s(H100.machine, "tcp", 4) == pytest.approx(4 * 0.59e9) == 4 * pd.link_bytes_s(H100.machine, "tcp", 1)
    assert pd.link_bytes_s(H100.machine, "tcp", 8) == pytest.approx(8 * 0.59e9)  # 4.7 GB/s: under the 15 GB/s NIC
    assert pd.link_bytes_s(replace(H100.machine, nic_gbps=40), "tcp", 8) == pytest.approx(40 / 8 * 1e9 * NET_EFFICIENCY)


def test_no_nic_rate_never_divides_by_zero(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pd, "link_bytes_s", lambda machine, how, devices: 0.0)  # a TPU machine states none
    s = pd.pd_sizing(model(PROMPT_HEAVY), H100, H100)
    assert s.transfer_s == math.inf and not s.pays and any("KV transfer" in r for r in s.reasons_against)


def test_one_ucx_worker_a_rank_so_the_pods_ports_suffice():
    cfg = pd.kv_transfer_config(model(), "prefill")
    assert cfg["kv_connector_extra_config"]["num_threads"] == pd.NIXL_NUM_THREADS == 0
    assert pd.ucx_listeners(4) == 4 and pd.ucx_listeners(4, 4) == 20  # vLLM 0.34's default: 4 threads


def test_the_stretch_counts_the_replicas_rounded_up(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pd, "rdma_ready", lambda p: True)
    s = pd.pd_sizing(model({"promptTokensPerSecond": 500, "outputTokensPerSecond": 100}), H100, H100)
    assert s.aggregated_replicas == 1 and round(s.itl_stretch, 2) == 1.12  # not 1 + (P/p)/(O/d) = 2.25
    assert not s.pays and "only 1.12x" in s.reasons_against[0]


def test_extra_gpus_and_dollars_are_a_reason_against(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pd, "rdma_ready", lambda p: True)
    s = pd.pd_sizing(model({"promptTokensPerSecond": 5000, "outputTokensPerSecond": 1300}), H100, H100)
    assert s.itl_stretch > pd.PAYS_ITL_STRETCH and s.transfer_s < pd.PAYS_TRANSFER_SHARE * s.prefill_s
    assert (s.gpus - s.aggregated_gpus, round(s.usd_per_million(False), 2), round(s.usd_per_million(True), 2)) == (
        4, 28.29, 37.72)
    assert not s.pays and s.reasons_against == [
        "the pools' rounding takes +4 GPUs: $37.72 per million output tokens against $28.29 aggregated (+33%; the load "
        "fits too few replicas for a whole extra one to vanish)"]


def test_without_a_load_the_verdict_says_it_is_synthetic():
    from vllm_gke.infra.disaggregation_text import pd_lines

    assert "verdict is synthetic" in pd_lines(pd.pd_sizing(model(), H100, H100))[1]
    assert not any("synthetic" in line for line in pd_lines(pd.pd_sizing(model(PROMPT_HEAVY), H100, H100)))


def test_the_plan_says_the_transfers_are_not_encrypted(tuned_plan: Plan):
    """The routing sidecar's prefill leg goes to a pod IP, which the mesh passes through without mTLS, and
    NIXL's ports bypass the mesh: the plan says what that costs (the tenant's token and prompt in clear)."""
    from vllm_gke.infra.disaggregation_text import pd_table, unencrypted_line

    line = unencrypted_line(pd.pd_sizing(model(PROMPT_HEAVY), H100, H100))
    assert "the tenant's token and prompt" in line and "unencrypted inside the VPC" in line
    table = pd_table(tuned_plan.config)
    assert table is not None and "llama-70b-pd: the prefill leg (the tenant's token and prompt)" in str(table.caption)


@pytest.fixture(scope="module")
def tuned() -> dict[str, Any]:
    return read_stack_config("tuned")


def _pd_model(values: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-pd")


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


@pytest.mark.parametrize("change, key, fix", [
    (lambda m: m.update(routing="length"), "models[llama-70b-pd].routing", "set routing: inference-gateway"),
    (lambda m: m["disaggregation"]["prefill"].update(nodePool="h200"), "disaggregation.prefill.nodePool",
     "is not declared"),
    (lambda m: m["disaggregation"].update(transport="rdma"), "disaggregation.transport", "set transport: tcp"),
    (lambda m: m.update(extraArgs=["--kv-transfer-config={}"]), "models[llama-70b-pd].extraArgs", "remove it"),
    (lambda m: m["disaggregation"].update(minPromptTokens=16384), "disaggregation.minPromptTokens", "lower it"),
    (lambda m: m["short"].update(minReplicas=0), "short.minReplicas", "set short.minReplicas to 1"),
    (lambda m: m["disaggregation"]["prefill"].update(maxNumSeqs=4096), "disaggregation.prefill",
     "prefill.maxNumSeqs"),
    # The per-pool rules run on the prefill pool too: vLLM 0.34 refuses a batch under maxModelLen unchunked.
    (lambda m: (m.update(enableChunkedPrefill=False), m["disaggregation"]["prefill"].update(maxNumBatchedTokens=8192)),
     "disaggregation.prefill.maxNumBatchedTokens", "below the pool's maxModelLen 16384 with chunked prefill off"),
    # The prefill replicas take their node pool's GPU slots like any pool's.
    (lambda m: m["disaggregation"]["prefill"].update(minReplicas=12, maxReplicas=12), "nodePools[h100].maxNodes",
     "raise maxNodes"),
])
def test_bad_config_names_the_key_and_the_fix(tuned, change, key, fix):
    values = copy.deepcopy(tuned)
    change(_pd_model(values))
    problems = [p for p in _problems(values) if key in p]
    assert problems and fix in problems[0], _problems(values)


def test_without_dataplane_v2_disaggregation_is_refused(tuned):
    """The prefill pods' NetworkPolicy is the only lock on NIXL's side channel and UCX's ports (past the mesh)."""
    values = copy.deepcopy(tuned)
    values["vllm-gke:cluster"]["dataplaneV2"] = False
    problems = [p for p in _problems(values) if "cluster.dataplaneV2" in p and "llama-70b-pd disaggregate" in p]
    assert problems and "set dataplaneV2 true" in problems[0], _problems(values)


def test_a_disaggregated_model_is_no_fallback_target(tuned):
    """Its Service reaches vLLM past the routing sidecar, whose guard admits the sidecar alone: a 403 every time."""
    values = copy.deepcopy(tuned)
    plain = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b")
    plain["fallback"] = {"model": "llama-70b-pd"}
    problems = [p for p in _problems(values) if "models[llama-70b].fallback.model" in p and "is disaggregated" in p]
    assert problems and "name a model without disaggregation" in problems[0], _problems(values)


@pytest.fixture(scope="module")
def frontier() -> dict[str, Any]:
    return read_stack_config("frontier")


def _disaggregated(values: dict[str, Any], name: str, prefill_pool: str) -> dict[str, Any]:
    m = next(m for m in values["vllm-gke:models"] if m["name"] == name)
    m.update(routing="inference-gateway", disaggregation={"prefill": {"nodePool": prefill_pool, "maxReplicas": 1}})
    m["short"]["minReplicas"] = 1
    return values


def test_the_decode_pool_gets_the_prefill_pools_machine_checks(frontier):
    problems = _problems(_disaggregated(copy.deepcopy(frontier), "llama-70b-tpu", "h100-hosts"))
    assert any("models[llama-70b-tpu].nodePool" in p and "is a TPU pool: NIXL moves the KV cache between whole GPUs"
               in p for p in problems), problems


def test_multi_host_replicas_are_refused(frontier):
    problems = _problems(_disaggregated(copy.deepcopy(frontier), "llama-405b", "h100-hosts"))
    assert any("models[llama-405b].multiHost" in p and "worker pods get no NIXL environment" in p
               for p in problems), problems


def test_the_prefill_pool_is_counted_on_its_node_pool(tuned):
    with_pd = parse(copy.deepcopy(tuned))
    values = copy.deepcopy(tuned)
    del _pd_model(values)["disaggregation"]
    without = parse(values)
    for bound, replicas in (("min", 1), ("max", 2)):
        assert gpu_slots_by_pool(with_pd, bound)["h100"] - gpu_slots_by_pool(without, bound)["h100"] == 4 * replicas


def test_cli_exits_2_on_rdma_without_the_nics(tmp_path: Path, tuned):
    values = copy.deepcopy(tuned)
    _pd_model(values)["disaggregation"]["transport"] = "rdma"
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "bad", "--stacks-dir",
                             str(tmp_path), "--no-write"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "disaggregation.transport" in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def tuned_plan(tuned) -> Plan:
    return run_program("tuned", tuned)


def test_the_tuned_stack_decodes_with_nixl_beside_the_plain_model(tuned_plan: Plan):
    args = {d["metadata"]["name"]: next(c for c in d["spec"]["template"]["spec"]["containers"]
                                        if c["name"] == "vllm")["args"] for d in vllm_deployments(tuned_plan)}
    assert _kv_config(args["llama-70b-pd-short"])["kv_role"] == "kv_consumer"
    assert "--kv-transfer-config" not in args["llama-70b-short"]


def test_the_plan_table_compares_with_the_aggregated_pool(tuned_plan: Plan):
    from vllm_gke.infra.disaggregation_text import pd_lines, pd_sizings

    (s,) = pd_sizings(tuned_plan.config)
    assert (s.model, s.transport, s.pays) == ("llama-70b-pd", "tcp", False)
    lines = pd_lines(s)
    assert "crosses tcp in" in lines[0] and "GPUDirect-RDMA NICs, which vllm-gke does not provision" in lines[1]
    assert "does not pay at this load: the KV transfer over tcp" in lines[2]
    values = copy.deepcopy(tuned_plan.config)
    m = next(m for m in values.models if m.name == "llama-70b-pd")
    assert m.disaggregation is not None
    slow = m.disaggregation.model_copy(update={"load": m.disaggregation.load.model_copy(  # type: ignore[union-attr]
        update={"prompt_tokens_per_second": 1000, "output_tokens_per_second": 4000})})
    light = pd.pd_sizing(m.model_copy(update={"disaggregation": slow}), H100, H100)
    assert "does not pay at this load" in pd_lines(light)[2] and "raise" in pd_lines(light)[3]


# Both pools' argv as `vllm serve` parses it, resolved into vLLM 0.34's own engine config (the platform
# stubbed to CPU: this machine has no GPU), the connector class vLLM would load for it, and the
# side-channel port its envs read.
ENGINE_CONFIG = """
import json, os, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.check_and_update_config = classmethod(lambda cls, c: None)
platforms._current_platform = CpuPlatform()
from vllm import envs
from vllm.config.kv_transfer import KVTransferConfig
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
out = {}
for role, argv in json.loads(sys.argv[1]).items():
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(argv)
    args.model = args.model_tag
    validate_parsed_serve_args(args)
    k = AsyncEngineArgs.from_cli_args(args).create_engine_config().kv_transfer_config
    direct = KVTransferConfig(**json.loads(argv[argv.index("--kv-transfer-config") + 1]))
    out[role] = {"connector": k.kv_connector, "role": k.kv_role, "producer": k.is_kv_producer,
                 "consumer": k.is_kv_consumer, "policy": k.kv_load_failure_policy, "device": k.kv_buffer_device,
                 "backends": k.get_from_extra_config("backends", None), "direct_role": direct.kv_role,
                 "threads": k.get_from_extra_config("num_threads", 4),
                 "class": KVConnectorFactory.get_connector_class(k).__name__}
out["port"] = envs.VLLM_NIXL_SIDE_CHANNEL_PORT
print(json.dumps(out))
"""


def vllm_python() -> str:
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks NIXL's --kv-transfer-config against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    return python


def test_vllm_0_34_resolves_both_roles_into_its_nixl_connector(tmp_path: Path):
    python = vllm_python()
    model_dir = tmp_path / "model"
    subprocess.run([python, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO_ROOT,
                   check=True, capture_output=True)
    m = model().model_copy(update={"tensor_parallel_size": 1})
    argv = {role: [str(model_dir), *[a for a in vllm_args(m, pool) if a != "--middleware"][1:]]
            for role, pool in (("decode", m.short), ("prefill", pd.prefill_pool(m)))}
    argv = {role: [a for a in v if "GuardMiddleware" not in a] for role, v in argv.items()}
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           **{e["name"]: e["value"] for e in pd.kv_transfer_env(m, H100) if "value" in e}}
    out = subprocess.run([python, "-c", ENGINE_CONFIG, json.dumps(argv)], capture_output=True, text=True,
                         cwd=REPO_ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for role, kv_role in (("decode", "kv_consumer"), ("prefill", "kv_producer")):
        r = got[role]
        assert (r["connector"], r["role"], r["direct_role"]) == ("NixlConnector", kv_role, kv_role)
        assert (r["policy"], r["device"], r["backends"], r["class"]) == ("recompute", "cuda", ["UCX"], "NixlPullConnector")
        assert r["threads"] == 0  # what base_worker.py:789 reads: one UCX worker an agent
    assert got["decode"]["consumer"] and not got["decode"]["producer"]
    assert got["prefill"]["producer"] and not got["prefill"]["consumer"]
    assert got["port"] == pd.NIXL_SIDE_CHANNEL_PORT


def test_the_prefill_pool_takes_surge_and_canary_room(tuned):
    from vllm_gke.components.model import capacity

    values = copy.deepcopy(tuned)
    values["vllm-gke:nodePools"][0]["maxNodes"] = 6  # 48 GPUs: 4 models x 2 x 4 and the prefill pool's 2 x 4
    cfg = parse(values)
    plain = next(m for m in cfg.models if m.name == "llama-70b")
    # Every other pool at its ceiling with a surge replica (3 x 3 x 4) and the prefill pool's 8 leave 4 GPUs.
    assert capacity.surge_room(cfg, plain, "h100", None, "short") == 1
    values["vllm-gke:nodePools"][0]["maxNodes"] = 7
    cfg = parse(values)
    assert capacity.surge_room(cfg, plain, "h100", None, "short") is None
    assert capacity.canary_room(cfg, plain, "h100", None, "short") == 0  # 56 - 40 - 16 surges


def test_the_cost_report_prices_the_prefill_pool(tuned):
    from vllm_gke.infra.accelerator_options import stack_options
    from vllm_gke.infra.cost import replica_costs

    cfg = parse(copy.deepcopy(tuned))
    rows = {(r.model, r.pool): r for r in replica_costs(cfg)}
    prefill, decode = rows[("llama-70b-pd", "prefill")], rows[("llama-70b-pd", "short")]
    assert (prefill.tokens_per_second, prefill.min_replicas, prefill.devices) == (0.0, 1, 4)
    assert prefill.usd_per_hour == pytest.approx(88.2539 / 2)
    here = {o.model: o for o in stack_options(cfg, tuple(replica_costs(cfg)))}
    # this stack's decode replica carries its prefill pool's replica (both at their floors, 1 and 1)
    assert here["llama-70b-pd"].usd_per_hour == pytest.approx(decode.usd_per_hour + prefill.usd_per_hour)
    assert here["llama-70b"].usd_per_hour == pytest.approx(rows[("llama-70b", "short")].usd_per_hour)


def test_adapters_with_speculative_need_the_prefill_batch_to_hold_each_proposal():
    from vllm_gke.components.model.config_rules.disaggregation import speculative_batch
    from vllm_gke.components.model.specs import AdapterSpec, SpeculativeSpec

    adapter = AdapterSpec.model_validate({"name": "sql", "source": "hf://acme/sql-lora", "rank": 16,
                                            "tenants": ["chat"]})
    m = model(prefill={"maxNumSeqs": 128, "maxNumBatchedTokens": 256}).model_copy(update={
        "speculative": SpeculativeSpec.model_validate({"method": "ngram", "numSpeculativeTokens": 3}),
        "adapters": [adapter]})
    found: list[tuple[str, str]] = []
    speculative_batch(lambda key, problem: found.append((key, problem)), "models[x].disaggregation.prefill", m,
                      pd.prefill_pool(m))
    assert found and found[0][0] == "models[x].disaggregation.prefill.maxNumBatchedTokens" and "= 512" in found[0][1]
    found.clear()
    speculative_batch(lambda key, problem: found.append((key, problem)), "p", m.model_copy(update={"adapters": []}),
                      pd.prefill_pool(m))
    assert found == []


def test_a_tokens_per_minute_limit_is_refused_for_a_tenant_of_a_disaggregated_model(tuned):
    """The sidecar's prefill leg asks for one token: the limit the prefill guard takes would not hold."""
    values = copy.deepcopy(tuned)
    chat = next(t for t in values["vllm-gke:tenants"] if "llama-70b-pd" in t["models"])
    chat["rateLimit"]["tokensPerMinute"] = 100000
    (problem,) = [p for p in _problems(values) if "tokensPerMinute" in p]
    assert problem.startswith(f"vllm-gke:tenants[{chat['name']}].rateLimit.tokensPerMinute:")
    assert "llama-70b-pd" in problem and "requestsPerMinute and maxTokens" in problem
