"""ASGI middleware loaded into vLLM's OpenAI server with `--middleware vllm_gke_guard.GuardMiddleware`.

It enforces, per tenant, what the mesh cannot see inside a request body:
- a `max_tokens` cap: a missing value is set to the cap, a larger one is refused (400);
- a request rate limit (token bucket per tenant and replica): over it, 429 with Retry-After.
The tenant is the JWT issuer Istio verified and copied into `issuerHeader`; a request
whose issuer is not configured is refused (403). Only generation endpoints are guarded.

Config is JSON in VLLM_GKE_GUARD_CONFIG: {"issuerHeader": ..., "issuers": {iss: {"tenant",
"maxTokens", "requestsPerMinute"}}}. Standard library only: it runs inside the vLLM image.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Awaitable, Callable, Optional

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GUARDED_PATHS = ("/v1/completions", "/v1/chat/completions")
WARMUP_HEADER = b"x-vllm-gke-warmup"
MAX_BODY_BYTES = 32 * 1024 * 1024


class TokenBucket:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.clock = clock
        self.stamp = clock()

    def take(self) -> Optional[float]:
        """None when admitted, else seconds until a token is free."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        return (1 - self.tokens) / self.rate


def _error(status: int, message: str, code: str, param: Optional[str] = None) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": "invalid_request_error" if status == 400 else code,
                      "param": param, "code": code}}
    return status, json.dumps(body).encode()


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: Optional[dict[str, Any]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.app = app
        cfg = config if config is not None else json.loads(os.environ.get("VLLM_GKE_GUARD_CONFIG") or "{}")
        self.issuer_header = cfg.get("issuerHeader", "x-vllm-gke-issuer").lower().encode()
        self.issuers: dict[str, dict[str, Any]] = cfg.get("issuers", {})
        self.buckets = {iss: TokenBucket(int(e["requestsPerMinute"]), clock) for iss, e in self.issuers.items()}
        self.warmup_token = os.environ.get("VLLM_GKE_WARMUP_TOKEN", "").encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.warmup_token and headers.get(WARMUP_HEADER) == self.warmup_token:
            await self.app(scope, receive, send)
            return
        issuer = headers.get(self.issuer_header, b"").decode()
        entry = self.issuers.get(issuer)
        if entry is None:
            await self._respond(send, *_error(403, "no tenant is configured for this token's issuer", "forbidden"))
            return
        wait = self.buckets[issuer].take()
        if wait is not None:
            await self._respond(send, *_error(
                429, f"rate limit of {entry['requestsPerMinute']} requests/minute for tenant "
                f"'{entry['tenant']}' exceeded", "rate_limited"), retry_after=wait)
            return

        body = await self._read_body(receive)
        if body is None:
            await self._respond(send, *_error(413, "request body too large", "payload_too_large"))
            return
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            await self.app(scope, _replay(body, receive), send)  # let vLLM report the malformed JSON
            return
        cap = int(entry["maxTokens"])
        field = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
        asked = payload.get(field)
        if asked is None:
            payload["max_tokens"] = cap
        elif not isinstance(asked, int) or asked > cap:
            await self._respond(send, *_error(
                400, f"{field}={asked} exceeds this tenant's cap of {cap}; ask for at most {cap}",
                "max_tokens_exceeded", field))
            return
        new_body = json.dumps(payload).encode()
        scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
                     + [(b"content-length", str(len(new_body)).encode())])
        await self.app(scope, _replay(new_body, receive), send)

    @staticmethod
    async def _read_body(receive: Receive) -> Optional[bytes]:
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _respond(send: Send, status: int, body: bytes, retry_after: Optional[float] = None) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if retry_after is not None:
            headers.append((b"retry-after", str(max(1, int(retry_after + 0.999))).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, upstream: Receive) -> Receive:
    """Hand the (possibly rewritten) body to the app once, then pass through to the client's
    channel, so a streaming response still hears about a real disconnect - and only then."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()

    return receive
