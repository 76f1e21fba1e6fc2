"""Per-tenant rate limits: each replica's own windows, and the glue to the shared limit store.

Every request a tenant sends is first counted in the replica's own window (a sliding window: at
most N in any 60 seconds, exact under concurrency, from a cold start), before its body is read:
refused bodies count too, so a stream of them meets a 429 instead of costing the event loop a
read and a parse each. With globalLimits the requests found valid are also counted across
replicas in the shared store (store.py); while the store is unreachable, the replica's windows
alone, for requests and (tokensPerMinute) tokens.
"""

from __future__ import annotations

import time
from array import array
from typing import TYPE_CHECKING, Any, Callable, Optional

from .errors import GuardError
from .metrics import STORE_FALLBACKS

if TYPE_CHECKING:
    from .config import Tenant

WINDOW_SECONDS = 60.0


class SlidingWindowLimiter:
    """At most `limit` admissions in any WINDOW_SECONDS: a log of admission times, not a bucket
    (a bucket that starts full admits twice its rate in its first window).

    The log is a flat array of doubles, oldest first from `head`, not a deque of float objects:
    a busy tenant's minute holds up to `limit` entries, and the garbage collector walks every
    item of a deque on each full collection (+1.1 ms for a minute at 2,800 req/s, on top of the
    ~10 ms a vLLM-like server's heap takes); an array is one untracked object, a third the size."""

    COMPACT_AFTER = 4096  # expired entries dropped from the front in one move, amortised O(1)

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.clock = clock
        self.times = array("d")
        self.head = 0

    def __len__(self) -> int:
        """Admissions in the current window (as of the last take)."""
        return len(self.times) - self.head

    def take(self) -> Optional[float]:
        """None when admitted, else seconds until a slot frees. Synchronous: atomic on the loop."""
        now = self.clock()
        times, head = self.times, self.head
        cutoff = now - WINDOW_SECONDS
        end = len(times)
        while head < end and times[head] <= cutoff:
            head += 1
        if head >= self.COMPACT_AFTER and head * 2 >= end:
            del times[:head]
            end -= head
            head = 0
        self.head = head
        if end - head < self.limit:
            times.append(now)
            return None
        return times[head] + WINDOW_SECONDS - now


class SlidingTokenWindow:
    """At most `limit` tokens reserved in any WINDOW_SECONDS, per replica: the fallback for a
    tenant's tokensPerMinute while the shared store is unreachable. A log of (time, tokens) in
    two flat arrays with a running sum; each entry is dropped once, so a call costs amortised O(1)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.clock = clock
        self.times = array("d")
        self.tokens = array("q")
        self.head = 0
        self.used = 0

    def take(self, tokens: int) -> Optional[float]:
        """None when `tokens` fit (and are reserved), else seconds until they could."""
        now = self.clock()
        times, held = self.times, self.tokens
        cutoff = now - WINDOW_SECONDS
        head, end = self.head, len(times)
        while head < end and times[head] <= cutoff:
            self.used -= held[head]
            head += 1
        if head >= SlidingWindowLimiter.COMPACT_AFTER and head * 2 >= end:
            del times[:head]
            del held[:head]
            head = 0
        self.head = head
        if self.used + tokens <= self.limit:
            if tokens > 0:
                times.append(now)
                held.append(tokens)
                self.used += tokens
            return None
        freed, i = 0, head
        while i < len(times) and self.used - freed + tokens > self.limit:
            freed += held[i]
            i += 1
        return (times[i - 1] + WINDOW_SECONDS - now) if i > head else WINDOW_SECONDS


def connect_store(shared: dict[str, Any]) -> tuple[Any, type[Exception]]:
    """The client of the shared store named in config's globalLimits, and what it raises when
    the store cannot be reached. `tlsFile` (a Cloud Run guard): the client certificate's PEM, which
    the entrypoint (serve.py) wrote from the `tlsEnv` env var to a private file and removed from
    vLLM's environment before vLLM started; `tlsEnv` without it: not started so, refused."""
    from .store import SharedLimiter, StoreUnavailable

    if shared.get("tlsEnv") and not shared.get("tlsFile"):
        raise RuntimeError(f"globalLimits.tlsEnv: env var {shared['tlsEnv']} must reach this server as a file: start it "
                           "through the entrypoint (images/serve.py), which writes it and starts vLLM without the variable")
    host, port = str(shared["host"]), int(shared["port"])
    if shared.get("tlsFile"):
        return SharedLimiter.connect(host, port, tls_pem=str(shared["tlsFile"])), StoreUnavailable
    return SharedLimiter.connect(host, port), StoreUnavailable  # a GKE guard: over the mesh, as before


def rate_limited(tenant: Tenant, wait: float) -> GuardError:
    err = GuardError(429, f"rate limit of {tenant.rpm} requests/minute for tenant "
                          f"'{tenant.name}' exceeded", "rate_limit_exceeded")
    err.retry_after = wait
    return err


async def take_shared(shared: Any, store_unavailable: type[Exception], tenant: Tenant, tokens: int) -> None:
    """Across replicas, counted once the request is known valid; the local window if the store is down."""
    if shared is None:
        return
    try:
        verdict = await shared.take(tenant.name, tenant.rpm, tenant.tpm, tokens)
    except store_unavailable:  # the replica's own windows: requests were counted before the body
        STORE_FALLBACKS.inc()
        if tenant.tokens is not None and (wait := tenant.tokens.take(tokens)) is not None:
            err = GuardError(429, f"rate limit of {tenant.tpm} tokens/minute for tenant '{tenant.name}' exceeded "
                                  f"(this request may generate {tokens}; counted on this replica while the "
                                  "shared store is unreachable)", "rate_limit_exceeded")
            err.retry_after = wait
            raise err from None
        return
    if verdict.wait is None:
        return
    what = (f"{tenant.rpm} requests/minute" if verdict.limit == "requests"
            else f"{tenant.tpm} tokens/minute (this request may generate {tokens})")
    err = GuardError(429, f"rate limit of {what} for tenant '{tenant.name}' across all replicas exceeded",
                     "rate_limit_exceeded")
    err.retry_after = verdict.wait
    raise err
