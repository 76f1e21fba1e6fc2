"""The GKE Gateway's load balancers (Cloud Load Balancing URL maps): which route matches each
Gateway class can program, and which HTTPRoute filters GKE claims (no path rewrite)."""

from __future__ import annotations

import json
from typing import Any, Iterator

from ...components.model.config_rules import LENGTH_ROUTING_CLASSES
from ..manifests import pod_templates
from ..plan import Plan
from .base import Contract, _docs

URL_MAPS = "https://cloud.google.com/compute/docs/reference/rest/v1/urlMaps"
GKE_CONFORMANCE = ("GoogleCloudPlatform/gke-gateway-api@v1.4.0:conformance/conformance_test.go:32-33; "
                   "kubernetes-sigs/gateway-api@c6fc4d1:conformance/reports/v1.1.0/gke-gateway/"
                   "standard-1.30.3-{rilb,rxlb}-report.yaml:36,46")


def regex_matches_on_a_regional_class(plan: Plan) -> list[str]:
    """Every RegularExpression header match (the length routes' Content-Length split, the picker
    routes' body bound and refused headers) behind a Gateway whose load balancer can program it."""
    classes = {(g["metadata"].get("namespace"), g["metadata"]["name"]): g["spec"]["gatewayClassName"]
               for g in _docs(plan, "Gateway")}
    out = []
    for route in _docs(plan, "HTTPRoute"):
        ns = route["metadata"].get("namespace")
        regex = [h["name"] for rule in route["spec"].get("rules") or [] for m in rule.get("matches") or []
                 for h in m.get("headers") or [] if h.get("type") == "RegularExpression"]
        for ref in route["spec"].get("parentRefs") or []:
            cls = classes.get((ref.get("namespace", ns), ref["name"]))
            if regex and cls is not None and cls not in LENGTH_ROUTING_CLASSES:
                out.append(f"HTTPRoute {ns}/{route['metadata']['name']} matches {sorted(set(regex))} by regular "
                           f"expression behind {cls}, whose load balancer has no regexMatch")
    return out


def _guards(plan: Plan) -> Iterator[tuple[str, dict[str, str], dict[str, Any]]]:
    """(namespace, pod labels, guard config) of every pod template that runs the guard."""
    for doc in [*_docs(plan, "Deployment"), *_docs(plan, "LeaderWorkerSet")]:
        for _role, pod in pod_templates(doc):
            for c in pod["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in c.get("env") or []}
                if env.get("GKE_LLM_GUARD_CONFIG"):
                    yield doc["metadata"]["namespace"], pod["metadata"].get("labels") or {}, \
                        json.loads(env["GKE_LLM_GUARD_CONFIG"])


def _selectors(plan: Plan) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, name) -> pod selector of each Service and InferencePool a route may name."""
    out = {(d["metadata"]["namespace"], d["metadata"]["name"]): (d.get("spec") or {}).get("selector") or {}
           for d in _docs(plan, "Service")}
    out.update({(d["metadata"]["namespace"], d["metadata"]["name"]): ((d.get("spec") or {}).get("selector") or {})
                .get("matchLabels") or {} for d in _docs(plan, "InferencePool")})
    return out


def gateway_rewrites_no_path(plan: Plan) -> list[str]:
    """No HTTPRoute rewrites a path (GKE's Gateway does not claim it), and every path a route sends
    to a pool is one the pool's guard strips a prefix of: /<prefix>/v1 (its pathPrefixes)."""
    guards, selectors, out = list(_guards(plan)), _selectors(plan), []
    for route in _docs(plan, "HTTPRoute"):
        ns, name = route["metadata"].get("namespace"), route["metadata"]["name"]
        for rule in route["spec"].get("rules") or []:
            if any(f.get("type") == "URLRewrite" and "path" in (f.get("urlRewrite") or {})
                   for f in rule.get("filters") or []):
                out.append(f"HTTPRoute {ns}/{name} rewrites the path (URLRewrite), which GKE's Gateway does not "
                           "claim (HTTPRoutePathRewrite exempt): forward it as sent, the guard strips the prefix")
            for ref in rule.get("backendRefs") or []:
                selector = selectors.get((ref.get("namespace", ns), ref["name"])) or {}
                pods = [cfg for g_ns, labels, cfg in guards if selector and g_ns == ref.get("namespace", ns)
                        and selector.items() <= labels.items()]
                for m in rule.get("matches") or []:
                    value = str((m.get("path") or {}).get("value", "/"))
                    for cfg in pods:
                        if not any(value == f"{p}/v1" or value.startswith(f"{p}/v1/") for p in cfg.get("pathPrefixes") or []):
                            out.append(f"HTTPRoute {ns}/{name} sends {value} to {ref['name']}, whose guard strips no "
                                       f"prefix of it (pathPrefixes {cfg.get('pathPrefixes')})")
    return sorted(set(out))


ROWS: tuple[Contract, ...] = (
    Contract("GKE Gateway (URL map)", "Compute API v1",
             "a header match by regular expression (HttpHeaderMatch.regexMatch) \"can only be used when the "
             "loadBalancingScheme is set to INTERNAL_SELF_MANAGED, EXTERNAL_MANAGED (regional scope) or "
             "INTERNAL_MANAGED\": gke-l7-rilb and gke-l7-regional-external-managed, not the global external load "
             "balancer of gke-l7-global-external-managed",
             f"{URL_MAPS} (HttpHeaderMatch.regexMatch)",
             "gateway.className must be a regional class for routing: length (and the picker's routes, which "
             "bound Content-Length the same way); every RegularExpression header match sits behind one",
             regex_matches_on_a_regional_class),
    Contract("GKE Gateway (gke-gateway-api)", "v1.4.0 conformance",
             "GKE's conformance run lists HTTPRoutePathRedirect as supported but HTTPRoutePathRewrite among its "
             "ExemptFeatures, and GKE's reports for both regional classes (gke-l7-rilb, gke-l7-regional-external-managed) "
             "list it under unsupportedFeatures: a URLRewrite "
             "of the path (ReplacePrefixMatch, ReplaceFullPath) is not relied on, so a request reaches the pod with "
             "its /<prefix>/v1 path as the client sent it",
             GKE_CONFORMANCE,
             "no HTTPRoute rewrites a path (a redirect's path is supported and kept); the mesh admits each tenant's "
             "prefixed paths and the guard strips its pool's pathPrefixes (/<model>, /<tenant>/<model>) before its "
             "checks and vLLM's router; every path a route sends to a pool is one its guard strips",
             gateway_rewrites_no_path),
)
