"""The load tests (components/load_test.py): what the plan declares, and the Job's program run for
real - inference-perf 0.7.0 against the pinned vLLM's API server (the instant engine core of
benchmarks/) behind the guard, through a stand-in for the gateway that checks the tenant's token.

The real run needs VLLM_PYTHON (a python with the pinned vLLM, as tests/test_guard_in_vllm.py) and
INFERENCE_PERF_PYTHON (one with inference-perf 0.7.0: .ci/run says how); under CI both must exist."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import REPO
from tests.conftest import manifests_of
from vllm_gke.components.load_test import Target, job_files, long_pool_target, lora_split, phases
from vllm_gke.components.model.serving_api import guard_config, tenant_routes
from vllm_gke.components.model.specs import LoadTestSpec
from vllm_gke.components.model.weights_layout import model_dir

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
INFERENCE_PERF_PYTHON = os.environ.get("INFERENCE_PERF_PYTHON", "")
STUB_GATEWAY = Path(__file__).parent / "fixtures" / "stub_gateway.py"


def test_prod_declares_an_on_demand_load_test_of_searchs_route(plans):
    plan = plans["prod"]
    (cron,) = [c for c in manifests_of(plan, "CronJob") if c["metadata"]["name"] == "loadtest-search-llama-8b"]
    assert cron["metadata"]["namespace"] == "vllm" and cron["spec"]["suspend"] is True  # never at `pulumi up`
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "quay.io/inference-perf/inference-perf:v0.7.0"
    # Outside the mesh, a client like the tenant; its token from a Secret, never from the plan.
    assert job["template"]["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    # Its own token Secret: another tenant's test in the namespace has another.
    assert {"name": "token", "secret": {"secretName": "loadtest-search-llama-8b-token", "defaultMode": 0o440}} \
        in pod["volumes"]
    (cm,) = [m for m in manifests_of(plan, "ConfigMap") if m["metadata"]["name"] == "loadtest-search-llama-8b"]
    mixed, shared = yaml.safe_load(cm["data"]["mixed.yaml"]), yaml.safe_load(cm["data"]["shared-prefix.yaml"])
    # search calls llama-8b at its shared route; inference-perf appends /v1/completions.
    assert mixed["server"]["base_url"] == "https://llm.acme.example/llama-8b"
    assert mixed["server"]["model_name"] == "llama-8b" and "api_key" not in mixed["server"]
    assert mixed["api"] == {"type": "completion", "streaming": True}
    assert mixed["tokenizer"]["pretrained_model_name_or_path"] == model_dir(plan.config.model("llama-8b"))
    # Its own adapter mixed in, not support's.
    assert [s["name"] for s in mixed["load"]["lora_traffic_split"]] == ["llama-8b", "search-rewrite"]
    assert shared["data"]["shared_prefix"]["system_prompt_len"] == 2048
    plan_json = json.loads(cm["data"]["plan.json"])
    assert plan_json["ttftSloSeconds"] == plan.config.monitoring.ttft_slo_seconds
    # The SLO keeps 95% of first tokens within it: the verdict holds p95, and takes the failures the
    # availability objective allows.
    assert plan.config.monitoring.slos.ttft == 0.95 and plan_json["ttftPercentile"] == "p95"
    assert plan_json["maxFailureRatio"] == pytest.approx(1 - plan.config.monitoring.slos.availability)
    assert plan_json["dollarsPerHour"] > 0
    # The token is nowhere in what the plan declares.
    configs = {k: v for k, v in cm["data"].items() if k != "run_load_test.py"}
    assert "Bearer" not in json.dumps(configs) and "api_key" not in json.dumps(configs)
    assert not any("TOKEN" in e["name"] for e in c["env"])


def test_the_verdict_holds_the_slos_percentile():
    from vllm_gke.components.load_test import ttft_percentile_key
    from vllm_gke.components.scripts.run_load_test import phase_verdict

    assert [ttft_percentile_key(g) for g in (0.5, 0.9, 0.95, 0.97, 0.99, 0.995, 0.9999)] == \
        ["p90", "p90", "p95", "p99", "p99", "p99.9", "p99.9"]
    summary = {"successes": {"count": 100, "latency": {"time_to_first_token": {
        "median": 0.5, "p95": 2.5, "p99": 4.0}}}, "failures": {"count": 0}}
    plan = {"ttftSloSeconds": 3.0, "ttftPercentile": "p95", "dollarsPerHour": None}
    # 95% of first tokens within 3 s holds a 95% objective, though the slowest 1% take 4 s.
    held = phase_verdict("mixed", summary, plan)
    assert held["ttftHeld"] and held["ttftAtSlo"] == 2.5
    assert not phase_verdict("mixed", summary, {**plan, "ttftPercentile": "p99"})["ttftHeld"]


def test_lora_shares_sum_to_exactly_one():
    for n in range(1, 12):
        names = [f"a{i}" for i in range(n)]
        assert sum(s["split"] for s in lora_split(names)) == 1.0


def test_the_deadline_covers_the_stages_and_the_longest_request():
    from vllm_gke.components.load_test import deadline_seconds

    spec = LoadTestSpec(name="t", tenant="a", model="m")
    assert deadline_seconds(spec, 600) >= sum(s.duration_seconds for s in spec.stages) + 600


def _config_map(plan, namespace: str, name: str) -> dict[str, Any]:
    (cm,) = [m for m in manifests_of(plan, "ConfigMap") if (m["metadata"]["namespace"], m["metadata"]["name"]) ==
             (namespace, name)]
    return cm


def test_a_long_canarys_variant_is_the_same_test_hinted_to_the_long_pool(plans):
    """loadtest-<name>-long (what the long pool's canary starts): the plain test's Job and configs,
    its own ConfigMap whose every phase sends x-vllm-gke-length: long on each request (the route's
    hint to the long pool: the plain test's prompts reach it only past longRequestBytes)."""
    plan = plans["prod"]
    crons = {c["metadata"]["name"]: c for c in manifests_of(plan, "CronJob") if c["metadata"]["namespace"] == "vllm"}
    plain, long = crons["loadtest-search-llama-8b"], crons["loadtest-search-llama-8b-long"]
    assert long["spec"]["suspend"] is True and long["metadata"]["labels"] == {
        **plain["metadata"]["labels"], "vllm-gke.io/load-test-variant": "long"}
    pods = [c["spec"]["jobTemplate"]["spec"]["template"]["spec"] for c in (plain, long)]
    assert [v["configMap"]["name"] for p in pods for v in p["volumes"] if v["name"] == "config"] == \
        ["loadtest-search-llama-8b", "loadtest-search-llama-8b-long"]
    assert [{**p, "volumes": [v for v in p["volumes"] if v["name"] != "config"]} for p in pods][0] == \
        [{**p, "volumes": [v for v in p["volumes"] if v["name"] != "config"]} for p in pods][1]
    plain_cm, long_cm = (_config_map(plan, "vllm", n) for n in ("loadtest-search-llama-8b", "loadtest-search-llama-8b-long"))
    assert set(plain_cm["data"]) == set(long_cm["data"]) >= {"mixed.yaml", "shared-prefix.yaml", "plan.json"}
    for file, text in plain_cm["data"].items():
        if not file.endswith(".yaml"):
            assert long_cm["data"][file] == text, file
            continue
        config = yaml.safe_load(text)
        config["api"]["headers"] = {**config["api"].get("headers", {}), "x-vllm-gke-length": "long"}
        assert yaml.safe_load(long_cm["data"][file]) == config, file


def test_the_long_variant_is_held_on_demand_as_the_plain_one(plans):
    """The policy load-tests-on-demand judges the variant too: scheduled, it is flagged."""
    import copy

    from vllm_gke.policies.rules import Resource, evaluate

    rs = [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in plans["prod"].policy_resources()]
    assert not [v for v in evaluate(rs) if v.policy == "load-tests-on-demand"]
    (long,) = [r for r in rs if r.props.get("kind") == "CronJob" and r.props["metadata"]["name"] ==
               "loadtest-search-llama-8b-long"]
    long.props["spec"]["suspend"] = False
    found = [v for v in evaluate(rs) if v.policy == "load-tests-on-demand"]
    assert len(found) == 1 and "loadtest-search-llama-8b-long" in found[0].message and "on a schedule" in found[0].message


def test_a_load_test_named_as_anothers_long_variant_is_refused(stack_values):
    """search-llama-8b-long's CronJob would be search-llama-8b's long-pool variant (same names)."""
    import copy

    from vllm_gke.components.model.stack_config import ConfigError
    from vllm_gke.infra.config import parse

    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:loadTests"].append({**values["vllm-gke:loadTests"][0], "name": "search-llama-8b-long"})
    with pytest.raises(ConfigError) as err:
        parse(values)
    assert [i.key for i in err.value.issues if "long-pool variant" in i.problem] == \
        ["vllm-gke:loadTests[search-llama-8b-long].name"]


@pytest.mark.parametrize("change,key,says", [
    (lambda t: t.update(tenant="nobody"), "vllm-gke:loadTests[search-llama-8b].tenant", "is not a tenant"),
    (lambda t: t.update(model="qwen-7b"), "vllm-gke:loadTests[search-llama-8b].model", "does not call 'qwen-7b'"),
    (lambda t: t.update(outputTokens={"mean": 100, "max": 4096}), "vllm-gke:loadTests[search-llama-8b].outputTokens.max",
     "over tenant 'search's maxTokens 2048"),
    (lambda t: t.update(promptTokens={"mean": 100, "max": 16000}),
     "vllm-gke:loadTests[search-llama-8b].promptTokens.max", "exceed 'llama-8b's longest context, 16384"),
])
def test_a_load_test_the_stack_cannot_run_is_refused(stack_values, change, key, says):
    import copy

    from vllm_gke.components.model.stack_config import ConfigError
    from vllm_gke.infra.plan import run_program

    values = copy.deepcopy(stack_values["prod"])
    change(values["vllm-gke:loadTests"][0])
    with pytest.raises(ConfigError) as err:
        run_program("prod", values)
    assert any(i.key == key and says in i.problem for i in err.value.issues), err.value.issues


# --- the real run ---------------------------------------------------------------------------

ISSUER = "https://auth.acme.example/search"
MODEL = "llama-8b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def route(tmp_path_factory, stack_values):
    """The pinned vLLM behind the guard (search as the tenant, as prod configures it), behind a
    stand-in gateway serving search's route /llama-8b/v1 to holders of the token."""
    if not (VLLM_PYTHON and INFERENCE_PERF_PYTHON):
        if os.environ.get("CI"):
            pytest.fail("CI runs the load test for real: .ci/run installs vLLM and inference-perf")
        pytest.skip("VLLM_PYTHON and INFERENCE_PERF_PYTHON are not set")
    from vllm_gke.components.model.stack_config import StackConfig

    tmp = tmp_path_factory.mktemp("loadtest")
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cfg = StackConfig.model_validate({k.removeprefix("vllm-gke:"): v for k, v in stack_values["prod"].items()
                                      if k.startswith("vllm-gke:")} | {"project": "p", "region": "us-central1"})
    search = next(t for t in cfg.tenants if t.name == "search")
    guard = guard_config([search], tenant_routes(), "not-none", cache_salt_paths=["/v1/completions",
                                                                                  "/v1/chat/completions"])
    guard["trustedPeers"] = ["127.0.0.1"]  # the stand-in gateway is the sidecar here
    guard["issuers"][ISSUER]["requestsPerMinute"] = 10**6
    port, gw_port = _free_port(), _free_port()
    marker = tmp / "warm"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]), HF_HUB_OFFLINE="1",
               GKE_LLM_GUARD_CONFIG=json.dumps(guard), GKE_LLM_WARM_MARKER=str(marker),
               GKE_LLM_WARMUP_PAUSE_SECONDS="1",
               GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve")
    log = open(tmp / "server.log", "wb")
    server = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"), str(model_dir),
                               "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
                               "--max-model-len", "4096", "--middleware", "vllm_gke_guard.GuardMiddleware"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    token = tmp / "auth" / "token"
    token.parent.mkdir()
    token.write_text("eyJ.search-token.sig\n")
    stats = tmp / "gateway.json"
    gateway = subprocess.Popen([sys.executable, str(STUB_GATEWAY), str(gw_port), MODEL, str(port), str(token), ISSUER,
                                str(stats)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not marker.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    try:
        assert marker.exists(), (tmp / "server.log").read_text()[-3000:]
        yield {"base": f"http://127.0.0.1:{gw_port}/{MODEL}", "model_dir": model_dir, "auth": token.parent,
               "tmp": tmp, "stats": stats}
    finally:
        stop(server)
        gateway.kill()
        log.close()


def run_job(route: dict[str, Any], name: str, spec: LoadTestSpec, ttft_slo: float = 5.0,
            auth: Path | None = None, long: bool = False) -> tuple[int, str, Path]:
    """The Job's program with the files its ConfigMap would hold (`long`: the long-pool variant's),
    pointed at the local route."""
    work = route["tmp"] / name
    config_dir, reports = work / "config", work / "reports"
    config_dir.mkdir(parents=True)
    target = Target(base_url=route["base"], model=MODEL, model_dir=str(route["model_dir"]), request_timeout_seconds=60)
    target = long_pool_target(target) if long else target
    for file, text in job_files(spec, target, ttft_slo, 9.7961, str(config_dir), str(reports)).items():
        (config_dir / file).write_text(text)
    env = dict(os.environ, LOADTEST_PLAN=str(config_dir / "plan.json"), LOADTEST_AUTH_DIR=str(auth or route["auth"]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HOME=str(work))
    done = subprocess.run([INFERENCE_PERF_PYTHON, str(config_dir / "run_load_test.py")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr, reports


def small(**extra: Any) -> LoadTestSpec:
    return LoadTestSpec.model_validate({
        "name": "t", "tenant": "search", "model": MODEL, "lora_mix": False,
        "prompt_tokens": {"distribution": "lognormal", "mean": 256, "std_dev": 384, "min": 16, "max": 2048},
        "output_tokens": {"distribution": "normal", "mean": 64, "std_dev": 32, "min": 8, "max": 256},
        "stages": [{"rate": 5, "duration_seconds": 2}, {"rate": 15, "duration_seconds": 2}], **extra})


def test_the_job_runs_inference_perf_through_the_tenants_route(route):
    spec = small(shared_prefix={"groups": 2, "prompts_per_group": 4, "prefix_tokens": 256, "question_tokens": 32,
                                "output_tokens": 16, "concurrency": 4})
    code, out, reports = run_job(route, "ok", spec)
    assert code == 0, out[-4000:]
    verdicts = {v["phase"]: v for v in json.loads((reports / "verdict.json").read_text())}
    assert set(verdicts) == {"mixed", "shared-prefix"}
    mixed = verdicts["mixed"]
    assert mixed["requests"] == mixed["successes"] == 5 * 2 + 15 * 2 and mixed["failures"] == 0
    assert verdicts["shared-prefix"]["successes"] == 8
    assert 0 < mixed["ttftP50"] <= mixed["ttftP99"] < 5.0 and mixed["ttftHeld"]
    assert mixed["outputTokensPerSecond"] > 0 and mixed["dollarsPerMillionOutputTokens"] > 0
    assert "=== LOAD TEST VERDICT ===" in out and "TTFT p50" in out
    # Every request went through the route with the token; the token is in no log or report.
    stats = json.loads(route["stats"].read_text())
    assert stats["refused"] == 0 and stats["paths"].get("POST /v1/completions") == 40 + 8
    token = (route["auth"] / "token").read_text().strip()
    assert token not in out
    assert not [p for p in reports.rglob("*") if p.is_file() and token in p.read_text(errors="replace")]


def test_the_long_variant_hints_every_request_to_the_long_pool(route):
    """inference-perf sends the config's api.headers on every request (0.7.0:
    client/modelserver/openai_client.py:475-476), and the program on /v1/models too: each request of
    the long-pool variant carries x-vllm-gke-length: long, which the route sends to the long pool."""
    def hints() -> dict[str, int]:
        return json.loads(route["stats"].read_text())["lengthHints"] if route["stats"].exists() else {}

    before = hints()
    code, out, _ = run_job(route, "long", small(), long=True)
    assert code == 0, out[-3000:]
    sent = {k: n - before.get(k, 0) for k, n in hints().items()}
    assert sent.get("", 0) == 0 and sent["long"] >= 5 * 2 + 15 * 2, sent


def test_a_refused_token_fails_the_job(route, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "token").write_text("not-the-token")
    code, out, _ = run_job(route, "refused", small(), auth=wrong)
    assert code == 1, out[-3000:]  # upstream would exit 0 with every request refused


def test_a_missed_slo_fails_the_job(route):
    code, out, reports = run_job(route, "slow", small(), ttft_slo=1e-6)
    assert code == 3, out[-3000:]
    (mixed,) = json.loads((reports / "verdict.json").read_text())
    assert mixed["ttftHeld"] is False and "MISSED" in out


def test_the_generated_configs_parse_with_inference_perfs_own_model(route, plans):
    """Prod's phases, LoRA split included, as inference-perf itself reads a config file."""
    (cm,) = [m for m in manifests_of(plans["prod"], "ConfigMap") if m["metadata"]["name"] == "loadtest-search-llama-8b"]
    for name in ("mixed.yaml", "shared-prefix.yaml"):
        path = route["tmp"] / name
        path.write_text(cm["data"][name])
        check = ("import sys; from inference_perf.config import read_config; "
                 "c = read_config(sys.argv[1]); print(c.load.type, c.data.type)")
        done = subprocess.run([INFERENCE_PERF_PYTHON, "-c", check, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]


def test_phases_follow_the_spec():
    spec = small(lora_mix=True)
    (name, mixed), = phases(spec, Target(base_url="https://h/m", model="m", adapters=["a"], model_dir="/models/m/main"))
    assert name == "mixed" and [s["split"] for s in mixed["load"]["lora_traffic_split"]] == [0.5, 0.5]
    assert mixed["load"]["stages"] == [{"rate": 5.0, "duration": 2}, {"rate": 15.0, "duration": 2}]


def test_the_ci_requirements_are_inference_perfs_own(route):
    """benchmarks/inference-perf-0.7.0-py311.txt is the tool's Requires-Dist (extras aside), as installed."""
    listed = [line for line in (REPO / "benchmarks" / "inference-perf-0.7.0-py311.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    check = ("import importlib.metadata as m; print(m.version('inference-perf')); "
             "print('\\n'.join(r for r in m.requires('inference-perf') if 'extra ==' not in r))")
    done = subprocess.run([INFERENCE_PERF_PYTHON, "-c", check], capture_output=True, text=True, check=True)
    version, *requires = done.stdout.split("\n")
    assert version == "0.7.0"
    assert sorted(r.replace(" ", "") for r in requires if r) == sorted(r.replace(" ", "") for r in listed)


@pytest.mark.parametrize("goal, percentiles", [(0.95, [50, 95, 99]), (0.99, [50, 99]), (0.995, [50, 99, 99.9])])
def test_each_config_names_the_percentiles_the_verdict_reads(goal, percentiles):
    """inference-perf's summary holds only the percentiles its config asks for (a default list
    when none): each phase asks for p50, p99 and the TTFT objective's own explicitly."""
    from vllm_gke.components.load_test import ttft_percentile_key

    spec = small(shared_prefix={"groups": 2, "prompts_per_group": 2, "prefix_tokens": 64})
    found = phases(spec, Target(base_url="https://h/m", model="m", model_dir="/models/m/main"), ttft_goal=goal)
    assert len(found) == 2
    for _, config in found:
        assert config["report"]["request_lifecycle"]["percentiles"] == percentiles
        named = {"median" if p == 50 else f"p{p:g}" for p in percentiles}
        assert {"median", "p99", ttft_percentile_key(goal)} <= named
