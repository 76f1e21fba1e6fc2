"""Per-tenant limits across all replicas: sliding windows in the shared store (LimitStore).

One Lua script per request, run atomically by Redis on Redis' own clock, so every replica sees
the same windows: at most `requests` admitted and at most `tokens` reserved per tenant in any
`window` milliseconds. Each admitted request reserves the tokens it may make vLLM generate (its
bound under the tenant's maxTokens): what it actually generates is not known when it is admitted,
so the count is conservative.

When the store cannot be reached the caller falls back to its per-replica window; after a
failure the store is not asked again for `retry_after_failure` seconds, so an outage adds no
latency to every request.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("vllm_gke_guard")

WINDOW_MS = 60_000
# KEYS: requests, tokens (sorted sets scored by ms). ARGV: window ms, max requests, max tokens
# (0: no token limit), this request's tokens, a unique member.
# Returns {1} when admitted, else {0, reason, ms until it could be}.
SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window, max_req, max_tok = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, member = tonumber(ARGV[4]), ARGV[5]
local start = now - window
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', start)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', start)
if redis.call('ZCARD', KEYS[1]) >= max_req then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, 'requests', tonumber(oldest[2]) + window - now}
end
if max_tok > 0 then
  local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local used = 0
  for i = 1, #held, 2 do used = used + tonumber(string.match(held[i], ':(%d+)$')) end
  if used + tokens > max_tok then
    local freed = 0
    for i = 1, #held, 2 do
      freed = freed + tonumber(string.match(held[i], ':(%d+)$'))
      if used - freed + tokens <= max_tok then return {0, 'tokens', tonumber(held[i + 1]) + window - now} end
    end
    return {0, 'tokens', window}
  end
  if tokens > 0 then
    redis.call('ZADD', KEYS[2], now, member .. ':' .. tokens)
    redis.call('PEXPIRE', KEYS[2], window)
  end
end
redis.call('ZADD', KEYS[1], now, member)
redis.call('PEXPIRE', KEYS[1], window)
return {1}
"""


class StoreUnavailable(Exception):
    """The shared store did not answer: use the per-replica window."""


@dataclass(frozen=True)
class Verdict:
    # None when admitted; else seconds until the request could be, and which limit refused it.
    wait: Optional[float] = None
    limit: str = ""


class SharedLimiter:
    def __init__(self, client: Any, window_ms: int = WINDOW_MS, retry_after_failure: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.script = client.register_script(SCRIPT)
        self.window_ms = window_ms
        self.retry_after_failure = retry_after_failure
        self.clock = clock
        self._down_until = 0.0

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 0.25) -> "SharedLimiter":
        import redis.asyncio as aioredis  # only in images with globalLimits; imported when configured

        return cls(aioredis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  health_check_interval=30))

    async def take(self, tenant: str, requests: int, tokens_limit: Optional[int], tokens: int) -> Verdict:
        """Admit one request of `tenant` reserving `tokens`, or say how long to wait."""
        if self.clock() < self._down_until:
            raise StoreUnavailable("recently unreachable")
        keys = [f"rl:{{{tenant}}}:req", f"rl:{{{tenant}}}:tok"]  # one hash slot per tenant
        try:
            result = await self.script(keys=keys, args=[self.window_ms, requests, tokens_limit or 0, tokens,
                                                        uuid.uuid4().hex])
        except Exception as exc:  # connection, timeout, script or server errors alike
            self._down_until = self.clock() + self.retry_after_failure
            log.warning("shared limit store unavailable (%s); per-replica limits apply for %.0f s",
                        type(exc).__name__, self.retry_after_failure)
            raise StoreUnavailable(str(exc)) from None
        if int(result[0]) == 1:
            return Verdict()
        reason = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        return Verdict(wait=max(int(result[2]), 1) / 1000.0, limit=reason)
