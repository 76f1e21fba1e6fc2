"""The server image: a pinned Dockerfile, the tenant guard middleware and the warm-up entrypoint."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time


from components.vllm_service import GUARD_MIDDLEWARE, WARM_MARKER
from infra.plan import REPO_ROOT
from tests.conftest import STACKS, vllm_deployments

IMAGES = REPO_ROOT / "images"
sys.path.insert(0, str(IMAGES))
import vllm_gke_guard as guard  # noqa: E402


# --- Dockerfile (static: no Docker engine here; Cloud Build builds it) -----------------------

def dockerfile() -> str:
    return (IMAGES / "Dockerfile").read_text()


def test_base_image_is_pinned():
    text = dockerfile()
    version = re.search(r"^ARG VLLM_VERSION=(v\d+\.\d+\.\d+)$", text, re.M)
    assert version, "the vLLM version must be pinned in an ARG"
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert base == "vllm/vllm-openai:${VLLM_VERSION}"
    assert "latest" not in version.group(1)


def test_image_carries_what_the_deployment_runs(plans):
    text = dockerfile()
    copied = re.search(r"^COPY (.+) /opt/vllm-gke/$", text, re.M).group(1).split()
    for name in copied:
        assert (IMAGES / name).exists()
    container = vllm_deployments(plans["dev"])[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][1] == "/opt/vllm-gke/serve.py" and "serve.py" in copied
    assert f"{GUARD_MIDDLEWARE.split('.')[0]}.py" in copied
    assert "PYTHONPATH=/opt/vllm-gke" in text and "HF_HUB_OFFLINE=1" in text


def test_stack_images_track_the_dockerfile_version(stack_values):
    version = re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile(), re.M).group(1)
    for stack in STACKS:
        image = stack_values[stack]["vllm-gke:serverImage"]
        assert "tag" not in image or image["tag"].startswith(version + "-"), stack
    build = (IMAGES / "cloudbuild.yaml").read_text()
    assert f"_VLLM_VERSION: {version}" in build


# --- guard middleware ------------------------------------------------------------------------

ISSUER = "https://auth.example/a"
CONFIG = {"issuerHeader": "x-vllm-gke-issuer",
          "issuers": {ISSUER: {"tenant": "a", "maxTokens": 100, "requestsPerMinute": 2}}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def call(mw, body: dict | bytes, path="/v1/completions", issuer=ISSUER, extra_headers=()):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if issuer:
        headers.append((b"x-vllm-gke-issuer", issuer.encode()))
    headers += list(extra_headers)
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    chunks = [raw[:5], raw[5:]]
    sent: list[dict] = []

    async def receive():
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent


class Recorder:
    def __init__(self):
        self.seen = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message["body"]
            if not message.get("more_body"):
                break
        self.seen.append((dict(scope["headers"]), json.loads(body)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def status(sent):
    return sent[0]["status"]


def test_guard_sets_missing_max_tokens_to_cap():
    app = Recorder()
    sent = call(guard.GuardMiddleware(app, CONFIG, Clock()), {"model": "m", "prompt": "hi"})
    assert status(sent) == 200
    headers, body = app.seen[0]
    assert body["max_tokens"] == 100
    assert headers[b"content-length"] == str(len(json.dumps(body).encode())).encode()


def test_guard_refuses_above_cap_with_openai_error():
    app = Recorder()
    sent = call(guard.GuardMiddleware(app, CONFIG, Clock()), {"model": "m", "max_tokens": 101})
    assert status(sent) == 400 and not app.seen
    err = json.loads(sent[1]["body"])["error"]
    assert err["code"] == "max_tokens_exceeded" and err["param"] == "max_tokens" and "100" in err["message"]
    sent = call(guard.GuardMiddleware(app, CONFIG, Clock()), {"messages": [], "max_completion_tokens": 500},
                path="/v1/chat/completions")
    assert status(sent) == 400


def test_guard_rejects_unknown_issuer():
    app = Recorder()
    assert status(call(guard.GuardMiddleware(app, CONFIG, Clock()), {}, issuer="https://evil")) == 403
    assert status(call(guard.GuardMiddleware(app, CONFIG, Clock()), {}, issuer=None)) == 403
    assert not app.seen


def test_guard_rate_limits_per_tenant():
    clock = Clock()
    app = Recorder()
    mw = guard.GuardMiddleware(app, CONFIG, clock)
    assert [status(call(mw, {"max_tokens": 1})) for _ in range(3)] == [200, 200, 429]
    sent = call(mw, {"max_tokens": 1})
    assert dict(sent[0]["headers"])[b"retry-after"] == b"30"
    clock.now += 30
    assert status(call(mw, {"max_tokens": 1})) == 200


def test_guard_passes_other_paths_and_warmup_token(monkeypatch):
    app = Recorder()
    mw = guard.GuardMiddleware(app, CONFIG, Clock())
    assert status(call(mw, {"x": 1}, path="/v1/models", issuer=None)) == 200
    monkeypatch.setenv("VLLM_GKE_WARMUP_TOKEN", "s3cret")
    mw = guard.GuardMiddleware(app, CONFIG, Clock())
    assert status(call(mw, {"max_tokens": 8}, issuer=None, extra_headers=[(b"x-vllm-gke-warmup", b"s3cret")])) == 200
    assert status(call(mw, {"max_tokens": 8}, issuer=None, extra_headers=[(b"x-vllm-gke-warmup", b"guess")])) == 403


def test_guard_reads_config_from_env(monkeypatch):
    monkeypatch.setenv("VLLM_GKE_GUARD_CONFIG", json.dumps(CONFIG))
    assert guard.GuardMiddleware(Recorder()).issuers == CONFIG["issuers"]


# --- warm-up entrypoint ----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_entrypoint_waits_for_health_warms_up_then_marks_warm(tmp_path):
    marker, log = tmp_path / "warm", tmp_path / "requests.jsonl"
    env = dict(os.environ, VLLM_GKE_WARM_MARKER=str(marker), FAKE_VLLM_LOG=str(log),
               VLLM_GKE_SERVER_COMMAND=f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'fake_vllm.py'}")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(IMAGES / "serve.py"), "/models/m/main",
                             "--served-model-name", "m", "--port", str(port)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        assert marker.exists()
        requests = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(requests) == 2
        assert all(r == {"path": "/v1/completions", "model": "m", "token_ok": True} for r in requests)
        proc.send_signal(signal.SIGTERM)  # forwarded to the server, which drains and exits
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_entrypoint_exits_with_server_when_it_dies(tmp_path):
    env = dict(os.environ, VLLM_GKE_WARM_MARKER=str(tmp_path / "warm"), FAKE_VLLM_EXIT="3",
               FAKE_VLLM_LOG=str(tmp_path / "log"),
               VLLM_GKE_SERVER_COMMAND=f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'fake_vllm.py'}")
    proc = subprocess.run([sys.executable, str(IMAGES / "serve.py"), "--port", str(free_port())],
                          env=env, timeout=30)
    assert proc.returncode == 3 and not (tmp_path / "warm").exists()


def test_warm_marker_matches_startup_probe(plans):
    c = vllm_deployments(plans["dev"])[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["startupProbe"]["exec"]["command"] == ["test", "-f", WARM_MARKER]
    assert {"name": "VLLM_GKE_WARM_MARKER", "value": WARM_MARKER} in c["env"]
