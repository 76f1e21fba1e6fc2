"""What the guard answers when it refuses: OpenAI-style JSON 4xx, never a 500."""

from __future__ import annotations

import json
from typing import Optional

from .asgi import Send
from .metrics import GUARD_REFUSALS


class GuardError(Exception):
    # Set on some 429s: seconds until a retry may pass (the Retry-After header).
    retry_after: Optional[float]

    def __init__(self, status: int, message: str, code: str, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class Disconnected(Exception):
    """The client left mid-body: nothing is forwarded, nothing answered."""


ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable"}
# Each status' counter resolved once (a labelled counter's lookup takes a dict and a lock).
_REFUSALS = {status: GUARD_REFUSALS.labels(str(status)) for status in (*ERROR_TYPES, 401)}


def error_body(err: GuardError) -> bytes:
    return json.dumps({"error": {"message": err.message, "type": ERROR_TYPES.get(err.status, "invalid_request_error"),
                                 "param": err.param, "code": err.code}}).encode()


async def respond(send: Send, err: GuardError) -> None:
    """Answer the refusal, and count it by status (metrics.GUARD_REFUSALS)."""
    (_REFUSALS.get(err.status) or GUARD_REFUSALS.labels(str(err.status))).inc()
    body = error_body(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, int(retry_after + 0.999))).encode()))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
