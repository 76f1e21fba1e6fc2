"""The vllm-gke component package: the components for every Pulumi language.

`pulumi package add <this folder>` runs __main__.py, which hosts the components below with the
Python SDK's component provider (the schema is inferred from their type annotations).
"""

from vllm_gke.components.provider.gateway import Gateway
from vllm_gke.components.provider.gpu_cluster import GpuCluster
from vllm_gke.components.provider.model_store import ModelStore
from vllm_gke.components.provider.observability import Observability
from vllm_gke.components.provider.serving_platform import Platform
from vllm_gke.components.provider.tenant_auth import TenantAuth
from vllm_gke.components.provider.vllm_service import VllmService

COMPONENTS = [Platform, GpuCluster, ModelStore, VllmService, Gateway, TenantAuth, Observability]
__all__ = ["COMPONENTS", "Gateway", "GpuCluster", "ModelStore", "Observability", "Platform", "TenantAuth",
           "VllmService"]
