"""LimitStore, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..limit_store import LimitStore as _LimitStore
from ..limit_store import LimitStoreArgs
from ..model.specs import ImageRef as ImageModel
from ..options import child_opts
from .convert import Problems, kubernetes_provider
from .types import ImageRef


class LimitStoreInputs(TypedDict):
    """Inputs of LimitStore."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    client_namespaces: list[str]
    """The namespaces whose servers (service account vllm-server) count limits here; nothing else may connect."""
    image: ImageRef
    """A Redis 7 image (globalLimits.image in a stack's config)."""


class LimitStore(pulumi.ComponentResource):
    """One Redis per cluster, in its own mesh namespace, that counts each tenant's rate limits across
    all replicas (VllmService globalLimits: true); only the servers of the client namespaces reach it."""

    host: pulumi.Output[str]
    """The store's cluster address (the servers' guards find it there)."""

    def __init__(self, name: str, args: LimitStoreInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:LimitStore", name, {}, opts)
        problems = Problems("LimitStore")
        image = problems.spec(ImageModel, args.get("image"), "image")
        if not args.get("client_namespaces"):
            problems.add("clientNamespaces", "none given, so no server could count limits here; list the namespaces "
                         "of the servers (MeshNamespace.name)")
        problems.raise_any()
        inner = _LimitStore(name, LimitStoreArgs(kubernetes_provider(name, args["kubeconfig"], self),
                                                 list(args["client_namespaces"]), image),
                            opts=child_opts(self, opts))
        self.host = pulumi.Output.from_input(inner.host)
        self.register_outputs({"host": self.host})
