"""The vllm-gke component package: the components for every Pulumi language.

`pulumi package add <this folder>` runs __main__.py, which hosts the components below with the
Python SDK's component provider (the schema is inferred from their type annotations). Every
component the stack program composes is here, with the stack config's checks.
"""

from vllm_gke.components.provider.gateway import Gateway
from vllm_gke.components.provider.gpu_cluster import GpuCluster
from vllm_gke.components.provider.inference_objective_crd import InferenceObjectiveCrd
from vllm_gke.components.provider.inference_pool import InferencePool
from vllm_gke.components.provider.keda import Keda
from vllm_gke.components.provider.limit_store import LimitStore
from vllm_gke.components.provider.mesh_namespace import MeshNamespace
from vllm_gke.components.provider.mesh_readiness import MeshReadiness
from vllm_gke.components.provider.model_store import ModelStore
from vllm_gke.components.provider.observability import Observability
from vllm_gke.components.provider.serving_platform import Platform
from vllm_gke.components.provider.tenant_auth import TenantAuth
from vllm_gke.components.provider.vllm_service import VllmService

COMPONENTS = [Platform, GpuCluster, MeshReadiness, Keda, MeshNamespace, TenantAuth, ModelStore, VllmService,
              InferenceObjectiveCrd, InferencePool, LimitStore, Gateway, Observability]
__all__ = ["COMPONENTS", *(c.__name__ for c in COMPONENTS)]
