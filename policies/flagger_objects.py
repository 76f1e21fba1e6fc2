"""What Flagger v1.44.0 creates for a Canary on the Gateway API provider, derived from the Canary and
its target as Flagger's source does it, so the policies judge the routes and Services a Flagger pool
will have as they judge declared ones (the plan never declares them: Flagger owns them).

- Services (pkg/router/kubernetes_default.go reconcileService:93-130): `<apex>` and `<apex>-primary`
  select `<label>: <value>-primary`, `<apex>-canary` selects `<label>: <value>`; one port,
  `service.port` to `service.targetPort` (else the port), named `service.portName` (else "http").
- The HTTPRoute (pkg/router/gateway_api.go Reconcile:63-110): named `<apex>` in the Canary's
  namespace, parentRefs the gatewayRefs, hostnames the hosts, one rule: the service.match mapped
  (mapRouteMatches:624-700; none: PathPrefix "/"), the request header filter (makeFilters:760-790),
  and the backends `<apex>-primary` (weight 100) and `<apex>-canary` (weight 0).
`<apex>` is service.name, else targetRef.name (GetServiceNames, pkg/apis/flagger/v1beta1/canary.go).
Only the standard library: the pack must stay light.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

# Flagger's default -selector-labels and the one this platform sets (components/flagger.py).
SELECTOR_LABELS = ("vllm-gke.io/workload", "app", "name", "app.kubernetes.io/name")


def apex_name(canary: Mapping[str, Any]) -> str:
    spec = canary.get("spec") or {}
    return (spec.get("service") or {}).get("name") or (spec.get("targetRef") or {}).get("name", "")


def selector_label(target: Optional[Mapping[str, Any]]) -> Optional[tuple[str, str]]:
    """The label Flagger rewrites (getSelectorLabel): the first of its labels in the target's selector."""
    labels = (((target or {}).get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return next(((k, labels[k]) for k in SELECTOR_LABELS if k in labels), None)


def _match(m: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    uri = m.get("uri") or {}
    for kind, key in (("RegularExpression", "regex"), ("Exact", "exact"), ("PathPrefix", "prefix")):
        if uri.get(key):
            out["path"] = {"type": kind, "value": uri[key]}
            break
    headers = [{"type": "Exact" if v.get("exact") else "RegularExpression", "name": k,
                "value": v.get("exact") or v.get("regex")} for k, v in sorted((m.get("headers") or {}).items())]
    if headers:
        out["headers"] = headers
    return out


def _filters(service: Mapping[str, Any]) -> list[dict[str, Any]]:
    request = (service.get("headers") or {}).get("request")
    if request is None:
        return []
    modifier: dict[str, Any] = {}
    for key in ("add", "set"):
        if request.get(key):
            modifier[key] = [{"name": k, "value": v} for k, v in sorted(request[key].items())]
    if request.get("remove"):
        modifier["remove"] = list(request["remove"])
    return [{"type": "RequestHeaderModifier", "requestHeaderModifier": modifier}]


def http_route(canary: Mapping[str, Any]) -> dict[str, Any]:
    """The HTTPRoute Flagger creates for a Gateway API Canary, at its initial weights."""
    spec, apex = canary.get("spec") or {}, apex_name(canary)
    service = spec.get("service") or {}
    port = service.get("port")
    matches = [m for m in (_match(x) for x in service.get("match") or []) if m] or [
        {"path": {"type": "PathPrefix", "value": "/"}}]

    def backend(name: str, weight: int) -> dict[str, Any]:
        return {"group": "", "kind": "Service", "name": name, "port": port, "weight": weight}

    rule: dict[str, Any] = {"matches": matches, "backendRefs": [backend(f"{apex}-primary", 100),
                                                                backend(f"{apex}-canary", 0)]}
    if filters := _filters(service):
        rule["filters"] = filters
    route_spec: dict[str, Any] = {"parentRefs": [dict(r) for r in service.get("gatewayRefs") or []], "rules": [rule]}
    if service.get("hosts"):
        route_spec["hostnames"] = list(service["hosts"])
    meta = canary.get("metadata") or {}
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": apex, "namespace": meta.get("namespace")}, "spec": route_spec}


def services(canary: Mapping[str, Any], target: Optional[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The apex, primary and canary Services (none where the target has no selector label Flagger knows)."""
    found = selector_label(target)
    if found is None:
        return []
    label, value = found
    service = (canary.get("spec") or {}).get("service") or {}
    apex, namespace = apex_name(canary), (canary.get("metadata") or {}).get("namespace")
    port: dict[str, Any] = {"name": service.get("portName") or "http", "protocol": "TCP", "port": service.get("port"),
                            "targetPort": service.get("targetPort") or service.get("port")}
    if service.get("appProtocol"):
        port["appProtocol"] = service["appProtocol"]

    def one(name: str, pods: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
                "spec": {"type": "ClusterIP", "selector": {label: pods}, "ports": [port]}}

    return [one(apex, f"{value}-primary"), one(f"{apex}-primary", f"{value}-primary"), one(f"{apex}-canary", value)]


def flagger_objects(canaries: Sequence[Mapping[str, Any]], deployments: Sequence[Mapping[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Every object Flagger would create for these Canaries (Gateway API provider ones)."""
    by_name = {((d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name")): d
               for d in deployments}
    out: list[dict[str, Any]] = []
    for c in canaries:
        spec = c.get("spec") or {}
        target = by_name.get(((c.get("metadata") or {}).get("namespace"), (spec.get("targetRef") or {}).get("name")))
        out += services(c, target)
        if str(spec.get("provider", "")).startswith("gatewayapi"):
            out.append(http_route(c))
    return out
