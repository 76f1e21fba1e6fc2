"""The scaling benchmark's generated stacks are valid, and what they declare grows linearly; the guard
benchmark runs vLLM with a stack deployment's own flags and pools its cells soundly."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.plan_scaling import MODEL_GRID, MODELS_PER_TENANT, TENANT_GRID, scaled_config
from benchmarks.vllm_server import MIDDLEWARE, bench_guard_config, longest_prompt_container, server_args
from tests.test_vllm_flags import pinned_version
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.infra.config import parse
from vllm_gke.infra.plan import run_program


@pytest.mark.parametrize("tenants,models", [(max(TENANT_GRID), 1), (1, max(MODEL_GRID)), (10, 5)])
def test_generated_configs_are_valid(tenants, models):
    cfg = parse(scaled_config(tenants, models))
    assert len(cfg.tenants) == tenants and len(cfg.models) == models


def _count(tenants: int, models: int, every_option: bool = False) -> int:
    return sum(r.custom for r in run_program("bench", scaled_config(tenants, models, every_option)).resources)


@pytest.mark.parametrize("every_option", [False, True])
def test_resources_grow_linearly_in_tenants(every_option):
    # From two tenants on: with every option the second brings a negative priority, and with it
    # the one shed alert a stack has.
    base = _count(2, 1, every_option)
    per_tenant = _count(3, 1, every_option) - base
    assert per_tenant > 0
    assert _count(6, 1, every_option) == base + 4 * per_tenant


def test_resources_grow_linearly_in_models():
    # Each tenant is allowed up to MODELS_PER_TENANT models; beyond that a model adds a fixed set.
    base = _count(1, MODELS_PER_TENANT)
    per_model = _count(1, MODELS_PER_TENANT + 1) - base
    assert per_model > 0
    assert _count(1, MODELS_PER_TENANT + 5) == base + 5 * per_model


@pytest.mark.parametrize("tenants,models", [(max(TENANT_GRID), 1), (1, max(MODEL_GRID)), (10, 5)])
def test_every_option_configs_are_valid_and_use_every_option(tenants, models):
    cfg = parse(scaled_config(tenants, models, every_option=True))
    assert cfg.global_limits.enabled and cfg.weights.backend == "hyperdisk-ml"
    routings = {m.routing for m in cfg.models}
    assert routings == ({"inference-gateway", "length"} if models > 1 else {"inference-gateway"})
    assert any(m.adapters for m in cfg.models)
    if models > 1:
        assert any(m.canary for m in cfg.models) and any(m.long.min_replicas == 0 for m in cfg.models
                                                          if m.routing == "length")


def test_resources_grow_linearly_in_models_with_every_option():
    # Models alternate between the two routings: count in pairs beyond the tenant's models.
    base = _count(1, MODELS_PER_TENANT + 1, True)
    per_pair = _count(1, MODELS_PER_TENANT + 3, True) - base
    assert per_pair > 0
    assert _count(1, MODELS_PER_TENANT + 7, True) == base + 3 * per_pair


# --- the guard benchmark's `vllm` server: the pinned vLLM run with a stack deployment's own flags ---


def test_the_vllm_server_runs_the_deployment_a_128kb_prompt_goes_to(plans):
    args, config = longest_prompt_container(plans["prod"])
    lengths = [int(c["args"][c["args"].index("--max-model-len") + 1])
               for d in plans["prod"].of_type("kubernetes:apps/v1:Deployment")
               for c in d.props["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    assert int(args[args.index("--max-model-len") + 1]) == max(lengths) >= 32768  # ~29k tokens fit
    assert config["routes"]["/v1/chat/completions"] == {"kind": "chat", "method": "POST"}


def test_server_args_keep_the_deployment_flags_and_load_the_guard_as_the_pod_does(plans):
    args, _ = longest_prompt_container(plans["prod"])
    guarded = server_args(args, Path("/tmp/model"), 9100, MIDDLEWARE["guard"])
    baseline = server_args(args, Path("/tmp/model"), 9100, None)
    assert guarded[0] == baseline[0] == "/tmp/model"
    # The pod's own --middleware value: the benchmark loads the guard exactly as vLLM does in the pod.
    assert MIDDLEWARE["guard"] == args[args.index("--middleware") + 1]
    assert guarded.count("--middleware") == 1 and guarded[guarded.index("--middleware") + 1] == MIDDLEWARE["guard"]
    assert "--middleware" not in baseline and baseline == guarded[:-2]
    for flag, value in (("--host", "127.0.0.1"), ("--port", "9100"), ("--tensor-parallel-size", "1")):
        assert guarded.count(flag) == 1 and guarded[guarded.index(flag) + 1] == value
    # Everything else as deployed, in order (no trace collector here: a test names its own receiver).
    dropped = {"--host", "--port", "--middleware", "--tensor-parallel-size", "--otlp-traces-endpoint"}
    kept = [a for i, a in enumerate(args[1:], 1) if a not in dropped and args[i - 1] not in dropped]
    assert guarded[1:1 + len(kept)] == kept
    assert check_argv(guarded, load_snapshot(pinned_version())) == []


def test_bench_guard_config_differs_from_the_pod_only_where_nothing_here_is_a_pod(plans):
    _, config = longest_prompt_container(plans["prod"])
    assert "globalLimits" in config  # prod shares limits across replicas through Redis
    bench = bench_guard_config(config)
    assert "globalLimits" not in bench and bench["trustedPeers"] == ["127.0.0.1"]
    for issuer, tenant in config["issuers"].items():
        assert bench["issuers"][issuer] == {**tenant, "requestsPerMinute": 10**9}
    same = set(config) - {"globalLimits", "trustedPeers", "issuers"}
    assert same and {k: bench[k] for k in same} == {k: config[k] for k in same}


def test_the_vllm_frontend_requirements_are_for_the_pinned_release():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"vllm-{pinned_version()}-frontend.txt"
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert "torch==2.14.0" in lines and not any(line.startswith("flashinfer") for line in lines)


@pytest.mark.parametrize("argv,message", [
    (["--stand-in", "vllm"], "--stand-in vllm needs --vllm-python"),
    (["--vllm-python", "/nonexistent/bin/python"], "--vllm-python /nonexistent/bin/python: no such file"),
])
def test_the_guard_benchmark_refuses_a_vllm_server_it_cannot_start(argv, message, capsys):
    from benchmarks.guard_overhead import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _cells(baseline: list[list[float]], guard: list[list[float]]) -> list[dict]:
    return [{"runs": {"baseline": b, "guard": g}} for b, g in zip(baseline, guard)]


def test_pooled_ratio_of_the_guard_benchmark():
    from benchmarks.guard_overhead import pooled_ratio

    same = [[100.0, 100.0, 100.0], [10.0, 10.0]]
    assert pooled_ratio(_cells(same, same)) == (1.0, 1.0, 1.0)
    # The same scatter in both modes: the point is 1, the interval around it (runs resampled per mode).
    scattered = [[100.0, 104.0, 96.0], [10.0, 11.0, 9.0]]
    point, low, high = pooled_ratio(_cells(scattered, scattered))
    assert point == 1.0 and low < 1.0 < high
    halved = _cells([[100.0, 100.0], [8.0, 8.0]], [[50.0, 50.0], [4.0, 4.0]])
    assert pooled_ratio(halved) == pytest.approx((0.5, 0.5, 0.5))
    # Geometric mean of the cells' ratios of medians: 0.9 and 1/0.9 pool to 1.
    assert pooled_ratio(_cells([[100.0], [90.0]], [[90.0], [100.0]]))[0] == pytest.approx(1.0)
    tight = _cells([[100.0, 101.0, 99.0, 100.0]] * 3, [[97.0, 98.0, 96.0, 97.0]] * 3)
    loose = _cells([[100.0, 120.0, 80.0, 100.0]] * 3, [[97.0, 117.0, 77.0, 97.0]] * 3)
    for cells in (tight, loose):
        point, low, high = pooled_ratio(cells)
        assert low <= point <= high and pooled_ratio(cells) == (point, low, high)  # seeded: the same each time
    assert (pooled_ratio(loose)[2] - pooled_ratio(loose)[1]) > 3 * (pooled_ratio(tight)[2] - pooled_ratio(tight)[1])
