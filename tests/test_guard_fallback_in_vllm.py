"""The degradation path between two real vLLM 0.34 API servers, each behind the guard with the
config the plan gives its pool (prod, llama-8b falling back to qwen-7b; a third tenant, batch,
shed first and not allowed qwen-7b): an overloaded llama-8b replica sends support's requests to
the qwen-7b server, answers batch 429 and serves search itself, and serves support again once
its queue drains. Only the GPU engine cores are stand-ins (benchmarks/vllm_fake_engine.py; the
llama-8b one reports the waiting requests a test writes, as the real scheduler reports its
stats), and, in front of the qwen-7b server, its sidecar: a stand-in that knows each tenant's
token and writes the verified issuer header from it, as Istio's jwt_authn does, and refuses an
unknown token. Needs VLLM_PYTHON, as tests/test_guard_in_vllm.py does.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import pytest

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import MIDDLEWARE, REPO, bench_guard_config, longest_prompt_container, server_args
from tests.test_fallback import guard_configs, tenant, with_fallback
from tests.test_guard_in_vllm import _free_port

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON and not os.environ.get("CI"),
                                reason="VLLM_PYTHON (a python with the pinned vllm) is not set")

ISSUERS = {t: f"https://auth.acme.example/{t}" for t in ("search", "support", "batch")}
TOKENS = {f"{t}-token": issuer for t, issuer in ISSUERS.items()}
SERVED = "x-vllm-gke-served-model"


@pytest.fixture(scope="module", autouse=True)
def _pinned_vllm():
    if not VLLM_PYTHON:
        pytest.fail("CI runs the guard inside the real vLLM: .ci/run installs it and sets VLLM_PYTHON")


def with_batch(values: dict[str, Any]) -> None:
    """prod with llama-8b falling back to qwen-7b, and batch: shed first (-5), not allowed qwen-7b."""
    with_fallback(values)
    support = tenant(values, "support")
    values["vllm-gke:tenants"].append({
        **copy.deepcopy(support), "name": "batch", "models": ["llama-8b"], "priority": -5,
        "jwt": {**support["jwt"], "issuer": ISSUERS["batch"], "jwksUri": f"{ISSUERS['batch']}/jwks.json"}})


class Sidecar:
    """The qwen-7b replica's sidecar, as far as a sent request meets it: the token verified (each
    tenant's is known here), the issuer header written from it, the request passed on; `refusing`,
    it answers 503 as a fallback at zero (its standby) does; `cutting`, it drops the connection
    half way through a 200's body, as when the fallback's pod goes mid-answer."""

    def __init__(self, upstream: str):
        self.upstream, self.refusing, self.cutting, self.seen = upstream, False, False, []
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802  (http.server's name)
                sidecar.seen.append({k.lower(): v for k, v in self.headers.items()})
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                token = (self.headers.get("authorization") or "").removeprefix("Bearer ")
                if sidecar.refusing or token not in TOKENS:
                    self._answer(503 if sidecar.refusing else 401, "text/plain", b"no")
                    return
                headers = {"content-type": self.headers.get("content-type") or "application/json",
                           "x-vllm-gke-issuer": TOKENS[token]}
                request = urllib.request.Request(sidecar.upstream + self.path, data=body, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=60) as resp:
                        self._answer(resp.status, resp.headers.get("content-type"), resp.read())
                except urllib.error.HTTPError as err:
                    self._answer(err.code, err.headers.get("content-type"), err.read())

            def _answer(self, status, kind, body):
                self.send_response(status)
                self.send_header("content-type", kind or "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if sidecar.cutting and status == 200 else body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def start(args: list[str], name: str, guard: dict[str, Any], model_dir, tmp, **env: str):
    """The pinned vLLM's own server (`vllm serve`) behind the guard, serving `name`."""
    args = list(args)
    args[args.index("--served-model-name") + 1] = name
    port = _free_port()
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]),
                   GKE_LLM_GUARD_CONFIG=json.dumps(guard), FAKE_ENGINE_LOG=str(tmp / f"{name}.engine.jsonl"), **env)
    log = open(tmp / f"{name}.log", "wb")
    proc = subprocess.Popen([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "serve",
                             *server_args(args, model_dir, port, MIDDLEWARE["guard"])],
                            cwd=REPO, env=environ, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", log


def healthy(base: str, proc, log_path) -> None:
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(log_path.read_text()[-3000:])


def guard_for(config: dict[str, Any]) -> dict[str, Any]:
    """The plan's guard config, with the local client trusted, no store, no traces (nothing listens)."""
    return {k: v for k, v in bench_guard_config(config).items() if k != "traces"}


@pytest.fixture(scope="module")
def servers(stack_values, tmp_path_factory):
    from vllm_gke.infra.plan import run_program

    tmp = tmp_path_factory.mktemp("fallback")
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    values = copy.deepcopy(stack_values["prod"])
    with_batch(values)
    plan = run_program("prod", values)
    args, _ = longest_prompt_container(plan)
    configs = guard_configs(plan)
    small = guard_for(configs["vllm/qwen-7b-short"])
    big = guard_for(configs["vllm/llama-8b-short"])
    big["overload"] = {"queueSloSeconds": 0.5}  # prod's is 1 s: the stand-in's queue never moves, so its age
    waiting = tmp / "waiting"
    waiting.write_text("0")
    fallback_proc, fallback_base, fallback_log = start(args, "qwen-7b", small, model_dir, tmp)
    sidecar = Sidecar(fallback_base)
    # The replicas reach the fallback's Service through its sidecar: here, the stand-in's address.
    for target in big["fallback"]["tenants"].values():
        for key in ("url", "longUrl"):
            target[key] = sidecar.url + "/" + target[key].split("/", 3)[3]
    proc, base, log = start(args, "llama-8b", big, model_dir, tmp, FAKE_ENGINE_WAITING_FILE=str(waiting))
    try:
        healthy(fallback_base, fallback_proc, tmp / "qwen-7b.log")
        healthy(base, proc, tmp / "llama-8b.log")
        yield {"base": base, "waiting": waiting, "sidecar": sidecar, "tmp": tmp, "config": big}
    finally:
        for p in (proc, fallback_proc):
            stop(p)
        sidecar.server.shutdown()
        log.close()
        fallback_log.close()


def ask(servers, who: str, stream: bool = False, model: str = "llama-8b") -> tuple[int, dict[str, str], Any]:
    """A chat request of `who` to the llama-8b replica, as its sidecar hands it on: the verified
    issuer header, and the token (kept on the request for the tenants sent to a fallback)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_completion_tokens": 8,
            "stream": stream}
    headers = {"content-type": "application/json", "x-vllm-gke-issuer": ISSUERS[who],
               "authorization": f"Bearer {who}-token"}
    request = urllib.request.Request(servers["base"] + "/llama-8b/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            raw = resp.read().decode()
            status, answer_headers = resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        raw, status, answer_headers = err.read().decode(), err.code, {k.lower(): v for k, v in err.headers.items()}
    if stream and status == 200:
        return status, answer_headers, [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]
    return status, answer_headers, json.loads(raw)


def until(servers, who: str, wanted: Optional[str], waiting: Optional[int] = None) -> tuple[int, dict[str, str], Any]:
    """Ask as `who` until the model that answers is `wanted` (None: this replica's own), the
    replica's engine reporting `waiting` requests (search's request carries it to the gauge)."""
    if waiting is not None:
        servers["waiting"].write_text(str(waiting))
        assert ask(servers, "search")[0] == 200
    deadline = time.monotonic() + 60
    while True:
        answer = ask(servers, who)
        if answer[0] == 200 and answer[1].get(SERVED) == wanted or time.monotonic() > deadline:
            return answer
        time.sleep(0.25)


def metric(servers, series: str) -> float:
    with urllib.request.urlopen(servers["base"] + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


def test_an_overloaded_replica_sends_support_to_the_fallback_and_takes_it_back(servers):
    served = 'vllm_gke_tenant_fallback_requests_total{fallback="qwen-7b",model="llama-8b",outcome="served",tenant="support"}'
    before = metric(servers, served)
    status, headers, body = until(servers, "support", "qwen-7b", waiting=100000)
    assert status == 200 and headers[SERVED] == "qwen-7b", (status, headers, body)
    assert body["model"] == "qwen-7b" and body["choices"][0]["message"]["role"] == "assistant"
    # The qwen-7b server's guard took it as support's: its cache salt reached that engine.
    engine = [json.loads(line) for line in (servers["tmp"] / "qwen-7b.engine.jsonl").read_text().splitlines()]
    assert engine and all(e["cache_salt"] == "tenant-support" for e in engine)
    # Sent with support's own token and no claim header of the replica's: the sidecar wrote its own.
    sent = servers["sidecar"].seen[-1]
    assert sent["authorization"] == "Bearer support-token" and "x-vllm-gke-issuer" not in sent
    # batch (shed first) may not call qwen-7b: the 429; search (priority 0) is served here.
    status, headers, body = ask(servers, "batch")
    assert status == 429 and body["error"]["code"] == "overloaded" and "retry-after" in headers
    status, headers, body = ask(servers, "search")
    assert status == 200 and SERVED not in headers and body["model"] == "llama-8b"
    # A stream comes back as the fallback sends it.
    status, headers, events = ask(servers, "support", stream=True)
    assert status == 200 and headers[SERVED] == "qwen-7b" and events and {e["model"] for e in events} == {"qwen-7b"}
    assert metric(servers, served) >= before + 2
    # The fallback refusing: the 429 the client would have had.
    servers["sidecar"].refusing = True
    status, headers, body = ask(servers, "support")
    servers["sidecar"].refusing = False
    assert status == 429 and body["error"]["code"] == "overloaded" and "retry-after" in headers
    # The queue drains: support is served here again.
    status, headers, body = until(servers, "support", None, waiting=0)
    assert status == 200 and SERVED not in headers and body["model"] == "llama-8b", (status, headers, body)


def test_an_answer_cut_midway_reaches_the_client_as_a_failure(servers):
    """The fallback's connection dropped half way through its answer, in vLLM's own server: a
    plain answer's connection is aborted (never a complete 200), a stream ends with vLLM's error
    event; each counted `cut`."""
    cut = 'vllm_gke_tenant_fallback_requests_total{fallback="qwen-7b",model="llama-8b",outcome="cut",tenant="support"}'
    before = metric(servers, cut)
    assert until(servers, "support", "qwen-7b", waiting=100000)[1].get(SERVED) == "qwen-7b"
    servers["sidecar"].cutting = True
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            ask(servers, "support")
        status, headers, events = ask(servers, "support", stream=True)
    finally:
        servers["sidecar"].cutting = False
    assert status == 200 and headers[SERVED] == "qwen-7b", (status, headers, events)
    assert events[-1]["error"]["type"] == "ServiceUnavailableError", events
    assert all(e["model"] == "qwen-7b" for e in events[:-1])
    assert metric(servers, cut) == before + 2
    assert until(servers, "support", None, waiting=0)[1].get(SERVED) is None
