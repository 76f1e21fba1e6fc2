"""Kubernetes label keys, names and small object bodies every layer shares (the components declare
them, the policies and the plan read them back)."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
MODEL_LABEL = "vllm-gke.io/model"
POOL_LABEL = "vllm-gke.io/serving-pool"  # short | long
# A Flagger target Deployment's own name, in its selector and on its pods: the one label Flagger
# rewrites for the primary it copies (<name>-primary; its -selector-labels flag), which a Flagger
# pool's gates read to tell the two revisions apart (components/model/rollouts.py).
WORKLOAD_LABEL = "vllm-gke.io/workload"
# The model revision a server runs.
REVISION_LABEL = "vllm-gke.io/revision"
TENANT_LABEL = "vllm-gke.io/tenant"
NODE_POOL_LABEL = "vllm-gke.io/node-pool"
COMPUTE_CLASS_LABEL = "cloud.google.com/compute-class"
# Namespaces carrying it may attach HTTPRoutes to the shared Gateway.
ACCESS_LABEL = "vllm-gke.io/gateway-access"
WEIGHTS_READY_MARKER = ".vllm-gke-complete"

BASE_LABELS = {PART_OF: "vllm-gke", MANAGED_BY: "pulumi"}
# A container that cannot gain privileges or write its image, with no Linux capabilities.
CONTAINER_SECURITY: dict[str, Any] = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


def vllm_health_check(target_ref: Mapping[str, str], port: int) -> dict[str, Any]:
    """HealthCheckPolicy spec probing vLLM's /health (the load balancer's default asks for '/',
    which vLLM answers 404). USE_FIXED_PORT: gke-gateway-api main rejects `port` without it; GKE
    1.33 accepts both. A failing replica leaves the load balancer in ~10 s (2 failed checks, 5 s apart)."""
    return {"default": {"checkIntervalSec": 5, "timeoutSec": 3, "healthyThreshold": 1, "unhealthyThreshold": 2,
                        "config": {"type": "HTTP", "httpHealthCheck": {
                            "portSpecification": "USE_FIXED_PORT", "port": port, "requestPath": "/health"}}},
            "targetRef": dict(target_ref)}


def content_digest(text: str) -> str:
    """A pod-template annotation value for a file a container reads once at start: a changed
    file changes the template, so the pods roll."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def service_name_of(model: str, pool_name: str, canary: bool = False) -> str:
    """The pool's Service, Deployment and autoscaler name."""
    return f"{model}-canary-{pool_name}" if canary else f"{model}-{pool_name}"


def group_name_of(service_name: str) -> str:
    """The pool's LeaderWorkerSet: not the Service's name, which the controller would take for its
    headless Service and reuse as it is (lws v0.10.0 pkg/utils/controller/controller_utils.go:37-40)."""
    return f"{service_name}-group"
