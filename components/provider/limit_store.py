"""LimitStore, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..limit_store import LimitStore as _LimitStore
from ..limit_store import LimitStoreArgs
from ..model.specs import ImageRef as ImageModel
from .convert import kubernetes_provider, named_inputs, to_spec
from .facade import LATER, Facade
from .types import ImageRef


class LimitStoreInputs(TypedDict):
    """Inputs of LimitStore."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    client_namespaces: list[str]
    """The namespaces whose servers (service account vllm-server) count limits here; nothing else may connect."""
    image: ImageRef
    """A Redis 7 image (globalLimits.image in a stack's config)."""


class LimitStore(_LimitStore, Facade):
    """One Redis per cluster, in its own mesh namespace, that counts each tenant's rate limits across
    all replicas (VllmService globalLimits: true); only the servers of the client namespaces reach it."""

    host: str
    """The store's cluster address (the servers' guards find it there)."""

    def __init__(self, name: str, args: LimitStoreInputs, opts: Optional[pulumi.ResourceOptions] = None):
        image = to_spec(ImageModel, args.get("image"), "LimitStore", "image")
        self.inputs, self.args = args, LimitStoreArgs(LATER, list(args.get("client_namespaces") or []), image)
        with named_inputs("LimitStore"):
            super().__init__(name, self.args, opts)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
