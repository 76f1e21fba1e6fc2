"""The P/D front on the decode pods (images/vllm_gke_guard/pd_front.py): the routing sidecar's route table
against what reaches it, the front as a real process before a stand-in sidecar, the decode pods' fence
(NetworkPolicy), the prefill leg's mesh path, and the identity extension's refusal of an unread P/D body.
The tuned stack's llama-70b-pd is the disaggregated model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.test_identity_extension import (  # noqa: F401 (issuers: its fixture, a JWKS server)
    CHAT,
    bearer,
    claims,
    config_of,
    headers_message,
    issuers,
    post,
    refusal,
    run,
)
from vllm_gke.components.model.disaggregation_cluster import DECODE_ENGINE_PORT, SIDECAR_PORT, decode_ingress
from vllm_gke.components.model.picker import picker_labels, picker_name
from vllm_gke.components.model.serving_api import picker_routes
from vllm_gke.images.vllm_gke_guard.pd_front import target
from vllm_gke.images.vllm_gke_guard.prefixes import Prefixes
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

MODEL = "llama-70b-pd"
ROOT = Path(__file__).resolve().parent.parent
# llm-d-router v0.10.0's routing sidecar routes these exact POST paths to its P/D handler and everything
# else to vLLM as it is (pkg/sidecar/proxy/proxy.go:627-635; the paths chat_completions.go:41-53).
SIDECAR_PD_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                     "/inference/v1/generate"}


@pytest.fixture(scope="module")
def tuned() -> Plan:
    return run_program("tuned", read_stack_config("tuned"))


def _decode(plan: Plan) -> dict[str, Any]:
    return next(d for d in plan.manifests() if d["kind"] == "Deployment"
                and d["metadata"]["name"] == f"{MODEL}-short")["spec"]["template"]


def _guard(container: dict[str, Any]) -> dict[str, Any]:
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG"))


def _args(container: dict[str, Any]) -> dict[str, str]:
    argv = [*container.get("command", []), *container.get("args", [])]
    return dict(a.removeprefix("--").split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def sidecar_sees(template: dict[str, Any], pool_port: int, path: str) -> str:
    """The path the routing sidecar gets for a request the pool's port got at `path`: through whatever
    container listens there (the P/D front takes the prefix off; the sidecar itself sees it as sent)."""
    front = next(c for c in template["spec"]["initContainers"]
                 if any(p["containerPort"] == pool_port for p in c.get("ports") or []))
    if front["name"] == "routing-sidecar":
        return path
    assert front["name"] == "pd-front" and int(_args(front)["upstream-port"]) == SIDECAR_PORT
    out = target(Prefixes(_guard(front)["pathPrefixes"]), path, path)
    assert out is not None, path
    return out


def test_every_tenant_route_of_a_pd_pool_reaches_the_sidecars_pd_handler(tuned):
    """Each POST route the decode pod's guard admits, under each prefix the pool is reached at, arrives at
    the routing sidecar as one of its P/D paths (before the front: /<tenant>/<model>/v1/..., never one)."""
    t = _decode(tuned)
    (pool,) = [d for d in tuned.manifests() if d["kind"] == "InferencePool" and d["metadata"]["name"] == MODEL]
    port = int(pool["spec"]["targetPorts"][0]["number"])
    guard = _guard(t["spec"]["containers"][0])
    posts = [p for p, r in guard["routes"].items() if r["method"] == "POST"]
    assert posts and guard["pathPrefixes"]
    for prefix in guard["pathPrefixes"]:
        for route in posts:
            assert sidecar_sees(t, port, prefix + route) in SIDECAR_PD_ROUTES, (prefix, route)


def test_the_front_strips_only_the_pools_prefixes():
    prefixes = Prefixes(["/chat/m", "/m"])
    assert target(prefixes, "/chat/m/v1/chat/completions", "/chat/m/v1/chat/completions?a=1") == "/v1/chat/completions?a=1"
    assert target(prefixes, "/m/v1/completions", "/m/v1/completions") == "/v1/completions"
    assert target(prefixes, "/other/m/v1/completions", "/other/m/v1/completions") is None
    assert target(prefixes, "/chat/m-evil/v1/x", "/chat/m-evil/v1/x") is None
    for kept in ("/health", "/metrics", "/v1/models", "/v1/chat/completions"):
        assert target(prefixes, kept, kept) == kept


def test_decode_pods_run_the_front_on_the_pools_port_and_the_sidecar_behind_it(tuned):
    t = _decode(tuned)
    by_name = {c["name"]: c for c in t["spec"]["initContainers"]}
    front, sidecar, vllm = by_name["pd-front"], by_name["routing-sidecar"], t["spec"]["containers"][0]
    assert front["restartPolicy"] == sidecar["restartPolicy"] == "Always"
    assert front["image"] == vllm["image"] and front["ports"] == [{"name": "pd-front", "containerPort": 8000}]
    assert front["command"][:3] == ["python3", "-m", "vllm_gke_guard.pd_front"]
    assert _args(front) == {"port": "8000", "upstream-port": str(SIDECAR_PORT)}
    assert (_args(sidecar)["port"], _args(sidecar)["model-server-port"]) == (str(SIDECAR_PORT), str(DECODE_ENGINE_PORT))
    assert _guard(front)["pathPrefixes"] == _guard(vllm)["pathPrefixes"]
    assert front["securityContext"]["readOnlyRootFilesystem"] and front["securityContext"]["runAsNonRoot"]
    assert front["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}


# --- the decode pods' fence and the prefill leg's mesh path --------------------------------------

def test_the_decode_pods_admit_the_pools_port_from_the_load_balancer_and_picker_alone(tuned):
    (pol,) = [d for d in tuned.manifests() if d["kind"] == "NetworkPolicy"
              and (d["spec"]["podSelector"].get("matchLabels") or {}).get("llm-d.ai/role") == "decode"]
    assert pol["spec"]["podSelector"]["matchLabels"] == {"vllm-gke.io/model": MODEL, "llm-d.ai/role": "decode"}
    rules = {tuple(p["port"] for p in r["ports"]): r["from"] for r in pol["spec"]["ingress"]}
    pool = rules[(8000,)]
    cidrs = {p["ipBlock"]["cidr"] for p in pool if "ipBlock" in p}
    (picker_ingress,) = [d for d in tuned.manifests() if d["kind"] == "NetworkPolicy"
                         and d["metadata"]["name"] == f"{MODEL}-epp-ingress"] or [None]
    if picker_ingress is not None:  # the same load balancer sources as the picker's
        assert cidrs == {p["ipBlock"]["cidr"] for p in picker_ingress["spec"]["ingress"][0]["from"]}
    assert "130.211.0.0/22" in cidrs and "35.191.0.0/16" in cidrs
    assert [p for p in pool if "podSelector" in p] == [{"podSelector": {"matchLabels": picker_labels(picker_name(MODEL))}}]
    assert all("namespaceSelector" in p or "ipBlock" in p for p in rules[(DECODE_ENGINE_PORT,)])
    nixl = next(v for k, v in rules.items() if 5600 in k)
    assert nixl == [{"podSelector": {"matchLabels": {"vllm-gke.io/model": MODEL, "llm-d.ai/role": "prefill"}}}]


def test_the_decode_fence_needs_the_load_balancers_sources():
    spec = decode_ingress("m", ["10.0.0.0/23"], [])
    assert spec["ingress"][0]["from"][0] == {"ipBlock": {"cidr": "10.0.0.0/23"}}


def test_the_prefill_leg_reaches_the_prefill_pods_at_the_bare_path(tuned):
    """The front takes the prefix off, so the sidecar's prefill leg is /v1/...: each caller's allow on the
    prefill pods admits it there (with its own objective), and only there."""
    allows = [d for d in tuned.manifests() if d["kind"] == "AuthorizationPolicy"
              and d["metadata"]["name"].endswith(f"-{MODEL}-prefill")]
    assert allows
    for a in allows:
        assert a["spec"]["selector"]["matchLabels"] == {"vllm-gke.io/model": MODEL, "llm-d.ai/role": "prefill"}
        paths = {p for r in a["spec"]["rules"] for op in r["to"] for p in op["operation"]["paths"]}
        assert paths == {r.path for r in picker_routes()}


# --- the front as a real process ---------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandIn(BaseHTTPRequestHandler):
    """The routing sidecar's stand-in: records what it got, answers an SSE stream in three chunks."""
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802
        self._answer(b"")

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self.rfile.read(int(self.headers.get("content-length") or 0)))

    def _answer(self, body: bytes) -> None:
        self.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        if self.path == "/v1/slow":  # a long non-streamed answer: does the front let go when its client does?
            self.seen[-1]["left"] = self._peer_left()
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for event in (b"data: {\"n\":1}\n\n", b"data: {\"n\":2}\n\n", b"data: [DONE]\n\n"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if self.path == "/v1/broken":  # the sidecar fails after the answer began
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def _peer_left(self) -> bool:
        """Whether the front closed this request's connection within 30 s (it should once its client left)."""
        import select

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([self.connection], [], [], 0.2)[0] and self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        return False

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def front() -> Iterator[dict[str, Any]]:
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        if os.environ.get("CI") == "true":
            pytest.fail("VLLM_PYTHON unset: CI must run the front in the vLLM image's interpreter (aiohttp)")
        pytest.skip("VLLM_PYTHON unset")
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "images"),
           "GKE_LLM_GUARD_CONFIG": json.dumps({
               "pathPrefixes": ["/chat/m", "/m"], "maxBodyBytes": 4096,
               "issuers": {"https://iss": {"tenant": "chat", "maxTokens": 64, "requestsPerMinute": 10}},
               "routes": {"/v1/chat/completions": {"method": "POST", "kind": "chat"},
                          "/v1/completions": {"method": "POST", "kind": "completions"}}})}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([python, "-m", "vllm_gke_guard.pd_front", f"--port={port}",
                             f"--upstream-port={upstream.server_address[1]}"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    try:
        assert proc.poll() is None, log.seek(0) or log.read().decode()[-2000:]
        yield {"port": port}
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.shutdown()
        log.close()


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body or None, headers or {})
    return conn, conn.getresponse()


def test_a_prefixed_request_reaches_the_sidecar_bare_with_its_headers_and_streams_back(front):
    StandIn.seen.clear()
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    conn, resp = _request(front["port"], "POST", "/chat/m/v1/chat/completions?x=1", body,
                          {"content-type": "application/json", "authorization": "Bearer t",
                           "x-gateway-inference-objective": "chat.m", "x-prefiller-host-port": "10.0.0.9:8000"})
    assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream"
    first = resp.read1(65536)  # the first event arrives before the stream ends
    assert first.startswith(b"data: {\"n\":1}")
    rest = first + resp.read()
    conn.close()
    assert rest == b"data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n"
    (seen,) = StandIn.seen
    assert seen["path"] == "/v1/chat/completions?x=1" and seen["body"] == body
    assert seen["headers"]["authorization"] == "Bearer t"
    assert seen["headers"]["x-gateway-inference-objective"] == "chat.m"
    assert seen["headers"]["x-prefiller-host-port"] == "10.0.0.9:8000"
    assert seen["headers"]["content-type"] == "application/json"


@pytest.mark.parametrize("path", ["/chat/m/v1/chat/completions", "/m/v1/completions", "/v1/chat/completions",
                                  "/chat/m/v1/responses"])
def test_a_clients_kv_transfer_params_never_reach_the_sidecar(front, path):
    StandIn.seen.clear()
    for body in (b'{"model":"m","kv_transfer_params":{"remote_host":"10.9.9.9","remote_port":5600}}',
                 b'{"model":"m","kv\\u005ftransfer_params":{}}',
                 b'{"model":"m","vllm_xargs":{"kv_transfer_params":0}}'):
        conn, resp = _request(front["port"], "POST", path, body, {"content-type": "application/json"})
        answer = json.loads(resp.read())
        conn.close()
        assert resp.status == 400 and answer["error"]["code"] == "kv_transfer_params_refused", answer
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["param"] == ("vllm_xargs" if b"xargs" in body else "kv_transfer_params")
    assert StandIn.seen == []


@pytest.mark.parametrize("path,body", [
    ("/chat/m/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}),
    ("/m/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 40, "n": 2}),
])
def test_a_request_over_its_tenants_cap_never_reaches_the_sidecar(front, path, body):
    """The sidecar's prefill leg sets max_tokens to 1, so no guard could refuse it before the prefill ran:
    the front checks the tenant's cap (the guard's config and caps.py)."""
    StandIn.seen.clear()
    headers = {"content-type": "application/json", "x-vllm-gke-issuer": "https://iss"}
    conn, resp = _request(front["port"], "POST", path, json.dumps(body).encode(), headers)
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 400 and answer["error"]["code"] == "max_tokens_exceeded", answer
    assert StandIn.seen == []
    # Within the cap, or no tenant the front knows (the guard decides): passed on.
    for sent in ({**body, "max_tokens": 8}, body):
        conn, resp = _request(front["port"], "POST", path, json.dumps(sent).encode(),
                              {**headers, "x-vllm-gke-issuer": "https://iss" if sent is not body else "https://x"})
        resp.read()
        conn.close()
        assert resp.status == 200
    assert len(StandIn.seen) == 2


def test_a_client_that_leaves_cancels_the_sidecars_request(front):
    """aiohttp's run_app keeps a handler running after its client left unless handler_cancellation is on:
    the sidecar (and vLLM behind it) would generate a non-streamed answer to its end for nobody."""
    StandIn.seen.clear()
    conn = socket.create_connection(("127.0.0.1", front["port"]))
    conn.sendall(b"POST /v1/slow HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
    while not StandIn.seen:
        time.sleep(0.05)
    conn.close()
    while "left" not in StandIn.seen[0]:
        time.sleep(0.1)
    assert StandIn.seen[0]["left"] is True


def test_a_sidecar_failing_mid_answer_cuts_the_clients_connection(front):
    """Once the answer began, the front may not answer a 503 inside its body, nor end it as if complete:
    the connection is cut, and the client sees the answer broke off."""
    conn = socket.create_connection(("127.0.0.1", front["port"]), timeout=30)
    conn.sendall(b"POST /v1/broken HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
    raw = b""
    while chunk := conn.recv(1 << 16):
        raw += chunk
    conn.close()
    assert raw.startswith(b"HTTP/1.1 200") and b"data: {" in raw, raw
    assert b"503" not in raw and b"upstream_unavailable" not in raw and not raw.endswith(b"0\r\n\r\n"), raw


def test_an_unknown_prefix_is_404_and_health_and_metrics_pass_as_they_are(front):
    StandIn.seen.clear()
    conn, resp = _request(front["port"], "POST", "/other/m/v1/chat/completions", b"{}")
    assert resp.status == 404 and json.loads(resp.read())["error"]["type"] == "invalid_request_error"
    conn.close()
    for path in ("/health", "/metrics"):
        conn, resp = _request(front["port"], "GET", path)
        assert resp.status == 200
        resp.read()
        conn.close()
    assert [s["path"] for s in StandIn.seen] == ["/health", "/metrics"]


def test_a_body_over_the_guards_limit_is_413(front):
    conn, resp = _request(front["port"], "POST", "/m/v1/completions", b"x" * 5000)
    assert resp.status == 413 and json.loads(resp.read())["error"]["type"] == "invalid_request_error"
    conn.close()


# --- the identity extension: a P/D body it would not read ----------------------------------------

def test_a_pd_urls_body_on_the_header_only_chain_is_refused_503(issuers):  # noqa: F811
    """While GKE has not programmed the body chain's match for a P/D URL, its body would pass unread (a
    client's kv_transfer_params with it): refused; its bodiless requests and the body chain's pass."""
    cfg = config_of(issuers["base"])
    cfg["prefixes"]["/support/llama"]["disaggregated"] = True
    token = issuers["keys"]["/a"].sign(claims())
    path = "/support/llama/v1/chat/completions"
    [resp] = run(cfg, post(path, token, CHAT, body_chain=False)[:1])
    code, answer = refusal(resp)
    assert code == 503 and answer["error"]["type"] == "service_unavailable", answer
    [ok] = run(cfg, [headers_message("/support/llama/v1/models", bearer(token), True)])
    assert ok.WhichOneof("response") == "request_headers"
    held = run(cfg, post(path, token, CHAT))
    assert len(held) == 2 and held[0].WhichOneof("response") == "request_headers"
    # Not a P/D URL: as before, answered at its headers.
    del cfg["prefixes"]["/support/llama"]["disaggregated"]
    [plain] = run(cfg, post(path, token, CHAT, body_chain=False)[:1])
    assert plain.WhichOneof("response") == "request_headers"


def test_the_stacks_pd_urls_are_marked_for_the_extension(tuned):
    doc = next(d for d in tuned.manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vllm-gke-identity")
    prefixes = json.loads(doc["data"]["identity.json"])["prefixes"]
    marked = {p for p, v in prefixes.items() if v.get("disaggregated")}
    assert marked and marked == {p for p in prefixes if p.endswith(f"/{MODEL}")}





def test_a_body_the_front_cannot_read_never_reaches_the_sidecar(front):
    """A lone surrogate escape fails msgspec, and Go's decoder in the sidecar would turn it into U+FFFD
    and send a prefill leg at max_tokens 1: the front refuses the body as the guard would (400), so an
    over-cap request cannot buy a prefill that way."""
    StandIn.seen.clear()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi\\ud800"}], "max_tokens": 100000}'
    headers = {"content-type": "application/json", "x-vllm-gke-issuer": "https://iss"}
    conn, resp = _request(front["port"], "POST", "/chat/m/v1/chat/completions", body, headers)
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 400 and answer["error"]["code"] == "invalid_json", answer
    assert StandIn.seen == []
