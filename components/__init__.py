"""Reusable Pulumi components for serving vLLM on GKE; one component per module."""

from vllm_gke.components.gateway import Gateway, GatewayArgs, RouteTarget
from vllm_gke.components.gpu_cluster import GpuCluster, GpuClusterArgs
from vllm_gke.components.inference_objective_crd import InferenceObjectiveCrd, InferenceObjectiveCrdArgs
from vllm_gke.components.inference_pool import InferencePool, InferencePoolArgs
from vllm_gke.components.keda import Keda, KedaArgs
from vllm_gke.components.limit_store import LimitStore, LimitStoreArgs
from vllm_gke.components.mesh_namespace import MeshNamespace, MeshNamespaceArgs
from vllm_gke.components.model_store import ModelStore, ModelStoreArgs
from vllm_gke.components.observability import Observability, ObservabilityArgs
from vllm_gke.components.standby import Standby, StandbyArgs
from vllm_gke.components.tenant_auth import TenantAuth, TenantAuthArgs
from vllm_gke.components.vllm_service import VllmService, VllmServiceArgs

__all__ = [
    "Gateway", "GatewayArgs", "GpuCluster", "GpuClusterArgs", "InferenceObjectiveCrd", "InferenceObjectiveCrdArgs",
    "InferencePool", "InferencePoolArgs", "Keda", "KedaArgs", "LimitStore", "LimitStoreArgs", "MeshNamespace", "MeshNamespaceArgs",
    "ModelStore", "ModelStoreArgs", "Observability", "ObservabilityArgs", "RouteTarget",
    "Standby", "StandbyArgs", "TenantAuth", "TenantAuthArgs", "VllmService", "VllmServiceArgs",
]
