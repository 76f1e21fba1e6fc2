"""Istio's request authentication and authorization, as a request to a meshed workload sees them.

A small evaluator over RequestAuthentication and AuthorizationPolicy manifests, following
Istio's documented semantics (security/v1):
  - RequestAuthentication: a request carrying a token must carry a valid one from an issuer
    configured for the workload (else 401); a request without a token passes with no principal.
    The request principal is "<iss>/<sub>"; a requestPrincipals value is split at its last '/'
    and matched against iss and sub apart (match_request_principal), as Istio does.
  - AuthorizationPolicy: CUSTOM, then DENY, then ALLOW. Any matching DENY denies. If ALLOW
    policies apply to the workload, one must match, else 403 (an ALLOW with no rules matches
    nothing: deny-all). A policy applies to workloads in its namespace whose labels match its
    selector (no selector: all of them); the root namespace's apply mesh-wide.
  - A rule matches when each of from/to/when matches; a list of sources or operations matches
    when any entry does; fields within one entry must all match. Strings match exactly, by
    prefix ("abc*"), by suffix ("*abc") or always ("*"); paths are normalised first.
Standard library only: the CrossGuard pack uses it.
"""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

ROOT_NAMESPACE = "istio-system"


@dataclass(frozen=True)
class Request:
    namespace: str
    path: str
    method: str = "GET"
    # Workload labels of the pod the request reaches.
    labels: Mapping[str, str] = field(default_factory=dict)
    source_ip: str = "10.20.0.5"
    # The JWT: (issuer, subject), or None when the request carries no token.
    token: Optional[tuple[str, str]] = None
    # Whether the token's signature and audience check out against the issuer's keys.
    token_valid: bool = True
    # Request headers as the workload's Envoy sees them (names lowercase).
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    status: int  # 200, 401 or 403
    reason: str


def _applies(policy: Mapping[str, Any], request: Request) -> bool:
    meta = policy.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    if ns not in (request.namespace, ROOT_NAMESPACE):
        return False
    spec = policy.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    return all(request.labels.get(k) == v for k, v in selector.items())


def match_string(pattern: str, value: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return value.endswith(pattern[1:])
    return pattern == value


def normalize_path(path: str) -> str:
    """Envoy's default normalisation: no query, dot segments resolved (RFC 3986)."""
    path = path.split("?", 1)[0].split("#", 1)[0] or "/"
    trailing = path.endswith("/") and path != "/"
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm + ("/" if trailing and not norm.endswith("/") else "")


def _in_blocks(ip: str, blocks: Iterable[str]) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr in ipaddress.ip_network(b if "/" in b else f"{b}/32", strict=False) for b in blocks)


def _any(patterns: Sequence[str], value: Optional[str]) -> bool:
    return value is not None and any(match_string(p, value) for p in patterns)


def match_request_principal(pattern: str, token: Optional[tuple[str, str]]) -> bool:
    """A requestPrincipals value against a verified token's (iss, sub), as Istio builds the matcher
    (istio/istio@1.24.6 pilot/pkg/security/authz/model/generator.go:202-251): the value splits at
    its last '/', iss and sub are matched apart, exactly unless a '*' stands at the value's start
    (a suffix of iss, or of sub where there is no '/') or end (a prefix of sub, or of iss); a bare
    '*' part matches any non-empty value."""
    if token is None:
        return False
    iss, sub = token
    if pattern == "*":
        return bool(iss) and bool(sub)
    p_iss, slash, p_sub = pattern.rpartition("/")
    if not slash:
        p_iss, p_sub = pattern, ""
    if pattern.startswith("*"):
        if not slash:
            return bool(iss) and sub.endswith(pattern[1:])
        return (bool(iss) if p_iss == "*" else iss.endswith(p_iss[1:])) and sub == p_sub
    if pattern.endswith("*"):
        if not slash:
            return iss.startswith(pattern[:-1]) and bool(sub)
        return iss == p_iss and (bool(sub) if p_sub == "*" else sub.startswith(p_sub[:-1]))
    return iss == p_iss and sub == p_sub


def _any_principal(patterns: Sequence[str], token: Optional[tuple[str, str]]) -> bool:
    return any(match_request_principal(p, token) for p in patterns)


def _source_matches(source: Mapping[str, Any], request: Request, principal: Optional[str]) -> bool:
    checks = {
        "requestPrincipals": lambda v: principal is not None and _any_principal(v, request.token),
        "notRequestPrincipals": lambda v: principal is None or not _any_principal(v, request.token),
        "ipBlocks": lambda v: _in_blocks(request.source_ip, v),
        "notIpBlocks": lambda v: not _in_blocks(request.source_ip, v),
        "remoteIpBlocks": lambda v: _in_blocks(request.source_ip, v),
        "notRemoteIpBlocks": lambda v: not _in_blocks(request.source_ip, v),
        # Peer identities need mTLS, which the load balancer and the collectors do not have.
        "principals": lambda v: False, "namespaces": lambda v: False,
        "notPrincipals": lambda v: True, "notNamespaces": lambda v: True,
    }
    return all(checks[k](v) for k, v in source.items() if k in checks)


def _operation_matches(op: Mapping[str, Any], request: Request) -> bool:
    path = normalize_path(request.path)
    checks = {
        "methods": lambda v: request.method in v,
        "notMethods": lambda v: request.method not in v,
        "paths": lambda v: _any(v, path),
        "notPaths": lambda v: not _any(v, path),
    }
    return all(checks[k](v) for k, v in op.items() if k in checks)


def _when_matches(condition: Mapping[str, Any], principal: Optional[str], request: Request) -> bool:
    key = condition.get("key", "")
    token = request.token
    value = {"request.auth.principal": principal,
             "request.auth.claims[iss]": token[0] if token else None}.get(key)
    if key.startswith("request.headers[") and key.endswith("]"):
        value = request.headers.get(key[len("request.headers["):-1].lower())
    values, not_values = condition.get("values") or [], condition.get("notValues") or []
    return (not values or _any(values, value)) and not _any(not_values, value)


def rule_matches(rule: Mapping[str, Any], request: Request, principal: Optional[str]) -> bool:
    sources = rule.get("from")
    if sources and not any(_source_matches(s.get("source") or {}, request, principal) for s in sources):
        return False
    ops = rule.get("to")
    if ops and not any(_operation_matches(o.get("operation") or {}, request) for o in ops):
        return False
    return all(_when_matches(c, principal, request) for c in rule.get("when") or [])


def _matches(policy: Mapping[str, Any], request: Request, principal: Optional[str]) -> bool:
    return any(rule_matches(rule, request, principal) for rule in (policy.get("spec") or {}).get("rules") or [])


def applicable(manifests: Iterable[Mapping[str, Any]], namespace: str, labels: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """The RequestAuthentications and AuthorizationPolicies that apply to a workload: what
    `decide` would consider, selected once for many requests to the same workload."""
    probe = Request(namespace, "/", labels=labels)
    return [d for d in manifests if d.get("kind") in ("RequestAuthentication", "AuthorizationPolicy")
            and _applies(d, probe)]


def _cannot_match(policy: Mapping[str, Any], token: tuple[str, str]) -> bool:
    """Every rule of the policy names request principals, none of which is the token's."""
    rules = (policy.get("spec") or {}).get("rules") or []
    if not rules:
        return False
    for rule in rules:
        sources = rule.get("from") or []
        if not sources or any(set(src.get("source") or {}) != {"requestPrincipals"} for src in sources):
            return False
        if any(_any_principal((src.get("source") or {})["requestPrincipals"], token) for src in sources):
            return False
    return True


def for_token(manifests: Iterable[Mapping[str, Any]], issuer: str, subject: str) -> list[Mapping[str, Any]]:
    """`manifests` less what cannot bear on a request with this token: other issuers'
    RequestAuthentications and policies whose every rule names other principals. `decide` gives
    the same answer on the result, in time independent of how many other tenants there are."""
    docs = list(manifests)
    kept: list[Mapping[str, Any]] = []
    dropped_allow = False
    for d in docs:
        if d.get("kind") == "RequestAuthentication":
            if any(r.get("issuer") == issuer for r in (d.get("spec") or {}).get("jwtRules") or []):
                kept.append(d)
        elif d.get("kind") == "AuthorizationPolicy" and _cannot_match(d, (issuer, subject)):
            dropped_allow |= (d.get("spec") or {}).get("action", "ALLOW") == "ALLOW"
        else:
            kept.append(d)
    if dropped_allow and not any(d.get("kind") == "AuthorizationPolicy" and
                                 (d.get("spec") or {}).get("action", "ALLOW") == "ALLOW" for d in kept):
        # ALLOW policies still apply: one that matches nothing keeps "none matched" a denial.
        kept.append({"kind": "AuthorizationPolicy", "metadata": {"name": "(other principals' allows)",
                     "namespace": ROOT_NAMESPACE}, "spec": {"action": "ALLOW"}})
    return kept


def decide(manifests: Iterable[Mapping[str, Any]], request: Request, claim_to_headers: bool = True) -> Decision:
    """`claim_to_headers`: the data plane applies outputClaimToHeaders (Envoy's jwt_authn writes
    the verified claim, replacing a client's copy, before RBAC runs); False models one that
    ignores it and leaves the client's headers as sent."""
    docs = list(manifests)
    authns = [d for d in docs if d.get("kind") == "RequestAuthentication" and _applies(d, request)]
    authzs = [d for d in docs if d.get("kind") == "AuthorizationPolicy" and _applies(d, request)]
    principal: Optional[str] = None
    if request.token is not None:
        issuer, subject = request.token
        rules = [r for a in authns for r in (a.get("spec") or {}).get("jwtRules") or [] if r.get("issuer") == issuer]
        if not rules or not request.token_valid:
            return Decision(False, 401, f"Jwt issuer {issuer} is not configured or the token is invalid")
        principal = f"{issuer}/{subject}"
        if claim_to_headers:
            claims = {"iss": issuer, "sub": subject}
            written = {o["header"].lower(): claims[o["claim"]] for r in rules for o in r.get("outputClaimToHeaders") or []
                       if o.get("claim") in claims}
            request = replace(request, headers={**request.headers, **written})
    for p in authzs:
        if (p.get("spec") or {}).get("action") == "CUSTOM":
            return Decision(False, 403, "CUSTOM policies are not modelled: treat as deny")
    for p in authzs:
        if (p.get("spec") or {}).get("action") == "DENY" and _matches(p, request, principal):
            return Decision(False, 403, f"denied by {p['metadata'].get('name')}")
    allows = [p for p in authzs if (p.get("spec") or {}).get("action", "ALLOW") == "ALLOW"]
    if not allows:
        return Decision(True, 200, "no ALLOW policy applies")
    for p in allows:
        if _matches(p, request, principal):
            return Decision(True, 200, f"allowed by {p['metadata'].get('name')}")
    return Decision(False, 403, "RBAC: access denied (no ALLOW policy matches)")
