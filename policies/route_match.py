"""Which HTTPRoute rule a request reaches at the Gateway, as the Gateway API specifies it.

A small evaluator over HTTPRoute manifests (gateway.networking.k8s.io/v1 HTTPRouteRule, the
`matches` field's documented precedence), so tests and policies follow a request through the
load balancer rather than read rules one by one:
  - a match holds when its path, method and every header match hold (headers by name, case
    insensitive; Exact values equal, RegularExpression values matched whole, as GKE's URL maps
    do with RE2); a rule holds when any of its matches does;
  - among the matches that hold, across all routes: an Exact path first, then the longest
    PathPrefix, then a method match, then the most header matches, then the most query-param
    matches; ties go to the route first listed (here: the order given), then the rule first listed.
PathPrefix matches whole path elements ("/a/v1" matches "/a/v1/x", not "/a/v1x"). Query params,
hostnames and parentRefs are not modelled: the platform's routes use none of them to choose.
Standard library only: the CrossGuard pack uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence


@dataclass(frozen=True)
class HttpRequest:
    path: str
    method: str = "POST"
    # Request headers as the client sent them (names any case).
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reached:
    route: Mapping[str, Any]
    rule: Mapping[str, Any]
    match: Mapping[str, Any]

    @property
    def backends(self) -> list[Mapping[str, Any]]:
        return list(self.rule.get("backendRefs") or [])

    @property
    def redirect(self) -> Optional[Mapping[str, Any]]:
        return next((f["requestRedirect"] for f in self.rule.get("filters") or []
                     if f.get("type") == "RequestRedirect"), None)


def _path_holds(match: Mapping[str, Any], path: str) -> bool:
    spec = match.get("path") or {"type": "PathPrefix", "value": "/"}
    value = spec.get("value", "/")
    if spec.get("type") == "Exact":
        return path == value
    if spec.get("type") == "RegularExpression":
        return re.fullmatch(value, path) is not None
    prefix = value.rstrip("/")
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def _headers_hold(match: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    sent = {k.lower(): v for k, v in headers.items()}
    for h in match.get("headers") or []:
        value = sent.get(str(h.get("name", "")).lower())
        if value is None:
            return False
        if h.get("type") == "RegularExpression":
            if re.fullmatch(h.get("value", ""), value) is None:
                return False
        elif value != h.get("value"):
            return False
    return True


def holds(match: Mapping[str, Any], request: HttpRequest) -> bool:
    method = match.get("method")
    return (_path_holds(match, request.path) and (method is None or method == request.method)
            and _headers_hold(match, request.headers))


def forwarded_path(reached: Reached, path: str) -> str:
    """The path the backend receives for a request to `path` sent by `reached`: the rule's
    URLRewrite applied (ReplaceFullPath, or ReplacePrefixMatch of the matched PathPrefix)."""
    rewrite = next((f["urlRewrite"].get("path") for f in reached.rule.get("filters") or []
                    if f.get("type") == "URLRewrite"), None)
    if not rewrite:
        return path
    if rewrite.get("type") == "ReplaceFullPath":
        return str(rewrite["replaceFullPath"])
    prefix = str((reached.match.get("path") or {}).get("value", "/")).rstrip("/")
    rest = path[len(prefix):]
    return (str(rewrite["replacePrefixMatch"]).rstrip("/") + rest) or "/"


def sample_request(match: Mapping[str, Any], extra: Mapping[str, str]) -> HttpRequest:
    """A request that holds for `match` (its Exact path, method and header values; "0" for a
    pattern, which the platform's content-length patterns accept), plus `extra` headers."""
    headers = {str(h.get("name")): (str(h.get("value")) if h.get("type", "Exact") == "Exact" else "0")
               for h in match.get("headers") or []}
    path = (match.get("path") or {}).get("value", "/")
    return HttpRequest(path, str(match.get("method") or "POST"), {**headers, **extra})


def _rank(match: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    path = match.get("path") or {"type": "PathPrefix", "value": "/"}
    exact = 1 if path.get("type") == "Exact" else 0
    return (exact, len(path.get("value", "")) if not exact else 0, 1 if match.get("method") else 0,
            len(match.get("headers") or []), len(match.get("queryParams") or []))


def attached(route: Mapping[str, Any], listener: Optional[str]) -> bool:
    """Whether the route serves requests arriving on `listener` (a Gateway listener's name)."""
    refs = (route.get("spec") or {}).get("parentRefs") or []
    return listener is None or any(ref.get("sectionName") in (None, listener) for ref in refs)


def reach(routes: Sequence[Mapping[str, Any]], request: HttpRequest,
          listener: Optional[str] = None) -> Optional[Reached]:
    """The rule (and match) of `routes` the request is sent by, arriving on `listener` (any when
    None), or None: no route matches (404)."""
    best: Optional[tuple[tuple[int, ...], Reached]] = None
    for r_i, route in enumerate(routes):
        if not attached(route, listener):
            continue
        for k_i, rule in enumerate((route.get("spec") or {}).get("rules") or []):
            for match in rule.get("matches") or [{}]:
                if not holds(match, request):
                    continue
                # Higher rank wins; among equals the earlier route, then the earlier rule.
                key = (*_rank(match), -r_i, -k_i)
                if best is None or key > best[0]:
                    best = (key, Reached(route, rule, match))
    return best[1] if best else None
