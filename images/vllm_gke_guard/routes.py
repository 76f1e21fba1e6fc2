"""Which requests pass at all, and what each kind of route is metered by.

Only the routes in the config pass (components/model/serving_api.py writes the table: each tenant
route with its method and kind), plus GET /health and GET /metrics; any other path or method
gets 404/405. A route's kind says which field bounds its output and which fields hold prompts.
"""

from __future__ import annotations

from typing import Any

from .errors import GuardError

OPEN_ROUTES = {"/health": "GET", "/metrics": "GET"}
# Per-sequence output bound field, and vLLM's default when absent, per request kind.
OUTPUT_FIELDS = {"completions": "max_tokens", "chat": "max_completion_tokens",
                 "chat_batch": "max_completion_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# The fields that hold a request's prompts, per kind (one prompt where a kind has none).
PROMPT_FIELDS = {"completions": ("prompt", "prompt_embeds"), "chat_batch": ("messages",)}


def route_table(cfg: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """path -> (method, kind), from the config's routes (the config names both for every route)."""
    routes: dict[str, Any] = cfg.get("routes") or {}
    return {path: (r.get("method"), r.get("kind")) for path, r in routes.items()}


def route_kind(routes: dict[str, tuple[str, str]], path: str, method: str) -> str:
    """The kind of a tenant route the request may take (the open routes are not tenant routes),
    else 404 or 405."""
    route = routes.get(path)
    if route is None or path in OPEN_ROUTES:
        raise GuardError(404, f"no route {path}", "not_found")
    route_method, kind = route
    if route_method != method:
        raise GuardError(405, f"{path} takes {route_method}", "method_not_allowed")
    return kind
