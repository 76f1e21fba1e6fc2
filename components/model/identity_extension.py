"""The tenant identity extension as data: its config, the GCPRoutingExtension that makes GKE's
load balancer call it before route selection, its Deployment, budget, Service, health check and
NetworkPolicy (components/identity_extension.py declares them; images/vllm_gke_identity runs).

Deployed as GKE's body-based router is (gateway-api-inference-extension v1.2.0
config/charts/body-based-routing/templates/gke.yaml, bbr.yaml): a GCPRoutingExtension
(networking.gke.io/v1) targeting the Gateway, its backendRef the extension's Service (appProtocol
HTTP2: the load balancer calls it over HTTP/2 with TLS, which it serves self-signed), a gRPC
HealthCheckPolicy on a fixed health port. Unlike that chart it fails closed (failOpen false: with
the extension down the load balancer answers 500 rather than route a request whose headers nobody
checked), reads bodies only where it must, and runs two replicas on two nodes with a budget of one
disruption.

Two extension chains (routing_extension_spec): the first matches every /<tenant>/<model>/v1/ path
of each tenant URL a picker serves where its release salts (the extension salts the routes whose
request models take cache_salt, bounds every body there, and answers the rest at their headers)
and is called, as the body-based router is, with the request headers, body and
trailers in FullDuplexStreamed mode: it sets the tenant's cache_salt in the body, which the
picker's prefix keys hash (images/vllm_gke_identity/salt.py says why). The second has no match
condition and takes every other request's headers only. The load balancer runs the first chain
whose condition matches a request and no other (LbRouteExtension.extensionChains: "The first
extension chain that has a condition that matches the request is executed. Any subsequent
extension chains do not execute", Network Services API reference), so every request runs exactly
one of them, both with the headers (the header stripping covers every request), and only the
picker's body routes are read. FullDuplexStreamed: "Subsequent chunks will be sent for processing
without waiting for the response ... for REQUEST_HEADERS event. Extension can freely modify or
chunk the body contents" (BodySendMode, ibid.); Streamed sends a chunk only once the previous one
is answered, so no whole body could be read before the headers' answer.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional, Sequence

from .k8s_objects import CONTAINER_SECURITY
from .serving_api import (
    FAIRNESS_HEADER,
    IDENTITY_STRIPS,
    OBJECTIVE_HEADER,
    TENANT_HEADER,
    cache_salt,
    objective_name,
    path_prefix,
    picker_max_body_bytes,
    picker_routes,
)
from .specs import ImageRef, ModelSpec, TenantSpec
from .stack_config import StackConfig
from .vllm_versions import VllmRelease

NAME = "vllm-gke-identity"
# The image's tag (images/vllm_gke_identity/cloudbuild.yaml builds it into the serverImage's repository).
IDENTITY_TAG = "0.6.0"  # 0.6.0: refuses vllm_xargs with the engine's keys (0.5.0: a P/D URL's header-only body)
EXT_PROC_PORT = 9004  # the body-based router's ports (values.yaml)
HEALTH_PORT = 9005
UID = 65532
REPLICAS = 2
CONFIG_FILE = "identity.json"
# Per message; a JWKS fetch on a cache miss (2 s at most, verify.py) fits. Past it: 500 (fail closed).
TIMEOUT = "5s"
# On SIGTERM it reports NOT_SERVING and answers this long (the load balancer's health check moves
# traffic off it) before it stops; the grace period leaves room for the stop itself.
DRAIN_S = 15
GRACE_S = DRAIN_S * 2 + 5
LABELS = {"app.kubernetes.io/name": NAME}


def needs_identity(cfg: StackConfig) -> bool:
    """Only stacks with models behind an endpoint picker: nothing else reads what it sets."""
    return any(m.routing == "inference-gateway" for m in cfg.models)


def identity_image(server_image: ImageRef) -> ImageRef:
    """The extension's image, built beside the server image (its repository's folder)."""
    folder = server_image.repository.rsplit("/", 1)[0]
    return ImageRef(repository=f"{folder}/{NAME}", tag=IDENTITY_TAG)


def picker_prefixes(tenants: Sequence[TenantSpec], models: Sequence[ModelSpec],
                    releases: Mapping[str, VllmRelease]) -> dict[str, dict[str, Any]]:
    """'/<tenant>/<model>' of every tenant URL an endpoint picker serves -> its tenant, objective,
    and where its release salts: the tenant's cache_salt (the guard's), the picker routes whose
    bodies take it (those the guard salts: the release's cache_salt_paths among the picker's
    POST routes) and the route's body limit (gateway_routes.picker_rules' Content-Length bound).
    `releases`: each picker model's vLLM release, by the model's name."""
    by_name = {m.name: m for m in models}
    out: dict[str, dict[str, Any]] = {}
    for tenant in tenants:
        dedicated: set[str] = set(tenant.dedicated.models) if tenant.dedicated else set()
        for name in tenant.models:
            model = by_name.get(name)
            if model is None or model.routing != "inference-gateway":
                continue
            salted = releases[name].cache_salt_paths
            entry: dict[str, Any] = {"tenant": tenant.name, "objective": objective_name(tenant.name, name)}
            if paths := sorted(r.path for r in picker_routes() if r.method == "POST" and r.path in salted):
                entry.update(cacheSalt=cache_salt(tenant), saltedPaths=paths, maxBodyBytes=picker_max_body_bytes(model))
            if model.disaggregation is not None:  # its bodies are read, or refused (processor.on_headers)
                entry["disaggregated"] = True
            out["/" + path_prefix(model, tenant, name in dedicated)] = entry
    return dict(sorted(out.items()))


def tenants_identity_config(tenants: Sequence[TenantSpec], models: Sequence[ModelSpec],
                            releases: Mapping[str, VllmRelease]) -> dict[str, Any]:
    """The extension's IDENTITY_CONFIG: the jwt of each tenant with a picker's URL (the fields
    Istio's RequestAuthentication and AuthorizationPolicy check: tenant_policies.py), the URLs,
    and the header names the picker, its routes and the guard read (serving_api). From the
    tenants and models alone, as the component package builds it (picker_prefixes' arguments)."""
    prefixes = picker_prefixes(tenants, models, releases)
    callers = {p["tenant"] for p in prefixes.values()}
    configs = {t.name: {"issuer": t.jwt.issuer, "jwksUri": t.jwt.jwks_uri, "audiences": list(t.jwt.audiences),
                        "subjects": list(t.jwt.subjects) if t.jwt.subjects is not None else None}
               for t in tenants if t.name in callers}
    return {"tenants": configs, "prefixes": prefixes,
            "headers": {"objective": OBJECTIVE_HEADER, "fairness": FAIRNESS_HEADER, "tenant": TENANT_HEADER,
                        "strip": list(IDENTITY_STRIPS)}}


def identity_config(cfg: StackConfig) -> dict[str, Any]:
    """A stack's IDENTITY_CONFIG: its tenants and models, each model on its node pool's release."""
    return tenants_identity_config(cfg.tenants, cfg.models, {m.name: cfg.release_for(m.node_pool) for m in cfg.models})


def config_json(identity: Mapping[str, Any]) -> str:
    """The config as the ConfigMap holds it (its digest rolls the Deployment)."""
    return json.dumps(identity, indent=1, sort_keys=True)


def config_text(cfg: StackConfig) -> str:
    return config_json(identity_config(cfg))


# A path the CEL condition names as is: tenant and model names are DNS labels.
_PLAIN_PATH = re.compile(r"/[a-z0-9/-]+")
# The body chain's extension metadata: GKE passes it in each ProcessingRequest's metadata_context
# (a com.google.* namespace), and the extension holds a request's headers for its body only when
# it is there (images/vllm_gke_identity/processor.py BODY_CHAIN: a request the other chain took
# never sends its body, so a held answer would wait out the callout's timeout).
BODY_CHAIN = {"vllm-gke-chain": "body"}


def salted_prefixes(identity: Mapping[str, Any]) -> list[str]:
    """The prefixes ('/<tenant>/<model>') under which the extension salts bodies (its config's)."""
    return [prefix for prefix, v in sorted(identity["prefixes"].items()) if v.get("saltedPaths")]


# GKE's CRD holds each celMatcher to 512 characters of Service Extensions' CEL subset, whose string
# literals may not hold RE2's ^ $ | ? [ ] (so no anchored matches()), and ORs at most 10 of them.
CEL_MAX = 512
CEL_EXPRESSIONS_MAX = 10


def _startswith_any(prefixes: Sequence[str]) -> str:
    return " || ".join(f"request.path.startsWith('{p}/v1/')" for p in prefixes)


def body_conditions(prefixes: Sequence[str]) -> list[str]:
    """CEL matchers (ORed by GKE): the request's path starts with a salted prefix's /v1/. Only
    startsWith: request.path carries the query string (Envoy's attribute), so no ending is matched;
    the extension reads only the salted routes' bodies under them, bounds the others' and passes
    the rest at their headers."""
    if bad := [p for p in prefixes if not _PLAIN_PATH.fullmatch(p)]:
        raise ValueError(f"identity extension: paths a CEL condition cannot name as they are: {bad}")
    out: list[str] = []
    chunk: list[str] = []
    for prefix in prefixes:
        if chunk and len(_startswith_any([*chunk, prefix])) > CEL_MAX:
            out.append(_startswith_any(chunk))
            chunk = []
        chunk.append(prefix)
    if chunk:
        out.append(_startswith_any(chunk))
    if len(out) > CEL_EXPRESSIONS_MAX or any(len(e) > CEL_MAX for e in out):
        raise ValueError(f"identity extension: {len(out)} CEL conditions for the salted picker routes; GKE takes at most "
                         f"{CEL_EXPRESSIONS_MAX} of {CEL_MAX} characters each")
    return out



def conditions_problem(identity: Mapping[str, Any]) -> Optional[str]:
    """Why GKE could not take the body chain's conditions for this config (its bound: 10 matchers of
    512 characters), or None: the stack config and the package's facade judge it alike."""
    try:
        body_conditions(salted_prefixes(identity))
    except ValueError as exc:
        return f"{exc}: give fewer tenants the picker's models, or route some models by length"
    return None

def _extension(name: str, events: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "authority": NAME, "timeout": TIMEOUT, "failOpen": False, "supportedEvents": events,
            **extra, "backendRef": {"group": "", "kind": "Service", "name": NAME, "port": EXT_PROC_PORT}}


def routing_extension_spec(gateway: str, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The GCPRoutingExtension, failing closed: under the salted picker URLs (`identity`: the
    extension's config) the headers, body and trailers in full duplex (trailers as the body-based
    router's chart: Envoy streams full duplex only with them), with BODY_CHAIN as its metadata;
    then every other request (no match condition: a request that skipped it would keep its own
    copies of the headers the picker's routes match on) its headers only. Fields as GKE's CRD
    (networking.gke.io/v1) has them."""
    chains: list[dict[str, Any]] = []
    if prefixes := salted_prefixes(identity):
        chains.append({"name": "tenant-identity-body",
                       "matchCondition": {"celExpressions": [{"celMatcher": c} for c in body_conditions(prefixes)]},
                       "extensions": [_extension("salt-tenant", ["RequestHeaders", "RequestBody", "RequestTrailers"],
                                                 requestBodySendMode="FullDuplexStreamed",
                                                 metadata=dict(BODY_CHAIN))]})
    chains.append({"name": "tenant-identity", "extensions": [_extension("verify-tenant", ["RequestHeaders"])]})
    return {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway}],
            "extensionChains": chains}


def health_check_spec() -> dict[str, Any]:
    """The load balancer's gRPC health check of the extension's pods (as the chart's bbr-healthcheck)."""
    return {"default": {"logConfig": {"enabled": True}, "config": {
                "type": "GRPC", "grpcHealthCheck": {"portSpecification": "USE_FIXED_PORT", "port": HEALTH_PORT}}},
            "targetRef": {"group": "", "kind": "Service", "name": NAME}}


def service_spec() -> dict[str, Any]:
    # HTTP2: the load balancer's backend service for the callout speaks HTTP/2 (over TLS) to it.
    return {"type": "ClusterIP", "selector": dict(LABELS),
            "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT,
                       "targetPort": EXT_PROC_PORT, "appProtocol": "HTTP2"}]}


def container(image: str) -> dict[str, Any]:
    def grpc_probe() -> dict[str, Any]:
        return {"grpc": {"port": HEALTH_PORT}}
    return {"name": "identity", "image": image,
            "env": [{"name": "IDENTITY_CONFIG", "value": f"/config/{CONFIG_FILE}"},
                    {"name": "EXT_PROC_PORT", "value": str(EXT_PROC_PORT)},
                    {"name": "HEALTH_PORT", "value": str(HEALTH_PORT)},
                    {"name": "DRAIN_S", "value": str(DRAIN_S)}],
            "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                      {"name": "grpc-health", "containerPort": HEALTH_PORT}],
            "readinessProbe": {**grpc_probe(), "periodSeconds": 2},
            "livenessProbe": {**grpc_probe(), "initialDelaySeconds": 5, "periodSeconds": 10},
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}]}


def deployment_spec(image: str, config_digest: str) -> dict[str, Any]:
    """Two replicas on two nodes (a drain or a node's failure takes one), outside the mesh (the
    load balancer calls it directly, from the proxy-only subnet, with no mesh identity)."""
    return {"replicas": REPLICAS, "selector": {"matchLabels": dict(LABELS)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {**LABELS, "sidecar.istio.io/inject": "false"},
                             "annotations": {"vllm-gke.io/config-sha256": config_digest}},
                "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": GRACE_S,
                         "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                             "seccompProfile": {"type": "RuntimeDefault"}},
                         "topologySpreadConstraints": [{
                             "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "minDomains": 2,
                             "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                             "labelSelector": {"matchLabels": dict(LABELS)}, "matchLabelKeys": ["pod-template-hash"]}],
                         "containers": [container(image)],
                         "volumes": [{"name": "config", "configMap": {"name": NAME}}]}}}


def budget_spec() -> dict[str, Any]:
    """One replica may be evicted at a time: the other keeps answering."""
    return {"maxUnavailable": 1, "selector": {"matchLabels": dict(LABELS)}}


def ingress_spec(load_balancer_sources: Sequence[object]) -> dict[str, Any]:
    """Only the load balancer's proxies (ext_proc) and health checks (the health port) reach it."""
    return {"podSelector": {"matchLabels": dict(LABELS)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": c}} for c in load_balancer_sources],
                         "ports": [{"protocol": "TCP", "port": EXT_PROC_PORT},
                                   {"protocol": "TCP", "port": HEALTH_PORT}]}]}
