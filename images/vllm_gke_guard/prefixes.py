"""The tenant URL's prefix, taken off before anything reads the path.

The Gateway routes /<prefix>/v1/... to a pool and forwards the path as sent: GKE does not claim
HTTPRoute path rewrites (its conformance run exempts HTTPRoutePathRewrite), so the mesh admits the
prefixed paths and the guard strips the prefix here, first thing, for its own checks and vLLM's
router. The config's `pathPrefixes` are the pool's ('/<model>', '/<tenant>/<model>': serving_api's
pool_prefixes). A prefix is stripped only where the raw path (what the sidecar matched) starts
with it and then '/v1' as a whole segment, so /qwen-7b/v1 is not /qwen-7b-evil/v1 and an encoded
'/' (%2F) is never a segment boundary. Any other path is left as it is: /health, /metrics and the
entrypoint's own warm-up stay unprefixed, and an unknown prefix is no route (404).
"""

from __future__ import annotations

from typing import Any, Iterable

from .asgi import Scope

VERSION = "/v1"


class Prefixes:
    __slots__ = ("markers",)

    def __init__(self, prefixes: Iterable[Any]):
        # (prefix + '/v1' as str and bytes, the prefix's length), longest first: the most specific wins.
        cut = sorted({str(p).rstrip("/") for p in prefixes if str(p).strip("/")}, key=len, reverse=True)
        self.markers = tuple((p + VERSION, (p + VERSION).encode(), len(p)) for p in cut)

    def strip(self, scope: Scope) -> Scope:
        """The scope with the pool's prefix taken off `path` and `raw_path` (the query string is
        apart, kept), or the scope itself where no prefix of the pool starts the path."""
        if not self.markers:
            return scope
        path = scope.get("path") or ""
        raw = scope.get("raw_path")
        for marker, raw_marker, n in self.markers:
            if raw is not None:
                # The raw path decides (a %2F is not a '/'); the decoded path starts alike.
                if not _starts(raw, raw_marker, b"/") or not _starts(path, marker, "/"):
                    continue
                return dict(scope, path=path[n:], raw_path=raw[n:])
            if _starts(path, marker, "/"):
                return dict(scope, path=path[n:])
        return scope


def _starts(path: Any, marker: Any, slash: Any) -> bool:
    """`path` is `marker` or continues it with a new segment."""
    return path.startswith(marker) and (len(path) == len(marker) or path[len(marker):len(marker) + 1] == slash)
