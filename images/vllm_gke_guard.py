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
    larger one refused;
  - per tenant, its own prefix-cache salt on every route the release salts (`cache_salt`,
    overwriting a client's): tenants on one replica share no cached prefix, so none can time
    another's prompts (vLLM documents cache_salt for exactly this).
Errors are OpenAI-style JSON 4xx; nothing raised inside the guard escapes as a 500. A client that
disconnects mid-body gets nothing forwarded.

For speed (it runs in vLLM's single API-server event loop) the body is never decoded whole:
msgspec (in the vLLM image) reads small bodies into a struct of the few fields the guard needs,
and a scanner that skips strings with memchr reads large ones while that is cheaper, msgspec
(or json.loads) the rest, so no body costs more than linear C time. The fields read are the ones
Python's json.loads (what vLLM's FastAPI uses) would give, last key winning; the bytes are left
untouched unless a bound must be added. The common request takes a shorter path of its own.

Config: JSON in GKE_LLM_GUARD_CONFIG (see components/serving_api.py for the shape).
Standard library and msgspec, both in the vLLM image (without msgspec: json.loads, slower).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import sys
import time
from array import array
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

# A child of vLLM's own logger, whose handler vLLM's logging config sets up: in vLLM's API
# server the root logger has no handler and is at ERROR, so a plain module logger shows nothing.
log = logging.getLogger("vllm.gke_guard")


class _NoCounter:
    def inc(self) -> None:
        pass


def _counter(name: str, documentation: str) -> Any:
    """A Prometheus counter on vLLM's /metrics (prometheus_client's default registry, which vLLM's
    single API server serves); a no-op where prometheus_client is missing (tests)."""
    try:
        from prometheus_client import Counter
    except ImportError:  # pragma: no cover - it ships with vLLM
        return _NoCounter()
    try:
        return Counter(name, documentation)
    except ValueError:  # registered already (the module loaded twice)
        from prometheus_client import REGISTRY

        return REGISTRY._names_to_collectors[name]  # type: ignore[attr-defined]


# Requests counted on the replica's own windows because the shared limit store did not answer:
# the dashboard and an alert read it (vllm_gke_guard_limit_store_fallbacks_total).
STORE_FALLBACKS = _counter("vllm_gke_guard_limit_store_fallbacks", "Requests limited per replica because the "
                           "shared limit store was unreachable")
# Tenant requests refused because they did not arrive from the sidecar's inbound passthrough
# address: a process in the pod calling vLLM directly, or a mesh whose data plane delivers from
# another address (the platform is built on istiod's 127.0.0.6; managed Cloud Service Mesh's
# TRAFFIC_DIRECTOR implementation does not document it). An alert reads it
# (vllm_gke_guard_untrusted_peer_requests_total); the log names the address, once each.
UNTRUSTED_PEERS = _counter("vllm_gke_guard_untrusted_peer_requests", "Tenant requests refused because they did "
                           "not come from the mesh sidecar's inbound passthrough address")
LOGGED_PEERS_MAX = 16


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


# --- the top-level JSON scanner --------------------------------------------------------------

class JsonShapeError(ValueError):
    pass


_WS = frozenset(b" \t\n\r")
_WS_RUN = re.compile(rb"[ \t\n\r]*")
# Runs the scanner can hop over in one C call: anything but quotes and brackets, and short
# strings without escapes (sre walks strings at ~4 ns a byte, memchr far faster: long or
# escaped strings are left to _skip_string).
# Bounded, so that no single call can run long (sre takes ~100 ns an iteration of a group, and
# a body can be one long run of digits or short strings): the caller loops, spending its work.
_BULK = re.compile(rb'(?:[^"\[\]{}]{1,4096}|"[^"\\]{0,64}"){0,16}')
# A key without escapes, the colon and the whitespace around them.
_KEY = re.compile(rb'[ \t\n\r]*"([^"\\]*)"[ \t\n\r]*:[ \t\n\r]*')
_SCALAR = re.compile(rb"[^,\]}\s]+")
# A whole member with a scalar or short string value and what follows it, in one C call.
_MEMBER = re.compile(rb'[ \t\n\r]*"([^"\\]*)"[ \t\n\r]*:[ \t\n\r]*'
                     rb'(-?[0-9][0-9.eE+-]*|true|false|null|"[^"\\]{0,64}")[ \t\n\r]*([,}])')
_AFTER = re.compile(rb"[ \t\n\r]*([,}])")


def _skip_ws(buf: bytes, i: int) -> int:
    if i < len(buf) and buf[i] in _WS:  # a regex call only where there is whitespace
        return _WS_RUN.match(buf, i).end()  # type: ignore[union-attr]
    return i


class ScanTooLong(Exception):
    """The scanner's work allowance ran out: the body has so many strings, escapes or brackets
    that msgspec's linear C parser is faster; the caller decodes it that way instead. Without
    an allowance a body of escaped quotes costs the scanner ~100 ms a MB of event-loop time."""


def _spend(work: list[int], steps: int = 1) -> None:
    work[0] -= steps
    if work[0] < 0:
        raise ScanTooLong()


def _skip_string(buf: bytes, i: int, work: list[int]) -> int:
    """Index after the closing quote of the string opening at buf[i]."""
    j = i + 1
    while True:
        q = buf.find(b'"', j)
        if q < 0:
            raise JsonShapeError("unterminated string")
        if buf[q - 1] != 0x5C:  # not escaped: the common case
            return q + 1
        k, lowest = q - 1, q - 1 - work[0]
        while buf[k] == 0x5C:  # backslash
            k -= 1
            if k < lowest:
                raise ScanTooLong()
        _spend(work, q - k)
        if (q - 1 - k) % 2 == 0:
            return q + 1
        j = q + 1


def _skip_container(buf: bytes, i: int, work: list[int]) -> int:
    depth = 0
    pos = i
    n = len(buf)
    while True:
        end = _BULK.match(buf, pos).end()  # type: ignore[union-attr]
        work[0] -= 1 + ((end - pos) >> 7)  # _spend, inline
        if work[0] < 0:
            raise ScanTooLong()
        pos = end
        if pos >= n:
            raise JsonShapeError("unterminated array or object")
        c = buf[pos]
        if c == 0x22:
            pos = _skip_string(buf, pos, work)
            continue
        if c == 0x5B or c == 0x7B:
            depth += 1
        elif c == 0x5D or c == 0x7D:
            depth -= 1
        else:
            continue  # _BULK stopped at its bound
        pos += 1
        if depth == 0:
            return pos
        if depth < 0:
            raise JsonShapeError("unbalanced brackets")


def _skip_value(buf: bytes, i: int, work: list[int]) -> int:
    if i >= len(buf):
        raise JsonShapeError("missing value")
    c = buf[i]
    if c == 0x22:
        return _skip_string(buf, i, work)
    if c in (0x5B, 0x7B):
        return _skip_container(buf, i, work)
    m = _SCALAR.match(buf, i)
    if m is None:
        raise JsonShapeError("missing value")
    return m.end()


def _slow_key(buf: bytes, i: int, work: list[int]) -> tuple[str, int]:
    """A key with escapes (decoded exactly as json.loads does) and where its value starts."""
    i = _skip_ws(buf, i)
    if buf[i:i + 1] != b'"':
        raise JsonShapeError("expected a key")
    end = _skip_string(buf, i, work)
    key = json.loads(buf[i:end])
    i = _skip_ws(buf, end)
    if buf[i:i + 1] != b":":
        raise JsonShapeError("expected ':'")
    return key, _skip_ws(buf, i + 1)


def scan_object(buf: bytes, wanted: frozenset[str], work: Optional[list[int]] = None) \
        -> tuple[dict[str, tuple[int, int]], int]:
    """Spans of the wanted top-level fields (the last occurrence, as json.loads keeps) and the
    index of the object's closing brace. Anything that is not one JSON object is refused.
    `work`: [steps allowed] (ScanTooLong past it); no limit by default."""
    if work is None:
        work = [sys.maxsize]
    i = _skip_ws(buf, 0)
    if buf[i:i + 1] != b"{":
        # Also refuses what json.loads would decode as UTF-16/32 or with a BOM.
        raise JsonShapeError("the body must be a JSON object")
    spans: dict[str, tuple[int, int]] = {}
    i = _skip_ws(buf, i + 1)
    if buf[i:i + 1] == b"}":
        close = i
    else:
        while True:
            work[0] -= 1  # _spend, inline
            if work[0] < 0:
                raise ScanTooLong()
            m = _MEMBER.match(buf, i)
            if m is not None:  # the common small member
                key = m.group(1).decode("utf-8")
                if key in wanted:
                    spans[key] = m.span(2)
                if m.group(3) == b"}":
                    close = m.end() - 1
                    break
                i = m.end()
                continue
            m = _KEY.match(buf, i)
            if m is not None:
                key, start = m.group(1).decode("utf-8"), m.end()
            else:
                key, start = _slow_key(buf, i, work)
            end = _skip_value(buf, start, work)
            if key in wanted:
                spans[key] = (start, end)
            after = _AFTER.match(buf, end)
            if after is None:
                raise JsonShapeError("expected ',' or '}'")
            if after.group(1) == b"}":
                close = after.end() - 1
                break
            i = after.end()
    if close + 1 != len(buf) and buf[close + 1:].strip(b" \t\n\r"):
        raise JsonShapeError("data after the JSON object")
    return spans, close


# --- what vLLM would generate ------------------------------------------------------------------

def as_int(value: Any, field: str, allow_none: bool = True) -> Optional[int]:
    """pydantic's lax int, as vLLM's request models take it: ints, integral floats, integer
    strings and booleans; anything else is refused here with the reason vLLM would give."""
    if type(value) is int:  # the common case first
        return value
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


COUNTED = ("n", "best_of", "max_tokens", "max_completion_tokens", "max_output_tokens", "model")
PROMPT_FIELDS = {"completions": ("prompt", "prompt_embeds"), "chat_batch": ("messages",)}


class _Absent:
    """A field the body does not have (null is None: vLLM reads the two differently)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
LISTED = ("prompt", "prompt_embeds", "messages")  # the prompt lists, kept as raw JSON to count


class Fields:
    """What the budget reads of a request body, as the scanner found it: the counted fields
    decoded (as json.loads would; ABSENT when missing), the prompt lists raw, and where the
    object closes. The msgspec reader gives its own struct with the same attributes (and no
    `close`): the common path builds one object, no dicts."""

    __slots__ = COUNTED + LISTED + ("close",)

    def __init__(self, values: list[Any], close: int):
        (self.n, self.best_of, self.max_tokens, self.max_completion_tokens, self.max_output_tokens, self.model,
         self.prompt, self.prompt_embeds, self.messages) = values
        self.close = close

    @property
    def values(self) -> dict[str, Any]:
        return present_values(self)


def present_values(fields: Any) -> dict[str, Any]:
    """The counted fields a body has, as json.loads gives them."""
    return {k: v for k in COUNTED if (v := getattr(fields, k)) is not ABSENT}


def prompt_lists(fields: Any, kind: str) -> dict[str, bytes]:
    """The raw JSON of the prompt fields a request of this kind has."""
    return {k: bytes(raw) for k in PROMPT_FIELDS.get(kind, ()) if (raw := getattr(fields, k)) is not ABSENT}


def closing_brace(fields: Any, buf: bytes) -> int:
    """Where the body's object closes: the scanner knows; for a body msgspec read (valid JSON)
    it is the last byte but trailing whitespace."""
    close = getattr(fields, "close", -1)
    return close if close >= 0 else buf.rstrip().rfind(b"}")


# A string json.loads would return as is: no escapes, no control characters.
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')


def _decode_small(raw: bytes) -> Any:
    """A scanned value as json.loads gives it, the common forms without its per-call cost."""
    if raw.isdigit():
        return int(raw)
    if raw == b"null":
        return None
    if _PLAIN_STRING.fullmatch(raw):  # json.loads decodes bytes as UTF-8 with surrogatepass
        return raw[1:-1].decode("utf-8", "surrogatepass")
    return json.loads(raw)


_WANTED = {kind: frozenset(COUNTED + PROMPT_FIELDS.get(kind, ())) for kind in OUTPUT_FIELDS}


def read_fields_by_scanning(buf: bytes, kind: str, work: Optional[list[int]] = None) -> Fields:
    lists = PROMPT_FIELDS.get(kind, ())
    spans, close = scan_object(buf, _WANTED.get(kind) or frozenset(COUNTED + lists), work)
    values = [_decode_small(buf[span[0]:span[1]]) if (span := spans.get(k)) else ABSENT for k in COUNTED]
    values += [buf[span[0]:span[1]] if k in lists and (span := spans.get(k)) else ABSENT for k in LISTED]
    return Fields(values, close)


try:  # msgspec ships in the vLLM image: C speed on small bodies, same reading as json.loads
    import msgspec

    class _Body(msgspec.Struct):
        n: Any = ABSENT
        best_of: Any = ABSENT
        max_tokens: Any = ABSENT
        max_completion_tokens: Any = ABSENT
        max_output_tokens: Any = ABSENT
        model: Any = ABSENT
        prompt: msgspec.Raw = ABSENT
        prompt_embeds: msgspec.Raw = ABSENT
        messages: msgspec.Raw = ABSENT

        @property
        def values(self) -> dict[str, Any]:
            return present_values(self)

    _BODY = msgspec.json.Decoder(_Body)
    _ARRAY = msgspec.json.Decoder(list[msgspec.Raw])  # its elements, undecoded: to count them

    class _AnyObject(msgspec.Struct):
        pass

    _OBJECT = msgspec.json.Decoder(_AnyObject)  # any JSON object: every member skipped in C

except ImportError:  # pragma: no cover - then json.loads where the scanner would be slow: as exact, slower
    _BODY = _ARRAY = _OBJECT = None

# Below this size msgspec's C parser wins; above it the scanner's memchr over long strings does.
MSGSPEC_MAX_BYTES = 16 * 1024


def read_fields(buf: bytes, kind: str) -> Any:
    """Fields, or msgspec's struct with the same attributes."""
    if _BODY is None:
        try:
            return read_fields_by_scanning(buf, kind, [scan_allowance(len(buf))])
        except ScanTooLong:
            return read_fields_with_json(buf, kind)
    if len(buf) > MSGSPEC_MAX_BYTES:
        try:  # while its work stays under msgspec's (~0.3 ns a byte), the scanner is the faster
            return read_fields_by_scanning(buf, kind, [scan_allowance(len(buf))])
        except ScanTooLong:
            pass
    try:
        return _BODY.decode(buf)
    except (msgspec.MsgspecError, RecursionError) as exc:  # deep nesting is malformed too
        raise JsonShapeError(str(exc)) from None


def read_fields_with_json(buf: bytes, kind: str) -> Fields:
    """Without msgspec, for what the scanner gives up on: json.loads is linear, in C."""
    try:
        doc = json.loads(buf)
    except (ValueError, RecursionError) as exc:
        raise JsonShapeError(str(exc)) from None
    if not isinstance(doc, dict):
        raise JsonShapeError("the body must be a JSON object")
    lists = PROMPT_FIELDS.get(kind, ())
    values = [doc.get(k, ABSENT) for k in COUNTED]
    values += [json.dumps(doc[k]).encode() if k in lists and k in doc else ABSENT for k in LISTED]
    return Fields(values, -1)


def scan_allowance(size: int) -> int:
    """Scanner steps (~0.25 us each) worth spending on a body before msgspec would have been faster."""
    return 64 + size // 1024


def is_object(buf: bytes) -> None:
    """Refuses (JsonShapeError) what is not one JSON object, in linear time."""
    if _OBJECT is None:
        try:
            scan_object(buf, frozenset(), [scan_allowance(len(buf))])
        except ScanTooLong:
            read_fields_with_json(buf, "")
        return
    try:
        _OBJECT.decode(buf)
    except (msgspec.MsgspecError, RecursionError) as exc:  # deep nesting is malformed too
        raise JsonShapeError(str(exc)) from None


def prompt_count(lists: dict[str, bytes], every_item: bool = False) -> int:
    """How many prompts a request carries: a string or a token list is one, a list of them many.
    With several prompt fields (prompt and prompt_embeds) vLLM may take both: count both.
    `every_item`: each element is a prompt whatever it looks like (a chat batch's conversations).
    Counted in C where msgspec is there: a list can hold millions of elements."""
    total = 0
    for raw in lists.values():
        if raw[:1] != b"[":
            total += 1
            continue
        i = _skip_ws(raw, 1)
        first = raw[i:i + 1]
        if not every_item and first not in (b'"', b"["):  # a list of token ids (or empty): one prompt
            total += 1
            continue
        if _ARRAY is None:
            try:
                count = len(json.loads(raw))
            except ValueError as exc:
                raise JsonShapeError(str(exc)) from None
        else:
            try:
                count = len(_ARRAY.decode(raw))
            except (msgspec.MsgspecError, RecursionError) as exc:  # deep nesting is malformed too
                raise JsonShapeError(str(exc)) from None
        total += max(count, 1)
    return max(total, 1)


class Budget:
    """The output bound of one request: per-sequence tokens x sequences."""

    __slots__ = ("kind", "sequences", "per_sequence", "param")

    def __init__(self, kind: str, fields: Any, rule: str):
        self.kind = kind
        n, best_of = fields.n, fields.best_of
        n = 1 if n is ABSENT else as_int(n, "n") or 1
        best_of = 1 if best_of is ABSENT else as_int(best_of, "best_of") or 1
        prompts = prompt_count(prompt_lists(fields, kind), every_item=kind == "chat_batch") \
            if kind in PROMPT_FIELDS else 1
        self.sequences = (n if n > best_of else best_of) * prompts
        if self.sequences < 1:
            raise GuardError(400, "n and best_of must be at least 1", "invalid_value", "n")
        if kind == "chat" or kind == "chat_batch":
            mct, mt = fields.max_completion_tokens, fields.max_tokens
            mct = None if mct is ABSENT else as_int(mct, "max_completion_tokens")
            mt = None if mt is ABSENT else as_int(mt, "max_tokens")
            # vLLM <= 0.1x: `max_completion_tokens or max_tokens` (0 falls through);
            # later: max_completion_tokens unless None. "both": bound under either reading.
            not_none = mct if mct is not None else mt
            if rule == "not-none":
                self.per_sequence = [not_none]
            elif rule == "or" or mct:  # a non-zero max_completion_tokens: both readings agree
                self.per_sequence = [mct or mt]
            else:
                self.per_sequence = [mct or mt, not_none]
            self.param = "max_completion_tokens" if mct is not None else "max_tokens"
        elif kind == "completions":
            mt = fields.max_tokens
            mt = COMPLETIONS_DEFAULT_MAX_TOKENS if mt is ABSENT else as_int(mt, "max_tokens")
            self.per_sequence = [mt]
            self.param = "max_tokens"
            if rule != "not-none":
                # vLLM <= 0.1x reads `max_completion_tokens or max_tokens` for completions too (an
                # extra field its request model keeps: vllm/entrypoints/utils.py get_max_tokens).
                mct = fields.max_completion_tokens
                if mct is not ABSENT and mct is not None and type(mct) is not int:
                    # An extra field: no model converts it, and vLLM's min(int, "5") would fail
                    # with a 500. Only a JSON integer (or null) is what the engine can read.
                    raise GuardError(400, f"max_completion_tokens must be an integer, not "
                                          f"{json.dumps(mct)[:40]}", "invalid_type", "max_completion_tokens")
                mct = None if mct is ABSENT else mct
                self.per_sequence = [mct or mt] if rule == "or" else [mct or mt, mt]
                if mct:
                    self.param = "max_completion_tokens"
        else:
            self.param = OUTPUT_FIELDS[kind]
            value = getattr(fields, self.param)
            self.per_sequence = [None if value is ABSENT else as_int(value, self.param)]

    def check(self, cap: int, tenant: str) -> Optional[int]:
        """None when the request is within the cap; else the per-sequence bound to add."""
        unbounded = False
        for value in self.per_sequence:
            if value is None:
                unbounded = True
                continue
            if value < 0:
                raise GuardError(400, f"{self.param} must not be negative", "invalid_value", self.param)
            if value * self.sequences > cap:
                raise GuardError(400, (
                    f"{self.param}={value} x {self.sequences} sequence(s) would generate up to "
                    f"{value * self.sequences} tokens, over tenant '{tenant}' cap of {cap}; ask for at most "
                    f"{cap // self.sequences} per sequence"), "max_tokens_exceeded", self.param)
        if not unbounded:
            return None
        per_sequence = cap // self.sequences
        if per_sequence < 1:
            raise GuardError(400, f"{self.sequences} sequences exceed tenant '{tenant}' cap of {cap} tokens",
                             "max_tokens_exceeded", "n")
        return per_sequence


def int_member(name: str, value: int) -> bytes:
    """`"name":value`, a member add_members appends."""
    return b'"' + name.encode() + b'":' + str(value).encode()


def add_members(buf: bytes, close: int, members: bytes) -> bytes:
    """Append already-encoded members (`"a":1,"b":"x"`) as the object's last: they win over any
    earlier copy of the same keys, as json.loads (and so vLLM) reads duplicates."""
    before = buf[:close].rstrip()
    sep = b"" if before.endswith(b"{") else b","
    return before + sep + members + buf[close:]


def utf8_or_error(body: bytes) -> None:
    """Refuse a body that is not UTF-8 anywhere, also inside fields the guard does not read
    (msgspec and the scanner skip those): vLLM would fail on it later, past the guard."""
    if not body.isascii():  # the common case without a decode
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GuardError(400, f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}",
                             "invalid_encoding") from None


# --- the middleware --------------------------------------------------------------------------

class Disconnected(Exception):
    pass


# Which of _Headers' values a header sets (the issuer and objective names come from config).
_ISSUER, _OBJECTIVE, _CONTENT_TYPE, _CONTENT_LENGTH, _WARMUP = range(5)


def header_slots(issuer_header: bytes, objective_header: bytes = b"") -> dict[bytes, int]:
    slots = {b"content-type": _CONTENT_TYPE, b"content-length": _CONTENT_LENGTH, WARMUP_HEADER: _WARMUP}
    if objective_header:
        slots[objective_header] = _OBJECTIVE
    slots[issuer_header] = _ISSUER  # set last: it wins should config name a standard header
    return slots


class _Headers:
    """The few request headers the guard reads, in one pass with one dict lookup a header (this
    runs on every request): the first value of each, and which of them came more than once."""

    __slots__ = ("issuer", "objective", "content_type", "content_length", "warmup", "repeated")

    def __init__(self, headers: list, slots: dict[bytes, int]):
        found: list[Optional[bytes]] = [None, None, None, None, None]
        repeated = 0
        get = slots.get
        for k, v in headers:
            i = get(k)
            if i is not None:
                if found[i] is None:
                    found[i] = v
                else:
                    repeated |= 1 << i
        self.issuer, self.objective, self.content_type, self.content_length, self.warmup = found
        self.repeated = repeated

    def once(self, slot: int) -> Optional[bytes]:
        """The header's value if it came exactly once, else None."""
        return None if self.repeated & (1 << slot) else (self.issuer, self.objective, self.content_type,
                                                          self.content_length, self.warmup)[slot]


class Tenant:
    """One issuer's tenant, read from config once (not looked up in a dict on every request)."""

    __slots__ = ("name", "cap", "rpm", "tpm", "objective", "models", "limiter", "tokens", "salt")

    def __init__(self, entry: dict[str, Any], clock: Callable[[], float]):
        self.name = str(entry["tenant"])
        self.cap = int(entry["maxTokens"])
        self.rpm = int(entry["requestsPerMinute"])
        self.tpm: Optional[int] = entry.get("tokensPerMinute")
        self.objective: Optional[str] = entry.get("objective")
        # On a server with LoRA adapters: the `model` values the tenant may name.
        self.models: Optional[frozenset[str]] = frozenset(entry["models"]) if "models" in entry else None
        self.limiter = SlidingWindowLimiter(self.rpm, clock)
        # tokensPerMinute per replica, while the shared store is unreachable.
        self.tokens = SlidingTokenWindow(int(self.tpm), clock) if self.tpm else None
        # The member appended to salted requests, encoded once: `"cache_salt":"<salt>"`.
        salt = entry.get("cacheSalt")
        self.salt: Optional[bytes] = b'"cache_salt":' + json.dumps(str(salt)).encode() if salt else None


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: Optional[dict[str, Any]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.app = app
        cfg = config if config is not None else json.loads(os.environ.get(CONFIG_ENV) or "{}")
        self.issuer_header = str(cfg.get("issuerHeader", "x-vllm-gke-issuer")).lower().encode()
        self.tenants = {iss: Tenant(e, clock) for iss, e in (cfg.get("issuers") or {}).items()}
        # Behind the endpoint picker: the objective (priority) the route set must be the tenant's own.
        self.objective_header = str(cfg.get("objectiveHeader") or "").lower().encode()
        # path -> (method, kind)
        self.routes = {path: (r.get("method"), r.get("kind")) for path, r in (cfg.get("routes") or {}).items()}
        self.trusted_peers = frozenset(cfg.get("trustedPeers") or DEFAULT_TRUSTED_PEERS)
        self.max_body = int(cfg.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
        self.rule = str(cfg.get("maxTokensRule") or "both")
        # The routes whose request models take cache_salt in the pinned release.
        self.salted = frozenset(cfg.get("cacheSaltRoutes") or ())
        # Limits across replicas (LimitStore); the per-replica windows are then the fallback.
        shared = cfg.get("globalLimits")
        self.shared: Any = None
        self.store_unavailable: type[Exception] = Exception
        if shared:
            from vllm_gke_limits import SharedLimiter, StoreUnavailable

            self.shared = SharedLimiter.connect(str(shared["host"]), int(shared["port"]))
            self.store_unavailable = StoreUnavailable
        self.warmup_token = os.environ.get(WARMUP_TOKEN_ENV, "").encode()
        self.header_slots = header_slots(self.issuer_header, self.objective_header)
        self.logged_peers: set[str] = set()

    def _untrusted(self, client: str) -> None:
        """Count the refusal; name each new address once (bounded: a flood logs nothing more)."""
        UNTRUSTED_PEERS.inc()
        if client not in self.logged_peers and len(self.logged_peers) < LOGGED_PEERS_MAX:
            self.logged_peers.add(client)
            log.error("refused a tenant request from %s: only the mesh sidecar's inbound passthrough address (%s) "
                      "is trusted. If every request comes from it, the mesh's data plane does not deliver from "
                      "127.0.0.6: check the control plane implementation (gcloud container fleet mesh describe: "
                      "controlPlaneManagement.implementation) against the README's 'Managed Cloud Service Mesh'",
                      client or "an unknown peer", ", ".join(sorted(self.trusted_peers)))

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
            scope, receive, listed = await self._admit(scope, receive)
        except GuardError as err:
            await self._respond(send, err)
            return
        except Disconnected:
            return  # the client left mid-body: nothing is forwarded
        except Exception:  # a guard bug must not become a 500 or let the request through
            log.exception("guard failed on %s %s", scope.get("method"), scope.get("path"))
            await self._respond(send, GuardError(400, "the request could not be checked", "unprocessable"))
            return
        await self.app(scope, receive, send if listed is None else _model_list_filter(send, listed))

    # Off only in tests, to check that the fast path decides exactly as the general one.
    fast_path = True

    async def _admit(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive, Optional[frozenset[str]]]:
        """The scope and body to forward, and on a server with adapters the `model` values the
        tenant may see listed (GET /v1/models names every adapter the server loaded)."""
        if self.fast_path and self.routes.get(path := scope.get("path")) == ("POST", "chat") \
                and scope.get("method") == "POST" and path not in OPEN_ROUTES:
            admitted = await self._admit_common_chat(scope, receive)
            if admitted is not None:
                return admitted
        path, method = scope.get("path") or "", scope.get("method") or ""
        if OPEN_ROUTES.get(path) == method:
            return scope, receive, None
        route = self.routes.get(path)
        if route is None or path in OPEN_ROUTES:
            raise GuardError(404, f"no route {path}", "not_found")
        route_method, kind = route
        if route_method != method:
            raise GuardError(405, f"{path} takes {route_method}", "method_not_allowed")
        headers = scope.get("headers") or []
        seen = _Headers(headers, self.header_slots)
        client = (scope.get("client") or ("", 0))[0]
        if self.warmup_token and client == "127.0.0.1" and self._is_warmup(seen):
            return scope, receive, None
        if client not in self.trusted_peers:
            self._untrusted(client)
            raise GuardError(403, "the request did not come through the mesh sidecar; refused", "no_mesh")
        issuer = seen.once(_ISSUER)
        if issuer is None:
            raise GuardError(403 if seen.issuer is None else 400, "exactly one verified issuer is required",
                             "forbidden")
        tenant = self.tenants.get(issuer.decode("latin-1"))
        if tenant is None:
            raise GuardError(403, "no tenant is configured for this token's issuer", "forbidden")
        if self.objective_header and ((objective := seen.once(_OBJECTIVE)) is None
                                      or objective.decode("latin-1") != tenant.objective):
            raise GuardError(403, f"tenant '{tenant.name}' must call this model under its own path "
                                  f"(/{tenant.name}/<model>/v1)", "forbidden")
        if self.shared is None and (wait := tenant.limiter.take()) is not None:
            raise self._rate_limited(tenant, wait)
        if kind == "info":
            await self._take_shared(tenant, 0)
            return scope, receive, tenant.models
        if seen.content_type != b"application/json" or seen.repeated:  # the common case without parsing it
            self._check_content_type(seen)
        length = seen.content_length
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            raise self._too_large()
        return await self._admit_body(scope, receive, await self._receive_body(receive), kind, tenant,
                                      salt=tenant.salt if path in self.salted else None)

    async def _admit_common_chat(self, scope: Scope, receive: Receive) \
            -> Optional[tuple[Scope, Receive, Optional[frozenset[str]]]]:
        """The request nearly every call is - a tenant's chat completion within its cap, through
        the sidecar, one issuer, JSON, one sequence - checked in one function:
        in a busy server the guard's code is out of the CPU's caches on every request, so each
        function and object it touches costs (timed inside a loaded server at 1 KB: ~10 us a
        request on the general path, ~7 here). None, before anything is counted or read, for any request
        that is not plainly that one: the general path then decides it from the start. Once the
        rate limit is taken it finishes as the general path would (tests compare the two)."""
        if self.shared is not None or self.objective_header:
            return None
        path = scope.get("path")
        issuer_header = self.issuer_header
        issuer = content_type = length = None
        for k, v in scope.get("headers") or ():
            if k == issuer_header:
                if issuer is not None:
                    return None
                issuer = v
            elif k == b"content-type":
                if content_type is not None:
                    return None
                content_type = v
            elif k == b"content-length":
                if length is not None:
                    return None
                length = v
            elif k == WARMUP_HEADER:
                return None
        if issuer is None or content_type != b"application/json" or length is None or not length.isdigit() \
                or int(length) > self.max_body or (scope.get("client") or ("", 0))[0] not in self.trusted_peers:
            return None
        tenant = self.tenants.get(issuer.decode("latin-1"))
        if tenant is None or tenant.models is not None:
            return None
        # From here on, as the general path: counted, then the body.
        if (wait := tenant.limiter.take()) is not None:
            raise self._rate_limited(tenant, wait)
        message = await receive()
        if message.get("type") == "http.request" and not message.get("more_body") \
                and len(body := message.get("body", b"")) <= MSGSPEC_MAX_BYTES and _BODY is not None:
            if len(body) > self.max_body:
                raise self._too_large()
            try:  # read_fields, inline
                fields = _BODY.decode(body)
            except (msgspec.MsgspecError, RecursionError):
                fields = None  # the general path says why
        else:
            body = await self._receive_body(receive, message)
            try:
                fields = read_fields(body, "chat")
            except (JsonShapeError, ValueError):
                fields = None
        salt = tenant.salt if path in self.salted else None
        if fields is not None and fields.n is ABSENT and fields.best_of is ABSENT:
            mct, mt = fields.max_completion_tokens, fields.max_tokens
            # One sequence bounded by a positive max_completion_tokens within the cap: every reading
            # of the rule agrees; max_tokens must still be what as_int accepts.
            if type(mct) is int and 0 < mct <= tenant.cap and (mt is ABSENT or mt is None or type(mt) is int) \
                    and body.isascii():
                if salt is None:
                    return scope, _Replay(body, receive), None
                return self._forward(scope, receive, add_members(body, closing_brace(fields, body), salt))
        return await self._admit_body(scope, receive, body, "chat", tenant, fields, salt=salt)

    async def _receive_body(self, receive: Receive, message: Optional[Message] = None) -> bytes:
        if message is None:
            message = await receive()
        if message.get("type") == "http.request" and not message.get("more_body"):  # one message: the common case
            return self._within_limit(message.get("body", b""))
        return await self._read_body(receive, message)

    def _within_limit(self, body: bytes) -> bytes:
        if len(body) > self.max_body:
            raise self._too_large()
        return body

    def _too_large(self) -> GuardError:
        return GuardError(413, f"request body over {self.max_body} bytes", "payload_too_large")

    async def _admit_body(self, scope: Scope, receive: Receive, body: bytes, kind: str, tenant: Tenant,
                          fields: Any = None, salt: Optional[bytes] = None) \
            -> tuple[Scope, Receive, Optional[frozenset[str]]]:
        """The checks on the body, once the request is counted and its body read (and its fields,
        where the caller has read them already); `salt`, the tenant's cache_salt member to append."""
        utf8_or_error(body)
        if kind not in OUTPUT_FIELDS:  # pooling: rate limited, generates nothing
            if tenant.models is not None:
                self._check_model(tenant.models, fields := self._fields(body, kind))
            else:
                self._object_or_error(body)
            await self._take_shared(tenant, 0)
            if salt is None:
                return scope, _Replay(body, receive), None
            return self._forward(scope, receive, add_members(body, closing_brace(fields, body), salt))
        if fields is None:
            fields = self._fields(body, kind)
        try:
            budget = Budget(kind, fields, self.rule)
        except (JsonShapeError, ValueError) as exc:  # includes UnicodeDecodeError, JSONDecodeError
            raise GuardError(400, f"the body is not a valid JSON object: {exc}", "invalid_json") from None
        if tenant.models is not None:
            self._check_model(tenant.models, fields)
        add = budget.check(tenant.cap, tenant.name)
        if self.shared is not None:
            per_sequence = add if add is not None else max(v for v in budget.per_sequence if v is not None)
            await self._take_shared(tenant, per_sequence * budget.sequences)
        if add is None and salt is None:
            return scope, _Replay(body, receive), None
        members = b",".join(m for m in (None if add is None else int_member(OUTPUT_FIELDS[kind], add), salt) if m)
        return self._forward(scope, receive, add_members(body, closing_brace(fields, body), members))

    @staticmethod
    def _forward(scope: Scope, receive: Receive, body: bytes) -> tuple[Scope, Receive, Optional[frozenset[str]]]:
        """Forward a rewritten body, with its Content-Length fixed."""
        headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        return dict(scope, headers=headers), _Replay(body, receive), None

    @staticmethod
    def _fields(body: bytes, kind: str) -> Any:
        try:
            return read_fields(body, kind)
        except (JsonShapeError, ValueError) as exc:  # includes UnicodeDecodeError, JSONDecodeError
            raise GuardError(400, f"the body is not a valid JSON object: {exc}", "invalid_json") from None

    @staticmethod
    def _check_model(allowed: frozenset[str], fields: Any) -> None:
        """On a server with LoRA adapters the body's `model` picks base or adapter: only the ones
        the tenant is allowed pass (no `model`: the base model). Unknown and forbidden look alike."""
        model = fields.model
        if model is None or model is ABSENT:
            return
        if not isinstance(model, str):
            raise GuardError(400, "model must be a string", "invalid_type", "model")
        if model not in allowed:
            raise GuardError(404, f"The model `{model[:100]}` does not exist or you do not have access to it.",
                             "model_not_found", "model")

    @staticmethod
    def _rate_limited(tenant: Tenant, wait: float) -> GuardError:
        err = GuardError(429, f"rate limit of {tenant.rpm} requests/minute for tenant "
                              f"'{tenant.name}' exceeded", "rate_limit_exceeded")
        err.retry_after = wait  # type: ignore[attr-defined]
        return err

    async def _take_shared(self, tenant: Tenant, tokens: int) -> None:
        """Across replicas, counted once the request is known valid; the local window if the store is down."""
        if self.shared is None:
            return
        try:
            verdict = await self.shared.take(tenant.name, tenant.rpm, tenant.tpm, tokens)
        except self.store_unavailable:  # the replica's own windows instead, requests and tokens
            STORE_FALLBACKS.inc()
            if (wait := tenant.limiter.take()) is not None:
                raise self._rate_limited(tenant, wait) from None
            if tenant.tokens is not None and (wait := tenant.tokens.take(tokens)) is not None:
                err = GuardError(429, f"rate limit of {tenant.tpm} tokens/minute for tenant '{tenant.name}' exceeded "
                                      f"(this request may generate {tokens}; counted on this replica while the "
                                      "shared store is unreachable)", "rate_limit_exceeded")
                err.retry_after = wait  # type: ignore[attr-defined]
                raise err from None
            return
        if verdict.wait is None:
            return
        what = (f"{tenant.rpm} requests/minute" if verdict.limit == "requests"
                else f"{tenant.tpm} tokens/minute (this request may generate {tokens})")
        err = GuardError(429, f"rate limit of {what} for tenant '{tenant.name}' across all replicas exceeded",
                         "rate_limit_exceeded")
        err.retry_after = verdict.wait  # type: ignore[attr-defined]
        raise err

    def _is_warmup(self, seen: _Headers) -> bool:
        token = seen.once(_WARMUP)
        return bool(self.warmup_token) and token is not None and hmac.compare_digest(token, self.warmup_token)

    @staticmethod
    def _check_content_type(seen: _Headers) -> None:
        if seen.content_type is None:
            return  # FastAPI parses an untyped body as JSON
        media = seen.content_type.split(b";")[0].strip().lower()
        if seen.repeated & (1 << _CONTENT_TYPE) or not (media == b"application/json" or media.endswith(b"+json")):
            raise GuardError(415, "the body must be application/json", "unsupported_media_type")

    @staticmethod
    def _object_or_error(body: bytes) -> None:
        try:
            is_object(body)
        except (JsonShapeError, UnicodeDecodeError, ValueError) as exc:
            raise GuardError(400, f"the body is not a JSON object: {exc}", "invalid_json") from None

    async def _read_body(self, receive: Receive, message: Message) -> bytes:
        """The whole body, from its first message on."""
        chunks, size = [], 0
        while True:
            if message.get("type") == "http.disconnect":
                raise Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)
            message = await receive()

    @staticmethod
    async def _respond(send: Send, err: GuardError) -> None:
        body = error_body(err)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            headers.append((b"retry-after", str(max(1, int(retry_after + 0.999))).encode()))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


# A model list is a few KB; past this the response is not one, and the tenant gets an empty list.
MODEL_LIST_MAX_BYTES = 1 << 20
EMPTY_MODEL_LIST = b'{"object": "list", "data": []}'


def _model_list_filter(send: Send, allowed: frozenset[str]) -> Send:
    """Pass a 200 model list on with only the entries whose `id` the tenant may use; anything
    else (an error status) unchanged. A body that is not the list OpenAI's format describes
    becomes an empty list: nothing another tenant may use is ever shown."""
    start: Optional[Message] = None
    chunks: list[bytes] = []
    size = 0

    async def filtered(message: Message) -> None:
        nonlocal start, size
        if message.get("type") == "http.response.start":
            if message.get("status") != 200:
                start = None
                await send(message)
                return
            start = message
            return
        if start is None or message.get("type") != "http.response.body":
            await send(message)
            return
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= MODEL_LIST_MAX_BYTES:
            chunks.append(chunk)
        if message.get("more_body"):
            return
        body = _listed_only(b"".join(chunks), allowed) if size <= MODEL_LIST_MAX_BYTES else EMPTY_MODEL_LIST
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return filtered


def _listed_only(body: bytes, allowed: frozenset[str]) -> bytes:
    try:
        listing = json.loads(body)
    except ValueError:
        return EMPTY_MODEL_LIST
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return EMPTY_MODEL_LIST
    listing["data"] = [m for m in listing["data"] if isinstance(m, dict) and m.get("id") in allowed]
    return json.dumps(listing).encode()


class _Replay:
    """The receive channel the app gets: the (possibly rewritten) body once, then the client's
    own channel, so a streaming response still hears about a real disconnect - and only then.
    A small object rather than a closure: one allocation a request, not four."""

    __slots__ = ("body", "upstream")

    def __init__(self, body: bytes, upstream: Receive):
        self.body: Optional[bytes] = body
        self.upstream = upstream

    async def __call__(self) -> Message:
        body = self.body
        if body is None:
            return await self.upstream()
        self.body = None
        return {"type": "http.request", "body": body, "more_body": False}


__all__ = ["Budget", "GuardMiddleware", "SlidingWindowLimiter", "Tenant", "scan_object"]
