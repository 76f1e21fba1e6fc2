"""One request's token checked as one tenant's, by the rules the replica's Istio applies again
(components/model/tenant_policies.py: RequestAuthentication's issuer, JWKS and audiences, the
token read from `Authorization: Bearer` only; AuthorizationPolicy's subjects): a signature by a key
of the issuer's JWKS with an algorithm of that key's type (never none, never HMAC), `iss` exactly
the tenant's, an `aud` among its audiences, `exp`/`nbf` where present with Envoy jwt_authn's 60 s
clock skew, `sub` among its subjects where it lists them."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt import PyJWK, PyJWKClient, PyJWKSet

from .config import TenantJwt

log = logging.getLogger("vllm_gke_identity")

# Envoy jwt_authn's default clock_skew_seconds (what the mesh allows on exp and nbf).
LEEWAY_S = 60
# A JWKS is fetched again after this long, and on an unknown key id at most this often (a stream
# of made-up kids must not become a stream of fetches).
JWKS_LIFESPAN_S = 300
JWKS_MISS_REFETCH_S = 30
JWKS_TIMEOUT_S = 2
# The whole fetch, name resolution included (urllib's timeout covers the socket only), well under
# the load balancer's 5 s callout timeout; a failed fetch with no keys cached is remembered this
# long, its requests answered 503 at once rather than each waiting for a fetch of its own in turn.
JWKS_FETCH_BUDGET_S = 2.5
JWKS_FAILURE_S = 5
# Algorithms by key: a key verifies only its own family (an HMAC or unknown key, none).
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


@dataclass(frozen=True)
class Verdict:
    """Who the request is (`tenant`), or why not: the HTTP status and message to answer with."""

    tenant: Optional[str] = None
    status: int = 0
    message: str = ""


class KeysUnavailable(Exception):
    """The issuer's JWKS could not be fetched (and none is cached)."""


class Jwks:
    """One JWKS URI's keys, cached for JWKS_LIFESPAN_S, fetched off the event loop, one fetch at a time."""

    def __init__(self, uri: str, clock: Callable[[], float] = time.monotonic):
        self.client = PyJWKClient(uri, cache_jwk_set=False, timeout=JWKS_TIMEOUT_S)
        self.keys: Optional[PyJWKSet] = None
        self.fetched = float("-inf")
        self.failed = float("-inf")  # the last fetch that failed with no keys cached
        self.clock = clock
        self.lock = asyncio.Lock()

    async def _fetch(self, stale_before: float) -> None:
        self._recently_failed()
        async with self.lock:
            if self.fetched >= stale_before:  # another request fetched it meanwhile
                return
            self._recently_failed()  # or failed meanwhile
            try:
                # A thread past the budget is left to finish on its own (it holds no lock).
                data: Any = await asyncio.wait_for(asyncio.to_thread(self.client.fetch_data), JWKS_FETCH_BUDGET_S)
                self.keys = PyJWKSet.from_dict(data)
            except (jwt.PyJWKClientError, jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError,
                    asyncio.TimeoutError) as err:
                log.warning("JWKS %s: %s", self.client.uri, err or "no answer in time")
                if self.keys is None:
                    self.failed = self.clock()
                    raise KeysUnavailable(str(err)) from err
            self.fetched = self.clock()

    def _recently_failed(self) -> None:
        if self.keys is None and self.clock() - self.failed < JWKS_FAILURE_S:
            raise KeysUnavailable("the last fetch failed moments ago")

    async def candidates(self, kid: Optional[str]) -> list[PyJWK]:
        """The keys a token with this key id may be signed by (all of them without a kid)."""
        now = self.clock()
        if now - self.fetched > JWKS_LIFESPAN_S:
            await self._fetch(now - JWKS_LIFESPAN_S)
        keys = self._matching(kid)
        if not keys and now - self.fetched > JWKS_MISS_REFETCH_S:  # a rotated key: fetch once more
            await self._fetch(now - JWKS_MISS_REFETCH_S)
            keys = self._matching(kid)
        return keys

    def _matching(self, kid: Optional[str]) -> list[PyJWK]:
        keys = self.keys.keys if self.keys is not None else []
        return [k for k in keys if kid is None or k.key_id == kid]


def algorithms(key: PyJWK) -> list[str]:
    """The algorithms a key verifies: its family's, only its own `alg` where it names one (as Envoy's
    jwt_verify_lib skips a key whose alg differs from the token's)."""
    family = _family(key)
    alg: Any = getattr(key, "_jwk_data", {}).get("alg")  # PyJWK keeps the JWK as published
    return [a for a in family if a == alg] if isinstance(alg, str) else family


def _family(key: PyJWK) -> list[str]:
    public: Any = key.key
    if isinstance(public, rsa.RSAPublicKey):
        return list(RSA_ALGORITHMS)
    if isinstance(public, ec.EllipticCurvePublicKey):
        return [EC_ALGORITHMS[public.curve.name]] if public.curve.name in EC_ALGORITHMS else []
    return ["EdDSA"] if isinstance(public, ed25519.Ed25519PublicKey) else []


class Verifier:
    def __init__(self, tenants: dict[str, TenantJwt], clock: Callable[[], float] = time.monotonic):
        self.tenants = tenants
        self.jwks = {uri: Jwks(uri, clock) for uri in sorted({t.jwks_uri for t in tenants.values()})}

    async def check(self, tenant_name: str, authorization: list[str]) -> Verdict:
        """`authorization`: every Authorization header the request carried."""
        tenant = self.tenants[tenant_name]
        if len(authorization) != 1 or not authorization[0].startswith("Bearer ") \
                or not (token := authorization[0][len("Bearer "):].strip()):
            return Verdict(status=401, message=f"one 'Authorization: Bearer <token>' of tenant '{tenant.name}' is required")
        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            keys = await self.jwks[tenant.jwks_uri].candidates(kid if isinstance(kid, str) else None)
        except KeysUnavailable:
            return Verdict(status=503, message="the tenant's signing keys cannot be fetched now; retry")
        except jwt.PyJWTError:
            return Verdict(status=401, message="the token is not a JWT")
        claims = self._claims(token, tenant, keys)
        if claims is None:
            return Verdict(status=401, message=f"the token is not one of tenant '{tenant.name}' (signature, issuer, "
                                               "audience or validity)")
        if tenant.subjects is not None and claims.get("sub") not in tenant.subjects:
            return Verdict(status=403, message=f"this token's subject is not one tenant '{tenant.name}' lists")
        return Verdict(tenant=tenant.name)

    @staticmethod
    def _claims(token: str, tenant: TenantJwt, keys: list[PyJWK]) -> Optional[dict[str, Any]]:
        for key in keys:
            try:
                return jwt.decode(token, key.key, algorithms=algorithms(key), issuer=tenant.issuer,
                                  audience=list(tenant.audiences), leeway=LEEWAY_S,
                                  options={"require": ["iss", "aud"]})
            except (jwt.PyJWTError, ValueError, TypeError):
                continue
        return None
