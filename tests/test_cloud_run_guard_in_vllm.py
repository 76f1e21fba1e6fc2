"""The guard's Cloud Run identity inside the real vLLM API server, started as the Cloud Run service
starts it: the container's entrypoint (images/serve.py) with the service's own vLLM argv
(components/model/cloud_run.py server_args) and guard config (cloud_run_tenancy.py), only the GPU
engine core a stand-in that answers at once (benchmarks/vllm_fake_engine.py), as
tests/test_guard_in_vllm.py does. Hostile requests - no token, alg none, HS256 keyed with the public
key, another issuer's key, the wrong audience, expired, a token that Cloud Run did not verify, two
credentials, repeated headers, the mesh's identity headers, another tenant's URL - are each a 4xx in
OpenAI's error format; a good token is served. Needs VLLM_PYTHON (skipped without it, outside CI)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import MIDDLEWARE, REPO, server_args
from tests.test_cloud_run_tenancy import MODEL, SEARCH_SA, SUPPORT_SA, staging
from tests.test_guard_in_vllm import _free_port
from vllm_gke.components.model.cloud_run import server_args as cloud_run_args
from vllm_gke.components.model.cloud_run_tenancy import cloud_run_guard_config
from vllm_gke.infra.config import parse
from vllm_gke.infra.plan import read_stack_config

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON and not os.environ.get("CI"),
                                reason="VLLM_PYTHON (a python with the pinned vllm) is not set")
SEARCH_ISS, AUDIENCE = "https://auth.acme.example/search", "llm.staging.acme.example"


class Issuer:
    """A tenant's signing key and the JWKS publishing it, over local HTTP (counted fetches)."""

    def __init__(self) -> None:
        self.key: Any = rsa.generate_private_key(65537, 2048)
        self.fetches = 0
        issuer = self

        class Jwks(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                issuer.fetches += 1
                jwk = json.loads(RSAAlgorithm.to_jwk(issuer.key.public_key()))
                body = json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self.http.server_address[1]}/jwks"

    def sign(self, key: Any = None, alg: str = "RS256", **claims: Any) -> str:
        body = {"iss": SEARCH_ISS, "aud": AUDIENCE, "sub": "svc", "exp": int(time.time()) + 600, **claims}
        return jwt.encode(body, key if key is not None else self.key, algorithm=alg, headers={"kid": "k1"})


def google_token(stripped: bool = True, **claims: Any) -> str:
    """A Google ID token as Cloud Run hands it on (`stripped`: its signature replaced), or as a client
    forges it (signed by a key of its own)."""
    body = {"iss": "https://accounts.google.com", "aud": "https://svc.run.app", "sub": "1", "email": SEARCH_SA,
            "email_verified": True, "exp": int(time.time()) + 600, **claims}
    token = jwt.encode(body, rsa.generate_private_key(65537, 2048), algorithm="RS256", headers={"kid": "g"})
    return token.rsplit(".", 1)[0] + ".SIGNATURE_REMOVED_BY_GOOGLE" if stripped else token


def _unsigned(**claims: Any) -> str:
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{enc({'alg': 'none', 'typ': 'JWT'})}.{enc(claims)}."


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    out = Issuer()
    yield out
    out.http.shutdown()


def _serve(auth: str, issuer: Issuer, tmp) -> Iterator[dict[str, Any]]:
    """serve.py running vLLM with the Cloud Run service's argv and guard config for `auth`."""
    cfg = parse(staging({"staging": read_stack_config("staging")}, auth=auth, callers=("search", "support")))
    model = cfg.cloud_run_models[0]
    guard = cloud_run_guard_config(cfg, model)
    for t in guard["cloudRun"].get("tenants", {}).values():  # the tenants' JWKS, served here
        t["jwksUri"] = issuer.uri
    guard.pop("globalLimits", None)  # no store here: each replica's own windows
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port, marker = _free_port(), tmp / "warm"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]),
               GKE_LLM_GUARD_CONFIG=json.dumps(guard), GKE_LLM_WARM_MARKER=str(marker),
               GKE_LLM_WARMUP_PAUSE_SECONDS="1", GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve")
    log = open(tmp / "server.log", "wb")
    argv = server_args(cloud_run_args(cfg, model, cfg.release_for("cloud-run")), model_dir, port, MIDDLEWARE["guard"])
    proc = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"), *argv], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    try:
        assert marker.exists(), (tmp / "server.log").read_text()[-3000:]
        yield {"base": f"http://127.0.0.1:{port}", "model": guard["model"]}
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def jwt_server(issuer, tmp_path_factory) -> Iterator[dict[str, Any]]:
    yield from _serve("jwt", issuer, tmp_path_factory.mktemp("jwt"))


@pytest.fixture(scope="module")
def iam_server(issuer, tmp_path_factory) -> Iterator[dict[str, Any]]:
    yield from _serve("iam", issuer, tmp_path_factory.mktemp("iam"))


def call(server: dict[str, Any], headers: list[tuple[str, str]], path: str = f"/{MODEL}/v1/chat/completions"
         ) -> tuple[int, dict[str, Any]]:
    """A chat completion with exactly these headers, repeats kept (urllib would fold them)."""
    body = json.dumps({"model": server["model"], "messages": [{"role": "user", "content": "hi"}],
                       "max_completion_tokens": 8}).encode()
    parts = urlsplit(server["base"])
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        conn.putrequest("POST", path)
        for k, v in [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers]:
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def refused(server: dict[str, Any], headers: list[tuple[str, str]], path: str = f"/{MODEL}/v1/chat/completions"
            ) -> tuple[int, str]:
    status, body = call(server, headers, path)
    assert 400 <= status < 500, (status, body)
    error = body["error"]
    assert set(error) >= {"message", "type", "code"} and error["message"], body
    return status, error["code"]


def test_a_tenants_own_token_is_served(jwt_server, issuer):
    status, body = call(jwt_server, [("Authorization", f"Bearer {issuer.sign()}")])
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant", body
    status, body = call(jwt_server, [("Authorization", f"Bearer {issuer.sign()}")], f"/search/{MODEL}/v1/chat/completions")
    assert status == 200, body


def test_the_jwks_is_fetched_once_not_per_request(jwt_server, issuer):
    for _ in range(5):
        assert call(jwt_server, [("Authorization", f"Bearer {issuer.sign()}")])[0] == 200
    assert issuer.fetches == 1


def test_forged_tokens_are_refused(jwt_server, issuer):
    pem = issuer.key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    hs256 = _hs256_with(pem)
    cases = {
        "no token": [],
        "not bearer": [("Authorization", f"Basic {issuer.sign()}")],
        "alg none": [("Authorization", f"Bearer {_unsigned(iss=SEARCH_ISS, aud=AUDIENCE, exp=int(time.time()) + 600)}")],
        "HS256 keyed with the public key": [("Authorization", f"Bearer {hs256}")],
        "another issuer's key": [("Authorization", f"Bearer {issuer.sign(key=rsa.generate_private_key(65537, 2048))}")],
        "wrong audience": [("Authorization", f"Bearer {issuer.sign(aud='another-service')}")],
        "expired": [("Authorization", f"Bearer {issuer.sign(exp=int(time.time()) - 3600)}")],
        "unknown issuer": [("Authorization", f"Bearer {issuer.sign(iss='https://evil.example')}")],
        "a Google ID token Cloud Run stripped": [("Authorization", f"Bearer {google_token()}")],
    }
    for name, headers in cases.items():
        assert refused(jwt_server, headers)[0] == 401, name


def _hs256_with(secret: bytes) -> str:
    """HS256 over the claims with the issuer's public key (PEM) as the HMAC secret: the classic
    confusion attack (PyJWT refuses to build it with a PEM key, so it is built by hand)."""
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    claims = enc(json.dumps({"iss": SEARCH_ISS, "aud": AUDIENCE, "sub": "svc", "exp": int(time.time()) + 600}).encode())
    sig = enc(hmac.new(secret, f"{head}.{claims}".encode(), hashlib.sha256).digest())
    return f"{head}.{claims}.{sig}"


def test_two_credentials_repeats_and_the_mesh_headers_are_refused(jwt_server, issuer):
    good, forged = issuer.sign(), issuer.sign(key=rsa.generate_private_key(65537, 2048))
    cases = {
        "verified in X-Serverless, forged in Authorization": [("X-Serverless-Authorization", f"Bearer {good}"),
                                                             ("Authorization", f"Bearer {forged}")],
        "forged in X-Serverless, verified in Authorization": [("X-Serverless-Authorization", f"Bearer {forged}"),
                                                             ("Authorization", f"Bearer {good}")],
        "X-Serverless alone": [("X-Serverless-Authorization", f"Bearer {good}")],
        "Authorization twice": [("Authorization", f"Bearer {good}"), ("Authorization", f"Bearer {forged}")],
        "the mesh's issuer header": [("Authorization", f"Bearer {good}"), ("x-vllm-gke-issuer", SEARCH_ISS)],
        "the mesh's subject header": [("Authorization", f"Bearer {good}"), ("x-vllm-gke-subject", "svc")],
        "the identity extension's tenant header": [("Authorization", f"Bearer {good}"), ("x-vllm-gke-tenant", "support")],
    }
    for name, headers in cases.items():
        assert refused(jwt_server, headers)[0] == 400, name


def test_another_tenants_url_is_refused(jwt_server, issuer):
    status, code = refused(jwt_server, [("Authorization", f"Bearer {issuer.sign()}")],
                           f"/support/{MODEL}/v1/chat/completions")
    assert (status, code) == (403, "forbidden")


def test_iam_serves_the_account_cloud_run_verified(iam_server):
    for header in ("Authorization", "X-Serverless-Authorization"):
        status, body = call(iam_server, [(header, f"Bearer {google_token()}")])
        assert status == 200, (header, body)
    status, _ = call(iam_server, [("Authorization", f"Bearer {google_token(email=SUPPORT_SA)}")],
                     f"/support/{MODEL}/v1/chat/completions")
    assert status == 200


def test_iam_refuses_what_cloud_run_did_not_verify(iam_server):
    cases = {
        "no token": ([], 401),
        "a token still signed (Cloud Run did not check it)": ([("Authorization", f"Bearer {google_token(stripped=False)}")], 401),
        "the verified one in X-Serverless, a forged one in Authorization": (
            [("X-Serverless-Authorization", f"Bearer {google_token()}"),
             ("Authorization", f"Bearer {google_token(stripped=False, email=SUPPORT_SA)}")], 400),
        "the reverse": ([("X-Serverless-Authorization", f"Bearer {google_token(stripped=False, email=SUPPORT_SA)}"),
                         ("Authorization", f"Bearer {google_token()}")], 400),
        "X-Serverless twice": ([("X-Serverless-Authorization", f"Bearer {google_token()}"),
                                ("X-Serverless-Authorization", f"Bearer {google_token(email=SUPPORT_SA)}")], 400),
        "another account": ([("Authorization", f"Bearer {google_token(email='x-y-z12@other.iam.gserviceaccount.com')}")], 403),
        "no email": ([("Authorization", f"Bearer {google_token(email=None)}")], 403),
        "unverified email": ([("Authorization", f"Bearer {google_token(email_verified=False)}")], 403),
        "not Google's": ([("Authorization", f"Bearer {google_token(iss='https://evil.example')}")], 401),
        "expired": ([("Authorization", f"Bearer {google_token(exp=int(time.time()) - 3600)}")], 401),
        "the mesh's issuer header": ([("Authorization", f"Bearer {google_token()}"),
                                      ("x-vllm-gke-issuer", "https://auth.acme.example/support")], 400),
    }
    for name, (headers, expected) in cases.items():
        assert refused(iam_server, headers)[0] == expected, name
    status, code = refused(iam_server, [("Authorization", f"Bearer {google_token()}")], f"/support/{MODEL}/v1/chat/completions")
    assert (status, code) == (403, "forbidden")


def get(server: dict[str, Any], path: str, source: str = "127.0.0.1") -> tuple[int, bytes]:
    """A GET from `source` (another address of the loopback network: a peer the guard must not take for
    the instance itself, as Cloud Run's front end is not)."""
    parts = urlsplit(server["base"])
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60, source_address=(source, 0))
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_metrics_only_to_the_instances_own_sidecar(iam_server):
    status, body = get(iam_server, "/metrics")  # the sidecar's scrape of localhost
    assert status == 200 and b"vllm:" in body
    status, body = get(iam_server, "/metrics", source="127.0.0.2")
    assert status == 403, body
    error = json.loads(body)["error"]
    assert error["code"] == "forbidden" and error["message"] and "type" in error
    assert b"vllm:" not in body
    assert get(iam_server, "/health", source="127.0.0.2")[0] == 200  # open: it says nothing
