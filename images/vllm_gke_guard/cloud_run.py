"""The tenant of a request on Cloud Run (cloudRun.models[]), where no mesh sidecar verified a token
before the guard: the guard's config `cloudRun` (components/model/cloud_run_tenancy.py writes it).
Nothing a client can set names the tenant - not the mesh's verified-issuer or -subject headers
(refused: they mean nothing here, and a client sending them is probing), not the peer address
(Cloud Run's front end connects for every client) - only a credential checked here or by Cloud Run:

  - auth `jwt` (Cloud Run's invoker check off; the service takes traffic from the stack's load
    balancer only): the one `Authorization: Bearer` token, verified here as its issuer's tenant's
    by vllm_gke_identity/verify.py, the checks the identity extension and Istio make on GKE (the
    issuer's JWKS, cached and refreshed at a bounded rate; an algorithm of the key's own family;
    iss, aud, exp/nbf, sub where the tenant lists subjects). An X-Serverless-Authorization beside it
    is refused: two credentials, one of them unread, is no identity.
  - auth `iam`: Cloud Run's invoker check admitted the request on the Google ID token of an account
    granted roles/run.invoker, read from X-Serverless-Authorization when the request has one, else
    from Authorization, and handed it on with its signature replaced by SIGNATURE_REMOVED_BY_GOOGLE
    (infra/contracts/cloud_run_identity.py cites Google's pages). The guard reads the same header by
    the same rule, takes only a token whose signature Cloud Run removed (one it checked), and maps
    the token's `email` to the one tenant listing that account (tenants[].cloudRunInvokers). Both
    headers at once are refused here too: Cloud Run checked only one of them, and this server has no
    use for the other.

Where the path names a tenant (/<tenant>/<model>/v1), the verified tenant must be that one.
GET /metrics (the tenants' usage, vLLM's series) is served to a loopback peer alone: the metrics
sidecar scrapes it over the instance's localhost, and every request Cloud Run delivers comes from
outside the instance. /health stays open: the startup probe may use it, and it says nothing.
Every refusal is a GuardError (OpenAI's format, 4xx; 503 only while a JWKS cannot be fetched).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from .asgi import Scope
from .errors import GuardError

try:  # as the tests and the plan load the guard: vllm_gke.images.vllm_gke_guard, its sibling package
    from ..vllm_gke_identity.config import TenantJwt
    from ..vllm_gke_identity.verify import LEEWAY_S, Verifier
except ImportError:  # as the pod loads it: vllm_gke_guard beside vllm_gke_identity on the path (images/Dockerfile)
    from vllm_gke_identity.config import TenantJwt  # pyright: ignore[reportMissingImports]  (the image's layout)
    from vllm_gke_identity.verify import LEEWAY_S, Verifier  # pyright: ignore[reportMissingImports]

AUTHORIZATION = b"authorization"
SERVERLESS_AUTHORIZATION = b"x-serverless-authorization"
# What Cloud Run puts in place of the signature of the ID token it verified.
SIGNATURE_REMOVED = "SIGNATURE_REMOVED_BY_GOOGLE"
# The issuer of Google's ID tokens, as they spell it.
GOOGLE_ISSUERS = frozenset({"https://accounts.google.com", "accounts.google.com"})
# The scope key strip() records the path's tenant under (None: the shared /<model>/v1).
PATH_TENANT = "vllm_gke.path_tenant"
# Longer than any token a tenant should send: refused before it is parsed.
MAX_CREDENTIAL_BYTES = 16384
# The open route only the instance itself may read, and the peers that are the instance itself (the
# sidecar's scrape of localhost; Cloud Run's front end connects to the container's 0.0.0.0 listener).
METRICS_PATH = "/metrics"
LOOPBACK_PEERS = frozenset({"127.0.0.1", "::1"})


class CloudRunIdentity:
    """The tenant of each request on a Cloud Run model, from the config's `cloudRun` section."""

    def __init__(self, cfg: Mapping[str, Any], tenants: Iterable[str], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.mode = str(cfg["auth"])
        known = set(tenants)
        self.refused = tuple(str(h).lower().encode() for h in cfg.get("refusedHeaders") or ())
        # '/<tenant>/<model>' -> tenant: the prefixes that name their tenant.
        prefixes: Mapping[str, str] = cfg.get("tenantPrefixes") or {}
        self.path_tenants = {str(p).rstrip("/"): str(t) for p, t in prefixes.items()}
        self.wall = wall
        if self.mode == "jwt":
            entries: Mapping[str, Any] = cfg["tenants"]
            self.verifier = Verifier({n: TenantJwt(n, str(t["issuer"]), str(t["jwksUri"]), tuple(t["audiences"]),
                                                   frozenset(t["subjects"]) if t.get("subjects") is not None else None)
                                      for n, t in entries.items()}, clock)
            self.by_issuer = {str(t["issuer"]): n for n, t in entries.items()}
            named = set(entries)
        elif self.mode == "iam":
            self.accounts = {str(e).lower(): str(t) for e, t in cfg["accounts"].items()}
            named = set(self.accounts.values())
        else:
            raise KeyError(f"cloudRun.auth: '{self.mode}' is neither jwt nor iam")
        if unknown := sorted(named - known):
            raise KeyError(f"cloudRun names tenants the guard has no entry for: {unknown}")

    def open_route(self, path: str, peer: str) -> None:
        """An open route (GET /health, /metrics) on Cloud Run: /metrics to a loopback peer alone."""
        if path == METRICS_PATH and peer not in LOOPBACK_PEERS:
            raise GuardError(403, "/metrics is served to this instance's own metrics sidecar only", "forbidden")

    def strip(self, prefixes: Any, scope: Scope) -> Scope:
        """The scope with the pool's prefix stripped (prefixes.py), and under PATH_TENANT the tenant
        the prefix named, read first from the raw path (what decides the strip)."""
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if isinstance(raw, bytes) else str(scope.get("path") or "")
        return dict(prefixes.strip(scope), **{PATH_TENANT: self.path_tenant(path)})

    def path_tenant(self, path: str) -> Optional[str]:
        """The tenant a raw path's prefix names (/<tenant>/<model>/v1...), None for /<model>/v1."""
        for prefix, tenant in self.path_tenants.items():
            rest = path[len(prefix):]
            if path.startswith(prefix) and (rest == "/v1" or rest.startswith("/v1/")):
                return tenant
        return None

    async def tenant(self, scope: Scope) -> str:
        """The tenant's name, or a GuardError saying why not (`scope`: as strip() made it)."""
        authorization, serverless = self._credentials(scope.get("headers") or ())
        name = await self._verified(authorization, serverless)
        path_tenant = scope.get(PATH_TENANT)
        if path_tenant is not None and path_tenant != name:
            raise GuardError(403, f"this URL is tenant '{path_tenant}''s; call /<model>/v1 or your own "
                                  f"/{name}/<model>/v1", "forbidden")
        return name

    def _credentials(self, headers: Iterable[tuple[bytes, bytes]]) -> tuple[Optional[bytes], Optional[bytes]]:
        found: dict[bytes, list[bytes]] = {AUTHORIZATION: [], SERVERLESS_AUTHORIZATION: []}
        for k, v in headers:
            if k in found:
                found[k].append(v)
            elif k in self.refused:
                raise GuardError(400, f"the '{k.decode('latin-1')}' header is not accepted here: the tenant is the "
                                      "one its token proves", "forbidden_header")
        if any(len(v) > 1 for v in found.values()):
            raise GuardError(400, "a credential header came more than once; send one", "invalid_credentials")
        a, s = found[AUTHORIZATION], found[SERVERLESS_AUTHORIZATION]
        return (a[0] if a else None), (s[0] if s else None)

    async def _verified(self, authorization: Optional[bytes], serverless: Optional[bytes]) -> str:
        if authorization is not None and serverless is not None:
            raise GuardError(400, "both Authorization and X-Serverless-Authorization came: send the one credential "
                                  "that is you", "invalid_credentials")
        if self.mode == "jwt":
            if serverless is not None:
                raise GuardError(400, "this model reads the tenant's token from Authorization alone; send no "
                                      "X-Serverless-Authorization", "invalid_credentials")
            return await self._jwt(_bearer(authorization))
        # Cloud Run's rule: X-Serverless-Authorization when the request has one, else Authorization.
        return self._iam(_bearer(serverless if serverless is not None else authorization))

    async def _jwt(self, token: str) -> str:
        issuer = _claims(token).get("iss")
        name = self.by_issuer.get(issuer) if isinstance(issuer, str) else None
        if name is None:
            raise GuardError(401, "the token's issuer is no tenant's of this model", "invalid_api_key")
        verdict = await self.verifier.check(name, ["Bearer " + token])
        if verdict.tenant is None:
            code = {401: "invalid_api_key", 403: "forbidden", 503: "keys_unavailable"}.get(verdict.status, "forbidden")
            raise GuardError(verdict.status, verdict.message, code)
        return verdict.tenant

    def _iam(self, token: str) -> str:
        if token.rsplit(".", 1)[-1] != SIGNATURE_REMOVED or token.count(".") != 2:
            raise GuardError(401, "the token was not verified by Cloud Run's invoker check (its signature is "
                                  "still on it): send the account's Google ID token", "invalid_api_key")
        claims = _claims(token)
        exp = claims.get("exp")
        if claims.get("iss") not in GOOGLE_ISSUERS or not isinstance(exp, (int, float)) \
                or exp + LEEWAY_S < self.wall():
            raise GuardError(401, "the token is not a current Google ID token", "invalid_api_key")
        email = claims.get("email")
        if not isinstance(email, str) or claims.get("email_verified", True) is not True:
            raise GuardError(403, "the token names no verified account: ask for the ID token with its email claim "
                                  "(gcloud auth print-identity-token --include-email; the metadata server's "
                                  "format=full)", "forbidden")
        tenant = self.accounts.get(email.lower())
        if tenant is None:
            raise GuardError(403, "this account is no tenant's of this model (tenants[].cloudRunInvokers)", "forbidden")
        return tenant


def _bearer(value: Optional[bytes]) -> str:
    if value is None:
        raise GuardError(401, "a Bearer token is required ('Authorization: Bearer <token>')", "invalid_api_key")
    if len(value) > MAX_CREDENTIAL_BYTES or not value.startswith(b"Bearer ") \
            or not (token := value[len(b"Bearer "):].strip()) or not token.isascii():
        raise GuardError(401, "the credential is not one 'Bearer <token>'", "invalid_api_key")
    return token.decode("ascii")


def _claims(token: str) -> dict[str, Any]:
    """The token's claims, unverified (which tenant's keys to verify it with, or Cloud Run's verified one)."""
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("not three parts")
        raw = parts[1] + "=" * (-len(parts[1]) % 4)
        claims: Any = json.loads(base64.urlsafe_b64decode(raw.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):
        raise GuardError(401, "the token is not a JWT", "invalid_api_key") from None
    if not isinstance(claims, dict):
        raise GuardError(401, "the token's claims are not a JSON object", "invalid_api_key")
    return claims  # pyright: ignore[reportUnknownVariableType]  (JSON: checked claim by claim where read)
