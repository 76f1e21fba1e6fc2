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
GKE's own firewall rule (443, 10250) does not allow, so this component opens it. The controller's
Deployment is Ready before its webhooks serve (its readiness check is a bare ping, v0.10.0
cmd/main.go:258; the certificate comes later), so a Job waits until a server-side dry run of a
LeaderWorkerSet passes them: whatever depends on this component creates its sets after that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, meta
from .mesh_readiness import KUBECTL_IMAGE, kubectl_container, readiness_job_spec
from .options import child_opts
from .project_apis import ProjectApis

RELEASE = "v0.10.0"
MANIFEST_URL = f"https://github.com/kubernetes-sigs/lws/releases/download/{RELEASE}/manifests.yaml"
NAMESPACE = "lws-system"
# The webhook server's pod port (config/webhook/service.yaml targetPort; see infra/contracts/lws.py).
WEBHOOK_PORT = 9443
READY_JOB = "lws-webhook-ready"
# What the dry run submits: the smallest set the validating and defaulting webhooks accept.
PROBE = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
         "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
         "spec": {"leaderWorkerTemplate": {"size": 1, "workerTemplate": {"spec": {"containers": [
             {"name": "probe", "image": "registry.k8s.io/pause:3.10"}]}}}}}


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
        after = child_opts(self, opts, provider=args.provider, depends_on=[self.manifests])
        probe = k8s.core.v1.ConfigMap(f"{name}-probe", metadata=meta(READY_JOB, NAMESPACE),
                                      data={"probe.json": json.dumps(PROBE, sort_keys=True)}, opts=after)
        sa = k8s.core.v1.ServiceAccount(f"{name}-ready-ksa", metadata=meta(READY_JOB, NAMESPACE), opts=after)
        # Dry-run creates of sets in its own namespace: nothing is ever stored.
        role = k8s.rbac.v1.Role(f"{name}-ready-role", metadata=meta(READY_JOB, NAMESPACE), rules=api_body([
            {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["create"]}]),
            opts=after)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-ready-binding", metadata=meta(READY_JOB, NAMESPACE),
            role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": READY_JOB}),
            subjects=[{"kind": "ServiceAccount", "name": READY_JOB, "namespace": NAMESPACE}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[role, sa]))
        container = kubectl_container("webhook", KUBECTL_IMAGE.uri,
                                      ["create", "--dry-run=server", "-f", "/probe/probe.json"])
        container["volumeMounts"] = [*container["volumeMounts"], {"name": "probe", "mountPath": "/probe",
                                                                  "readOnly": True}]
        self.ready = k8s.batch.v1.Job(
            f"{name}-ready", metadata=meta(READY_JOB, NAMESPACE, annotations={"pulumi.com/timeoutSeconds": "1200"}),
            spec=api_body(readiness_job_spec(READY_JOB, [container], 1200,
                                             volumes=[{"name": "probe", "configMap": {"name": READY_JOB}}])),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[binding, probe],
                            custom_timeouts=pulumi.CustomTimeouts(create="20m", update="20m")))
        self.register_outputs({"release": RELEASE, "namespace": NAMESPACE, "url": args.url,
                               "readyJob": self.ready.metadata.name})
