"""On a server with LoRA adapters: which models a tenant may name, and see listed.

The body's `model` picks base or adapter: only the ones the tenant is allowed pass, and
GET /v1/models (which names every adapter the server loaded) shows only those.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .asgi import Message, Send
from .body import ABSENT, json_object
from .errors import GuardError


def check_model(allowed: frozenset[str], fields: Any) -> None:
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


# A model list is a few KB; past this the response is not one, and the tenant gets an empty list.
MODEL_LIST_MAX_BYTES = 1 << 20
EMPTY_MODEL_LIST = b'{"object": "list", "data": []}'


def model_list_filter(send: Send, allowed: frozenset[str]) -> Send:
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
        headers = [(k, v) for k, v in start.get("headers") or () if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return filtered


def _listed_only(body: bytes, allowed: frozenset[str]) -> bytes:
    try:
        listing = json.loads(body)
    except ValueError:
        return EMPTY_MODEL_LIST
    if not json_object(listing) or not isinstance(listing.get("data"), list):
        return EMPTY_MODEL_LIST
    listing["data"] = [m for m in listing["data"] if json_object(m) and m.get("id") in allowed]
    return json.dumps(listing).encode()
