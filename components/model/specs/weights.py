"""Where the one copy of the weights lives and how it is loaded."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import (
    Field,
    field_validator,
)

from ..catalog import populator_vcpus
from ..gcp_names import is_bucket_name
from .base import (
    SECRET_ID,
    TOKEN_LIKE,
    ImageRef,
    K8sName,
    Spec,
)


class SecretKeyRef(Spec):
    # Secret name.
    name: K8sName
    # Key in the Secret's data.
    key: str = "token"

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", v):
            raise ValueError(f"'{v}' is not a Secret data key: letters, digits, '-', '_' or '.'")
        return v


class WeightsSpec(Spec):
    # Where the one copy of the weights lives: a Filestore share (NFS, ReadOnlyMany), or a Cloud
    # Storage bucket mounted by GKE's Cloud Storage FUSE CSI driver with a file cache and parallel
    # downloads (regional, no capacity to size; each node caches what it reads), or Hyperdisk ML
    # disks (ReadOnlyMany, one per weight set and zone) that GKE Volume Populator fills from
    # that bucket once the loaders have written it.
    backend: Literal["filestore", "gcs", "hyperdisk-ml"] = "filestore"
    # gcs, hyperdisk-ml: the bucket (default <project>-<cluster>-weights); created by the stack.
    bucket: Optional[str] = None
    # hyperdisk-ml: each disk's provisioned throughput, MiB/s (Hyperdisk ML takes 400 to
    # 1,200,000; GKE's Volume Populator guide uses 2,400). Readers of one disk share it.
    hyperdisk_throughput_mib_s: int = Field(default=2400, ge=400, le=1_200_000, alias="hyperdiskThroughputMiBps")
    # hyperdisk-ml: the machine type of the transfer nodes Volume Populator's Jobs run on (a
    # node pool that scales from zero; C3 or C3D, which attach Hyperdisk ML, with at least 8 vCPUs).
    populator_machine_type: str = "c3-standard-44"
    # Warn when a pool's estimated time from node ready to serving exceeds this.
    cold_start_budget_seconds: int = Field(default=900, ge=60, le=7200)
    # The weights store's read throughput, MiB/s, as measured (overrides the documented figure).
    read_throughput_mib_s: Optional[float] = Field(default=None, gt=0, alias="readThroughputMiBps")
    # The Filestore tier, fixed for the share's life (a change re-creates it). REGIONAL replicates
    # across the region's zones: the share survives a zone outage, which a zonal tier serving a
    # multi-zone cluster does not. BASIC_HDD reads at 100 MiB/s whatever its size.
    tier: Literal["BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL"] = "ZONAL"

    @field_validator("tier", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        if v == "auto":
            raise ValueError("'auto' is no longer a tier: it chose BASIC_HDD or ZONAL from the models' total size, so "
                             "adding a model re-created the share. Set the tier the share has: BASIC_HDD if it was "
                             "made while the weights totalled 100 GB or less, else ZONAL")
        return v

    @field_validator("populator_machine_type")
    @classmethod
    def _populator_machine(cls, v: str) -> str:
        if populator_vcpus(v) is None:
            raise ValueError(f"'{v}' is not a C3 or C3D machine type with at least 8 vCPUs (e.g. c3-standard-44, "
                             "c3-highcpu-22, c3d-standard-30): the transfer Jobs need a series that attaches "
                             "Hyperdisk ML")
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not is_bucket_name(v):
            raise ValueError(f"'{v}' is not a Cloud Storage bucket name: 3-63 lowercase letters, digits, '-' or '_', "
                             "a letter or digit at both ends, not starting with goog or containing google")
        return v
    # Filestore capacity, GiB; default: the tier's minimum or what the weights need: every copy,
    # plus the largest again (a new revision or source loads beside the current copy), plus 30%.
    # Below that the config is refused. On BASIC tiers the share's size, which only grows, so it is
    # never derived; on ZONAL and REGIONAL a floor over what the models need, and crossing 9.75 TiB
    # brings up a new share, since the two size ranges do not convert in place.
    capacity_gb: Optional[int] = Field(default=None, ge=1024)
    # Secret Manager secret holding the Hugging Face token; the loader mounts it through the
    # GKE Secret Manager CSI add-on, so the token never enters Pulumi state or a manifest.
    secret_manager_secret: str = "hf-token"

    @field_validator("secret_manager_secret")
    @classmethod
    def _secret_id(cls, v: str) -> str:
        if TOKEN_LIKE.match(v):
            raise ValueError("looks like a token itself: give the Secret Manager secret's id (e.g. hf-token), "
                             "never the token; put the token in Secret Manager with gcloud secrets create")
        if not SECRET_ID.match(v):
            raise ValueError(f"'{v}' is not a Secret Manager secret id: 1-255 letters, digits, '_' or '-'")
        return v
    # Or: an existing Kubernetes Secret in the loader namespace, vllm-gke-system (e.g. synced from Secret Manager
    # by External Secrets); the loader then reads HF_TOKEN through a secretKeyRef.
    hf_token_kubernetes_secret: Optional[SecretKeyRef] = None
    # hf:// sources load with the server image (it ships the HF CLI); gs:// ones need gcloud.
    gcs_loader_image: ImageRef = Field(
        default_factory=lambda: ImageRef(
            repository="gcr.io/google.com/cloudsdktool/google-cloud-cli", tag="499.0.0-slim"
        )
    )
