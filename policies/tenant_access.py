"""Who reaches the servers: tenant namespaces authenticated, external Gateways behind JWT auth
and HTTPS only, and no serving path open without a verified token, as the mesh decides."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterator, Mapping, Optional, Sequence

from ..components.model.issuers import shared_public_issuer
from .base import (
    Finding,
    Resource,
    is_deny_all,
    kube,
    meta,
    namespace_of,
    parent_gateways,
    route_backends,
    template_labels,
    vllm_servers,
    where,
)
from .mesh_authz import Request, applicable, decide

INTERNAL_GATEWAY = re.compile(r"rilb|internal")
# What an unauthenticated caller is tried on: the OpenAI paths that make the GPU work, as they
# are and under every prefix a route forwards (the Gateway rewrites no path: the guard strips it).
SERVING_PROBE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/responses")
INTERNET_PROBE_IP = "203.0.113.1"


def _mesh_policies(resources: Sequence[Resource]) -> tuple[dict[str, list[Resource]], dict[str, list[Resource]]]:
    authn: dict[str, list[Resource]] = {}
    authz: dict[str, list[Resource]] = {}
    for r in kube(resources, "RequestAuthentication"):
        authn.setdefault(namespace_of(r), []).append(r)
    for r in kube(resources, "AuthorizationPolicy"):
        authz.setdefault(namespace_of(r), []).append(r)
    return authn, authz


def tenant_namespaces_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    authn, authz = _mesh_policies(resources)
    for ns in kube(resources, "Namespace"):
        labels = meta(ns).get("labels") or {}
        if "vllm-gke.io/tenant" not in labels:
            continue
        name = meta(ns).get("name", ns.name)
        missing = [k for k, found in (("RequestAuthentication", authn), ("AuthorizationPolicy", authz))
                   if not found.get(name)]
        if missing:
            yield ns, f"tenant namespace '{name}' has no {' and no '.join(missing)}"


def _external_gateways(resources: Sequence[Resource]) -> dict[tuple[str, Any], Resource]:
    return {(namespace_of(g), meta(g).get("name")): g for g in kube(resources, "Gateway")
            if not INTERNAL_GATEWAY.search((g.props.get("spec") or {}).get("gatewayClassName", ""))}


def external_gateway_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    external = _external_gateways(resources)
    if not external:
        return
    authn, authz = _mesh_policies(resources)
    for route in kube(resources, "HTTPRoute"):
        if not parent_gateways(route, external) or not route_backends(route):
            continue
        ns = namespace_of(route)
        if not authn.get(ns):
            yield route, (f"{where(route)} is exposed on an external Gateway but namespace '{ns}' has no "
                          "RequestAuthentication")
        if not any(is_deny_all(p) for p in authz.get(ns, [])):
            yield route, (f"{where(route)} is exposed on an external Gateway but namespace '{ns}' has no "
                          "deny-all AuthorizationPolicy")


def external_gateway_https_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    external = _external_gateways(resources)
    for gw in external.values():
        listeners = (gw.props.get("spec") or {}).get("listeners") or []
        if not any(listener.get("protocol") == "HTTPS" for listener in listeners):
            yield gw, f"{where(gw)} is external but has no HTTPS listener: bearer tokens would cross the internet in clear"
        for listener in listeners:
            admits = ((listener.get("allowedRoutes") or {}).get("namespaces") or {}).get("from", "Same")
            if listener.get("protocol") == "HTTP" and admits != "Same":
                yield gw, (f"{where(gw)} listener '{listener.get('name')}' is plain HTTP and admits routes from "
                           f"'{admits}' namespaces; admit only the gateway's own redirect (from: Same)")
    for route in kube(resources, "HTTPRoute"):
        for ref, gw in parent_gateways(route, external):
            listeners = {x.get("name"): x for x in (gw.props.get("spec") or {}).get("listeners") or []}
            section = ref.get("sectionName")
            targets = [listeners[section]] if section in listeners else list(listeners.values())
            if any(listener.get("protocol") == "HTTP" for listener in targets) and route_backends(route):
                yield route, (f"{where(route)} sends traffic to backends through a plain HTTP listener of external "
                              f"{where(gw)}; attach it to the HTTPS listener (sectionName)")


def _probe_sources(resources: Sequence[Resource]) -> list[str]:
    """One address inside every range any AuthorizationPolicy names, plus one on the internet."""

    ips = {INTERNET_PROBE_IP}
    for p in kube(resources, "AuthorizationPolicy"):
        for rule in (p.props.get("spec") or {}).get("rules") or []:
            for f in rule.get("from") or []:
                src = f.get("source") or {}
                for block in (src.get("ipBlocks") or []) + (src.get("remoteIpBlocks") or []):
                    net = ipaddress.ip_network(block, strict=False)
                    ips.add(str(next(iter(net.hosts()), net.network_address)))
    return sorted(ips)


def _forged_claim_headers(docs: list[Mapping[str, Any]], namespace: str) -> list[dict[str, str]]:
    """What a client without a token can send: nothing, or any header a RequestAuthentication
    writes from a claim, set to each issuer it knows (only a verified token's claim replaces it)."""
    out: list[dict[str, str]] = [{}]
    for d in docs:
        if d.get("kind") != "RequestAuthentication" or (d.get("metadata") or {}).get("namespace") != namespace:
            continue
        for rule in (d.get("spec") or {}).get("jwtRules") or []:
            for o in rule.get("outputClaimToHeaders") or []:
                if o.get("claim") == "iss" and rule.get("issuer"):
                    out.append({o["header"].lower(): rule["issuer"]})
    return out


def _route_prefixes(resources: Sequence[Resource]) -> list[str]:
    """Every '/<prefix>' an HTTPRoute forwards as /<prefix>/v1/... ('' for unprefixed)."""
    prefixes = {""}
    for route in kube(resources, "HTTPRoute"):
        for rule in (route.props.get("spec") or {}).get("rules") or []:
            for match in rule.get("matches") or []:
                value = str((match.get("path") or {}).get("value") or "")
                if "/v1" in value:
                    prefixes.add(value[:value.index("/v1")])
    return sorted(prefixes)


def _open_probe(docs: list[Mapping[str, Any]], namespace: str, labels: Mapping[str, str],
                sources: Sequence[str], prefixes: Sequence[str] = ("",)) -> Optional[str]:
    """The first unauthenticated request to a serving path (under any of `prefixes`) the mesh
    would let through, if any."""
    forged = _forged_claim_headers(docs, namespace)
    for path in (prefix + p for prefix in prefixes for p in SERVING_PROBE_PATHS):
        for ip in sources:
            for method in ("GET", "POST"):
                for headers in forged:
                    decision = decide(docs, Request(namespace, path, method, labels, ip, headers=headers))
                    if decision.allowed:
                        return f"{method} {path} from {ip} ({decision.reason})"
    return None


def serving_paths_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    docs = [r.props for r in resources if r.type.startswith("kubernetes:")]
    sources = _probe_sources(resources)
    prefixes = _route_prefixes(resources)
    seen = set()
    for r, _pod, _c in vllm_servers(resources):
        if r.urn in seen:
            continue
        seen.add(r.urn)
        labels = template_labels(r)
        if probe := _open_probe(applicable(docs, namespace_of(r), labels), namespace_of(r), labels, sources, prefixes):
            yield r, f"{where(r)}: {probe} is allowed without a JWT; only /health and /metrics may be"


def _any_subject(value: str, public_trusted: bool) -> Optional[str]:
    """The shared public issuer a requestPrincipals value admits any (or a pattern of) subject of,
    read as Istio splits it (at its last '/'); '*' for one that names no issuer where one is trusted."""
    iss, _, sub = value.rpartition("/")
    if value == "*" or (value.startswith("*") and ("/" not in value or iss.startswith("*"))):
        return "*" if public_trusted else None
    return iss if shared_public_issuer(iss) and (sub.startswith("*") or sub.endswith("*")) else None


def public_issuers_pinned_to_subjects(resources: Sequence[Resource]) -> Iterator[Finding]:
    """Anyone can get a token from accounts.google.com (any audience, IAM's generateIdToken) and
    the like: such an issuer is a tenant only through its exact `<iss>/<sub>` principals."""
    public: dict[str, set[str]] = {}
    for ra in kube(resources, "RequestAuthentication"):
        for rule in (ra.props.get("spec") or {}).get("jwtRules") or []:
            if shared_public_issuer(str(rule.get("issuer") or "")):
                public.setdefault(namespace_of(ra), set()).add(str(rule["issuer"]))
    for p in kube(resources, "AuthorizationPolicy"):
        if (p.props.get("spec") or {}).get("action", "ALLOW") != "ALLOW":
            continue
        trusted = bool(public.get(namespace_of(p)) or public.get("istio-system"))
        for rule in (p.props.get("spec") or {}).get("rules") or []:
            for src in rule.get("from") or []:
                for value in (src.get("source") or {}).get("requestPrincipals") or []:
                    if (issuer := _any_subject(str(value), trusted)) is not None:
                        whose = "a trusted issuer" if issuer == "*" else f"'{issuer}'"
                        yield p, (f"{where(p)} admits '{value}': any subject of {whose}, which issues tokens to "
                                  "anyone; name the tenant's subjects exactly ('<iss>/<sub>', jwt.subjects)")
