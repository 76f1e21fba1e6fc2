"""Workload Identity Federation principals: a Kubernetes service account as an IAM member."""

from __future__ import annotations

import pulumi


def workload_principal(project_number: pulumi.Input[str], workload_pool: pulumi.Input[str],
                       namespace: pulumi.Input[str], service_account: str) -> pulumi.Output[str]:
    """The Workload Identity Federation principal of a Kubernetes service account, for IAM
    bindings on a resource (no Google service account in between)."""
    return pulumi.Output.all(project_number, workload_pool, namespace).apply(lambda a: (
        f"principal://iam.googleapis.com/projects/{a[0]}/locations/global/workloadIdentityPools/"
        f"{a[1]}/subject/ns/{a[2]}/sa/{service_account}"))
