"""The vllm-gke component package: the components for every Pulumi language.

`pulumi package add <this folder>` runs __main__.py, which hosts the components below with the
Python SDK's component provider (the schema is inferred from their type annotations). Every
component the stack program composes is here, with the stack config's checks.
"""

import pulumi

from .gateway import Gateway
from .gpu_cluster import GpuCluster
from .identity_extension import IdentityExtension
from .inference_objective_crd import InferenceObjectiveCrd
from .inference_pool import InferencePool
from .keda import Keda
from .limit_store import LimitStore
from .mesh_namespace import MeshNamespace
from .mesh_readiness import MeshReadiness
from .model_store import ModelStore
from .observability import Observability
from .serving_platform import Platform
from .tenant_auth import TenantAuth
from .vllm_service import VllmService

COMPONENTS: list[type[pulumi.ComponentResource]] = [
    Platform, GpuCluster, MeshReadiness, Keda, MeshNamespace, TenantAuth, ModelStore, VllmService, InferenceObjectiveCrd,
    InferencePool, IdentityExtension, LimitStore, Gateway, Observability]
# Spelt out, as static tools read it (tests/test_code_quality.py keeps it equal to COMPONENTS).
__all__ = ["COMPONENTS", "Platform", "GpuCluster", "MeshReadiness", "Keda", "MeshNamespace", "TenantAuth", "ModelStore",
           "VllmService", "InferenceObjectiveCrd", "InferencePool", "IdentityExtension", "LimitStore", "Gateway",
           "Observability"]
