"""InferenceObjectiveCrd: the Inference Gateway APIs GKE does not install - llm-d-router v0.10.0's
InferenceObjective and InferenceModelRewrite (group llm-d.ai).

GKE installs the GA InferencePool CRD itself from 1.34.0-gke.1626000 (llm-d's GKE guide: "GKE
automatically installs all GA CRDs"); the llm-d.ai kinds are alpha, and the picker reads them only
if their CRD exists when it starts (pkg/epp/server/controller_config.go:71-88, probed once,
cmd/epp/runner/runner.go:361-366), so every pool waits for this component. The stack applies the
files the release's `make artifacts` bundles (config/crd/bases); the provider fetches each URL at
deploy time; nothing upstream is copied into this repository.

gateway-api-inference-extension v1.2.0's InferenceObjective CRD (inference.networking.x-k8s.io)
stays declared for one release: deleting a CRD deletes its objects, and a rollback to the v1.2.0
picker reads only that group. With both installed the v0.10.0 picker reads llm-d.ai's and ignores
the old group (controller_config.go:74-79).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from .options import child_opts

RELEASE = "v0.10.0"
LLMD_BASE = f"https://raw.githubusercontent.com/llm-d/llm-d-router/{RELEASE}/config/crd/bases"
CRD_URLS = (f"{LLMD_BASE}/llm-d.ai_inferenceobjectives.yaml", f"{LLMD_BASE}/llm-d.ai_inferencemodelrewrites.yaml")
LEGACY_RELEASE = "v1.2.0"
LEGACY_CRD_URL = ("https://raw.githubusercontent.com/kubernetes-sigs/gateway-api-inference-extension/"
                  f"{LEGACY_RELEASE}/config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml")
# The objective CRD's URL (the one the InferenceObjectives need).
CRD_URL = CRD_URLS[0]


@dataclass
class InferenceObjectiveCrdArgs:
    provider: k8s.Provider
    # llm-d-router's CRDs, by URL at the pinned tag.
    urls: tuple[str, ...] = field(default=CRD_URLS)
    # The v1.2.0 objective CRD, kept for a rollback ("" drops it: its objects go with it).
    legacy_url: str = LEGACY_CRD_URL


class InferenceObjectiveCrd(pulumi.ComponentResource):
    crd: k8s.yaml.v2.ConfigFile
    crds: list[k8s.yaml.v2.ConfigFile]

    def __init__(self, name: str, args: InferenceObjectiveCrdArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:InferenceObjectiveCrd", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.crds = [k8s.yaml.v2.ConfigFile(f"{name}-llmd-{url.rsplit('_', 1)[-1].removesuffix('.yaml')}", file=url,
                                            opts=k8s_opts) for url in args.urls]
        self.crd = self.crds[0]
        if args.legacy_url:
            # The same logical name as before: a stack coming from v1.2.0 keeps it untouched.
            k8s.yaml.v2.ConfigFile(f"{name}-crd", file=args.legacy_url, opts=k8s_opts)
        self.register_outputs({"urls": list(args.urls), "legacyUrl": args.legacy_url})


# The llm-d.ai CRDs' installer under the name of what it installs.
LlmdCrds = InferenceObjectiveCrd
