"""Per-tenant limits across all replicas: windows in the shared store (LimitStore).

One call of a Redis function per request, run atomically on Redis' own clock, so every replica sees
the same windows: at most `requests` admitted and at most `tokens` reserved per tenant in any
60 seconds. Each admitted request reserves the tokens it may make vLLM generate (its bound under
the tenant's maxTokens): what it actually generates is not known when it is admitted, so the
count is conservative.

Each call costs the same whatever the window holds. A tenant's window is one hash of BUCKETS
one-second buckets (requests and tokens per bucket, in a ring) plus running totals: a call drops
the buckets that left the window since the last one (at most BUCKETS, usually none), compares
the totals and adds to the current bucket. 61 buckets cover the current second and the 60 before
it, so whatever 60 seconds one looks at, they hold at most the limit. (A log of every admission,
read on every call, let one tenant's flood of refused requests slow the single-threaded store
for every tenant: 13 ms a call at 6,000 entries.)

A refusal is remembered here until its Retry-After passes: the tenant's next requests are
refused without asking the store, so a refused flood never reaches it. A replica has at most one
call per tenant in flight (the others wait their turn, then read the refusal first) over a
bounded pool of connections: a tenant's burst is one call at a time from each replica, never a
storm of connections that could slow the store (or, past its maxclients, refuse everyone).
When the store cannot be reached the caller falls back to its per-replica windows; after a
failure the store is not asked again for `retry_after_failure` seconds, so an outage adds no
latency to every request, and it is logged once per outage, not per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

# A child of vLLM's own logger, whose handler vLLM's logging config sets up: the root logger
# in vLLM's API server has none (and is at ERROR), so a plain module logger is never shown.
log = logging.getLogger("vllm.gke_guard")

BUCKET_MS = 1000
BUCKETS = 61
# The function the store's library registers (components/scripts/limit_store.lua, loaded when
# the store starts): the guards' ACL allows FCALL and no EVAL, so no client can run code of its
# own. The name carries the version of its arguments; a guard calling a version the store has
# not loaded gets an error and falls back to its replica's windows until the store rolls.
FUNCTION = "vllm_gke_take_v1"


class StoreUnavailable(Exception):
    """The shared store did not answer: use the per-replica window."""


@dataclass(frozen=True)
class Verdict:
    # None when admitted; else seconds until the request could be, and which limit refused it.
    wait: Optional[float] = None
    limit: str = ""


class SharedLimiter:
    def __init__(self, client: Any, bucket_ms: int = BUCKET_MS, buckets: int = BUCKETS,
                 retry_after_failure: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.bucket_ms, self.buckets = bucket_ms, buckets
        self.retry_after_failure = retry_after_failure
        self.clock = clock
        self._down_until = 0.0
        # tenant -> (until, limit, tokens): until then its requests are refused without asking the
        # store - all of them after a refusal on requests, those reserving as many tokens or more
        # after one on tokens (a smaller one may still fit).
        self._refused: dict[str, tuple[float, str, int]] = {}
        # tenant -> its one call in flight from this replica.
        self._turns: dict[str, asyncio.Lock] = {}

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 0.25, connections: int = 16,
                tls_pem: Optional[str] = None) -> "SharedLimiter":
        """`tls_pem`: a file with the store's client certificate and key (a Cloud Run guard, on the
        store's TLS port): the certificate is also the only CA the store's own is checked against."""
        import redis.asyncio as aioredis  # only in images with globalLimits; imported when configured

        tls: dict[str, Any] = {}
        if tls_pem is not None:
            # The store is reached by address: the certificate is pinned (its own CA), not a name.
            tls = {"connection_class": aioredis.SSLConnection, "ssl_certfile": tls_pem, "ssl_keyfile": tls_pem,
                   "ssl_ca_certs": tls_pem, "ssl_cert_reqs": "required", "ssl_check_hostname": False}
        # redis-py annotates the pool's timeout as int; it is asyncio's timeout, seconds as a float.
        pool = aioredis.BlockingConnectionPool(host=host, port=port, max_connections=connections,
                                               timeout=timeout,  # pyright: ignore[reportArgumentType]
                                               socket_timeout=timeout, socket_connect_timeout=timeout,
                                               health_check_interval=30, **tls)
        return cls(aioredis.Redis(connection_pool=pool))

    def _cached_refusal(self, tenant: str, tokens: int) -> Optional[Verdict]:
        refused = self._refused.get(tenant)
        if refused is None:
            return None
        until, limit, held = refused
        now = self.clock()
        if now >= until:
            del self._refused[tenant]
            return None
        return Verdict(wait=until - now, limit=limit) if limit == "requests" or tokens >= held else None

    async def take(self, tenant: str, requests: int, tokens_limit: Optional[int], tokens: int) -> Verdict:
        """Admit one request of `tenant` reserving `tokens`, or say how long to wait."""
        if (verdict := self._cached_refusal(tenant, tokens)) is not None:
            return verdict
        turn = self._turns.setdefault(tenant, asyncio.Lock())
        async with turn:
            # What the call before this one learnt: a refusal, or that the store is down.
            if (verdict := self._cached_refusal(tenant, tokens)) is not None:
                return verdict
            if self.clock() < self._down_until:
                raise StoreUnavailable("recently unreachable")
            return await self._ask(tenant, requests, tokens_limit, tokens)

    async def _ask(self, tenant: str, requests: int, tokens_limit: Optional[int], tokens: int) -> Verdict:
        try:
            result = await self.client.fcall(FUNCTION, 1, f"rl:{{{tenant}}}:w",  # one hash slot per tenant
                                             self.bucket_ms, self.buckets, requests, tokens_limit or 0, tokens)
        except Exception as exc:  # connection, timeout, function or server errors alike
            now = self.clock()
            if now >= self._down_until:  # the first failure of an outage says so; the rest count
                log.warning("shared limit store unavailable (%s); per-replica limits apply for %.0f s",
                            type(exc).__name__, self.retry_after_failure)
            self._down_until = now + self.retry_after_failure
            raise StoreUnavailable(str(exc)) from None
        if int(result[0]) == 1:
            return Verdict()
        reason = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        wait = max(int(result[2]), 1) / 1000.0
        self._refused[tenant] = (self.clock() + wait, reason, tokens)
        return Verdict(wait=wait, limit=reason)
