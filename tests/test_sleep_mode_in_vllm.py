"""Two models swapping on one GPU, each in the real vLLM API server as its pod starts it.

Two servers of the tuned stack's swapping models (their argv and guard config from the plan), each
started by the container's entrypoint (images/serve.py) with vLLM 0.34's own `vllm serve` and the
guard as --middleware; the engine core is the instant stand-in (benchmarks/vllm_fake_engine.py),
which keeps the sleep state AsyncLLM's sleep/wake_up set and logs each call. One real Redis with
the limit store's config, ACL and library holds the GPU's lease. Checked: the second server starts
only once the first sleeps; a tenant request to the sleeping one wakes it (the other sleeps first)
and no request reaches a sleeping engine; a request the guard refuses wakes nothing; vLLM's
/sleep and /wake_up routes are not reachable; a GPU held past waitSeconds gives a 503 with
Retry-After. --enable-sleep-mode is dropped from the argv here: vLLM refuses it on a machine
without CUDA (config/model.py, is_sleep_mode_available); the stand-in engine keeps the state.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import MIDDLEWARE, REPO, flag, server_args
from vllm_gke.infra.plan import read_stack_config, run_program

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON and not os.environ.get("CI"),
                                reason="VLLM_PYTHON (a python with the pinned vllm) is not set")
MODELS = ("qwen-1-5b", "qwen-7b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _containers() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Each swapping model's vLLM argv and guard config, as the tuned stack's plan declares them."""
    plan = run_program("tuned", read_stack_config("tuned"))
    out: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for resource in plan.of_type("kubernetes:apps/v1:Deployment"):
        for c in resource.props["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "vllm" and (served := flag(list(c["args"]), "--served-model-name", "")) in MODELS:
                env = {e["name"]: e.get("value") for e in c["env"]}
                out[served] = (list(c["args"]), json.loads(env["GKE_LLM_GUARD_CONFIG"]))
    assert set(out) == set(MODELS), sorted(out)
    return out


class Pod:
    def __init__(self, name: str, args: list[str], guard: dict[str, Any], store_port: int, model_dir: Path,
                 tmp: Path, redis_path: Path):
        self.name, self.port, self.marker = name, _free_port(), tmp / f"{name}.warm"
        self.swaps, self.log_path = tmp / f"{name}.swap.jsonl", tmp / f"{name}.log"
        self.guard = dict(guard, trustedPeers=["127.0.0.1"], globalLimits={"host": "127.0.0.1", "port": store_port},
                          swap={**guard["swap"], "minAwakeSeconds": 0, "waitSeconds": 8})
        argv = [a for a in server_args(args, model_dir, self.port, MIDDLEWARE["guard"]) if a != "--enable-sleep-mode"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO), str(redis_path)]),
                   GKE_LLM_GUARD_CONFIG=json.dumps(self.guard), GKE_LLM_WARM_MARKER=str(self.marker),
                   GKE_LLM_WARMUP_PAUSE_SECONDS="1", GKE_LLM_SWAP_NODE="node-1", GKE_LLM_SWAP_HOLDER=name,
                   GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve",
                   FAKE_ENGINE_SWAP_LOG=str(self.swaps))
        self.out = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"), *argv], cwd=REPO, env=env,
                                     stdout=self.out, stderr=subprocess.STDOUT)

    def warm(self, timeout_s: float = 600) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.marker.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.marker.exists()

    def ops(self) -> list[str]:
        if not self.swaps.exists():
            return []
        return [json.loads(line)["op"] for line in self.swaps.read_text().splitlines()]

    def call(self, path: str, body: Optional[dict[str, Any]] = None, tenant: bool = True,
             method: str = "POST") -> tuple[int, dict[str, Any], dict[str, str]]:
        (issuer, entry), = self.guard["issuers"].items()
        headers = {"content-type": "application/json"}
        if tenant:
            headers |= {"x-vllm-gke-issuer": issuer, self.guard["objectiveHeader"]: entry["objective"]}
        prefix = self.guard["pathPrefixes"][0]
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{prefix}{path}", data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read()), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}"), dict(err.headers)

    def close(self) -> None:
        stop(self.proc)
        self.out.close()


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    if not VLLM_PYTHON:
        pytest.fail("CI runs the swap inside the real vLLM: set VLLM_PYTHON")
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("the swap's lease needs a real redis-server (set REDIS_SERVER)")
    import redis

    from benchmarks.limit_store import start_redis

    tmp = tmp_path_factory.mktemp("swap")
    (tmp / "store").mkdir()
    store, store_port = start_redis(binary, tmp / "store")
    # The image installs redis-py beside vLLM (images/Dockerfile); here the test's own copy is lent.
    lent = tmp / "redis-py"
    lent.mkdir()
    (lent / "redis").symlink_to(Path(redis.__file__).parent)
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started: dict[str, Pod] = {}
    try:
        containers = _containers()
        for name in MODELS:  # in order: the first is awake when the second starts
            args, guard = containers[name]
            started[name] = Pod(name, args, guard, store_port, model_dir, tmp, lent)
            assert started[name].warm(), started[name].log_path.read_text()[-4000:]
        yield started, store_port
    finally:
        for pod in started.values():
            pod.close()
        store.terminate()
        store.wait(5)


def test_the_second_server_starts_only_once_the_first_sleeps(pods):
    pods, _ = pods
    first, second = (pods[m] for m in MODELS)
    # The first slept (its lease wanted by the second's entrypoint) before the second's vLLM started;
    # the second started holding the lease, awake, and never woke.
    assert first.ops()[:1] == ["sleep"], first.ops()
    assert "wake_up" not in second.ops()[:1], second.ops()


def test_a_request_wakes_its_model_and_the_other_sleeps_first(pods):
    pods, _ = pods
    first, second = (pods[m] for m in MODELS)
    before_first, before_second = len(first.ops()), len(second.ops())
    status, body, _ = first.call("/v1/chat/completions", chat(first.name))
    assert status == 200, body
    assert first.ops()[before_first:] == ["wake_up"], first.ops()
    assert second.ops()[before_second:] == ["sleep"], second.ops()
    # And back: the second's next request wakes it, the first sleeps.
    status, body, _ = second.call("/v1/chat/completions", chat(second.name))
    assert status == 200, body
    assert second.ops()[-1] == "wake_up" and first.ops()[-1] == "sleep"
    for pod in (first, second):
        assert "request_while_asleep" not in pod.ops()  # every request ran on an awake engine


def test_a_refused_request_wakes_nothing_and_the_dev_routes_stay_shut(pods):
    pods, _ = pods
    asleep = pods[MODELS[0]] if pods[MODELS[0]].ops()[-1] == "sleep" else pods[MODELS[1]]
    before = asleep.ops()
    status, _, _ = asleep.call("/v1/chat/completions", chat(asleep.name), tenant=False)
    assert status == 403
    for path, method in (("/sleep", "POST"), ("/wake_up", "POST"), ("/is_sleeping", "GET")):
        status, _, _ = asleep.call(path, None, method=method)
        assert status == 404, path
    assert asleep.ops() == before


def test_a_gpu_held_past_the_wait_gives_503_with_retry_after(pods):
    import redis

    pods, store_port = pods
    first, second = (pods[m] for m in MODELS)
    client: Any = redis.Redis(port=store_port)  # Any: redis-py annotates fcall's arguments as lists
    key = "rl:{gpu:node-1}:lease"

    def take(holder: str, ttl_ms: int) -> bool:
        return int(client.fcall("vllm_gke_lease_v1", 1, key, "take", holder, ttl_ms, 1000)[0]) == 1

    # A holder that never yields (a server stuck mid-request): it claims the GPU, the awake server
    # yields it, and it keeps it.
    deadline = time.monotonic() + 60
    while not take("stuck", 120_000) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        status, body, headers = first.call("/v1/chat/completions", chat(first.name))
    finally:
        client.fcall("vllm_gke_lease_v1", 1, key, "drop", "stuck", 1000, 1000)
    assert status == 503, body
    assert body["error"]["code"] == "model_swapping" and body["error"]["type"] == "service_unavailable"
    assert int(headers["retry-after"]) >= 1
    assert "request_while_asleep" not in first.ops() + second.ops()
    # Once the GPU is free again the model serves.
    status, body, _ = first.call("/v1/chat/completions", chat(first.name))
    assert status == 200, body
