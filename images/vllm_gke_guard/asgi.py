"""The ASGI plumbing the guard's modules share: the types, and how a checked body goes on to vLLM."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Replay:
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


def forward(scope: Scope, receive: Receive, body: bytes) -> tuple[Scope, Receive]:
    """Forward a rewritten body, with its Content-Length fixed (the scope copied, sharing its
    `state` dict: what the app leaves there, the guard sees)."""
    headers = [(k, v) for k, v in scope.get("headers") or () if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    return dict(scope, headers=headers), Replay(body, receive)
