"""Keda: the KEDA operator (Helm chart, pinned), so serving pools can scale to zero and back.

An HPA cannot go below one replica; KEDA can, and it reads its triggers from Managed
Prometheus through the GMP query API (monitoring.googleapis.com), authenticated as a Google
service account through Workload Identity (the chart's podIdentity.gcp, KEDA's "GCP Workload
Identity" authentication provider). The account may read monitoring data and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from vllm_gke.components.k8s_meta import custom_resource, meta
from vllm_gke.components.options import child_opts
from vllm_gke.components.project_apis import ProjectApis

CHART_VERSION = "2.20.2"
CHART_REPO = "https://kedacore.github.io/charts"
NAMESPACE = "keda"
OPERATOR_SA = "keda-operator"
# The ClusterTriggerAuthentication ScaledObjects use to query Managed Prometheus.
GMP_AUTH = "gmp-workload-identity"


def gmp_query_url(project: str) -> str:
    """Managed Prometheus' Prometheus-compatible query API for a project."""
    return f"https://monitoring.googleapis.com/v1/projects/{project}/location/global/prometheus"


@dataclass
class KedaArgs:
    project: str
    provider: k8s.Provider
    # The cluster's Workload Identity pool (GpuCluster.workload_pool).
    workload_pool: pulumi.Input[str]
    gsa_name: str
    apis: Optional[ProjectApis] = None


class Keda(pulumi.ComponentResource):
    release: k8s.helm.v3.Release
    auth_name: str = GMP_AUTH

    def __init__(self, name: str, args: KedaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Keda", name, None, opts)
        apis = args.apis

        def gcp_opts(*api_names: str) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=apis.needs(*api_names) if apis else [])

        gsa = gcp.serviceaccount.Account(
            f"{name}-gsa", account_id=args.gsa_name, project=args.project,
            display_name="KEDA: reads Managed Prometheus to scale serving pools", opts=gcp_opts("iam.googleapis.com"))
        gcp.projects.IAMMember(
            f"{name}-monitoring-viewer", project=args.project, role="roles/monitoring.viewer",
            member=gsa.email.apply(lambda e: f"serviceAccount:{e}"), opts=gcp_opts("cloudresourcemanager.googleapis.com"))
        binding = gcp.serviceaccount.IAMMember(
            f"{name}-wi", service_account_id=gsa.name, role="roles/iam.workloadIdentityUser",
            member=pulumi.Output.from_input(args.workload_pool).apply(
                lambda pool: f"serviceAccount:{pool}[{NAMESPACE}/{OPERATOR_SA}]"),
            opts=gcp_opts("iam.googleapis.com"))
        k8s_opts = child_opts(self, opts, provider=args.provider)
        namespace = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release", name="keda", chart="keda", version=CHART_VERSION,
            repository_opts={"repo": CHART_REPO}, namespace=namespace.metadata.name,
            values={"podIdentity": {"gcp": {"enabled": True, "gcpIAMServiceAccount": gsa.email}},
                    "serviceAccount": {"operator": {"name": OPERATOR_SA}}},
            # The operator must not start before it may use its Google identity.
            opts=child_opts(self, opts, provider=args.provider, depends_on=[binding]))
        custom_resource(
            f"{name}-gmp-auth", "keda.sh/v1alpha1", "ClusterTriggerAuthentication", meta(GMP_AUTH),
            {"podIdentity": {"provider": "gcp"}},
            child_opts(self, opts, provider=args.provider, depends_on=[self.release]))
        self.register_outputs({"chartVersion": CHART_VERSION, "namespace": NAMESPACE, "auth": GMP_AUTH})
