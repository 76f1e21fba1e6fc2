"""MeshReadiness, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..mesh_readiness import MeshReadiness as _MeshReadiness
from ..mesh_readiness import MeshReadinessArgs
from ..model.specs import ClusterSpec as ClusterModel
from .convert import kubernetes_provider, to_spec
from .facade import LATER, Facade
from .types import ClusterSpec


class MeshReadinessInputs(TypedDict):
    """Inputs of MeshReadiness."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    cluster: ClusterSpec
    """The cluster's settings, as given to GpuCluster: the managed control plane's revision follows its
    releaseChannel."""


class MeshReadiness(_MeshReadiness, Facade):
    """Waits until managed Cloud Service Mesh serves the cluster: give it to dependsOn of every
    component that declares Istio resources or meshed pods (MeshNamespace, TenantAuth, VllmService,
    InferencePool, LimitStore), or their sidecars are never injected."""

    revision: str
    """The managed control plane's revision (asm-managed, asm-managed-rapid or asm-managed-stable)."""

    def __init__(self, name: str, args: MeshReadinessInputs, opts: Optional[pulumi.ResourceOptions] = None):
        cluster = to_spec(ClusterModel, args.get("cluster"), "MeshReadiness", "cluster")
        self.inputs, self.args = args, MeshReadinessArgs(LATER, cluster.release_channel)
        super().__init__(name, self.args, opts)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
