"""Label keys and small builders shared by the Kubernetes-facing components."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
MODEL_LABEL = "vllm-gke.io/model"
POOL_LABEL = "vllm-gke.io/serving-pool"  # short | long
TENANT_LABEL = "vllm-gke.io/tenant"
NODE_POOL_LABEL = "vllm-gke.io/node-pool"
COMPUTE_CLASS_LABEL = "cloud.google.com/compute-class"
# Namespaces carrying it may attach HTTPRoutes to the shared Gateway.
ACCESS_LABEL = "vllm-gke.io/gateway-access"
WEIGHTS_READY_MARKER = ".vllm-gke-complete"

BASE_LABELS = {PART_OF: "vllm-gke", MANAGED_BY: "pulumi"}
# A container that cannot gain privileges or write its image, with no Linux capabilities.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


def api_body(body: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
    """A Kubernetes object's body (a spec, a role's rules or reference) as written here: in the API's
    own field names (camelCase), as the manifests the plan writes and checks against the API's
    schema (infra/manifests.py validates every one, strictly). pulumi_kubernetes sends such keys
    as they are, but its *ArgsDict TypedDicts name only snake_case keys, so a type checker cannot
    match the two: the body passes typed as Any, unchanged, and the schema check is its check."""
    return body


def vllm_health_check(target_ref: Mapping[str, str], port: int) -> dict[str, Any]:
    """HealthCheckPolicy spec probing vLLM's /health (the load balancer's default asks for '/',
    which vLLM answers 404). USE_FIXED_PORT: gke-gateway-api main rejects `port` without it; GKE
    1.33 accepts both. A failing replica leaves the load balancer in ~10 s (2 failed checks, 5 s apart)."""
    return {"default": {"checkIntervalSec": 5, "timeoutSec": 3, "healthyThreshold": 1, "unhealthyThreshold": 2,
                        "config": {"type": "HTTP", "httpHealthCheck": {
                            "portSpecification": "USE_FIXED_PORT", "port": port, "requestPath": "/health"}}},
            "targetRef": dict(target_ref)}


def meta(name: str, namespace: Optional[str] = None, labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None) -> k8s.meta.v1.ObjectMetaArgsDict:
    """ObjectMeta with an explicit name: manifests stay predictable and diffable across stacks."""
    out: k8s.meta.v1.ObjectMetaArgsDict = {"name": name, "labels": {**BASE_LABELS, **(labels or {})}}
    if namespace:
        out["namespace"] = namespace
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def custom_resource(resource_name: str, api_version: str, kind: str, metadata: k8s.meta.v1.ObjectMetaArgsDict,
                    spec: Any, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        resource_name, api_version=api_version, kind=kind, metadata=metadata, spec=spec, opts=opts
    )


def content_digest(text: str) -> str:
    """A pod-template annotation value for a file a container reads once at start: a changed
    file changes the template, so the pods roll."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def deny_all_ingress(resource_name: str, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions) -> None:
    """A NetworkPolicy refusing every connection to the namespace's pods: for namespaces outside the
    mesh whose pods serve nothing (loaders, checks). Enforced by GKE Dataplane V2."""
    k8s.networking.v1.NetworkPolicy(
        resource_name, metadata={**meta("deny-all-ingress"), "namespace": namespace},
        spec=api_body({"podSelector": {}, "policyTypes": ["Ingress"]}), opts=opts)
