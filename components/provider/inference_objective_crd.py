"""InferenceObjectiveCrd, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..inference_objective_crd import CRD_URL, InferenceObjectiveCrdArgs
from ..inference_objective_crd import InferenceObjectiveCrd as _InferenceObjectiveCrd
from ..options import child_opts
from .convert import kubernetes_provider


class InferenceObjectiveCrdInputs(TypedDict):
    """Inputs of InferenceObjectiveCrd."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""


class InferenceObjectiveCrd(pulumi.ComponentResource):
    """The InferenceObjective CRD (gateway-api-inference-extension v1.2.0), once per cluster: GKE
    provides InferencePool's CRD, not this one. Give it to dependsOn of every InferencePool; it
    outlives any one pool (deleting it would delete every pool's objectives)."""

    url: pulumi.Output[str]
    """Where the CRD's manifest comes from (the pinned release)."""

    def __init__(self, name: str, args: InferenceObjectiveCrdInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:InferenceObjectiveCrd", name, {}, opts)
        _InferenceObjectiveCrd(name, InferenceObjectiveCrdArgs(kubernetes_provider(name, args["kubeconfig"], self)),
                               opts=child_opts(self, opts))
        self.url = pulumi.Output.from_input(CRD_URL)
        self.register_outputs({"url": self.url})
