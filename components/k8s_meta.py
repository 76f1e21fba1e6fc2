"""Label keys and small builders shared by the Kubernetes-facing components."""

from __future__ import annotations

from typing import Any, Mapping, Optional

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


def meta(name: str, namespace: Optional[str] = None, labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """ObjectMeta with an explicit name: manifests stay predictable and diffable across stacks."""
    out: dict[str, Any] = {"name": name, "labels": {**BASE_LABELS, **(labels or {})}}
    if namespace:
        out["namespace"] = namespace
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def custom_resource(resource_name: str, api_version: str, kind: str, metadata: dict[str, Any],
                    spec: Any, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        resource_name, api_version=api_version, kind=kind, metadata=metadata, spec=spec, opts=opts
    )
