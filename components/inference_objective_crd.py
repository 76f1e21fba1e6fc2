"""InferenceObjectiveCrd: the one Inference Gateway API GKE does not install.

GKE installs the GA InferencePool CRD itself from 1.34.0-gke.1626000 (llm-d's GKE guide: "GKE
automatically installs all GA CRDs"); InferenceObjective (inference.networking.x-k8s.io/v1alpha2)
is alpha, and the v1.2.0 endpoint picker watches it, so the stack applies it from the upstream
release it pins - the same file `kubectl apply -k config/crd` installs. The provider fetches
the URL at deploy time; nothing upstream is copied into this repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from .options import child_opts

RELEASE = "v1.2.0"
CRD_URL = ("https://raw.githubusercontent.com/kubernetes-sigs/gateway-api-inference-extension/"
           f"{RELEASE}/config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml")


@dataclass
class InferenceObjectiveCrdArgs:
    provider: k8s.Provider
    url: str = CRD_URL


class InferenceObjectiveCrd(pulumi.ComponentResource):
    crd: k8s.yaml.v2.ConfigFile

    def __init__(self, name: str, args: InferenceObjectiveCrdArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:InferenceObjectiveCrd", name, None, opts)
        self.crd = k8s.yaml.v2.ConfigFile(f"{name}-crd", file=args.url,
                                          opts=child_opts(self, opts, provider=args.provider))
        self.register_outputs({"url": args.url})
