"""ASGI middleware loaded into vLLM's OpenAI server with `--middleware vllm_gke_guard.GuardMiddleware`.

It is all that stands between a tenant and the GPUs, so it denies by default:
  - only the routes in its config pass (the tenant routes, each with its method and kind, plus
    GET /health and GET /metrics); any other path, method or a websocket gets 404/405;
  - a tenant route needs the request to have come through the pod's Envoy sidecar (the peer
    address Envoy's inbound passthrough uses, 127.0.0.6) carrying exactly one verified-issuer
    header that Istio set from the JWT; no sidecar, no service;
  - per tenant: a request rate limit (a sliding window: at most N admitted in any 60 seconds,
    exact under concurrency, from a cold start) and a cap on the tokens one request can make
    vLLM generate: per-sequence max tokens (resolved as the pinned vLLM resolves them)
    x max(n, best_of) x number of prompts. A missing bound is set to what the cap allows, a
    larger one refused.
Errors are OpenAI-style JSON 4xx; nothing raised inside the guard escapes as a 500. A client that
disconnects mid-body gets nothing forwarded.

For speed (it runs in vLLM's single API-server event loop) the body is never decoded whole: a
scanner walks the top-level JSON object, skipping strings with memchr, reads only the few
fields it needs and leaves the bytes untouched unless a bound must be added. The fields it reads
are the ones Python's json.loads (what vLLM's FastAPI uses) would give, last key winning.

Config: JSON in GKE_LLM_GUARD_CONFIG (see components/serving_api.py for the shape).
Standard library only: it runs inside the vLLM image.
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import os
import re
import time
from typing import Any, Awaitable, Callable, Optional

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
WARMUP_TOKEN_ENV = "GKE_LLM_WARMUP_TOKEN"
WARMUP_HEADER = b"x-gke-llm-warmup"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Istio's sidecar connects to the application from this address (inbound passthrough).
DEFAULT_TRUSTED_PEERS = ("127.0.0.6",)
WINDOW_SECONDS = 60.0
OPEN_ROUTES = {"/health": "GET", "/metrics": "GET"}
# Per-sequence output bound field, and vLLM's default when absent, per request kind.
OUTPUT_FIELDS = {"completions": "max_tokens", "chat": "max_completion_tokens",
                 "chat_batch": "max_completion_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

log = logging.getLogger("vllm_gke_guard")


class GuardError(Exception):
    def __init__(self, status: int, message: str, code: str, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               429: "rate_limit_error"}


def error_body(err: GuardError) -> bytes:
    return json.dumps({"error": {"message": err.message, "type": ERROR_TYPES.get(err.status, "invalid_request_error"),
                                 "param": err.param, "code": err.code}}).encode()


# --- rate limit ------------------------------------------------------------------------------

class SlidingWindowLimiter:
    """At most `limit` admissions in any WINDOW_SECONDS: a log of admission times, not a bucket
    (a bucket that starts full admits twice its rate in its first window)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.clock = clock
        self.admitted: collections.deque[float] = collections.deque()

    def take(self) -> Optional[float]:
        """None when admitted, else seconds until a slot frees. Synchronous: atomic on the loop."""
        now = self.clock()
        while self.admitted and self.admitted[0] <= now - WINDOW_SECONDS:
            self.admitted.popleft()
        if len(self.admitted) < self.limit:
            self.admitted.append(now)
            return None
        return self.admitted[0] + WINDOW_SECONDS - now


# --- the top-level JSON scanner --------------------------------------------------------------

class JsonShapeError(ValueError):
    pass


_WS = frozenset(b" \t\n\r")
_STRUCT = re.compile(rb'["\[\]{}]')
_SCALAR_END = re.compile(rb"[,\]}\s]")


def _skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def _skip_string(buf: bytes, i: int) -> int:
    """Index after the closing quote of the string opening at buf[i]."""
    j = i + 1
    while True:
        q = buf.find(b'"', j)
        if q < 0:
            raise JsonShapeError("unterminated string")
        k = q - 1
        while buf[k] == 0x5C:  # backslash
            k -= 1
        if (q - 1 - k) % 2 == 0:
            return q + 1
        j = q + 1


def _skip_container(buf: bytes, i: int) -> int:
    depth = 0
    pos = i
    while True:
        m = _STRUCT.search(buf, pos)
        if m is None:
            raise JsonShapeError("unterminated array or object")
        at = m.start()
        c = buf[at]
        if c == 0x22:
            pos = _skip_string(buf, at)
            continue
        depth += 1 if c in (0x5B, 0x7B) else -1
        pos = at + 1
        if depth == 0:
            return pos
        if depth < 0:
            raise JsonShapeError("unbalanced brackets")


def _skip_value(buf: bytes, i: int) -> int:
    if i >= len(buf):
        raise JsonShapeError("missing value")
    c = buf[i]
    if c == 0x22:
        return _skip_string(buf, i)
    if c in (0x5B, 0x7B):
        return _skip_container(buf, i)
    m = _SCALAR_END.search(buf, i)
    end = m.start() if m else len(buf)
    if end == i:
        raise JsonShapeError("missing value")
    return end


def _key(raw: bytes) -> str:
    # Keys are short; json.loads decodes escapes exactly as vLLM's parser will.
    return raw[1:-1].decode("utf-8") if b"\\" not in raw else json.loads(raw)


def scan_object(buf: bytes, wanted: frozenset[str]) -> tuple[dict[str, tuple[int, int]], int]:
    """Spans of the wanted top-level fields (the last occurrence, as json.loads keeps) and the
    index of the object's closing brace. Anything that is not one JSON object is refused."""
    i = _skip_ws(buf, 0)
    if buf[i:i + 1] != b"{":
        # Also refuses what json.loads would decode as UTF-16/32 or with a BOM.
        raise JsonShapeError("the body must be a JSON object")
    spans: dict[str, tuple[int, int]] = {}
    i = _skip_ws(buf, i + 1)
    if i < len(buf) and buf[i] == 0x7D:
        close = i
    else:
        while True:
            if i >= len(buf) or buf[i] != 0x22:
                raise JsonShapeError("expected a key")
            key_end = _skip_string(buf, i)
            key = _key(buf[i:key_end])
            i = _skip_ws(buf, key_end)
            if i >= len(buf) or buf[i] != 0x3A:
                raise JsonShapeError("expected ':'")
            start = _skip_ws(buf, i + 1)
            end = _skip_value(buf, start)
            if key in wanted:
                spans[key] = (start, end)
            i = _skip_ws(buf, end)
            if i < len(buf) and buf[i] == 0x2C:
                i = _skip_ws(buf, i + 1)
                continue
            if i < len(buf) and buf[i] == 0x7D:
                close = i
                break
            raise JsonShapeError("expected ',' or '}'")
    if _skip_ws(buf, close + 1) != len(buf):
        raise JsonShapeError("data after the JSON object")
    return spans, close


def count_items(buf: bytes, start: int, end: int) -> tuple[int, bytes]:
    """(elements, first byte of the first element) of the JSON array at buf[start:end]."""
    i = _skip_ws(buf, start + 1)
    if buf[i:i + 1] == b"]":
        return 0, b""
    first = buf[i:i + 1]
    count = 0
    while i < end:
        i = _skip_ws(buf, _skip_value(buf, i))
        count += 1
        if buf[i:i + 1] != b",":
            return count, first
        i = _skip_ws(buf, i + 1)
    raise JsonShapeError("malformed array")


# --- what vLLM would generate ------------------------------------------------------------------

def as_int(value: Any, field: str, allow_none: bool = True) -> Optional[int]:
    """pydantic's lax int, as vLLM's request models take it: ints, integral floats, integer
    strings and booleans; anything else is refused here with the reason vLLM would give."""
    if value is None:
        if allow_none:
            return None
        raise GuardError(400, f"{field} must be an integer, not null", "invalid_type", field)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise GuardError(400, f"{field} must be an integer, not {json.dumps(value)[:40]}", "invalid_type", field)


def _field(buf: bytes, spans: dict[str, tuple[int, int]], name: str, default: Any = None) -> Any:
    if name not in spans:
        return default
    start, end = spans[name]
    return json.loads(buf[start:end])


def prompt_count(buf: bytes, spans: dict[str, tuple[int, int]], fields: tuple[str, ...]) -> int:
    """How many prompts a request carries: a string or a token list is one, a list of them many.
    With several prompt fields (prompt and prompt_embeds) vLLM may take both: count both."""
    total = 0
    for name in fields:
        if name in spans:
            start, end = spans[name]
            if buf[start] != 0x5B:
                total += 1
                continue
            count, first = count_items(buf, start, end)
            total += max(count, 1) if first in (b'"', b"[") else 1  # else a list of token ids
    return max(total, 1)


class Budget:
    """The output bound of one request: per-sequence tokens x sequences."""

    def __init__(self, kind: str, buf: bytes, spans: dict[str, tuple[int, int]], rule: str):
        self.kind = kind
        n = as_int(_field(buf, spans, "n", 1), "n") or 1
        best_of = as_int(_field(buf, spans, "best_of"), "best_of") or 1
        prompts = {"completions": ("prompt", "prompt_embeds"), "chat_batch": ("messages",)}.get(kind)
        self.sequences = max(n, best_of) * (prompt_count(buf, spans, prompts) if prompts else 1)
        if self.sequences < 1:
            raise GuardError(400, "n and best_of must be at least 1", "invalid_value", "n")
        if kind in ("chat", "chat_batch"):
            mct = as_int(_field(buf, spans, "max_completion_tokens"), "max_completion_tokens")
            mt = as_int(_field(buf, spans, "max_tokens"), "max_tokens")
            # vLLM <= 0.1x: `max_completion_tokens or max_tokens` (0 falls through);
            # later: max_completion_tokens unless None. "both": bound under either reading.
            readings = {"or": [mct or mt], "not-none": [mct if mct is not None else mt]}
            self.per_sequence = readings.get(rule, readings["or"] + readings["not-none"])
            self.param = "max_completion_tokens" if mct is not None else "max_tokens"
        elif kind == "completions":
            default = COMPLETIONS_DEFAULT_MAX_TOKENS if "max_tokens" not in spans else None
            self.per_sequence = [as_int(_field(buf, spans, "max_tokens", default), "max_tokens")]
            self.param = "max_tokens"
        else:
            self.param = OUTPUT_FIELDS[kind]
            self.per_sequence = [as_int(_field(buf, spans, self.param), self.param)]

    def check(self, cap: int, tenant: str) -> Optional[int]:
        """None when the request is within the cap; else the per-sequence bound to add."""
        bounded = [v for v in self.per_sequence if v is not None]
        for value in bounded:
            if value < 0:
                raise GuardError(400, f"{self.param} must not be negative", "invalid_value", self.param)
            if value * self.sequences > cap:
                raise GuardError(400, (
                    f"{self.param}={value} x {self.sequences} sequence(s) would generate up to "
                    f"{value * self.sequences} tokens, over tenant '{tenant}' cap of {cap}; ask for at most "
                    f"{cap // self.sequences} per sequence"), "max_tokens_exceeded", self.param)
        if len(bounded) == len(self.per_sequence):
            return None
        per_sequence = cap // self.sequences
        if per_sequence < 1:
            raise GuardError(400, f"{self.sequences} sequences exceed tenant '{tenant}' cap of {cap} tokens",
                             "max_tokens_exceeded", "n")
        return per_sequence


def add_field(buf: bytes, close: int, name: str, value: int) -> bytes:
    """Append `"name": value` as the object's last member: with duplicate keys the last wins."""
    before = buf[:close].rstrip()
    sep = b"" if before.endswith(b"{") else b","
    return before + sep + b'"' + name.encode() + b'":' + str(value).encode() + buf[close:]


# --- the middleware --------------------------------------------------------------------------

class Disconnected(Exception):
    pass


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: Optional[dict[str, Any]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.app = app
        cfg = config if config is not None else json.loads(os.environ.get(CONFIG_ENV) or "{}")
        self.issuer_header = str(cfg.get("issuerHeader", "x-vllm-gke-issuer")).lower().encode()
        self.issuers: dict[str, dict[str, Any]] = dict(cfg.get("issuers") or {})
        self.routes: dict[str, dict[str, str]] = dict(cfg.get("routes") or {})
        self.trusted_peers = frozenset(cfg.get("trustedPeers") or DEFAULT_TRUSTED_PEERS)
        self.max_body = int(cfg.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
        self.rule = str(cfg.get("maxTokensRule") or "both")
        self.limiters = {iss: SlidingWindowLimiter(int(e["requestsPerMinute"]), clock)
                         for iss, e in self.issuers.items()}
        self.warmup_token = os.environ.get(WARMUP_TOKEN_ENV, "").encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind != "http":  # websockets (e.g. /v1/realtime) are not behind the tenant checks
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        try:
            forward = await self._admit(scope, receive)
        except GuardError as err:
            await self._respond(send, err)
            return
        except Disconnected:
            return  # the client left mid-body: nothing is forwarded
        except Exception:  # a guard bug must not become a 500 or let the request through
            log.exception("guard failed on %s %s", scope.get("method"), scope.get("path"))
            await self._respond(send, GuardError(400, "the request could not be checked", "unprocessable"))
            return
        await self.app(*forward, send)

    async def _admit(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive]:
        path, method = scope.get("path") or "", scope.get("method") or ""
        if OPEN_ROUTES.get(path) == method:
            return scope, receive
        route = self.routes.get(path)
        if route is None or path in OPEN_ROUTES:
            raise GuardError(404, f"no route {path}", "not_found")
        if route.get("method") != method:
            raise GuardError(405, f"{path} takes {route.get('method')}", "method_not_allowed")
        headers = scope.get("headers") or []
        if self._is_warmup(scope, headers):
            return scope, receive
        client = (scope.get("client") or ("", 0))[0]
        if client not in self.trusted_peers:
            raise GuardError(403, "the request did not come through the mesh sidecar; refused", "no_mesh")
        issuers = [v for k, v in headers if k == self.issuer_header]
        if len(issuers) != 1:
            raise GuardError(403 if not issuers else 400, "exactly one verified issuer is required", "forbidden")
        issuer = issuers[0].decode("latin-1")
        entry = self.issuers.get(issuer)
        if entry is None:
            raise GuardError(403, "no tenant is configured for this token's issuer", "forbidden")
        wait = self.limiters[issuer].take()
        if wait is not None:
            err = GuardError(429, f"rate limit of {entry['requestsPerMinute']} requests/minute for tenant "
                                  f"'{entry['tenant']}' exceeded", "rate_limit_exceeded")
            err.retry_after = wait  # type: ignore[attr-defined]
            raise err
        if route.get("kind") == "info":
            return scope, receive
        self._check_content_type(headers)
        body = await self._read_body(receive, headers)
        if route.get("kind") not in OUTPUT_FIELDS:  # pooling: rate limited, generates nothing
            self._object_or_error(body, frozenset())
            return scope, _replay(body, receive)
        kind = route["kind"]
        wanted = frozenset({"n", "best_of", "max_tokens", "max_completion_tokens", "max_output_tokens",
                            "prompt", "prompt_embeds", "messages" if kind == "chat_batch" else "prompt"})
        spans, close = self._object_or_error(body, wanted)
        try:
            budget = Budget(kind, body, spans, self.rule)
        except ValueError as exc:  # a field's JSON that json.loads refuses
            raise GuardError(400, f"invalid JSON value: {exc}", "invalid_json") from None
        add = budget.check(int(entry["maxTokens"]), entry["tenant"])
        if add is None:
            return scope, _replay(body, receive)
        body = add_field(body, close, OUTPUT_FIELDS[kind], add)
        headers = [(k, v) for k, v in headers if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        return dict(scope, headers=headers), _replay(body, receive)

    def _is_warmup(self, scope: Scope, headers: list) -> bool:
        if not self.warmup_token or (scope.get("client") or ("", 0))[0] != "127.0.0.1":
            return False
        offered = [v for k, v in headers if k == WARMUP_HEADER]
        return len(offered) == 1 and hmac.compare_digest(offered[0], self.warmup_token)

    @staticmethod
    def _check_content_type(headers: list) -> None:
        types = [v for k, v in headers if k == b"content-type"]
        if not types:
            return  # FastAPI parses an untyped body as JSON
        media = types[-1].split(b";")[0].strip().lower()
        if len(types) > 1 or not (media == b"application/json" or media.endswith(b"+json")):
            raise GuardError(415, "the body must be application/json", "unsupported_media_type")

    @staticmethod
    def _object_or_error(body: bytes, wanted: frozenset[str]) -> tuple[dict[str, tuple[int, int]], int]:
        try:
            return scan_object(body, wanted)
        except (JsonShapeError, UnicodeDecodeError, ValueError) as exc:
            raise GuardError(400, f"the body is not a JSON object: {exc}", "invalid_json") from None

    async def _read_body(self, receive: Receive, headers: list) -> bytes:
        lengths = [v for k, v in headers if k == b"content-length"]
        if lengths and (not lengths[0].isdigit() or int(lengths[0]) > self.max_body):
            raise GuardError(413, f"request body over {self.max_body} bytes", "payload_too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                raise Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise GuardError(413, f"request body over {self.max_body} bytes", "payload_too_large")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _respond(send: Send, err: GuardError) -> None:
        body = error_body(err)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            headers.append((b"retry-after", str(max(1, int(retry_after + 0.999))).encode()))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
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


__all__ = ["Budget", "GuardMiddleware", "SlidingWindowLimiter", "scan_object"]
