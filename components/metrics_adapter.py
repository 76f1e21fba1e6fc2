"""MetricsAdapter: the Custom Metrics Stackdriver Adapter, so HPAs can read Managed Prometheus.

Without it an HPA on `prometheus.googleapis.com|vllm:num_requests_waiting|gauge` never gets a
value and silently stays at minReplicas. This is GKE's published adapter deployment (new
resource model), with its Google identity through Workload Identity instead of node scopes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from vllm_gke.components.k8s_meta import meta
from vllm_gke.components.options import child_opts
from vllm_gke.components.project_apis import ProjectApis
from vllm_gke.components.specs import ImageRef

NAMESPACE = "custom-metrics"
NAME = "custom-metrics-stackdriver-adapter"
RBAC = "rbac.authorization.k8s.io"
DEFAULT_IMAGE = ImageRef(repository="gcr.io/gke-release/custom-metrics-stackdriver-adapter", tag="v0.15.2-gke.1")


@dataclass
class MetricsAdapterArgs:
    project: str
    provider: k8s.Provider
    # GpuCluster.workload_pool: the binding must wait for the cluster that creates the pool.
    workload_pool: pulumi.Input[str]
    # A valid service account id (components.gcp_names.service_account_id derives one).
    gsa_name: str = "metrics-adapter"
    image: ImageRef = DEFAULT_IMAGE
    apis: Optional[ProjectApis] = None


class MetricsAdapter(pulumi.ComponentResource):
    def __init__(self, name: str, args: MetricsAdapterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MetricsAdapter", name, None, opts)
        apis = args.apis

        def gcp_opts(*api_names: str) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=apis.needs(*api_names) if apis else [])

        k8s_opts = child_opts(self, opts, provider=args.provider)

        gsa = gcp.serviceaccount.Account(
            f"{name}-gsa", account_id=args.gsa_name, project=args.project,
            display_name="Custom Metrics Stackdriver Adapter (reads Cloud Monitoring)",
            opts=gcp_opts("iam.googleapis.com"))
        gcp.projects.IAMMember(f"{name}-monitoring-viewer", project=args.project, role="roles/monitoring.viewer",
                               member=gsa.email.apply(lambda e: f"serviceAccount:{e}"),
                               opts=gcp_opts("cloudresourcemanager.googleapis.com"))
        gcp.serviceaccount.IAMMember(
            f"{name}-wi", service_account_id=gsa.name, role="roles/iam.workloadIdentityUser",
            member=pulumi.Output.from_input(args.workload_pool).apply(
                lambda pool: f"serviceAccount:{pool}[{NAMESPACE}/{NAME}]"),
            opts=gcp_opts("iam.googleapis.com"))

        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        namespace = ns.metadata.name
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-ksa", metadata={**meta(NAME), "namespace": namespace,
                                     "annotations": {"iam.gke.io/gcp-service-account": gsa.email}},
            opts=k8s_opts)
        subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]

        def role_ref(kind: str, role: str) -> dict:
            return {"apiGroup": RBAC, "kind": kind, "name": role}

        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-auth-delegator", metadata=meta("custom-metrics:system:auth-delegator"),
            role_ref=role_ref("ClusterRole", "system:auth-delegator"), subjects=subject, opts=k8s_opts)
        k8s.rbac.v1.RoleBinding(
            f"{name}-auth-reader", metadata={**meta("custom-metrics-auth-reader"), "namespace": "kube-system"},
            role_ref=role_ref("Role", "extension-apiserver-authentication-reader"), subjects=subject,
            opts=k8s_opts)
        reader = k8s.rbac.v1.ClusterRole(
            f"{name}-resource-reader", metadata=meta("custom-metrics-resource-reader"),
            rules=[{"apiGroups": [""], "resources": ["pods", "nodes", "nodes/stats"],
                    "verbs": ["get", "list", "watch"]}], opts=k8s_opts)
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-resource-reader-binding", metadata=meta("custom-metrics-resource-reader"),
            role_ref=role_ref("ClusterRole", "custom-metrics-resource-reader"), subjects=subject,
            opts=child_opts(self, opts, provider=args.provider, depends_on=[reader]))
        # The HPA controller reads external metrics through this role.
        external = k8s.rbac.v1.ClusterRole(
            f"{name}-external-reader", metadata=meta("external-metrics-reader"),
            rules=[{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"],
                    "verbs": ["list", "get", "watch"]}], opts=k8s_opts)
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-external-reader-binding", metadata=meta("external-metrics-reader"),
            role_ref=role_ref("ClusterRole", "external-metrics-reader"),
            subjects=[{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[external]))

        labels = {"k8s-app": NAME}
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata={**meta(NAME, labels=labels), "namespace": namespace},
            spec={
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "serviceAccountName": sa.metadata.name,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "pod-custom-metrics-stackdriver-adapter",
                        "image": args.image.uri,
                        "command": ["/adapter", "--use-new-resource-model=true",
                                    "--fallback-for-container-metrics=true"],
                        "resources": {"requests": {"cpu": "250m", "memory": "200Mi"},
                                      "limits": {"cpu": "250m", "memory": "200Mi"}},
                        # It serves the aggregated API on 443: that one capability, nothing else.
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                    }],
                }},
            }, opts=k8s_opts)
        service = k8s.core.v1.Service(
            f"{name}-svc", metadata={**meta(NAME, labels=labels), "namespace": namespace},
            spec={"type": "ClusterIP", "selector": labels,
                  "ports": [{"port": 443, "protocol": "TCP", "targetPort": 443}]}, opts=k8s_opts)
        for group, version, priority in (("custom.metrics.k8s.io", "v1beta1", 100),
                                         ("custom.metrics.k8s.io", "v1beta2", 200),
                                         ("external.metrics.k8s.io", "v1beta1", 100)):
            k8s.apiregistration.v1.APIService(
                f"{name}-api-{group.split('.')[0]}-{version}", metadata=meta(f"{version}.{group}"),
                spec={"group": group, "version": version, "groupPriorityMinimum": 100,
                      "versionPriority": priority, "insecureSkipTLSVerify": True,
                      "service": {"name": NAME, "namespace": NAMESPACE}},
                opts=child_opts(self, opts, provider=args.provider, depends_on=[service]))

        self.register_outputs({"namespace": namespace, "serviceAccount": gsa.email})
