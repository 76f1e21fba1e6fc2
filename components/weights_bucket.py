"""The weights bucket: what both bucket backends share (BucketStorage), and the `gcs` backend, whose
servers mount the bucket through the GKE Cloud Storage FUSE CSI driver (GcsWeights).

The loaders write the bucket through Cloud Storage FUSE, or copy gs:// sources into it
server-side. Every reader lists it (a custom list-only role: Cloud Storage FUSE lists a bucket to
mount it) and opens only the folders it serves (bucket_readers.py).
"""

from __future__ import annotations

import math
from typing import Any

import pulumi
import pulumi_gcp as gcp

from . import bucket_readers
from .model import gcs_weights
from .model.gcp_names import bucket_name
from .model.specs import ModelSpec
from .model.vllm_versions import VllmRelease
from .model.weights_backends import STORAGE_API
from .model.weights_layout import LOADER_UID, SERVER_SA, SERVER_UID, WeightCopy, bucket_folder, loader_command, weight_copies
from .model.weights_mount import WeightsMount, bucket_mount, tokenizer_mount, writable_mount
from .weights_storage import ReaderWeights, StoreSite, WeightsStorage


class BucketStorage(WeightsStorage):
    bucket: gcp.storage.Bucket
    # Lists the bucket, reads nothing: what every bucket reader (servers, load tests) mounts it with.
    list_role: pulumi.Output[str]
    # The project's number: the bucket's Workload Identity principals name it.
    project_number: pulumi.Output[str]

    def __init__(self, site: StoreSite):
        args = site.args
        self.site = site
        self.location = args.region
        # What the bucket holds, GB (it has no capacity to provision).
        self.tier, self.capacity_gb = args.weights.backend, math.ceil(sum(c.weights_gb for c in weight_copies(args.models)))
        self.server_ip = pulumi.Output.from_input("")
        self.bucket = gcp.storage.Bucket(
            f"{site.name}-bucket", name=args.weights.bucket or bucket_name(args.project, site.instance_name),
            project=args.project, location=args.region.upper(), uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            # Cloud Storage FUSE lists and renames faster on a hierarchical namespace (GKE's guide).
            hierarchical_namespace={"enabled": True}, force_destroy=False,
            opts=site.gcp_opts(STORAGE_API, protect=args.protect))
        self.project_number = gcp.organizations.get_project_output(project_id=args.project).number
        # Writes the weights into the bucket, nothing else anywhere.
        self.loader_grants = [gcp.storage.BucketIAMMember(
            f"{site.name}-loader-bucket", bucket=self.bucket.name, role="roles/storage.objectUser",
            member=site.loader_member, opts=site.gcp_opts(STORAGE_API))]
        self.list_role = bucket_readers.role_name(bucket_readers.list_role(
            f"{site.name}-lister", args.project, site.instance_name, site.gcp_opts("iam.googleapis.com")), args.project)
        self.reads = bucket_readers.BucketReads(self.bucket.name, self.list_role, self.project_number, args.workload_pool)
        self.loader_mount = writable_mount(gcs_weights.weights_volume(self.bucket.name, read_only=False, uid=LOADER_UID),
                                           gcs_weights.POD_ANNOTATIONS, through_fuse=True)

    def dest_uri(self, copy: WeightCopy) -> pulumi.Output[str]:
        """The copy's folder in the bucket, where the loader copies gs:// sources server-side."""
        return pulumi.Output.concat("gs://", self.bucket.name, "/", bucket_folder(copy))

    def loader_command(self, copy: WeightCopy, release: VllmRelease) -> list[Any]:
        return loader_command(copy, release, dest_uri=self.dest_uri(copy))

    def reader_for(self, consumer: str, model: ModelSpec) -> ReaderWeights:
        """The bucket as the servers would mount it, without the file cache; the reader's identity
        gets the list role and the reads it names."""
        volume = gcs_weights.weights_volume(self.bucket.name, read_only=True, uid=SERVER_UID)
        return ReaderWeights(tokenizer_mount(volume, gcs_weights.POD_ANNOTATIONS), self.reads)


class GcsWeights(BucketStorage):
    def __init__(self, site: StoreSite):
        super().__init__(site)
        # Readers: the vLLM servers of each consumer namespace (their own service account,
        # SERVER_SA - not the namespace's default, which the standby and anything else there
        # would share), by Workload Identity Federation principal, this bucket only: they list
        # it, and open only the folders of the models the namespace serves and their adapters.
        # The pool is the cluster's output: the bindings wait for the cluster that creates it.
        for key, ns in site.args.consumer_namespaces.items():
            self.reads.grant(f"{site.name}-reader-{key}", ns, SERVER_SA, gcs_weights.reader_prefixes(site.served(key)),
                             site.gcp_opts(STORAGE_API))
        self.weights_volume = gcs_weights.weights_volume(self.bucket.name, read_only=True, uid=SERVER_UID)

    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        return bucket_mount(self.weights_volume, model, gcs_weights.MESHED_POD_ANNOTATIONS)
