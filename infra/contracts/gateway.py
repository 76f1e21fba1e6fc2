"""The GKE Gateway's load balancers (Cloud Load Balancing URL maps): which route matches each
Gateway class can program."""

from __future__ import annotations

from ...components.config_rules import LENGTH_ROUTING_CLASSES
from ..plan import Plan
from .base import Contract, _docs

URL_MAPS = "https://cloud.google.com/compute/docs/reference/rest/v1/urlMaps"


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
)
