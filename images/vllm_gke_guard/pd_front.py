"""The P/D front: the decode pod's first hop, on the pool's port, in front of llm-d-router's routing sidecar.

The sidecar (v0.10.0) routes exact paths only (pkg/sidecar/proxy/proxy.go:627-635: /v1/chat/completions,
/v1/completions, /v1/messages, /v1/responses, /inference/v1/generate; anything else straight to vLLM), but
tenant URLs arrive prefixed (/<tenant>/<model>/v1/...: GKE claims no HTTPRoute path rewrite, prefixes.py).
So this hop takes the pool's prefix off exactly as the guard does (prefixes.py, the same `pathPrefixes`),
refuses any body carrying kv_transfer_params (400, kv_transfer.py's reading: no client's copy reaches the
sidecar, which would forward it to vLLM, on any path), refuses a request over its tenant's max-tokens cap
(400, the guard's caps.py on the guard's config: the sidecar's prefill leg sets max_tokens to 1, so neither
guard could refuse it before the prefill ran), refuses a path under another prefix (404), and
passes everything else on as it came (headers kept, the answer streamed): /health and /metrics as before.
The request body is read whole before it is passed on (the check needs it; the guard reads it whole too),
up to the guard's maxBodyBytes.

Run in the server image: python3 -m vllm_gke_guard.pd_front --port 8000 --upstream-port 8100, with the
guard's config in GKE_LLM_GUARD_CONFIG (components/model/disaggregation_cluster.py)."""

from __future__ import annotations

import argparse
import asyncio
from importlib import import_module
from typing import Any, Iterable, Optional

from . import kv_transfer
from .body import fields_or_error
from .caps import Budget
from .config import DEFAULT_MAX_BODY_BYTES, load_config
from .errors import GuardError, error_body
from .prefixes import VERSION, Prefixes
from .routes import OUTPUT_FIELDS, route_table

# Hop-by-hop headers (RFC 9110 7.6.1), never passed on; the length is the one of what is passed.
HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
       "proxy-authenticate", "proxy-authorization", "content-length"}
CHUNK = 1 << 16
UPSTREAM = "upstream"


def _aiohttp(module: str = "") -> Any:
    """aiohttp (the vLLM image's; this venv has none), untyped here: the plan's side imports `target` alone."""
    return import_module("aiohttp" + (f".{module}" if module else ""))


def _error(err: GuardError) -> Any:
    return _aiohttp("web").Response(status=err.status, body=error_body(err), content_type="application/json")


def _kept(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in HOP]


def unknown_prefix(path: str) -> bool:
    """A path under a prefix that is not the pool's: '/<something>/v1...' left as it was."""
    segments = path.split("/")
    return len(segments) > 2 and segments[1] != VERSION[1:] and VERSION[1:] in segments[2:]


async def _body(request: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > limit:
            raise GuardError(413, f"the request body is over {limit} bytes", "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def target(prefixes: Prefixes, path: str, raw_path: str) -> Optional[str]:
    """The path and query to pass on (`raw_path`: as sent, query included; `path`: decoded), or None
    where the path is under a prefix not the pool's."""
    raw, _, query = raw_path.partition("?")
    scope = prefixes.strip({"path": path, "raw_path": raw.encode("latin-1")})
    out = scope["raw_path"].decode("latin-1")
    if out == raw and unknown_prefix(path):
        return None
    return out + (f"?{query}" if query else "")


class Caps:
    """The tenants' max-tokens caps from the guard's config, checked as the decode pod's guard checks them."""

    def __init__(self, config: dict[str, Any]):
        self.header = str(config.get("issuerHeader", "x-vllm-gke-issuer"))
        issuers: dict[str, dict[str, Any]] = config.get("issuers") or {}
        self.caps = {iss: (str(e["tenant"]), int(e["maxTokens"])) for iss, e in issuers.items()}
        self.routes = route_table(config)
        self.rule = str(config.get("maxTokensRule") or "both")

    def check(self, headers: Any, path: str, body: bytes) -> None:
        """GuardError 400 over the tenant's cap; anything else (no tenant, a bad body) the guard decides."""
        kind = self.routes.get(path.partition("?")[0], ("", ""))[1]
        issuers = headers.getall(self.header, [])
        if kind not in OUTPUT_FIELDS or len(issuers) != 1 or (entry := self.caps.get(issuers[0])) is None:
            return
        # A body the front cannot read is refused here, as the guard refuses it (400 invalid_json): let
        # through, the sidecar's Go decoder would re-encode it (a lone surrogate becomes U+FFFD) into a
        # prefill leg with max_tokens 1 that no guard could hold to the cap.
        budget = Budget(kind, fields_or_error(body, kind), self.rule)
        budget.check(entry[1], entry[0])


def app(config: dict[str, Any], upstream_port: int) -> Any:
    aio, web = _aiohttp(), _aiohttp("web")
    prefixes = Prefixes(config.get("pathPrefixes") or ())
    limit = int(config.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
    caps = Caps(config)
    base = f"http://127.0.0.1:{upstream_port}"

    async def handle(request: Any) -> Any:
        path = target(prefixes, request.path, request.raw_path)
        if path is None:
            return _error(GuardError(404, "no such route on this model's pool", "not_found"))
        try:
            body = await _body(request, limit)
            kv_transfer.check(body, "refuse")
            caps.check(request.headers, path, body)
        except GuardError as err:
            return _error(err)
        session: Any = request.app[UPSTREAM]
        out: Any = None
        try:
            async with session.request(request.method, base + path, headers=_kept(request.headers.items()),
                                       data=body if body else None, allow_redirects=False) as answer:
                out = web.StreamResponse(status=answer.status, reason=answer.reason)
                out.headers.extend(_kept(answer.headers.items()))
                if answer.content_length is not None:
                    out.content_length = answer.content_length
                await out.prepare(request)
                async for chunk in answer.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (aio.ClientError, asyncio.TimeoutError):
            if out is not None and out.prepared:
                # The answer began: a 503 now would land inside its body. Cut the connection instead, so the
                # client sees the answer broke off (as the sidecar's own failure mid-stream looks).
                if request.transport is not None:
                    request.transport.abort()
                raise asyncio.CancelledError from None
            return _error(GuardError(503, "the routing sidecar did not answer", "upstream_unavailable"))

    async def session(a: Any) -> Any:
        # No read timeout (a stream runs as long as it generates); no header, encoding or cookie of its own.
        a[UPSTREAM] = aio.ClientSession(
            connector=aio.TCPConnector(limit=0), timeout=aio.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False, skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        yield
        await a[UPSTREAM].close()

    out = web.Application(client_max_size=limit + 1)
    out.cleanup_ctx.append(session)
    out.router.add_route("*", "/{tail:.*}", handle)
    return out


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="The P/D front: the pool's prefix off, kv_transfer_params refused.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args(argv)
    # handler_cancellation: a client that leaves cancels its handler, and so the sidecar's request and vLLM's
    # generation (aiohttp 3.14's run_app defaults to False: a non-streamed answer would run on to its end).
    _aiohttp("web").run_app(app(load_config(), args.upstream_port), port=args.port, access_log=None, print=None,
                            handler_cancellation=True)


if __name__ == "__main__":
    main()
