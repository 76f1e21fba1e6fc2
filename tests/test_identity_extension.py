"""The tenant identity extension (images/vllm_gke_identity) driven over real gRPC, as the load
balancer drives it: real RSA and EC keys, each issuer's JWKS served over HTTP, tokens signed by
PyJWT. What it must do: set the picker's objective, fairness id and the verified tenant only for
a valid token of the tenant the path names, remove every client copy of the picker's headers,
answer 401/403/503 in OpenAI's format otherwise, and never end a stream with an error. On the
picker's body routes: the body bounded before it is read (413), refused when it is not one JSON
object (400), and sent on with the tenant's cache_salt the replica's guard sets (the picker's
prefix keys then match the replica's salted blocks)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, AsyncIterator, Iterator, Optional, cast

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from vllm_gke.components.model.identity_extension import BODY_CHAIN, body_conditions, routing_extension_spec
from vllm_gke.components.model.identity_extension import identity_config as config_for
from vllm_gke.components.model.serving_api import (
    FAIRNESS_HEADER,
    IDENTITY_STRIPS,
    OBJECTIVE_HEADER,
    PICKER_CONTROL_HEADERS,
    TENANT_HEADER,
    guard_entry,
)
from vllm_gke.images.vllm_gke_guard.body import add_members, closing_brace
from vllm_gke.images.vllm_gke_guard.config import Tenant
from vllm_gke.images.vllm_gke_identity import config as identity_config
from vllm_gke.images.vllm_gke_identity import server as identity_server
from vllm_gke.images.vllm_gke_identity.salt import salted
from vllm_gke.infra.config import parse
from vllm_gke.infra.plan import read_stack_config

# xds-protos ships no type stubs.
pb: Any = external_processor_pb2
HeaderMap: Any = base_pb2.HeaderMap  # pyright: ignore[reportAttributeAccessIssue]
HeaderValue: Any = base_pb2.HeaderValue  # pyright: ignore[reportAttributeAccessIssue]
ISS_A = "https://issuer-a.example.com"
ISS_B = "https://issuer-b.example.com/"
LIMIT = 4096
GKE_NAMESPACE = "com.google.lb_route_extension.vllm-gke-identity.tenant-identity-body.salt-tenant"


class Keys:
    """An issuer's signing keys and the JWKS that publishes them (rotate() swaps in a new key)."""

    def __init__(self, kid: str, curve: bool = False):
        self.kid, self.curve = kid, curve
        self.private: Any = ec.generate_private_key(ec.SECP256R1()) if curve else rsa.generate_private_key(65537, 2048)
        self.fetches = 0

    def jwks(self) -> dict[str, Any]:
        algo = ECAlgorithm if self.curve else RSAAlgorithm
        key = json.loads(algo.to_jwk(self.private.public_key()))
        return {"keys": [{**key, "kid": self.kid, "use": "sig"}]}

    def sign(self, claims: dict[str, Any], kid: Optional[str] = "", alg: str = "") -> str:
        headers = {} if kid is None else {"kid": kid or self.kid}
        return jwt.encode(claims, self.private, algorithm=alg or ("ES256" if self.curve else "RS256"), headers=headers)


@pytest.fixture(scope="module")
def issuers() -> Iterator[dict[str, Any]]:
    keys = {"/a": Keys("a1"), "/b": Keys("b1", curve=True)}

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/down":
                self.send_error(500)
                return
            k = keys[self.path]
            k.fetches += 1
            body = json.dumps(k.jwks()).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{http.server_address[1]}"
    yield {"keys": keys, "base": base}
    http.shutdown()


def config_of(base: str) -> dict[str, Any]:
    return {
        "tenants": {
            "support": {"issuer": ISS_A, "jwksUri": f"{base}/a", "audiences": ["vllm"], "subjects": None},
            # Two tenants of one issuer, told apart by subject.
            "search": {"issuer": ISS_B, "jwksUri": f"{base}/b", "audiences": ["vllm", "other"],
                       "subjects": ["svc-search"]},
            "batch": {"issuer": ISS_B, "jwksUri": f"{base}/b", "audiences": ["vllm"], "subjects": ["svc-batch"]},
            "nokeys": {"issuer": "https://down.example.com", "jwksUri": f"{base}/down", "audiences": ["vllm"],
                       "subjects": None},
        },
        "prefixes": {"/support/llama": {"tenant": "support", "objective": "support.llama",
                                        "cacheSalt": "tenant-support", "maxBodyBytes": LIMIT,
                                        "saltedPaths": ["/v1/chat/completions", "/v1/completions"]},
                     "/search/llama": {"tenant": "search", "objective": "search.llama"},
                     "/batch/llama": {"tenant": "batch", "objective": "batch.llama"},
                     "/nokeys/llama": {"tenant": "nokeys", "objective": "nokeys.llama"}},
        "headers": {"objective": OBJECTIVE_HEADER, "fairness": FAIRNESS_HEADER, "tenant": TENANT_HEADER,
                    "strip": list(IDENTITY_STRIPS)},
    }


def claims(iss: str = ISS_A, sub: str = "anyone", aud: Any = "vllm", **extra: Any) -> dict[str, Any]:
    return {"iss": iss, "sub": sub, "aud": aud, "exp": int(time.time()) + 600, **extra}


def headers_message(path: str, headers: dict[str, Any], end_of_stream: bool = True, body_chain: bool = False) -> Any:
    """A request's headers (bodiless unless `end_of_stream` is False), from the body chain (its
    extension's metadata under GKE's namespace) or the headers-only one."""
    pairs = [(":path", path), (":method", "POST"), (":authority", "gw.example.com")]
    for k, v in headers.items():
        pairs += [(k, x) for x in (v if isinstance(v, list) else [v])]
    out = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=HeaderMap(
        headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]), end_of_stream=end_of_stream))
    if body_chain:
        out.metadata_context.filter_metadata[GKE_NAMESPACE].update(BODY_CHAIN)
    return out


def body_messages(body: bytes, chunk: int = 7) -> list[Any]:
    """The body as the load balancer streams it in full duplex: chunks, the last one ending it."""
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    return [pb.ProcessingRequest(request_body=pb.HttpBody(body=p, end_of_stream=i == len(parts) - 1))
            for i, p in enumerate(parts)]


def post(path: str, token: str, body: bytes, body_chain: bool = True, headers: Optional[dict[str, Any]] = None
         ) -> list[Any]:
    """A POST with its body (Content-Length declared unless `headers` says otherwise), by default
    from the body chain."""
    headers = headers or {}
    length = {"content-length": str(len(body))} if "content-length" not in headers else {}
    return [headers_message(path, {**bearer(token), **FORGED, **length, **headers}, False, body_chain),
            *body_messages(body)]


def streamed_body(resp: Any) -> bytes:
    assert resp.WhichOneof("response") == "request_body", resp
    streamed = resp.request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    return streamed.body


async def exchange(port: int, messages: list[Any]) -> list[Any]:
    """One ext_proc stream carrying `messages`; every answer it gave (it must give one each)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = ExternalProcessorStub(channel).Process(iter(messages))
        return [r async for r in stream]


def run(cfg: dict[str, Any], messages: list[Any]) -> list[Any]:
    async def main() -> list[Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(identity_server.serve(identity_config.parse(cfg), port_ext, port_health, tls=False,
                                                         stop=stop, drain_s=0))
        await _ready(port_health)
        try:
            return await exchange(port_ext, messages)
        finally:
            stop.set()
            await task

    port_ext, port_health = _free_port(), _free_port()
    return asyncio.run(main())


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _ready(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        for _ in range(100):
            try:
                stub: Any = health_pb2_grpc.HealthStub(channel)
                answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the extension never reported SERVING")


def mutation(resp: Any) -> tuple[dict[str, str], list[str]]:
    assert resp.WhichOneof("response") == "request_headers", resp
    common = resp.request_headers.response
    assert common.clear_route_cache
    sets = {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}
    return sets, list(common.header_mutation.remove_headers)


def refusal(resp: Any) -> tuple[int, dict[str, Any]]:
    assert resp.WhichOneof("response") == "immediate_response", resp
    imm = resp.immediate_response
    return imm.status.code, json.loads(imm.body)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


FORGED = {h: "attacker" for h in IDENTITY_STRIPS}


def test_a_valid_token_sets_the_tenants_objective_fairness_and_tenant_and_drops_client_copies(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    [resp] = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/models",
                                                              {**bearer(token), **FORGED})])
    sets, removes = mutation(resp)
    assert sets == {OBJECTIVE_HEADER: "support.llama", FAIRNESS_HEADER: "support", TENANT_HEADER: "support"}
    # Every other spelling and control header the client sent is removed; what is set overwrites.
    assert set(removes) == set(IDENTITY_STRIPS) - set(sets)
    assert {"x-gateway-inference-objective", "x-gateway-inference-fairness-id", "x-llm-d-model-name-rewrite",
            "x-slo-ttft-ms", "x-llm-d-slo-tpot-ms"} <= set(removes)
    assert not (set(sets) & set(removes))  # Envoy removes before it sets: never its own headers


def test_every_picker_control_header_in_both_spellings_is_stripped():
    assert len(PICKER_CONTROL_HEADERS) == 13
    # llm-d-router v0.10.0's other input control headers (pkg/epp/util/request/headers.go:30-40).
    assert {"x-llm-d-video-fps", "x-llm-d-video-duration-seconds", "x-llm-d-video-resolution"} <= set(IDENTITY_STRIPS)
    for name in ("inference-objective", "inference-fairness-id", "model-name-rewrite"):
        assert f"x-llm-d-{name}" in IDENTITY_STRIPS and f"x-gateway-{name}" in IDENTITY_STRIPS
    for name in ("slo-ttft-ms", "slo-tpot-ms"):
        assert f"x-llm-d-{name}" in IDENTITY_STRIPS and f"x-{name}" in IDENTITY_STRIPS
    assert TENANT_HEADER in IDENTITY_STRIPS


def test_an_ec_key_a_rotated_kid_and_a_kidless_token_verify(issuers):
    b = issuers["keys"]["/b"]
    cfg = config_of(issuers["base"])
    ok = b.sign(claims(ISS_B, "svc-search", ["other", "x"]))
    kidless = b.sign(claims(ISS_B, "svc-search"), kid=None)
    for resp in run(cfg, [headers_message("/search/llama/v1/completions", bearer(t)) for t in (ok, kidless)]):
        assert mutation(resp)[0][FAIRNESS_HEADER] == "search"


def test_one_issuer_two_tenants_told_apart_by_subject(issuers):
    b = issuers["keys"]["/b"]
    cfg = config_of(issuers["base"])
    batch_token = b.sign(claims(ISS_B, "svc-batch"))
    own, other = run(cfg, [headers_message("/batch/llama/v1/completions", bearer(batch_token)),
                           headers_message("/search/llama/v1/completions", bearer(batch_token))])
    assert mutation(own)[0][OBJECTIVE_HEADER] == "batch.llama"
    status, body = refusal(other)
    assert status == 403 and body["error"]["type"] == "permission_error"


@pytest.mark.parametrize("case", ["wrong issuer", "wrong audience", "expired", "not yet valid", "other key",
                                  "alg none", "hmac with the public key", "garbage", "no bearer", "two tokens",
                                  "no token", "another tenant's token"])
def test_a_token_that_is_not_the_paths_tenants_is_refused_401_and_sets_nothing(issuers, case):
    a, b = issuers["keys"]["/a"], issuers["keys"]["/b"]
    other = Keys("a1")  # same kid, another key: the signature fails
    token = {
        "wrong issuer": lambda: a.sign(claims(iss="https://evil.example.com")),
        "wrong audience": lambda: a.sign(claims(aud="someone-else")),
        "expired": lambda: a.sign(claims(exp=int(time.time()) - 3600)),
        "not yet valid": lambda: a.sign(claims(nbf=int(time.time()) + 3600)),
        "other key": lambda: other.sign(claims()),
        "alg none": lambda: jwt.encode(claims(), "", algorithm="none", headers={"kid": "a1"}),
        "hmac with the public key": lambda: _hmac_with_public(a),
        "garbage": lambda: "not.a.jwt",
        "another tenant's token": lambda: b.sign(claims(ISS_B, "svc-search")),
    }.get(case)
    headers: dict[str, Any] = {**FORGED}
    if case == "no bearer":
        headers["authorization"] = f"Basic {a.sign(claims())}"
    elif case == "two tokens":
        headers["authorization"] = [f"Bearer {a.sign(claims())}", f"Bearer {a.sign(claims())}"]
    elif token is not None:
        headers.update(bearer(token()))
    [resp] = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/chat/completions", headers)])
    status, body = refusal(resp)
    assert status == 401, (case, body)
    assert body["error"]["type"] == "authentication_error" and body["error"]["message"]
    assert ("www-authenticate", 'Bearer error="invalid_token"') in [
        (o.header.key, o.header.raw_value.decode()) for o in resp.immediate_response.headers.set_headers]


def _hmac_with_public(keys: Keys) -> str:
    from cryptography.hazmat.primitives import serialization
    pem = keys.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": keys.kid}
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")
    signing = b64(json.dumps(header).encode()) + b"." + b64(json.dumps(claims()).encode())
    return (signing + b"." + b64(hmac.new(pem, signing, hashlib.sha256).digest())).decode()


def test_a_path_of_no_picker_sets_nothing_and_strips_client_copies(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    cfg = config_of(issuers["base"])
    # The shared length-routed URL, a model the tenant is not allowed behind the picker, a bare path.
    paths = ["/llama/v1/chat/completions", "/support/mistral/v1/chat/completions", "/", "/support"]
    for resp in run(cfg, [headers_message(p, {**bearer(token), **FORGED}) for p in paths]):
        sets, removes = mutation(resp)
        assert sets == {} and set(removes) == set(IDENTITY_STRIPS)


def test_an_unreachable_jwks_is_a_503_not_a_500(issuers):
    token = issuers["keys"]["/a"].sign(claims(iss="https://down.example.com"))
    [resp] = run(config_of(issuers["base"]), [headers_message("/nokeys/llama/v1/completions", bearer(token))])
    status, body = refusal(resp)
    assert status == 503 and body["error"]["code"] == "unavailable"


def test_bad_input_never_ends_the_stream(issuers):
    """Messages the load balancer should not send, a header message without :path, bodies and
    trailers: each gets an answer of its kind, and a valid request after them still passes."""
    token = issuers["keys"]["/a"].sign(claims())
    weird = [pb.ProcessingRequest(),
             pb.ProcessingRequest(request_body=pb.HttpBody(body=b"\xff\x00{", end_of_stream=True)),
             pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
             pb.ProcessingRequest(response_headers=pb.HttpHeaders()),
             pb.ProcessingRequest(request_headers=pb.HttpHeaders()),
             headers_message("/support/llama/v1/chat/completions", {"authorization": "Bearer \udcff".encode(
                 "utf-8", "surrogateescape").decode("latin-1")}),
             headers_message("/support/llama/v1/models", bearer(token))]
    answers = run(config_of(issuers["base"]), weird)
    assert len(answers) == len(weird)
    assert [a.WhichOneof("response") for a in answers[1:5]] == [
        "request_body", "request_trailers", "response_headers", "request_headers"]
    assert refusal(answers[5])[0] == 401
    assert mutation(answers[-1])[0][TENANT_HEADER] == "support"


def test_made_up_kids_do_not_become_a_fetch_each(issuers):
    a = issuers["keys"]["/a"]
    before = a.fetches
    tokens = [a.sign(claims(), kid=f"made-up-{i}") for i in range(20)]
    answers = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/models", bearer(t)) for t in tokens])
    assert all(refusal(r)[0] == 401 for r in answers)
    assert a.fetches - before <= 2  # the first fetch, at most one refetch for an unknown kid


def test_the_server_serves_ext_proc_over_tls(issuers):
    """The load balancer's HTTP/2 callouts run over TLS: the port answers a TLS client."""
    async def main() -> Any:
        stop = asyncio.Event()
        ext, hc = _free_port(), _free_port()
        task = asyncio.create_task(identity_server.serve(identity_config.parse(config_of(issuers["base"])), ext, hc,
                                                         stop=stop, drain_s=0))
        await _ready(hc)
        try:
            import ssl
            pem = ssl.get_server_certificate(("127.0.0.1", ext)).encode()
            creds = grpc.ssl_channel_credentials(root_certificates=pem)
            async with grpc.aio.secure_channel(f"127.0.0.1:{ext}", creds, options=[
                    ("grpc.ssl_target_name_override", "vllm-gke-identity")]) as channel:
                return [r async for r in ExternalProcessorStub(channel).Process(
                    iter([headers_message("/llama/v1/models", {})]))][0]
        finally:
            stop.set()
            await task
    assert mutation(asyncio.run(main()))[0] == {}


def test_a_config_naming_a_tenant_without_jwt_is_refused(issuers):
    cfg = config_of(issuers["base"])
    cfg["prefixes"]["/ghost/llama"] = {"tenant": "ghost", "objective": "ghost.llama"}
    with pytest.raises(KeyError, match="ghost"):
        identity_config.parse(cfg)


# --- the picker's body routes: the tenant's cache_salt --------------------------------------------

CHAT = b'{"model": "llama", "messages": [{"role": "user", "content": "hi <&> \\u00e9"}],\n "cache_salt": "mine",' \
       b' "max_tokens": 5, "temperature": 0.25}  \n'


def test_a_picker_body_gets_the_tenants_cache_salt_and_its_headers_wait_for_it(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    answers = run(config_of(issuers["base"]), post("/support/llama/v1/chat/completions?x=1", token, CHAT))
    # Nothing for the headers and the chunks until the body ends: then the headers, then the body.
    assert len(answers) == 2
    sets, removes = mutation(answers[0])
    out = streamed_body(answers[1])
    # No Content-Length: in full duplex Envoy removed the client's and would ignore one set here.
    assert sets == {OBJECTIVE_HEADER: "support.llama", FAIRNESS_HEADER: "support", TENANT_HEADER: "support"}
    assert set(removes) == set(IDENTITY_STRIPS) - set(sets)
    doc, sent = json.loads(out), json.loads(CHAT)
    assert doc["cache_salt"] == "tenant-support"  # the client's own is overridden (the last wins)
    assert {k: v for k, v in doc.items() if k != "cache_salt"} == {k: v for k, v in sent.items() if k != "cache_salt"}
    assert out.startswith(CHAT.rstrip()[:-1]) and out.endswith(b',"cache_salt":"tenant-support"}  \n')


def test_the_salt_is_the_guards_so_its_rewrite_at_the_replica_changes_nothing():
    """The guard's own functions on the same body for the same tenant of a real stack: the
    extension's salted body says what the guard's says, and the guard salting it again is a no-op."""
    cfg = parse(read_stack_config("staging"))
    identity = identity_config.parse(config_for(cfg))
    for tenant in (t for t in cfg.tenants if any(p.tenant == t.name for p in identity.prefixes.values())):
        target = next(p for p in identity.prefixes.values() if p.tenant == tenant.name)
        guard = Tenant(next(iter(guard_entry(tenant).values())), time.monotonic)
        assert guard.salt is not None and target.salt is not None
        for body in (CHAT, b'{}', b' {"prompt": "x"} ', b'{"prompt": [1, 2], "cache_salt": "other-tenant"}'):
            ours = salted(body, target.salt)
            theirs = add_members(body, closing_brace(None, body), guard.salt)
            assert ours == theirs
            again = add_members(ours, closing_brace(None, ours), guard.salt)
            assert json.loads(again) == json.loads(ours) and json.loads(ours)["cache_salt"] == f"tenant-{tenant.name}"


def test_a_length_routed_or_unsalted_paths_body_is_never_held_or_read(issuers):
    """Headers answered at once (the body chain is the picker's salted routes only); a body that
    reaches the extension anyway is sent back untouched, chunk by chunk."""
    token = issuers["keys"]["/a"].sign(claims())
    cfg = config_of(issuers["base"])
    for path in ("/llama/v1/chat/completions", "/support/llama/v1/responses", "/search/llama/v1/chat/completions"):
        tok = issuers["keys"]["/b"].sign(claims(ISS_B, "svc-search")) if path.startswith("/search") else token
        msgs = post(path, tok, CHAT)
        answers = run(cfg, msgs)
        assert len(answers) == len(msgs)
        assert answers[0].WhichOneof("response") == "request_headers"
        assert "content-length" not in mutation(answers[0])[0]
        echoed = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
        assert b"".join(e.body for e in echoed) == CHAT and [e.end_of_stream for e in echoed][-1]


def test_the_body_chain_reads_only_the_pickers_salted_routes():
    spec = routing_extension_spec("vllm", config_for(parse(read_stack_config("staging"))))
    body_chain, other = spec["extensionChains"]
    assert "matchCondition" not in other and other["extensions"][0]["supportedEvents"] == ["RequestHeaders"]
    ext = body_chain["extensions"][0]
    assert ext["supportedEvents"] == ["RequestHeaders", "RequestBody", "RequestTrailers"]
    assert ext["requestBodySendMode"] == "FullDuplexStreamed" and ext["failOpen"] is False
    matchers = [e["celMatcher"] for e in body_chain["matchCondition"]["celExpressions"]]
    # GKE's CRD (networking.gke.io/v1, as datreeio/CRDs-catalog dumps it): at most 10 matchers, each at
    # most 512 characters of the CEL subset's tokens, string literals of [A-Za-z0-9/-._~%!$&'()*+,;=:"\\].
    literal = r"'[A-Za-z0-9/\-._~%!$&()*+,;=:\"\\\\]*'"
    tokens = rf"( |request\.path|\.|startsWith|endsWith|\(|\)|\|\||&&|{literal})+"
    assert 1 <= len(matchers) <= 10 and all(len(m) <= 512 and re.fullmatch(tokens, m) for m in matchers), matchers

    def matched(path: str) -> bool:  # the subset's semantics, in Python: ORed expressions
        def one(m: str) -> bool:
            py = m.replace("request.path.startsWith(", "path.startswith(").replace(
                "request.path.endsWith(", "path.endswith(").replace("||", " or ").replace("&&", " and ")
            return bool(eval(py, {}, {"path": path}))  # noqa: S307 - our own generated expression
        return any(one(m) for m in matchers)

    # request.path carries the query string: a salted URL's /v1/ paths all take the body chain.
    for path, read in [("/support/llama-8b/v1/chat/completions", True), ("/search/llama-8b/v1/completions", True),
                       ("/support/llama-8b/v1/messages", True), ("/support/llama-8b/v1/chat/completions?x=y", True),
                       ("/support/llama-8b/v1/models", True), ("/llama-8b/v1/chat/completions", False),
                       ("/evil/llama-8b/v1/chat/completions", False), ("/x/support/llama-8b/v1/completions", False),
                       ("/support/llama-8b-2/v1/completions", False)]:
        assert matched(path) is read, path
    assert ext["metadata"] == BODY_CHAIN and "metadata" not in other["extensions"][0]


def test_many_salted_prefixes_are_split_into_matchers_gke_accepts():
    """Beyond one matcher's 512 characters the prefixes spread over several (ORed); beyond 10, a clear error."""
    many = body_conditions([f"/tenant-{i}/llama-8b" for i in range(40)])
    assert 1 < len(many) <= 10 and all(len(m) <= 512 for m in many)
    assert sum(m.count("startsWith") for m in many) == 40 and "endsWith" not in "".join(many)
    with pytest.raises(ValueError, match="at most 10"):
        body_conditions([f"/tenant-{i}/llama-8b" for i in range(400)])


@pytest.mark.parametrize("case", ["no length", "chunked", "over the limit", "two lengths", "not a number"])
def test_a_body_unbounded_before_it_is_read_is_refused_413_at_the_headers(issuers, case):
    token = issuers["keys"]["/a"].sign(claims())
    headers: dict[str, Any] = {
        "no length": {"content-length": []}, "chunked": {"content-length": [], "transfer-encoding": "chunked"},
        "over the limit": {"content-length": str(LIMIT + 1)}, "two lengths": {"content-length": ["5", "5"]},
        "not a number": {"content-length": "+5"}}[case]
    [resp] = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/completions",
                                                              {**bearer(token), **headers}, False, True)])
    status, body = refusal(resp)
    assert status == 413 and body["error"]["code"] == "payload_too_large" and str(LIMIT) in body["error"]["message"]


def test_a_body_longer_than_it_declared_is_refused_without_buffering_more(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    msgs = post("/support/llama/v1/completions", token, b'{"prompt": "' + b"x" * 200 + b'"}', headers={"content-length": "20"})
    answers = run(config_of(issuers["base"]), msgs)
    # The refusal comes at the chunk that passes the declared length; nothing is sent on after it.
    kinds = [a.WhichOneof("response") for a in answers]
    assert kinds[:4] == ["immediate_response", "request_body", "request_body", "request_body"]
    assert refusal(answers[0])[0] == 413
    assert not any(a.request_body.HasField("response") for a in answers[1:])


@pytest.mark.parametrize("body", [b'{"prompt": "x"', b"[1, 2]", b'"text"', b"\xff\xfe{}", b'{"a": NaN}', b"",
                                  b'{"a": {"b": ["\xff"]}}', b'{"a": 1} {}',
                                  '{"prompt": "é"}'.encode("utf-16")])
def test_a_body_that_is_not_one_json_object_is_a_400_and_the_stream_goes_on(issuers, body):
    token = issuers["keys"]["/a"].sign(claims())
    cfg = config_of(issuers["base"])
    answers = run(cfg, [*post("/support/llama/v1/completions", token, body),
                        *post("/support/llama/v1/completions", token, b'{"prompt": "ok"}')])
    status, error = refusal(answers[0])
    assert status == 400 and error["error"]["code"] == "invalid_json"
    assert json.loads(streamed_body(answers[-1]))["cache_salt"] == "tenant-support"


def test_trailers_after_a_held_body_are_refused(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    body = b'{"prompt": "x"}'
    msgs = [headers_message("/support/llama/v1/completions", {**bearer(token), "content-length": str(len(body))},
                            False, True),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=False)),
            pb.ProcessingRequest(request_trailers=pb.HttpTrailers())]
    [resp] = run(config_of(issuers["base"]), msgs)
    assert refusal(resp)[0] == 400


def test_a_bodiless_request_on_a_body_route_is_answered_at_its_headers(issuers):
    token = issuers["keys"]["/a"].sign(claims())
    [resp] = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/completions", bearer(token),
                                                              end_of_stream=True)])
    assert mutation(resp)[0][TENANT_HEADER] == "support"


def test_a_salted_path_from_the_headers_only_chain_is_answered_at_once(issuers):
    """request.path carries the query string, so such a request may take the headers-only chain,
    whose Envoy never sends the body: its headers are answered at once (held, they would wait out
    the 5 s callout timeout: 500), and only the body chain's (its metadata) are held and salted."""
    token = issuers["keys"]["/a"].sign(claims())
    path = "/support/llama/v1/chat/completions?x=y"
    [headers_only] = run(config_of(issuers["base"]), post(path, token, CHAT, body_chain=False)[:1])
    assert mutation(headers_only)[0][TENANT_HEADER] == "support"
    held = run(config_of(issuers["base"]), post(path, token, CHAT))
    assert len(held) == 2 and json.loads(streamed_body(held[1]))["cache_salt"] == "tenant-support"
    # Another extension's metadata, or the key under another value, is not the body chain.
    other = headers_message(path, {**bearer(token), "content-length": str(len(CHAT))}, False)
    other.metadata_context.filter_metadata["com.google.other"].update({"vllm-gke-chain": "headers", "x": "body"})
    [resp] = run(config_of(issuers["base"]), [other])
    assert mutation(resp)[0][TENANT_HEADER] == "support"


def test_an_unsalted_body_under_a_salted_url_is_bounded_as_it_passes(issuers):
    """Its route matches no Content-Length (Envoy removed it on the body chain), so the extension
    refuses one missing or over the limit at the headers and a body running past it."""
    token = issuers["keys"]["/a"].sign(claims())
    cfg = config_of(issuers["base"])
    [resp] = run(cfg, post("/support/llama/v1/responses", token, CHAT, headers={"content-length": str(LIMIT + 1)})[:1])
    assert refusal(resp)[0] == 413
    answers = run(cfg, post("/support/llama/v1/responses", token, b'{"input": "' + b"x" * 60 + b'"}',
                            headers={"content-length": "20"}))
    assert [a.WhichOneof("response") for a in answers][:2] == ["request_headers", "request_body"]
    assert refusal(answers[3])[0] == 413  # the chunk that passes 20 bytes


def test_held_bodies_are_capped_per_process_and_given_back(issuers):
    """Beyond MAX_HELD_BYTES of declared lengths held at once, a salted request is answered 503 with
    Retry-After before any of its body is read; a finished, refused or ended stream gives its bytes back."""
    from vllm_gke.images.vllm_gke_identity.processor import IdentityProcessor, Stream
    token = issuers["keys"]["/a"].sign(claims())
    proc = IdentityProcessor(identity_config.parse(config_of(issuers["base"])), max_held=LIMIT + 100)

    def headers(length: int) -> Any:
        return headers_message("/support/llama/v1/completions", {**bearer(token), "content-length": str(length)},
                               False, True)

    async def main() -> None:
        first, second = Stream(), Stream()
        assert await proc.answer(headers(LIMIT), first) == [] and proc.held == LIMIT
        status, error = refusal((await proc.answer(headers(200), second))[0])
        assert status == 503 and error["error"]["type"] == "service_unavailable"
        assert proc.held == LIMIT
        body = b'{"prompt": "' + b"x" * (LIMIT - 14) + b'"}'
        done = [a for m in body_messages(body, 1000) for a in await proc.answer(m, first)]
        assert json.loads(streamed_body(done[-1]))["cache_salt"] == "tenant-support" and proc.held == 0
        assert await proc.answer(headers(200), second) == [] and proc.held == 200

        async def ends_holding() -> AsyncIterator[Any]:
            yield headers(300)
        assert [a async for a in proc.Process(ends_holding(), cast(Any, None))] == []  # the client went away
        assert proc.held == 200
    asyncio.run(main())


@pytest.fixture
def failing_jwks() -> Iterator[dict[str, Any]]:
    """A JWKS URI that fails (500) or hangs past the fetch's timeout, counting its fetches."""
    seen = {"/fail": 0, "/hang": 0}

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen[self.path] += 1
            if self.path == "/hang":
                time.sleep(3)  # past JWKS_TIMEOUT_S
            self.send_error(500)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield {"seen": seen, "base": f"http://127.0.0.1:{http.server_address[1]}"}
    http.shutdown()


@pytest.mark.parametrize("uri", ["/fail", "/hang"])
def test_a_failed_jwks_fetch_is_one_fetch_for_all_waiting_requests(issuers, failing_jwks, uri):
    """Concurrent requests while the JWKS cannot be fetched: one fetch, every request a 503 (each
    fetching in turn, the third would pass the load balancer's 5 s callout timeout: 500)."""
    cfg = config_of(issuers["base"])
    cfg["tenants"]["nokeys"]["jwksUri"] = failing_jwks["base"] + uri
    token = issuers["keys"]["/a"].sign(claims(iss="https://down.example.com"))

    async def main() -> list[Any]:
        stop = asyncio.Event()
        ext, hc = _free_port(), _free_port()
        task = asyncio.create_task(identity_server.serve(identity_config.parse(cfg), ext, hc, tls=False, stop=stop,
                                                         drain_s=0))
        await _ready(hc)
        try:
            return await asyncio.gather(*(exchange(ext, [headers_message("/nokeys/llama/v1/models", bearer(token))])
                                          for _ in range(4)))
        finally:
            stop.set()
            await task
    answers = asyncio.run(main())
    assert [refusal(a)[0] for [a] in answers] == [503] * 4
    assert all(("retry-after", "5") in [(o.header.key, o.header.raw_value.decode())
                                        for o in a.immediate_response.headers.set_headers] for [a] in answers)
    assert failing_jwks["seen"][uri] == 1


def test_a_jwks_fetch_is_bounded_whole_name_resolution_included():
    """urllib's timeout covers the socket, not the name's resolution: the fetch as a whole is bounded."""
    from vllm_gke.images.vllm_gke_identity import verify
    released = threading.Event()
    keys = Keys("k1")
    jwks = verify.Jwks("http://jwks.invalid/keys")

    def stuck() -> Any:  # as a resolver that answers late
        released.wait(10)
        return keys.jwks()
    jwks.client.fetch_data = stuck  # type: ignore[method-assign]

    async def main() -> None:
        with pytest.raises(verify.KeysUnavailable):
            await jwks.candidates("k1")
    try:
        asyncio.run(main())
    finally:
        released.set()


def test_a_jwks_keys_alg_is_honoured(issuers):
    """A key that names its alg verifies only that alg (jwt_verify_lib skips a key whose alg differs)."""
    from jwt import PyJWKSet

    from vllm_gke.images.vllm_gke_identity import verify
    a = issuers["keys"]["/a"]
    tenant = identity_config.parse(config_of(issuers["base"])).tenants["support"]
    for alg, signed, ok in (("RS256", "RS256", True), ("RS512", "RS256", False), (None, "PS256", True)):
        verifier = verify.Verifier({"support": tenant})
        jwk = {**a.jwks()["keys"][0], **({"alg": alg} if alg else {})}
        cache = verifier.jwks[tenant.jwks_uri]
        cache.keys, cache.fetched = PyJWKSet.from_dict({"keys": [jwk]}), time.monotonic()
        verdict = asyncio.run(verifier.check("support", [f"Bearer {a.sign(claims(), alg=signed)}"]))
        assert (verdict.tenant == "support") is ok, (alg, signed, verdict)


def test_a_lone_surrogate_escape_is_salted_as_json_takes_it():
    """msgspec refuses it; json (and so the guard and vLLM) take it: the check follows json."""
    assert json.loads(salted(b'{"prompt": "\\ud800"}', "tenant-x"))["cache_salt"] == "tenant-x"


def test_salted_picker_routes_match_no_content_length_and_the_others_keep_it():
    """Envoy removes Content-Length in FullDuplexStreamed before the route is chosen (envoy#39035):
    a salted URL's routes requiring it would match nothing (404 for every request); a URL the
    extension does not salt keeps the bound."""
    from vllm_gke.components.model.gateway_routes import PickerTarget, picker_rules
    from vllm_gke.components.model.serving_api import picker_salted_paths
    from vllm_gke.components.model.vllm_versions import RELEASES

    def lengths(target: PickerTarget) -> dict[str, bool]:
        # The compat match (one release: the move from bf329cd's routes, issue 39; drop next release)
        # keeps bf329cd's bound: it holds only before the extension runs, when Envoy keeps Content-Length.
        return {m["path"]["value"]: any(h["name"] == "content-length" for h in m["headers"])
                for r in picker_rules("support/llama", target) for m in r["matches"]
                if m["headers"][0]["name"] != "x-gateway-inference-objective"}
    salted = picker_salted_paths(RELEASES["0.34.0"])
    assert set(salted) == {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
    assert not any(lengths(PickerTarget("llama", "support.llama", "support", salted_paths=salted)).values())
    plain = lengths(PickerTarget("llama", "support.llama", "support"))
    assert plain.pop("/support/llama/v1/models") is False and all(plain.values())


def test_the_stacks_salted_routes_are_the_extensions(plans):
    """The routes without a Content-Length match are exactly the URLs the extension's config salts."""
    manifests = plans["staging"].manifests()
    identity = json.loads(next(d for d in manifests if d["kind"] == "ConfigMap"
                               and d["metadata"]["name"] == "vllm-gke-identity")["data"]["identity.json"])
    salted = {p for p, v in identity["prefixes"].items() if v.get("saltedPaths")}
    assert salted
    for route in (d for d in manifests if d["kind"] == "HTTPRoute"):
        for rule in route["spec"]["rules"]:
            for m in (m for m in rule.get("matches") or [] if any(b.get("kind") == "InferencePool"
                                                                  for b in rule.get("backendRefs") or [])
                      # not the compat match (one release, issue 39: test_salted_picker_routes_match_no_content_length...)
                      and m["headers"][0]["name"] != "x-gateway-inference-objective"):
                value = m["path"]["value"]
                bounded = any(h["name"] == "content-length" for h in m.get("headers") or [])
                assert bounded is (not value.endswith("/v1/models") and value.rsplit("/v1/", 1)[0] not in salted), value
