"""InferenceObjectiveCrd, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..inference_objective_crd import InferenceObjectiveCrd as _InferenceObjectiveCrd
from ..inference_objective_crd import InferenceObjectiveCrdArgs
from .convert import kubernetes_provider
from .facade import LATER, Facade


class InferenceObjectiveCrdInputs(TypedDict):
    """Inputs of InferenceObjectiveCrd."""

    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""


class InferenceObjectiveCrd(_InferenceObjectiveCrd, Facade):
    """llm-d-router v0.10.0's InferenceObjective and InferenceModelRewrite CRDs (llm-d.ai), once per
    cluster, with v1.2.0's objective CRD kept for a rollback: GKE provides InferencePool's CRD, not
    these. Give it to dependsOn of every InferencePool; it
    outlives any one pool (deleting it would delete every pool's objectives)."""

    url: str
    """Where the objective CRD's manifest comes from (the pinned release)."""

    def __init__(self, name: str, args: InferenceObjectiveCrdInputs, opts: Optional[pulumi.ResourceOptions] = None):
        self.inputs, self.args = args, InferenceObjectiveCrdArgs(LATER)
        super().__init__(name, self.args, opts)
        self.url = self.args.urls[0]

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
