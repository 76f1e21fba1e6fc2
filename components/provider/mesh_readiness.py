"""MeshReadiness, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..mesh_readiness import MeshReadiness as _MeshReadiness
from ..mesh_readiness import MeshReadinessArgs
from ..model.specs import ClusterSpec as ClusterModel
from ..options import child_opts
from .convert import Problems, kubernetes_provider
from .types import ClusterSpec


class MeshReadinessInputs(TypedDict):
    """Inputs of MeshReadiness."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    cluster: ClusterSpec
    """The cluster's settings, as given to GpuCluster: the managed control plane's revision follows its
    releaseChannel."""


class MeshReadiness(pulumi.ComponentResource):
    """Waits until managed Cloud Service Mesh serves the cluster: give it to dependsOn of every
    component that declares Istio resources or meshed pods (MeshNamespace, TenantAuth, VllmService,
    InferencePool, LimitStore), or their sidecars are never injected."""

    revision: pulumi.Output[str]
    """The managed control plane's revision (asm-managed, asm-managed-rapid or asm-managed-stable)."""

    def __init__(self, name: str, args: MeshReadinessInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MeshReadiness", name, {}, opts)
        problems = Problems("MeshReadiness")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        problems.raise_any()
        channel = cluster.release_channel
        inner = _MeshReadiness(name, MeshReadinessArgs(kubernetes_provider(name, args["kubeconfig"], self),
                                                       channel),
                               opts=child_opts(self, opts))
        self.revision = pulumi.Output.from_input(inner.revision)
        self.register_outputs({"revision": self.revision})
