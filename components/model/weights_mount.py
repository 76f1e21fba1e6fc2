"""How a pod reads one model's weights, read-only, whatever the backend keeps them in (and how the
loaders write them).

Each weights backend hands every consumer (a serving pool, a load test) a WeightsMount: the pod's
volumes and mounts, the annotations its CSI driver needs, and whether the files come through a
FUSE mount. The pod builders (pods/) take it as it is and never ask which backend made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from . import gcs_weights
from .specs import ModelSpec
from .weights_layout import MOUNT_PATH, served_files_gb


@dataclass(frozen=True)
class WeightsMount:
    # Pod volumes and the containers' volumeMounts (claim names and bucket names may be Pulumi
    # outputs: the builders place them, never read them).
    volumes: tuple[Mapping[str, Any], ...]
    mounts: tuple[Mapping[str, Any], ...]
    annotations: Mapping[str, str] = field(default_factory=dict[str, str])
    # Read over the network through Cloud Storage FUSE: an init container would read before a
    # classic mesh sidecar serves, so the entrypoint waits for the completion markers instead.
    through_fuse: bool = False


def writable_mount(volume: Mapping[str, Any], annotations: Optional[Mapping[str, str]] = None,
                   through_fuse: bool = False) -> WeightsMount:
    """The loaders' own: one volume named `weights`, writable at /models."""
    return WeightsMount(volumes=(volume,), mounts=({"name": "weights", "mountPath": MOUNT_PATH},),
                        annotations=dict(annotations or {}), through_fuse=through_fuse)


def claim_mount(claim_name: Any) -> WeightsMount:
    """One ReadOnlyMany claim holding every model at /models (Filestore)."""
    return WeightsMount(
        volumes=({"name": "weights", "persistentVolumeClaim": {"claimName": claim_name, "readOnly": True}},),
        mounts=({"name": "weights", "mountPath": MOUNT_PATH, "readOnly": True},))


def claims_mount(claims: Mapping[str, Any]) -> WeightsMount:
    """A read-only claim per weight set, each at its directory (Hyperdisk ML: a disk per revision)."""
    ordered = sorted(claims.items())
    return WeightsMount(
        volumes=tuple({"name": f"weights-{i}", "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
                      for i, (_, c) in enumerate(ordered)),
        mounts=tuple({"name": f"weights-{i}", "mountPath": d, "readOnly": True} for i, (d, _) in enumerate(ordered)))


def tokenizer_mount(volume: Mapping[str, Any], annotations: Mapping[str, str]) -> WeightsMount:
    """The bucket through Cloud Storage FUSE as a load test reads it: a few tokenizer files, no
    file cache of the mount's own."""
    return WeightsMount(volumes=(volume,), mounts=({"name": "weights", "mountPath": MOUNT_PATH, "readOnly": True},),
                        annotations=dict(annotations), through_fuse=True)


def bucket_mount(volume: Mapping[str, Any], model: ModelSpec, annotations: Mapping[str, str]) -> WeightsMount:
    """The weights bucket through Cloud Storage FUSE, its file cache sized for this model and its
    adapters (an emptyDir the sidecar fills with what the server reads)."""
    files_gb = served_files_gb(model)
    return WeightsMount(
        volumes=(gcs_weights.with_cache_limit(volume, files_gb), gcs_weights.cache_volume(files_gb)),
        mounts=({"name": "weights", "mountPath": MOUNT_PATH, "readOnly": True},),
        annotations=dict(annotations), through_fuse=True)
