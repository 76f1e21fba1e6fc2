"""Reusable Pulumi components for serving vLLM on GKE; one component per module."""

from components.gateway import Gateway, GatewayArgs, RouteTarget
from components.gpu_cluster import GpuCluster, GpuClusterArgs
from components.mesh_namespace import MeshNamespace, MeshNamespaceArgs
from components.metrics_adapter import MetricsAdapter, MetricsAdapterArgs
from components.model_store import ModelStore, ModelStoreArgs
from components.observability import Observability, ObservabilityArgs
from components.tenant_auth import TenantAuth, TenantAuthArgs
from components.vllm_service import VllmService, VllmServiceArgs

__all__ = [
    "Gateway", "GatewayArgs", "GpuCluster", "GpuClusterArgs", "MeshNamespace", "MeshNamespaceArgs",
    "MetricsAdapter", "MetricsAdapterArgs",
    "ModelStore", "ModelStoreArgs", "Observability", "ObservabilityArgs", "RouteTarget",
    "TenantAuth", "TenantAuthArgs", "VllmService", "VllmServiceArgs",
]
