"""A stand-in for a serving pod's Envoy sidecar, for tests that call a tenant URL as a client
does, with `Authorization: Bearer <JWT>`, and need what the mesh answers before the guard.

It applies what the plan declares for the pod (its namespace's RequestAuthentications and
AuthorizationPolicies), in Envoy's order and with Envoy's answers:
  - jwt_authn (RequestAuthentication; a request without a token passes with no principal): a
    token of no configured issuer is 401 "Jwt issuer is not configured", an expired one 401 "Jwt
    is expired", one for an audience not listed 403 "Audiences in Jwt are not allowed", a bad
    signature 401 "Jwt verification fails" (Envoy's jwt_authn filter.cc Filter::onComplete: 403
    for the audience, else 401, the body jwt_verify_lib's status string; Envoy's authenticator
    checks the issuer, the time, the audience, then the signature);
  - the verified claims written into outputClaimToHeaders' headers, client copies dropped, and
    the token itself dropped (forwardOriginalToken: false);
  - RBAC: policies.mesh_authz.decide on the plan's policies; a denial is 403 "RBAC: access
    denied" (Envoy's RBAC filter).
Then it forwards the request to the pod's port from 127.0.0.1, which the guard's config must
trust in place of the sidecar's 127.0.0.6. Tokens are signed with the test's own keys (Issuer),
trusted for the tenant's issuer in place of its JWKS. Not Envoy: no TLS, no retries, no
x-envoy headers, HTTP/1.1 only.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Mapping, Optional, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from vllm_gke.policies.mesh_authz import Request, applicable, decide

# Envoy's jwt_authn allows this much clock skew on exp (JwtProvider.clock_skew_seconds default).
CLOCK_SKEW_S = 60
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
                        "proxy-authorization", "trailer"})
BAD_FORMAT = "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Issuer:
    """An RS256 signing key standing in for an identity provider's."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def mint(self, claims: Mapping[str, Any]) -> str:
        signing_input = f"{_b64(json.dumps({'alg': 'RS256', 'typ': 'JWT'}).encode())}." \
                        f"{_b64(json.dumps(dict(claims)).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"


# A refusal (status, body) or the verified claim headers to write.
Verdict = Union[tuple[int, str], dict[str, str]]


class Sidecar:
    def __init__(self, manifests: Iterable[Mapping[str, Any]], namespace: str, labels: Mapping[str, str],
                 keys: Mapping[str, Issuer], upstream_port: int):
        self.namespace, self.labels, self.upstream_port = namespace, dict(labels), upstream_port
        self.docs = applicable(manifests, namespace, labels)
        self.rules = [r for d in self.docs if d["kind"] == "RequestAuthentication"
                      for r in d["spec"].get("jwtRules") or []]
        self.claim_headers = {o["header"].lower() for r in self.rules for o in r.get("outputClaimToHeaders") or []}
        self.keys = {iss: issuer.key.public_key() for iss, issuer in keys.items()}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _claims(self, token: str) -> tuple[Optional[tuple[int, str]], dict[str, Any]]:
        """jwt_authn on one token: a refusal, or None and the verified claims."""
        parts = token.split(".")
        try:
            claims = json.loads(_unb64(parts[1])) if len(parts) == 3 else None
        except ValueError:
            claims = None
        if not isinstance(claims, dict):
            return (401, BAD_FORMAT), {}
        rule = next((r for r in self.rules if r["issuer"] == claims.get("iss")), None)
        key = self.keys.get(str(claims.get("iss")))
        if rule is None:
            return (401, "Jwt issuer is not configured"), {}
        if not isinstance(claims.get("exp"), int) or claims["exp"] + CLOCK_SKEW_S < time.time():
            return (401, "Jwt is expired"), {}
        aud = claims.get("aud")
        if rule.get("audiences") and not set([aud] if isinstance(aud, str) else aud or []) & set(rule["audiences"]):
            return (403, "Audiences in Jwt are not allowed"), {}
        try:
            if key is None:
                raise InvalidSignature
            key.verify(_unb64(parts[2]), f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except (InvalidSignature, ValueError):
            return (401, "Jwt verification fails"), {}
        return None, claims

    def verdict(self, method: str, path: str, headers: Mapping[str, str]) -> Verdict:
        """What the sidecar does with a request: refuse it, or pass it on with these claim headers."""
        auth = headers.get("authorization", "")
        token = auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else ""
        written: dict[str, str] = {}
        subject: Optional[tuple[str, str]] = None
        if token:
            refusal, claims = self._claims(token)
            if refusal is not None:
                return refusal
            subject = (str(claims["iss"]), str(claims.get("sub", "")))
            for rule in self.rules:
                if rule["issuer"] == claims["iss"]:
                    written.update({o["header"].lower(): str(claims[o["claim"]])
                                    for o in rule.get("outputClaimToHeaders") or [] if o["claim"] in claims})
        seen = {k: v for k, v in headers.items() if k not in self.claim_headers}
        decision = decide(self.docs, Request(self.namespace, path, method, self.labels, token=subject,
                                             headers={**seen, **written}))
        if not decision.allowed:
            return 403, "RBAC: access denied"
        return written


def _handler(sidecar: Sidecar) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
            pass

        def _handle(self) -> None:
            self.close_connection = True
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            lowered = {k.lower(): v for k, v in self.headers.items()}
            verdict = sidecar.verdict(self.command, self.path, lowered)
            if isinstance(verdict, tuple):
                self._reply(*verdict)
                return
            dropped = HOP_BY_HOP | sidecar.claim_headers | {"authorization"}
            sent = [(k, v) for k, v in self.headers.items() if k.lower() not in dropped] + list(verdict.items())
            upstream = http.client.HTTPConnection("127.0.0.1", sidecar.upstream_port, timeout=120)
            try:
                upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in sent:
                    upstream.putheader(k, v)
                upstream.endheaders(body or None)
                self._relay(upstream.getresponse())
            finally:
                upstream.close()

        def _reply(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _relay(self, resp: http.client.HTTPResponse) -> None:
            """The answer as it comes, a stream chunk by chunk (its own Server and Date headers)."""
            self.send_response_only(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            chunked = resp.getheader("content-length") is None
            if chunked:
                self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            while data := resp.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    return Handler
