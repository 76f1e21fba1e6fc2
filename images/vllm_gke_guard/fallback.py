"""The degradation path: a request this replica sheds (overload.py) goes to the stack's fallback
model instead of a 429, where its tenant may call that model (models[].fallback; the config's
`fallback`, from components/model/fallback.py). Nothing else changes: the same tiers are shed at
the same moments and come back by themselves, and a tier that comes back is served here again.

The shed request is posted, as the client sent it but for `model` (set to the fallback's, last
key winning as the guard's other members do), to the fallback's Service under the tenant's own
URL prefix, with the tenant's own bearer token (the mesh keeps it on the request for these
tenants). The fallback's sidecar verifies the token again and admits the tenant as it admits
its direct calls; its guard applies the tenant's caps, limits and priority there. Nothing a
client sends is trusted to choose any of it: the trigger is this replica's own shed decision,
the destination and route come from config, and no header says "forwarded".

The answer goes back unchanged, streamed or not, with x-vllm-gke-served-model naming the model
that served it. The fallback unreachable, slow to connect, or answering anything but a 2xx: the
client gets the 429 it would have got, in OpenAI's format. Only chat and completions requests
for the model itself (not one of its adapters, which the fallback does not serve) are sent; a
bounded number at a time, for this replica's event loop relays every byte of each.
Counted per tenant (vllm_gke_tenant_fallback_requests_total: served, or refused and answered 429).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterable, Optional

from .asgi import Receive, Scope, Send
from .body import ABSENT, add_members, closing_brace, read_fields, receive_body
from .metrics import FALLBACK_REQUESTS, log

SERVED_MODEL_HEADER = b"x-vllm-gke-served-model"
# The answer's headers passed on (the body's framing is the ASGI server's; the fallback's
# sidecar's own, such as server and x-envoy-*, are not the client's business).
PASSED_HEADERS = frozenset({"content-type", "cache-control", "x-request-id"})
# Requests this replica relays at once; beyond, the 429.
MAX_IN_FLIGHT = 64
CONNECT_TIMEOUT_S = 5.0
# (status, headers, body chunks) of the fallback's answer, while its connection is open.
Answer = tuple[int, Iterable[tuple[str, str]], AsyncIterator[bytes]]
Opener = Callable[[str, dict[str, str], bytes], Any]  # an async context manager of an Answer


class Route:
    """Where one tenant's shed requests go, and its two counters (label values resolved once)."""

    __slots__ = ("url", "long_url", "headers", "served", "refused")

    def __init__(self, entry: dict[str, Any], tenant: str, model: str, fallback: str):
        self.url = str(entry["url"])
        self.long_url: Optional[str] = entry.get("longUrl")
        headers: dict[str, Any] = entry.get("headers") or {}
        self.headers = {str(k): str(v) for k, v in headers.items()}
        self.served, self.refused = (FALLBACK_REQUESTS.labels(tenant, model, fallback, o) for o in ("served", "refused"))


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

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send, kind: str,
                    max_body: int) -> bool:
        """Send the shed request there and its answer to the client; False, with nothing sent to
        the client, where it is not sent or not answered (the caller answers the 429)."""
        headers = _request_headers(scope, route)
        if headers is None or self.in_flight >= MAX_IN_FLIGHT:
            return False
        body = await receive_body(receive, max_body)
        rewritten = self._rewritten(body, kind)
        if rewritten is None:
            return False
        url = (route.long_url if route.long_url and len(body) >= self.long_bytes else route.url) + scope["path"]
        self.in_flight += 1
        try:
            return await _until_gone(self._relay(route, url, headers, rewritten, send), receive)
        finally:
            self.in_flight -= 1

    def _rewritten(self, body: bytes, kind: str) -> Optional[bytes]:
        """The body with the fallback's `model`; None for one that names another model or is no object."""
        try:
            fields = read_fields(body, kind)
        except ValueError:  # JsonShapeError and JSON's own: the fallback would refuse it
            return None
        if fields.model not in (ABSENT, None, self.own_model):
            return None
        return add_members(body, closing_brace(fields, body), self.member)

    async def _relay(self, route: Route, url: str, headers: dict[str, str], body: bytes, send: Send) -> bool:
        started = False
        try:
            async with self.open(url, headers, body) as (status, answer_headers, chunks):
                if not 200 <= status < 300:
                    self._note(f"answered {status}")
                    route.refused.inc()
                    return False
                passed = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer_headers
                          if k.lower() in PASSED_HEADERS]
                await send({"type": "http.response.start", "status": status,
                            "headers": [*passed, (SERVED_MODEL_HEADER, self.model.encode())]})
                started = True
                route.served.inc()
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Exception as exc:  # unreachable, timed out, reset: never a 500
            self._note(type(exc).__name__)
            if not started:
                route.refused.inc()
                return False
        try:  # the end of the body (cut short where the fallback's answer was)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the client is gone
            pass
        return True

    def _note(self, why: str) -> None:
        """Log each new way the fallback fails once (bounded: a flood logs nothing more)."""
        if why not in self.logged and len(self.logged) < 16:
            self.logged.add(why)
            log.warning("the fallback model %s did not serve a shed request (%s): the client got the 429",
                        self.model, why)

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
