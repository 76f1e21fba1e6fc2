"""Read access to the weights bucket, narrowed to what a reader serves.

A reader (a namespace's vLLM servers, a load test) gets two grants on the bucket: a custom role
with storage.objects.list alone, unconditional (Cloud Storage FUSE lists the bucket to mount it;
listing yields names, not contents), and roles/storage.objectViewer under an IAM condition on the
objects' resource names: only the folders of its models and their adapters. IAM Conditions on a
bucket need uniform bucket-level access, which the store's bucket sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_gcp as gcp

from .model.gcs_weights import LIST_PERMISSIONS, object_condition, reader_terms, term_chunks
from .workload_identity import workload_principal


def list_role(name: str, project: str, instance_name: str, opts: pulumi.ResourceOptions) -> gcp.projects.IAMCustomRole:
    """The project's custom role that lists objects and nothing else (no predefined role holds
    storage.objects.list without storage.objects.get, bar the legacy bucket roles)."""
    return gcp.projects.IAMCustomRole(
        name, project=project, role_id=f"{instance_name.replace('-', '_')}_lister"[:64],
        title="vllm-gke weights lister", description="Lists the weights bucket (to mount it); reads nothing",
        permissions=list(LIST_PERMISSIONS), opts=opts)


def role_name(role: gcp.projects.IAMCustomRole, project: str) -> pulumi.Output[str]:
    """projects/<project>/roles/<id>, from role_id: the binding waits for the role."""
    return role.role_id.apply(lambda r: f"projects/{project}/roles/{r}")


def grant_reads(name: str, bucket: pulumi.Input[str], member: pulumi.Input[str], prefixes: Sequence[str],
                lister: pulumi.Input[str], opts: pulumi.ResourceOptions) -> list[gcp.storage.BucketIAMMember]:
    """`name`-list: the list-only role; `name` (then `name`-2, ...): objectViewer on the prefixes
    (and the names above them, which Cloud Storage FUSE looks up on the way)."""
    grants = [gcp.storage.BucketIAMMember(f"{name}-list", bucket=bucket, role=lister, member=member, opts=opts)]
    chunks = term_chunks(reader_terms(prefixes))
    for i, chunk in enumerate(chunks):
        grants.append(gcp.storage.BucketIAMMember(
            f"{name}{'' if i == 0 else f'-{i + 1}'}", bucket=bucket, role="roles/storage.objectViewer",
            member=member, opts=opts, condition={
                # Titled by the reader: in the bucket's policy the condition says whose read it is.
                "title": f"{name} {i + 1}"[:100],
                "description": ", ".join(n for op, n in chunk if op == "startsWith")[:256] or "the folders above",
                "expression": pulumi.Output.from_input(bucket).apply(lambda b, c=chunk: object_condition(b, c))}))
    return grants


@dataclass(frozen=True)
class BucketReads:
    """What a reader with its own identity (a load test) is granted to mount the weights bucket and
    open some of its folders: the bucket, its list-only role, and whose principals to name."""

    bucket: pulumi.Input[str]
    list_role: pulumi.Input[str]
    # The project's number and the cluster's Workload Identity pool: the reader's principal.
    project_number: pulumi.Input[str]
    workload_pool: pulumi.Input[str]

    def grant(self, name: str, namespace: pulumi.Input[str], service_account: str, prefixes: Sequence[str],
              opts: pulumi.ResourceOptions) -> list[gcp.storage.BucketIAMMember]:
        member = workload_principal(self.project_number, self.workload_pool, namespace, service_account)
        return grant_reads(name, self.bucket, member, prefixes, self.list_role, opts)
