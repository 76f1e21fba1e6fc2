"""MeshReadiness: a Job that completes once the managed Cloud Service Mesh serves the cluster.

The fleet accepts `MANAGEMENT_AUTOMATIC` at once and provisions the control plane
asynchronously: the Istio CRDs and the sidecar-injection webhook appear minutes later. Created
before then, an Istio custom resource fails (no such kind) and a serving pod starts without its
Envoy sidecar, i.e. with no JWT check at all. Pulumi waits for a Job to succeed, so everything
that needs the mesh depends on this Job:
  - init containers wait until the Istio CRDs the platform uses are Established;
  - the main container waits for the ControlPlaneRevision's ProvisioningFinished condition,
    the check asmcli itself runs (`kubectl wait --for=condition=ProvisioningFinished
    controlplanerevision <rev> -n istio-system`).
`kubectl wait` fails at once while a CRD or object does not exist yet; the Job retries it.
The revision follows the cluster's release channel (asm-managed, -rapid, -stable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, deny_all_ingress, meta
from .model.specs import ImageRef
from .options import child_opts

NAMESPACE = "vllm-gke-mesh-check"
NAME = "mesh-ready"
# registry.k8s.io publishes kubectl alone (distroless: no shell, so no script to inject into).
KUBECTL_IMAGE = ImageRef(repository="registry.k8s.io/kubectl", tag="v1.33.5")
ISTIO_CRDS = (
    "requestauthentications.security.istio.io",
    "authorizationpolicies.security.istio.io",
    "serviceentries.networking.istio.io",
    "destinationrules.networking.istio.io",
)
REVISIONS = {"REGULAR": "asm-managed", "RAPID": "asm-managed-rapid", "STABLE": "asm-managed-stable"}
TIMEOUT = "20m"
# kubectl caches discovery in $KUBECACHEDIR, else $HOME/.kube/cache (cli-runtime v0.33.5
# pkg/genericclioptions/config_flags.go:303-309); on the read-only root filesystem it would
# re-run full discovery on every retry. An emptyDir shared by both containers holds it.
CACHE_DIR = "/kube-cache"


@dataclass
class MeshReadinessArgs:
    provider: k8s.Provider
    release_channel: Literal["REGULAR", "RAPID", "STABLE"] = "REGULAR"
    image: ImageRef = KUBECTL_IMAGE


def kubectl_container(name: str, image: str, args: list[str]) -> dict[str, Any]:
    """A kubectl container of a readiness Job: hardened, its discovery cache on the `kube-cache` volume."""
    return {
        "name": name, "image": image, "command": ["kubectl"], "args": args,
        "env": [{"name": "KUBECACHEDIR", "value": CACHE_DIR}],
        "volumeMounts": [{"name": "kube-cache", "mountPath": CACHE_DIR}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": 65532, "capabilities": {"drop": ["ALL"]}},
    }


def readiness_job_spec(service_account: str, containers: list[dict[str, Any]], deadline_seconds: int,
                       init_containers: Sequence[dict[str, Any]] = (),
                       volumes: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A Job that retries kubectl until what it checks holds: on the system pool, outside the
    mesh, with the `kube-cache` volume kubectl_container mounts (and `volumes` of its own)."""
    return {
        "backoffLimit": 30,
        "activeDeadlineSeconds": deadline_seconds,
        "template": {
            "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
            "spec": {
                "serviceAccountName": service_account,
                "restartPolicy": "OnFailure",
                "nodeSelector": {"vllm-gke.io/role": "system"},
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                **({"initContainers": list(init_containers)} if init_containers else {}),
                "containers": containers,
                "volumes": [{"name": "kube-cache", "emptyDir": {"sizeLimit": "64Mi"}}, *volumes],
            },
        },
    }


class MeshReadiness(pulumi.ComponentResource):
    """Depend on `job` (or on this component) before Istio resources and meshed pods."""

    job: k8s.batch.v1.Job
    revision: str

    def __init__(self, name: str, args: MeshReadinessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MeshReadiness", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.revision = REVISIONS[args.release_channel]
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        # The check serves nothing and sits outside the mesh: nothing may connect to it.
        deny_all_ingress(f"{name}-deny-ingress", ns.metadata.name, k8s_opts)
        sa = k8s.core.v1.ServiceAccount(f"{name}-ksa", metadata={**meta(NAME), "namespace": ns.metadata.name},
                                        opts=k8s_opts)
        # Read-only, and only the two kinds it waits on.
        role = k8s.rbac.v1.ClusterRole(
            f"{name}-reader", metadata=meta("vllm-gke-mesh-ready-reader"),
            rules=api_body([{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                             "resourceNames": list(ISTIO_CRDS), "verbs": ["get", "list", "watch"]},
                            {"apiGroups": ["mesh.cloud.google.com"], "resources": ["controlplanerevisions"],
                             "verbs": ["get", "list", "watch"]}]),
            opts=k8s_opts)
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-reader-binding", metadata=meta("vllm-gke-mesh-ready-reader"),
            role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.metadata.name}),
            subjects=[{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[sa]))
        image = args.image.uri
        self.job = k8s.batch.v1.Job(
            f"{name}-job",
            metadata={**meta(NAME, annotations={"pulumi.com/timeoutSeconds": "2400"}),
                      "namespace": ns.metadata.name},
            spec=api_body(readiness_job_spec(NAME, [kubectl_container("control-plane", image, [
                "wait", "--for=condition=ProvisioningFinished", f"--timeout={TIMEOUT}",
                "-n", "istio-system", f"controlplanerevision/{self.revision}"])], 2400,
                init_containers=[kubectl_container("istio-crds", image, [
                    "wait", "--for=condition=Established", f"--timeout={TIMEOUT}",
                    *(f"crd/{c}" for c in ISTIO_CRDS)])])),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[binding],
                            custom_timeouts=pulumi.CustomTimeouts(create="40m", update="40m")))
        self.register_outputs({"revision": self.revision, "job": self.job.metadata.name})
