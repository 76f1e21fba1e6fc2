"""LeaderWorkerSetController: the LeaderWorkerSet API and controller (kubernetes-sigs/lws, pinned),
which runs a model replica across several nodes as one group.

Installed from the release's own manifest (the file `kubectl apply --server-side -f` installs:
namespace lws-system, the CRDs, the controller Deployment registry.k8s.io/lws/lws:v0.10.0 and its
webhooks); the provider fetches the URL at deploy time, nothing upstream is copied here, and a
later release's CRDs are applied on the next `pulumi up` (a Helm chart keeps its crds/ as first
installed). The controller fills its webhook certificate and CA bundles itself (v0.10.0
pkg/cert/cert.go), fields the manifest leaves out, so server-side apply never resets them.

Its webhooks fail closed (failurePolicy Fail) and every group pod passes them: a private
cluster's control plane must reach the controller's webhook port (9443) on the nodes, which
GKE's own firewall rule (443, 10250) does not allow, so this component opens it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .options import child_opts
from .project_apis import ProjectApis

RELEASE = "v0.10.0"
MANIFEST_URL = f"https://github.com/kubernetes-sigs/lws/releases/download/{RELEASE}/manifests.yaml"
NAMESPACE = "lws-system"
# The webhook server's pod port (config/webhook/service.yaml targetPort; see infra/contracts/lws.py).
WEBHOOK_PORT = 9443


@dataclass
class LeaderWorkerSetControllerArgs:
    project: str
    provider: k8s.Provider
    # A private cluster: its VPC and control plane range, for the webhook's firewall rule.
    network: Optional[pulumi.Input[str]] = None
    control_plane_cidr: Optional[str] = None
    apis: Optional[ProjectApis] = None
    url: str = MANIFEST_URL


class LeaderWorkerSetController(pulumi.ComponentResource):
    manifests: k8s.yaml.v2.ConfigFile

    def __init__(self, name: str, args: LeaderWorkerSetControllerArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:LeaderWorkerSetController", name, None, opts)
        deps: list[pulumi.Resource] = []
        if args.network is not None and args.control_plane_cidr:
            deps.append(gcp.compute.Firewall(
                f"{name}-control-plane", project=args.project, network=args.network, direction="INGRESS",
                description="GKE control plane to the LeaderWorkerSet admission webhooks",
                source_ranges=[args.control_plane_cidr],
                allows=[{"protocol": "tcp", "ports": [str(WEBHOOK_PORT)]}],
                opts=child_opts(self, opts, depends_on=args.apis.needs("compute.googleapis.com") if args.apis else [])))
        self.manifests = k8s.yaml.v2.ConfigFile(
            f"{name}-manifests", file=args.url,
            opts=child_opts(self, opts, provider=args.provider, depends_on=deps))
        self.register_outputs({"release": RELEASE, "namespace": NAMESPACE, "url": args.url})
