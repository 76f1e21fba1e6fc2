"""What each admitted tenant request cost and how it ended, counted per tenant and model (the
chargeback and the availability SLOs read these: metrics.py).

The tokens are vLLM's own count for the request: its chat and completions handlers (and the
Anthropic messages route, which runs through chat) leave the final usage on the request's state
for middleware - `raw_request.state.request_metadata.final_usage_info`, streamed or not
(vllm 0.34.0 entrypoints/openai/chat_completion/serving.py:928,1130,
entrypoints/openai/completion/serving.py:618,745) - so nothing on the wire changes and no client
can opt out by leaving `stream_options.include_usage` off. Its Responses handler leaves none: there
the usage is read from the response itself, the last `"usage":{...}` the body or its stream
carries (always present, streamed or not). So are the pooling routes' (embeddings, score,
rerank): their answers carry OpenAI's usage object, whose prompt tokens are the request's whole
cost (0.34's rerank usage has `prompt_tokens` too; an answer naming only `total_tokens` is read
from that, all of it prompt). An embedding answer in encoding_format "bytes" carries its usage in
a `metadata` header only, one in "bytes_only" nowhere: the guard refuses both on tenant routes
(body.metered_or_error), so no pooling answer goes unmetered. A request that
never gets a response (the app raised: the server answers 500) counts as an error.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from .asgi import Message, Scope, Send
from .metrics import TenantMeters

# A structural usage object: inside generated text a quote is always escaped, so `"usage":{`
# with bare quotes only occurs in the response's own structure.
USAGE_KEY = b'"usage"'
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_PROMPT = re.compile(rb'"(?:input_tokens|prompt_tokens)"\s*:\s*(\d+)')
_GENERATED = re.compile(rb'"(?:output_tokens|completion_tokens)"\s*:\s*(\d+)')
_TOTAL = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
# The route kinds whose usage is read from the answer's body (their handlers leave none on the state).
BODY_USAGE_KINDS = frozenset({"responses", "pooling"})
# The usage object's numbers lie within its first few hundred bytes.
USAGE_WINDOW = 512


class Meter:
    """The `send` the app gets for one tenant request: it notes the status and, on a route whose
    handler leaves no usage on the request state, the last usage the body carries; `done` counts
    the request once the app has returned."""

    __slots__ = ("send", "meters", "scope", "status", "read_body", "pooling", "prompt", "generated")

    def __init__(self, send: Send, meters: TenantMeters, scope: Scope, kind: str):
        self.send = send
        self.meters = meters
        self.scope = scope
        self.status = 0
        self.read_body = kind in BODY_USAGE_KINDS
        # Nothing generated: all the tokens a pooling answer counts are prompt tokens.
        self.pooling = kind == "pooling"
        self.prompt: Optional[int] = None
        self.generated: Optional[int] = None

    async def __call__(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.status = message.get("status", 0)
        elif self.read_body and kind == "http.response.body":
            self._read_usage(message.get("body", b""))
        await self.send(message)

    def _read_usage(self, chunk: bytes) -> None:
        if USAGE_KEY not in chunk:  # the common chunk, at memchr speed
            return
        starts = [m.start() for m in _USAGE_OBJECT.finditer(chunk)]
        if not starts:
            return
        window = chunk[starts[-1]:starts[-1] + USAGE_WINDOW]
        if (m := _PROMPT.search(window)) is not None or (self.pooling and (m := _TOTAL.search(window))):
            self.prompt = int(m.group(1))
        if (m := _GENERATED.search(window)) is not None:
            self.generated = int(m.group(1))

    def done(self) -> str:
        """Count the request; its outcome (prompt and generated tokens left in the meter)."""
        status, meters = self.status, self.meters
        if 0 < status < 400:
            outcome = "ok"
            meters.ok.inc()
        elif 400 <= status < 500:
            outcome = "refused"
            meters.refused.inc()
        else:
            outcome = "error"
            meters.error.inc()
        usage = final_usage(self.scope)
        if usage is not None:
            self.prompt = getattr(usage, "prompt_tokens", None)
            self.generated = getattr(usage, "completion_tokens", None)
        if self.prompt:
            meters.prompt.inc(self.prompt)
        if self.generated:
            meters.generation.inc(self.generated)
        return outcome


def final_usage(scope: Scope) -> Any:
    """vLLM's final usage for the request (its UsageInfo), where its handler left one."""
    state: Optional[dict[str, Any]] = scope.get("state")  # Starlette's request.state: a dict of anything
    metadata: Any = state.get("request_metadata") if state is not None else None
    return getattr(metadata, "final_usage_info", None)


def shared_state(scope: Scope) -> Scope:
    """The scope with a `state` dict the app's Request writes into (Starlette's request.state is
    scope["state"], created on first use): created here, so the guard, which keeps this scope,
    sees what the handler leaves there."""
    if "state" not in scope:
        scope["state"] = {}
    return scope
