"""The degradation path: a request this replica sheds (overload.py) goes to the stack's fallback
model instead of a 429, where its tenant may call that model (models[].fallback; the config's
`fallback`, from components/model/fallback.py). Nothing else changes: the same tiers are shed at
the same moments and come back by themselves, and a tier that comes back is served here again.
The trigger is this replica's queue time, not its TTFT (components/model/fallback.py says what
that misses).

The shed request is sent on within the tenant's rate limit on this replica (taken before, as for
a request served here: middleware.py) and with at most MAX_IN_FLIGHT read or relayed at once,
counted before its body is read. It is posted, as the client sent it but for `model` (set to the
fallback's, last key winning as the guard's other members do), to the fallback's Service under
the tenant's own URL prefix, with the tenant's own bearer token (the mesh keeps it on the request
for these tenants; vLLM here is never handed it). The fallback's sidecar verifies the token again
and admits the tenant as it admits its direct calls; its guard applies the tenant's caps, limits
and priority there. Nothing a client sends is trusted to choose any of it: the trigger is this
replica's own shed decision, the destination and route come from config, and no header says
"forwarded".

Not sent (the client gets the 429 it would have had, in OpenAI's format): a request for anything
but the model itself (an adapter, which the fallback does not serve), on another route than chat
and completions, or naming the model's token IDs or vectors (TOKEN_FIELDS, a prompt of token IDs:
another tokenizer reads other tokens). Nor where the fallback does not answer with a 2xx: this
replica reaches it through its own sidecar, which answers 503 where it cannot connect.

The answer goes back unchanged, streamed or not, with x-vllm-gke-served-model naming the model
that served it. Cut off once it started (the fallback's pod gone mid-answer), the failure is made
visible as vLLM makes its own: a stream ends with an error event then [DONE] (its chat and
completions stream generators); any other answer raises Cut, and the server aborts the
connection, for its 200 must not read as complete. Counted per tenant
(vllm_gke_tenant_fallback_requests_total: served, cut, or refused and answered 429).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterable, Optional, cast

from .asgi import Receive, Scope, Send
from .body import add_members, json_object, receive_body
from .metrics import FALLBACK_REQUESTS, log

SERVED_MODEL_HEADER = b"x-vllm-gke-served-model"
# The answer's headers passed on (the body's framing is the ASGI server's; the fallback's
# sidecar's own, such as server and x-envoy-*, are not the client's business).
PASSED_HEADERS = frozenset({"content-type", "cache-control", "x-request-id"})
# Requests this replica reads or relays at once; beyond, the 429.
MAX_IN_FLIGHT = 64
# To this replica's own sidecar (the mesh captures the connection): it accepts at once, and
# answers 503 itself where the fallback's pods cannot be reached.
CONNECT_TIMEOUT_S = 5.0
# Request fields in the original model's token IDs or vectors (vLLM 0.34's chat and completions
# protocols, vllm/entrypoints/openai/*/protocol.py): the fallback's tokenizer would read them as
# other tokens. Null or empty, they ask for nothing.
TOKEN_FIELDS = ("logit_bias", "allowed_token_ids", "stop_token_ids", "logprob_token_ids", "prompt_embeds",
                "kv_transfer_params")
# (status, headers, body chunks) of the fallback's answer, while its connection is open.
Answer = tuple[int, Iterable[tuple[str, str]], AsyncIterator[bytes]]
Opener = Callable[[str, dict[str, str], bytes], Any]  # an async context manager of an Answer


class Cut(Exception):
    """The answer broke off after the client's response started (the fallback's connection, or
    anything else then): raised on to the server, which aborts the connection (the ASGI way to
    say a started response failed)."""


class Route:
    """Where one tenant's shed requests go, and its counters (label values resolved once)."""

    __slots__ = ("url", "long_url", "headers", "served", "cut", "refused")

    def __init__(self, entry: dict[str, Any], tenant: str, model: str, fallback: str):
        self.url = str(entry["url"])
        self.long_url: Optional[str] = entry.get("longUrl")
        headers: dict[str, Any] = entry.get("headers") or {}
        self.headers = {str(k): str(v) for k, v in headers.items()}
        self.served, self.cut, self.refused = (FALLBACK_REQUESTS.labels(tenant, model, fallback, o)
                                               for o in ("served", "cut", "refused"))


class Fallback:
    def __init__(self, cfg: dict[str, Any], model: str, opener: Optional[Opener] = None):
        self.model = str(cfg["model"])
        self.member = b'"model":' + json.dumps(self.model).encode()
        self.own_model = model  # a request naming anything else (an adapter) is not sent
        paths: list[str] = cfg.get("paths") or []
        self.paths = frozenset(paths)
        self.long_bytes = int(cfg.get("longRequestBytes") or 0)
        self.timeout = float(cfg.get("timeoutSeconds") or 600)
        tenants: dict[str, dict[str, Any]] = cfg.get("tenants") or {}
        self.routes = {name: Route(entry, name, model, self.model) for name, entry in tenants.items()}
        self.open: Opener = opener or self._open
        self.session: Any = None
        self.in_flight = 0
        self.logged: set[str] = set()

    def route(self, tenant: str, path: str) -> Optional[Route]:
        return self.routes.get(tenant) if path in self.paths else None

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send, max_body: int) -> bool:
        """Send the shed request there and its answer to the client; False, with nothing sent to
        the client, where it is not sent or not answered (the caller answers the 429)."""
        headers = _request_headers(scope, route)
        if headers is None or self.in_flight >= MAX_IN_FLIGHT:
            return False
        self.in_flight += 1  # before its body is read: no more bodies held at once than that
        try:
            body = await receive_body(receive, max_body)
            rewritten = self._rewritten(body)
            if rewritten is None:
                return False
            url = (route.long_url if route.long_url and len(body) >= self.long_bytes else route.url) + scope["path"]
            return await _until_gone(self._relay(route, url, headers, rewritten, send), receive)
        finally:
            self.in_flight -= 1

    def _rewritten(self, body: bytes) -> Optional[bytes]:
        """The body with the fallback's `model`; None for one the fallback cannot serve as asked:
        no JSON object (as json.loads, vLLM's reader, sees it), another model, or token IDs."""
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):  # JSON's errors, UnicodeDecodeError; nesting too deep
            return None
        if not json_object(request) or _tied_to_tokenizer(request) or request.get("model") not in (None, self.own_model):
            return None
        return add_members(body, len(body.rstrip()) - 1, self.member)

    async def _relay(self, route: Route, url: str, headers: dict[str, str], body: bytes, send: Send) -> bool:
        """False, with nothing sent, where the answer is not a 2xx or never comes; a failure once the
        client's response started is raised on as Cut."""
        started = False
        try:
            async with self.open(url, headers, body) as (status, answer_headers, chunks):
                if not 200 <= status < 300:
                    return self._refused(route, f"answered {status}")
                passed = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer_headers
                          if k.lower() in PASSED_HEADERS]
                await send({"type": "http.response.start", "status": status,
                            "headers": [*passed, (SERVED_MODEL_HEADER, self.model.encode())]})
                started = True
                await self._pass_on(route, chunks, send, _is_stream(passed))
                return True
        except Cut:
            raise
        except Exception as exc:  # unreachable, timed out, reset before its answer: never a 500
            if started:  # the response cannot be taken back: the connection is aborted
                raise Cut(type(exc).__name__) from exc
            return self._refused(route, type(exc).__name__)

    async def _pass_on(self, route: Route, chunks: AsyncIterator[bytes], send: Send, stream: bool) -> None:
        """The answer's body, counted served once it ended (or the client left), else cut: a stream
        then ends with vLLM's error event, any other answer raises Cut."""
        outcome = route.served
        try:
            async for chunk in (_whole_events(_cut_on_failure(chunks)) if stream else _cut_on_failure(chunks)):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Cut as cut:
            outcome = route.cut
            self._note(f"cut: {cut}", "its answer broke off after the response started; "
                       + ("the stream ended with an error event" if stream else "the connection was aborted"))
            if not stream:
                raise
            await send({"type": "http.response.body", "body": _error_event(self.model), "more_body": False})
            return
        finally:
            outcome.inc()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _refused(self, route: Route, why: str) -> bool:
        route.refused.inc()
        self._note(why, "the client got the 429")
        return False

    def _note(self, why: str, then: str) -> None:
        """Log each new way the fallback fails once (bounded: a flood logs nothing more)."""
        if why not in self.logged and len(self.logged) < 16:
            self.logged.add(why)
            log.warning("the fallback model %s failed a shed request (%s): %s", self.model, why, then)

    @asynccontextmanager
    async def _open(self, url: str, headers: dict[str, str], body: bytes) -> AsyncGenerator[Answer, None]:
        """aiohttp, vLLM's own HTTP client (a dependency of vLLM: in its image, always; imported by
        name, for this repository's venv has none); one session, made in the server's event loop."""
        aiohttp: Any = importlib.import_module("aiohttp")
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=CONNECT_TIMEOUT_S),
                connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT))
        async with self.session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            yield resp.status, resp.headers.items(), resp.content.iter_any()


def _tied_to_tokenizer(request: dict[str, Any]) -> bool:
    """Whether the request names token IDs or vectors of the model it was sent to."""
    prompt: Any = request.get("prompt")
    # A list of anything but strings: token IDs, or lists of them (a string is text).
    return any(request.get(k) for k in TOKEN_FIELDS) or (
        isinstance(prompt, list) and not all(isinstance(p, str) for p in cast("list[Any]", prompt)))


def _is_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


async def _cut_on_failure(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The answer's chunks; its connection failing mid-body (reset, timed out, truncated) is Cut."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:
        raise Cut(type(exc).__name__) from exc


async def _whole_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream's server-sent events passed on whole, so one cut mid-event leaves none half sent
    before the error event."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        end = pending.rfind(b"\n\n") + 2
        if end > 1:
            yield pending[:end]
            pending = pending[end:]
    if pending:
        yield pending


def _error_event(model: str) -> bytes:
    """The end of a cut stream as vLLM ends a failed one (its ErrorResponse, then [DONE]); retryable."""
    error = {"message": f"the answer of the fallback model {model} broke off; retry the request",
             "type": "ServiceUnavailableError", "param": None, "code": 503}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\ndata: [DONE]\n\n"


def _request_headers(scope: Scope, route: Route) -> Optional[dict[str, str]]:
    """The tenant's own token (it must have come once), the body's type, and the route's headers
    (behind the endpoint picker, the tenant's objective there); None without a token."""
    found: dict[bytes, list[bytes]] = {}
    for k, v in scope.get("headers") or ():
        if k in (b"authorization", b"content-type"):
            found.setdefault(k, []).append(v)
    token = found.get(b"authorization") or []
    if len(token) != 1:
        return None
    out = {"authorization": token[0].decode("latin-1"), **route.headers}
    if len(kinds := found.get(b"content-type") or []) == 1:
        out["content-type"] = kinds[0].decode("latin-1")
    return out


async def _until_gone(work: Any, receive: Receive) -> bool:
    """Run `work` until it ends or the client leaves (then it is cancelled: the fallback stops
    generating for no one, and there is no one to answer)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(receive))
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        gone.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return True


async def _disconnect(receive: Receive) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass
