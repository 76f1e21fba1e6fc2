"""The tenant identity extension (images/vllm_gke_identity) driven over real gRPC, as the load
balancer drives it: real RSA and EC keys, each issuer's JWKS served over HTTP, tokens signed by
PyJWT. What it must do: set the picker's objective, fairness id and the verified tenant only for
a valid token of the tenant the path names, remove every client copy of the picker's headers,
answer 401/403/503 in OpenAI's format otherwise, and never end a stream with an error."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Optional

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from vllm_gke.components.model.serving_api import (
    FAIRNESS_HEADER,
    IDENTITY_STRIPS,
    OBJECTIVE_HEADER,
    PICKER_CONTROL_HEADERS,
    TENANT_HEADER,
)
from vllm_gke.images.vllm_gke_identity import config as identity_config
from vllm_gke.images.vllm_gke_identity import server as identity_server

# xds-protos ships no type stubs.
pb: Any = external_processor_pb2
HeaderMap: Any = base_pb2.HeaderMap  # pyright: ignore[reportAttributeAccessIssue]
HeaderValue: Any = base_pb2.HeaderValue  # pyright: ignore[reportAttributeAccessIssue]
ISS_A = "https://issuer-a.example.com"
ISS_B = "https://issuer-b.example.com/"


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
        "prefixes": {"/support/llama": {"tenant": "support", "objective": "support.llama"},
                     "/search/llama": {"tenant": "search", "objective": "search.llama"},
                     "/batch/llama": {"tenant": "batch", "objective": "batch.llama"},
                     "/nokeys/llama": {"tenant": "nokeys", "objective": "nokeys.llama"}},
        "headers": {"objective": OBJECTIVE_HEADER, "fairness": FAIRNESS_HEADER, "tenant": TENANT_HEADER,
                    "strip": list(IDENTITY_STRIPS)},
    }


def claims(iss: str = ISS_A, sub: str = "anyone", aud: Any = "vllm", **extra: Any) -> dict[str, Any]:
    return {"iss": iss, "sub": sub, "aud": aud, "exp": int(time.time()) + 600, **extra}


def headers_message(path: str, headers: dict[str, Any]) -> Any:
    pairs = [(":path", path), (":method", "POST"), (":authority", "gw.example.com")]
    for k, v in headers.items():
        pairs += [(k, x) for x in (v if isinstance(v, list) else [v])]
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=HeaderMap(
        headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])))


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
    [resp] = run(config_of(issuers["base"]), [headers_message("/support/llama/v1/chat/completions",
                                                              {**bearer(token), **FORGED})])
    sets, removes = mutation(resp)
    assert sets == {OBJECTIVE_HEADER: "support.llama", FAIRNESS_HEADER: "support", TENANT_HEADER: "support"}
    # Every other spelling and control header the client sent is removed; what is set overwrites.
    assert set(removes) == set(IDENTITY_STRIPS) - set(sets)
    assert {"x-gateway-inference-objective", "x-gateway-inference-fairness-id", "x-llm-d-model-name-rewrite",
            "x-slo-ttft-ms", "x-llm-d-slo-tpot-ms"} <= set(removes)
    assert not (set(sets) & set(removes))  # Envoy removes before it sets: never its own headers


def test_every_picker_control_header_in_both_spellings_is_stripped():
    assert len(PICKER_CONTROL_HEADERS) == 10
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
             headers_message("/support/llama/v1/chat/completions", bearer(token))]
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
