"""Run by tests/test_guard_fallback.py with VLLM_PYTHON (vLLM's own aiohttp and uvicorn): the
guard, served by uvicorn, sends a shed request through its real aiohttp client to an aiohttp
server that starts its answer and then drops the connection mid-body, once plain and once
streamed. Prints, as JSON, what an aiohttp client of the guard got each time.

Usage: python tests/guard_fallback_cut.py '<the guard config as JSON, its fallback's url left out>'
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp  # type: ignore[import-not-found]
import uvicorn  # type: ignore[import-not-found]
from aiohttp import web  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "images"))
import vllm_gke_guard as guard  # noqa: E402

# The start of an answer, then the connection dropped: a JSON body shorter than its Content-Length,
# a stream whose last event is half sent (and whose chunked encoding never ends).
PLAIN = b'{"id": "cmpl-1", "model": "small", "choi'
EVENTS = b'data: {"choices": [1]}\n\ndata: {"cho'


async def upstream(request: web.Request) -> web.StreamResponse:
    stream = bool((await request.json()).get("stream"))
    answer = web.StreamResponse(headers={"content-type": "text/event-stream" if stream else "application/json"})
    if not stream:
        answer.content_length = 4 * len(PLAIN)
    await answer.prepare(request)
    await answer.write(EVENTS if stream else PLAIN)
    assert request.transport is not None
    request.transport.abort()  # the fallback's pod gone mid-answer
    return answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ask(base: str, tenant: str, stream: bool) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8,
            "stream": stream}
    headers = {"x-vllm-gke-issuer": tenant, "authorization": "Bearer drafts-token"}
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
            got: dict[str, Any] = {"status": resp.status, "served": resp.headers.get("x-vllm-gke-served-model")}
            try:
                got["body"] = (await resp.read()).decode()
            except aiohttp.ClientPayloadError as exc:  # the connection aborted before the body's end
                got["error"] = type(exc).__name__
            return got


async def main(cfg: dict[str, Any]) -> dict[str, Any]:
    app = web.Application()
    app.router.add_post("/{tail:.*}", upstream)
    runner = web.AppRunner(app)
    await runner.setup()
    fallback_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", fallback_port).start()
    for target in cfg["fallback"]["tenants"].values():
        target.update(url=f"http://127.0.0.1:{fallback_port}", longUrl=None)
    mw = guard.GuardMiddleware(lambda *a: None, {**cfg, "trustedPeers": ["127.0.0.1"]})  # type: ignore
    assert mw.overload is not None
    mw.overload.shed = lambda priority: priority < 0  # type: ignore[method-assign]  # overloaded throughout
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(mw, host="127.0.0.1", port=port, log_level="critical", lifespan="off"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    tenant = next(iss for iss, t in cfg["issuers"].items() if t["tenant"] == "drafts")
    try:
        return {"plain": await ask(f"http://127.0.0.1:{port}", tenant, False),
                "stream": await ask(f"http://127.0.0.1:{port}", tenant, True)}
    finally:
        server.should_exit = True
        await serving
        await runner.cleanup()
        if mw.fallback is not None and mw.fallback.session is not None:
            await mw.fallback.session.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
