"""The weights backends (weights.backend) as facts: what the cluster, the APIs, the config rules,
the cold-start estimate and the load test need to know of each, so none of them compares the
backend's name. The resources each backend declares are its own module's (components/
weights_filestore.py, weights_bucket.py, hyperdisk_weights.py; ModelStore composes them).

- filestore     one Filestore share (NFS), a ReadOnlyMany claim onto it in every consumer namespace
- gcs           a Cloud Storage bucket the servers mount through the GKE Cloud Storage FUSE CSI
                driver, with a file cache on the node's disk
- hyperdisk-ml  that bucket, and Hyperdisk ML disks (one per weight set and zone) that GKE Volume
                Populator fills from it once the loaders have written it
The loaders of both bucket backends write the bucket through Cloud Storage FUSE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .specs import ModelSpec, WeightsSpec
from .weights_layout import plan_filestore

STORAGE_API = "storage.googleapis.com"
# Cloud Storage FUSE with parallel downloads has no documented read throughput: an assumption.
GCS_FUSE_READ_MIB_S = 1000.0


def filestore_read_mib_s(tier: str, capacity_gib: int) -> float:
    """Filestore's documented read throughput per tier (cloud.google.com/filestore/docs/performance)."""
    tib = capacity_gib / 1024
    if tier == "BASIC_HDD":
        return 100.0 if tib < 10 else 180.0
    if tier == "BASIC_SSD":
        return 1200.0
    if tier == "ZONAL":
        return 260.0 * tib
    if tier == "REGIONAL":
        return (120.0 if tib < 10 else 260.0) * tib
    raise ValueError(f"unknown Filestore tier {tier}")


def _share_read(models: Sequence[ModelSpec], weights: WeightsSpec) -> float:
    return filestore_read_mib_s(*plan_filestore(models, weights))


def _fuse_read(_models: Sequence[ModelSpec], _weights: WeightsSpec) -> float:
    return GCS_FUSE_READ_MIB_S


def _disk_read(_models: Sequence[ModelSpec], weights: WeightsSpec) -> float:
    # The disk's provisioned throughput; replicas reading one disk together share it.
    return float(weights.hyperdisk_throughput_mib_s)


@dataclass(frozen=True)
class WeightsBackend:
    name: str
    # The weights live in the stack's Cloud Storage bucket (the Storage API; the loaders write it
    # through Cloud Storage FUSE, so the cluster needs the GKE Cloud Storage FUSE CSI driver).
    uses_bucket: bool
    # A Filestore share holds them: its tier and size are the config's (weights.tier, capacityGb).
    has_filestore_share: bool
    # The servers read through Cloud Storage FUSE, its file cache on the node's disk (requested
    # with the replica's scratch).
    servers_read_through_fuse: bool
    # Hyperdisk ML disks GKE Volume Populator fills: its GKE version, a transfer node pool, and
    # serving machines that attach Hyperdisk ML; the disks are not in the cost figures.
    needs_volume_populator: bool
    # The servers mount one read-only claim per namespace (what the provider's VllmService takes).
    one_claim_per_namespace: bool
    # The load test, on the system pool, reads the model's tokenizer from the bucket (Hyperdisk
    # ML disks attach to the GPU machine series only), not from its servers' mount.
    tokenizer_from_bucket: bool
    # One replica's read throughput when it loads alone, MiB/s (the cold-start estimate).
    read_mib_s: Callable[[Sequence[ModelSpec], WeightsSpec], float]

    @property
    def needs_gcs_fuse(self) -> bool:
        """The cluster's Cloud Storage FUSE CSI driver: the loaders write the bucket through it."""
        return self.uses_bucket

    @property
    def apis(self) -> tuple[str, ...]:
        """Google Cloud APIs the backend needs beyond the platform's own."""
        return (STORAGE_API,) if self.uses_bucket else ()

    def transfer_machine_type(self, weights: WeightsSpec) -> Optional[str]:
        """The machine type of Volume Populator's transfer nodes; None: no transfer pool."""
        return weights.populator_machine_type if self.needs_volume_populator else None


FILESTORE = WeightsBackend("filestore", uses_bucket=False, has_filestore_share=True, servers_read_through_fuse=False,
                           needs_volume_populator=False, one_claim_per_namespace=True, tokenizer_from_bucket=False,
                           read_mib_s=_share_read)
GCS = WeightsBackend("gcs", uses_bucket=True, has_filestore_share=False, servers_read_through_fuse=True,
                     needs_volume_populator=False, one_claim_per_namespace=False, tokenizer_from_bucket=True,
                     read_mib_s=_fuse_read)
HYPERDISK_ML = WeightsBackend("hyperdisk-ml", uses_bucket=True, has_filestore_share=False,
                              servers_read_through_fuse=False, needs_volume_populator=True,
                              one_claim_per_namespace=False, tokenizer_from_bucket=True, read_mib_s=_disk_read)
BACKENDS = {b.name: b for b in (FILESTORE, GCS, HYPERDISK_ML)}


def backend_of(weights: WeightsSpec) -> WeightsBackend:
    return BACKENDS[weights.backend]
