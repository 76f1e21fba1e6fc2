"""Reusable Pulumi components for serving vLLM on GKE; one component per module.

The components load on first use (PEP 562): `import vllm_gke.components.model...` (the model
layer, which the policy pack and the plan's checks read) must not load Pulumi's SDKs with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .billing_budget import BillingBudget, BillingBudgetArgs
    from .flagger import Flagger, FlaggerArgs
    from .gateway import Gateway, GatewayArgs
    from .gpu_cluster import GpuCluster, GpuClusterArgs
    from .identity_extension import IdentityExtension, IdentityExtensionArgs
    from .inference_objective_crd import InferenceObjectiveCrd, InferenceObjectiveCrdArgs
    from .inference_pool import InferencePool, InferencePoolArgs
    from .keda import Keda, KedaArgs
    from .limit_store import LimitStore, LimitStoreArgs
    from .load_test import LoadTest, LoadTestArgs
    from .mesh_namespace import MeshNamespace, MeshNamespaceArgs
    from .model.gateway_routes import RouteTarget
    from .model_store import ModelStore, ModelStoreArgs
    from .observability import Observability, ObservabilityArgs
    from .service_levels import ServiceLevels, ServiceLevelsArgs
    from .standby import Standby, StandbyArgs
    from .tenant_auth import TenantAuth, TenantAuthArgs
    from .trace_collector import TraceCollector, TraceCollectorArgs
    from .vllm_service import VllmService, VllmServiceArgs

_MODULE_OF = {
    "BillingBudget": "billing_budget",
    "BillingBudgetArgs": "billing_budget",
    "Flagger": "flagger",
    "FlaggerArgs": "flagger",
    "Gateway": "gateway",
    "GatewayArgs": "gateway",
    "RouteTarget": "model.gateway_routes",
    "GpuCluster": "gpu_cluster",
    "GpuClusterArgs": "gpu_cluster",
    "IdentityExtension": "identity_extension",
    "IdentityExtensionArgs": "identity_extension",
    "InferenceObjectiveCrd": "inference_objective_crd",
    "InferenceObjectiveCrdArgs": "inference_objective_crd",
    "InferencePool": "inference_pool",
    "InferencePoolArgs": "inference_pool",
    "Keda": "keda",
    "KedaArgs": "keda",
    "LimitStore": "limit_store",
    "LimitStoreArgs": "limit_store",
    "LoadTest": "load_test",
    "LoadTestArgs": "load_test",
    "MeshNamespace": "mesh_namespace",
    "MeshNamespaceArgs": "mesh_namespace",
    "ModelStore": "model_store",
    "ModelStoreArgs": "model_store",
    "Observability": "observability",
    "ObservabilityArgs": "observability",
    "ServiceLevels": "service_levels",
    "ServiceLevelsArgs": "service_levels",
    "Standby": "standby",
    "StandbyArgs": "standby",
    "TenantAuth": "tenant_auth",
    "TenantAuthArgs": "tenant_auth",
    "TraceCollector": "trace_collector",
    "TraceCollectorArgs": "trace_collector",
    "VllmService": "vllm_service",
    "VllmServiceArgs": "vllm_service",
}

__all__ = [
    "BillingBudget", "BillingBudgetArgs", "Flagger", "FlaggerArgs",
    "Gateway", "GatewayArgs", "GpuCluster", "GpuClusterArgs", "IdentityExtension", "IdentityExtensionArgs",
    "InferenceObjectiveCrd", "InferenceObjectiveCrdArgs",
    "InferencePool", "InferencePoolArgs", "Keda", "KedaArgs", "LimitStore", "LimitStoreArgs", "LoadTest", "LoadTestArgs",
    "MeshNamespace",
    "MeshNamespaceArgs",
    "ModelStore", "ModelStoreArgs", "Observability", "ObservabilityArgs", "RouteTarget",
    "ServiceLevels", "ServiceLevelsArgs", "Standby", "StandbyArgs", "TenantAuth", "TenantAuthArgs",
    "TraceCollector", "TraceCollectorArgs", "VllmService", "VllmServiceArgs",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
