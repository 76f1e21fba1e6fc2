"""MeshReadiness, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from vllm_gke.components.mesh_readiness import REVISIONS, MeshReadinessArgs
from vllm_gke.components.mesh_readiness import MeshReadiness as _MeshReadiness
from vllm_gke.components.options import child_opts
from vllm_gke.components.provider.convert import Problems, kubernetes_provider, plain
from vllm_gke.components.provider.types import ReleaseChannel


class MeshReadinessInputs(TypedDict):
    """Inputs of MeshReadiness."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    release_channel: NotRequired[ReleaseChannel]
    """The cluster's release channel (cluster.releaseChannel): the managed control plane's revision
    follows it (default REGULAR)."""


class MeshReadiness(pulumi.ComponentResource):
    """Waits until managed Cloud Service Mesh serves the cluster: give it to dependsOn of every
    component that declares Istio resources or meshed pods (MeshNamespace, TenantAuth, VllmService,
    InferencePool, LimitStore), or their sidecars are never injected."""

    revision: pulumi.Output[str]
    """The managed control plane's revision (asm-managed, asm-managed-rapid or asm-managed-stable)."""

    def __init__(self, name: str, args: MeshReadinessInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MeshReadiness", name, {}, opts)
        problems = Problems("MeshReadiness")
        channel = plain(args.get("release_channel")) or "REGULAR"
        if channel not in REVISIONS:
            problems.add("releaseChannel", f"'{channel}' must be one of {', '.join(REVISIONS)}")
        problems.raise_any()
        inner = _MeshReadiness(name, MeshReadinessArgs(kubernetes_provider(name, args["kubeconfig"], self),
                                                       channel),  # type: ignore[arg-type]
                               opts=child_opts(self, opts))
        self.revision = pulumi.Output.from_input(inner.revision)
        self.register_outputs({"revision": self.revision})
