"""Workload Identity Federation principals: a Kubernetes service account as an IAM member."""

from __future__ import annotations

from typing import Callable

import pulumi
import pulumi_gcp as gcp


def workload_principal(project_number: pulumi.Input[str], workload_pool: pulumi.Input[str],
                       namespace: pulumi.Input[str], service_account: str) -> pulumi.Output[str]:
    """The Workload Identity Federation principal of a Kubernetes service account, for IAM
    bindings on a resource (no Google service account in between)."""
    return pulumi.Output.all(project_number, workload_pool, namespace).apply(lambda a: (
        f"principal://iam.googleapis.com/projects/{a[0]}/locations/global/workloadIdentityPools/"
        f"{a[1]}/subject/ns/{a[2]}/sa/{service_account}"))


def monitoring_reader(prefix: str, project: str, account_id: str, display_name: str,
                      workload_pool: pulumi.Input[str], namespace: str, service_account: str,
                      gcp_opts: Callable[[str], pulumi.ResourceOptions]
                      ) -> tuple[gcp.serviceaccount.Account, gcp.serviceaccount.IAMMember]:
    """A Google service account that may read monitoring data and nothing else
    (roles/monitoring.viewer), and the Workload Identity binding that lets the Kubernetes service
    account `namespace/service_account` act as it: for clients that query Managed Prometheus with
    Google credentials (KEDA's operator, GMP's PromQL frontend). `gcp_opts(api)`: a child's options
    waiting for that API."""
    gsa = gcp.serviceaccount.Account(
        f"{prefix}-gsa", account_id=account_id, project=project, display_name=display_name,
        opts=gcp_opts("iam.googleapis.com"))
    gcp.projects.IAMMember(
        f"{prefix}-monitoring-viewer", project=project, role="roles/monitoring.viewer",
        member=gsa.email.apply(lambda e: f"serviceAccount:{e}"), opts=gcp_opts("cloudresourcemanager.googleapis.com"))
    binding = gcp.serviceaccount.IAMMember(
        f"{prefix}-wi", service_account_id=gsa.name, role="roles/iam.workloadIdentityUser",
        member=pulumi.Output.from_input(workload_pool).apply(
            lambda pool: f"serviceAccount:{pool}[{namespace}/{service_account}]"),
        opts=gcp_opts("iam.googleapis.com"))
    return gsa, binding
