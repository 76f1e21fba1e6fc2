"""InferencePools and the endpoint picker: pools served (picker running, failing closed, health-checked,
behind a regional Gateway) and each tenant's priority its own."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Mapping, Sequence

from .base import (
    SERVING_KINDS,
    Finding,
    Resource,
    kube,
    meta,
    namespace_of,
    parent_gateways,
    selects,
    template_labels,
    where,
)
from .mesh_authz import Request, applicable, decide, for_token

# The endpoint picker's request headers (llm-d-router pkg/epp/metadata) and the identity extension's;
# the same names as components/model/serving_api.py, repeated so the pack stays light (a test ties them).
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
TENANT_HEADER = "x-vllm-gke-tenant"
PICKER_SETS = ("x-gateway-destination-endpoint",)
REFUSED_AT_THE_PICKER = ("x-gateway-inference-objective", "x-gateway-inference-fairness-id", "x-llm-d-model-name-rewrite",
                         "x-gateway-model-name-rewrite", "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms", "x-llm-d-slo-tpot-ms",
                         "x-slo-tpot-ms", "x-llm-d-video-fps", "x-llm-d-video-duration-seconds",
                         "x-llm-d-video-resolution")
# One release: the move from bf329cd's routes (issue 39); drop next release. The objective header
# those routes matched; its name is also in REFUSED_AT_THE_PICKER (stripped for good).
LEGACY_OBJECTIVE_HEADER = "x-gateway-inference-objective"
IDENTITY_CONFIG_KEY = "identity.json"
GLOBAL_GATEWAY = re.compile(r"global|gxlb")


def _to_pool(backend: Mapping[str, Any]) -> bool:
    return backend.get("kind") == "InferencePool" and backend.get("group") == "inference.networking.k8s.io"


def _pool_rules(route: Resource) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    for rule in (route.props.get("spec") or {}).get("rules") or []:
        pools = [b for b in rule.get("backendRefs") or [] if _to_pool(b)]
        if pools:
            yield rule, pools


def _header_changes(rule: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """What a rule's RequestHeaderModifier filters set (name -> value) and remove, names lowercase."""
    sets: dict[str, str] = {}
    removes: set[str] = set()
    for f in rule.get("filters") or []:
        if f.get("type") == "RequestHeaderModifier":
            mod = f.get("requestHeaderModifier") or {}
            sets.update({str(h.get("name", "")).lower(): str(h.get("value", "")) for h in mod.get("set") or []})
            removes.update(str(h).lower() for h in mod.get("remove") or [])
    return sets, removes


def inference_pools_served(resources: Sequence[Resource]) -> Iterator[Finding]:
    """An InferencePool serves only with its endpoint picker running, failing closed, health-checked
    by the load balancer, behind a regional Gateway in a VPC with a proxy-only subnet."""
    pools = kube(resources, "InferencePool")
    if not pools:
        return
    services = {(namespace_of(s), meta(s).get("name")): s for s in kube(resources, "Service")}
    deployments = [(namespace_of(d), template_labels(d)) for kind in SERVING_KINDS for d in kube(resources, kind)]
    checked = {(namespace_of(h), ref.get("name")) for h in kube(resources, "HealthCheckPolicy")
               if (ref := (h.props.get("spec") or {}).get("targetRef") or {}).get("kind") == "InferencePool"}
    for pool in pools:
        ns, name = namespace_of(pool), meta(pool).get("name")
        ref = (pool.props.get("spec") or {}).get("endpointPickerRef") or {}
        if ref.get("failureMode") == "FailOpen":
            yield pool, f"{where(pool)} fails open: with its picker down, requests skip priorities and load awareness"
        svc = services.get((ns, ref.get("name")))
        if svc is None:
            yield pool, f"{where(pool)}: its endpoint picker Service '{ref.get('name')}' is not declared in '{ns}'"
        elif not any(dns == ns and selects((svc.props.get("spec") or {}).get("selector") or {}, labels)
                     for dns, labels in deployments):
            yield pool, f"{where(pool)}: no Deployment runs behind its endpoint picker Service '{ref.get('name')}'"
        if (ns, name) not in checked:
            yield pool, (f"{where(pool)} has no HealthCheckPolicy: the load balancer probes '/' (404 on vLLM) and "
                         "marks every replica unhealthy")
    if not any(r.type == "gcp:compute/subnetwork:Subnetwork" and r.props.get("purpose") == "REGIONAL_MANAGED_PROXY"
               for r in resources):
        yield None, "InferencePools are served by a regional load balancer, which needs a proxy-only subnet; none is declared"
    gateways = {(namespace_of(g), meta(g).get("name")): g for g in kube(resources, "Gateway")}
    for route in kube(resources, "HTTPRoute"):
        if not any(True for _ in _pool_rules(route)):
            continue
        for _ref, gw in parent_gateways(route, gateways):
            cls = (gw.props.get("spec") or {}).get("gatewayClassName", "")
            if GLOBAL_GATEWAY.search(cls):
                yield route, f"{where(route)} sends to an InferencePool through {cls}: only regional classes serve pools"


def _required(match: Mapping[str, Any], name: str) -> str | None:
    return next((str(h.get("value")) for h in match.get("headers") or []
                 if h.get("name") == name and h.get("type", "Exact") == "Exact"), None)


def identity_strips(resources: Sequence[Resource], namespace: str) -> set[str]:
    """The headers the identity extension's server of `namespace` removes from every request."""
    configs = [json.loads(str((c.props.get("data") or {}).get(IDENTITY_CONFIG_KEY) or "{}"))
               for c in kube(resources, "ConfigMap") if namespace_of(c) == namespace
               and IDENTITY_CONFIG_KEY in (c.props.get("data") or {})]
    return {str(h).lower() for c in configs for h in (c.get("headers") or {}).get("strip") or []}


def _verified_or_dead(match: Mapping[str, Any], objective: str, dead: set[str]) -> bool:
    """The match requires what the extension set (the objective and its tenant) or, one release (the move
    from bf329cd's routes, issue 39; drop next release), the objective under LEGACY_OBJECTIVE_HEADER where
    the extension strips that header and sets none of that name (`dead`): such a match can no longer hold
    once the extension runs."""
    if _required(match, OBJECTIVE_HEADER) == objective and _required(match, TENANT_HEADER) == objective.split(".")[0]:
        return True
    return LEGACY_OBJECTIVE_HEADER in dead and _required(match, LEGACY_OBJECTIVE_HEADER) == objective


def identity_guarded(resources: Sequence[Resource], gateway: tuple[str, Any]) -> str:
    """Why the Gateway's requests may carry a client's copy of the picker's headers, or '': a
    GCPRoutingExtension on it, failing closed, on every request's headers, whose config strips
    every control header and the verified tenant."""
    for ext in kube(resources, "GCPRoutingExtension"):
        spec = ext.props.get("spec") or {}
        if not any(namespace_of(ext) == gateway[0] and t.get("kind") == "Gateway" and t.get("name") == gateway[1]
                   for t in spec.get("targetRefs") or []):
            continue
        chains = spec.get("extensionChains") or []
        # The first chain whose condition matches runs, and no other: one chain with no condition
        # runs on whatever no earlier chain took (components/model/identity_extension.py).
        if all(c.get("matchCondition") for c in chains):
            return f"{where(ext)} runs on some requests only: the others keep the client's headers"
        for e in (x for c in chains for x in c.get("extensions") or []):
            if e.get("failOpen") or "RequestHeaders" not in (e.get("supportedEvents") or ["RequestHeaders"]):
                return f"{where(ext)} fails open or skips request headers"
        stripped = identity_strips(resources, gateway[0])
        if missing := sorted({*REFUSED_AT_THE_PICKER, OBJECTIVE_HEADER, FAIRNESS_HEADER, TENANT_HEADER} - stripped):
            return f"{where(ext)}'s server keeps the client's {', '.join(missing)}"
        return ""
    return "no GCPRoutingExtension verifies the tenant before route selection"


def tenant_priorities_bound(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A tenant's priority is its own. The picker reads a request as it reaches the picker's ext_proc
    (route header changes apply after it, envoy#15012), so a route to a pool must require the
    objective and tenant the identity extension set from the verified token, and that extension must
    run on every request of the Gateway, fail closed and strip every client copy; every objective
    must exist, and the mesh must admit at most one tenant's tokens under each."""
    docs = [r.props for r in resources if r.type.startswith("kubernetes:")]
    objectives = {(namespace_of(o), meta(o).get("name")) for o in kube(resources, "InferenceObjective")}
    pools = {(namespace_of(p), meta(p).get("name")): p for p in kube(resources, "InferencePool")}
    deployments = [d for kind in SERVING_KINDS for d in kube(resources, kind)]
    gateways = {(namespace_of(g), meta(g).get("name")): g for g in kube(resources, "Gateway")}
    issuers_by_ns: dict[str, set[str]] = {}
    for ra in kube(resources, "RequestAuthentication"):
        issuers_by_ns.setdefault(namespace_of(ra), set()).update(
            str(rule.get("issuer")) for rule in (ra.props.get("spec") or {}).get("jwtRules") or [])
    # Per pool: the objectives its routes require, and where its policies apply.
    pool_objectives: dict[tuple[str, Any], list[tuple[Resource, str]]] = {}
    for route in kube(resources, "HTTPRoute"):
        ns = namespace_of(route)
        rules = list(_pool_rules(route))
        parents = list(parent_gateways(route, gateways)) if rules else []
        for ref, gw in parents:
            if why := identity_guarded(resources, (namespace_of(gw), ref.get("name"))):
                yield route, (f"{where(route)} routes to an InferencePool on headers a client could send: {why}")
        # What every parent Gateway's extension strips and never sets: a match on it dies once the extension runs.
        dead = set.intersection(*(identity_strips(resources, namespace_of(gw)) for _r, gw in parents)) \
            - {OBJECTIVE_HEADER, FAIRNESS_HEADER, TENANT_HEADER} if parents else set[str]()
        for rule, backends in rules:
            _sets, removes = _header_changes(rule)
            matches = rule.get("matches") or [{}]
            objective = _required(matches[0], OBJECTIVE_HEADER)
            if objective is None or not all(_verified_or_dead(m, objective, dead) for m in matches):
                yield route, (f"{where(route)} routes to an InferencePool without requiring the {OBJECTIVE_HEADER} "
                              f"and {TENANT_HEADER} the identity extension sets: clients would choose their own priority")
                continue
            if stripped := [h for h in PICKER_SETS if h in removes or any(
                    str(x.get("name", "")).lower() == h for m in matches for x in m.get("headers") or [])]:
                yield route, (f"{where(route)} matches on or strips {', '.join(stripped)}, which the picker sets: "
                              "applied after ext_proc it would drop or redirect the picker's choice")
            if (ns, objective) not in objectives:
                yield route, f"{where(route)} requires objective '{objective}' but no InferenceObjective of that name exists"
            for b in backends:
                pool_objectives.setdefault((b.get("namespace") or ns, b.get("name")), []).append((route, objective))
    for (ns, pool_name), routed in pool_objectives.items():
        pool = pools.get((ns, pool_name))
        selector = (((pool.props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}) if pool else {}
        pods = [template_labels(d) for d in deployments if namespace_of(d) == ns and selects(selector, template_labels(d))]
        if not pods:
            continue
        labels = pods[0]
        policies = applicable(docs, ns, labels)
        # Each issuer against each objective, on only the policies that can bear on its token.
        per_issuer = {iss: for_token(policies, iss, "policy-probe") for iss in sorted(issuers_by_ns.get(ns, set()))}
        # At every path a route forwards to the pool, as sent (no rewrite: the mesh sees the prefix),
        # whichever tenant's path a caller picks.
        paths = sorted({str((m.get("path") or {}).get("value") or "") for route, _o in routed
                        for rule in (route.props.get("spec") or {}).get("rules") or [] for m in rule.get("matches") or []})
        for route, objective in routed:
            admitted = [iss for iss, mine in per_issuer.items() if any(decide(mine, Request(
                ns, path, "GET" if path.endswith("/models") else "POST", labels, token=(iss, "policy-probe"),
                headers={header: objective})).allowed for path in paths
                for header in (OBJECTIVE_HEADER, LEGACY_OBJECTIVE_HEADER))]
            if len(admitted) > 1:
                yield route, (f"{where(route)}: objective '{objective}' admits the tokens of {len(admitted)} "
                              f"issuers ({', '.join(admitted)}); a tenant could take another's priority")
