"""The tenant identity extension as data: its config, the GCPRoutingExtension that makes GKE's
load balancer call it before route selection, its Deployment, budget, Service, health check and
NetworkPolicy (components/identity_extension.py declares them; images/vllm_gke_identity runs).

Deployed as GKE's body-based router is (gateway-api-inference-extension v1.2.0
config/charts/body-based-routing/templates/gke.yaml, bbr.yaml): a GCPRoutingExtension
(networking.gke.io/v1) targeting the Gateway, its backendRef the extension's Service (appProtocol
HTTP2: the load balancer calls it over HTTP/2 with TLS, which it serves self-signed), a gRPC
HealthCheckPolicy on a fixed health port. Unlike that chart it fails closed (failOpen false: with
the extension down the load balancer answers 500 rather than route a request whose headers nobody
checked), calls it on request headers only (no body passes through it), and runs two replicas on
two nodes with a budget of one disruption.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from .k8s_objects import CONTAINER_SECURITY
from .serving_api import FAIRNESS_HEADER, IDENTITY_STRIPS, OBJECTIVE_HEADER, TENANT_HEADER, objective_name, path_prefix
from .specs import ImageRef
from .stack_config import StackConfig

NAME = "vllm-gke-identity"
# The image's tag (images/vllm_gke_identity/cloudbuild.yaml builds it into the serverImage's repository).
IDENTITY_TAG = "0.1.0"
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


def picker_prefixes(cfg: StackConfig) -> dict[str, dict[str, str]]:
    """'/<tenant>/<model>' of every tenant URL an endpoint picker serves -> its tenant and objective."""
    out: dict[str, dict[str, str]] = {}
    for tenant in cfg.tenants:
        dedicated: set[str] = set(tenant.dedicated.models) if tenant.dedicated else set()
        for name in tenant.models:
            model = cfg.model(name)
            if model.routing == "inference-gateway":
                out["/" + path_prefix(model, tenant, name in dedicated)] = {
                    "tenant": tenant.name, "objective": objective_name(tenant.name, name)}
    return dict(sorted(out.items()))


def identity_config(cfg: StackConfig) -> dict[str, Any]:
    """The extension's IDENTITY_CONFIG: the jwt of each tenant with a picker's URL (the fields
    Istio's RequestAuthentication and AuthorizationPolicy check: tenant_policies.py), the URLs,
    and the header names the picker, its routes and the guard read (serving_api)."""
    prefixes = picker_prefixes(cfg)
    callers = {p["tenant"] for p in prefixes.values()}
    tenants = {t.name: {"issuer": t.jwt.issuer, "jwksUri": t.jwt.jwks_uri, "audiences": list(t.jwt.audiences),
                        "subjects": list(t.jwt.subjects) if t.jwt.subjects is not None else None}
               for t in cfg.tenants if t.name in callers}
    return {"tenants": tenants, "prefixes": prefixes,
            "headers": {"objective": OBJECTIVE_HEADER, "fairness": FAIRNESS_HEADER, "tenant": TENANT_HEADER,
                        "strip": list(IDENTITY_STRIPS)}}


def config_text(cfg: StackConfig) -> str:
    return json.dumps(identity_config(cfg), indent=1, sort_keys=True)


def routing_extension_spec(gateway: str) -> dict[str, Any]:
    """The GCPRoutingExtension: every request on the Gateway (no match condition: a request that
    skipped it would keep its own copies of the headers the picker's routes match on), its headers
    only, failing closed. Fields as GKE's CRD (networking.gke.io/v1) has them."""
    return {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway}],
            "extensionChains": [{"name": "tenant-identity", "extensions": [{
                "name": "verify-tenant", "authority": NAME, "timeout": TIMEOUT, "failOpen": False,
                "supportedEvents": ["RequestHeaders"],
                "backendRef": {"group": "", "kind": "Service", "name": NAME, "port": EXT_PROC_PORT}}]}]}


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
