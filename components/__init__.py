"""Reusable Pulumi components for serving vLLM on GKE; one component per module."""

from .billing_budget import BillingBudget, BillingBudgetArgs
from .gateway import Gateway, GatewayArgs, RouteTarget
from .gpu_cluster import GpuCluster, GpuClusterArgs
from .inference_objective_crd import InferenceObjectiveCrd, InferenceObjectiveCrdArgs
from .inference_pool import InferencePool, InferencePoolArgs
from .keda import Keda, KedaArgs
from .limit_store import LimitStore, LimitStoreArgs
from .load_test import LoadTest, LoadTestArgs
from .mesh_namespace import MeshNamespace, MeshNamespaceArgs
from .model_store import ModelStore, ModelStoreArgs
from .observability import Observability, ObservabilityArgs
from .service_levels import ServiceLevels, ServiceLevelsArgs
from .standby import Standby, StandbyArgs
from .tenant_auth import TenantAuth, TenantAuthArgs
from .trace_collector import TraceCollector, TraceCollectorArgs
from .vllm_service import VllmService, VllmServiceArgs

__all__ = [
    "BillingBudget", "BillingBudgetArgs",
    "Gateway", "GatewayArgs", "GpuCluster", "GpuClusterArgs", "InferenceObjectiveCrd", "InferenceObjectiveCrdArgs",
    "InferencePool", "InferencePoolArgs", "Keda", "KedaArgs", "LimitStore", "LimitStoreArgs", "LoadTest", "LoadTestArgs",
    "MeshNamespace",
    "MeshNamespaceArgs",
    "ModelStore", "ModelStoreArgs", "Observability", "ObservabilityArgs", "RouteTarget",
    "ServiceLevels", "ServiceLevelsArgs", "Standby", "StandbyArgs", "TenantAuth", "TenantAuthArgs",
    "TraceCollector", "TraceCollectorArgs", "VllmService", "VllmServiceArgs",
]
