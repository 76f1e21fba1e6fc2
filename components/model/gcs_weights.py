"""The Cloud Storage weights backend as pods see it: the GKE Cloud Storage FUSE CSI driver.

Settings follow GKE's "Optimize Cloud Storage FUSE CSI driver performance" guide for serving:
an unbounded metadata cache (the weights never change under a revision's directory), and a file
cache with parallel downloads, which is what makes a multi-GB model load fast: the sidecar pulls
each file in parallel chunks into the cache while vLLM reads. The cache lives in an emptyDir
named `gke-gcsfuse-cache` (the driver's convention), sized to the model.

On a meshed pod the driver's sidecar starts before Envoy and cannot reach the GKE metadata
server through it: GKE's guide (Pod annotations, Istio) has the application wait for the proxy
and the metadata server's address bypass it.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any, Mapping, Optional, Sequence

from .specs import ModelSpec
from .weights_layout import MOUNT_PATH, adapter_dir, draft_dir

CSI_DRIVER = "gcsfuse.csi.storage.gke.io"
CACHE_VOLUME = "gke-gcsfuse-cache"
SERVING_CACHE_OPTIONS = (
    "metadata-cache:ttl-secs:-1", "metadata-cache:stat-cache-max-size-mb:-1",
    "metadata-cache:type-cache-max-size-mb:-1", "file-cache:max-size-mb:-1",
    "file-cache:cache-file-for-range-read:true", "file-cache:enable-parallel-downloads:true",
)
# The driver's sidecar has no resource limits of its own ("0": unlimited), so a large parallel
# download is not throttled or OOM-killed; it shares the pod's.
POD_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0",
}
# On a meshed pod the FUSE sidecar's calls bypass Envoy: the metadata server (GKE's guide for
# Istio), and HTTPS to Cloud Storage, so the mount works before any proxy runs (a classic sidecar
# under Istio CNI starts after the FUSE sidecar has begun retrying, and gcsfuse gives up after
# minutes). Nothing else in a serving pod calls out on 443: vLLM runs offline, Envoy fetches JWKS
# as its own user (never captured), and the guard's limit store is on 6379, still meshed.
MESHED_POD_ANNOTATIONS = {**POD_ANNOTATIONS, "traffic.sidecar.istio.io/excludeOutboundIPRanges": "169.254.169.254/32",
                          "traffic.sidecar.istio.io/excludeOutboundPorts": "443"}


def mount_options(read_only: bool, uid: Optional[int] = None) -> str:
    options = ["implicit-dirs", *(SERVING_CACHE_OPTIONS if read_only else ())]
    if uid is not None:  # a non-root container reads files the driver would otherwise own as root
        options += [f"uid={uid}", f"gid={uid}"]
    return ",".join(options)


def weights_volume(bucket: Any, read_only: bool, uid: Optional[int] = None) -> dict[str, Any]:
    return {"name": "weights", "csi": {"driver": CSI_DRIVER, "readOnly": read_only, "volumeAttributes": {
        "bucketName": bucket, "mountOptions": mount_options(read_only, uid)}}}


def cache_gi(files_gb: float) -> int:
    """Room for the files a server reads, plus a tenth."""
    return max(1, math.ceil(files_gb * 1.1))


def cache_volume(files_gb: float) -> dict[str, Any]:
    return {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": f"{cache_gi(files_gb)}Gi"}}


def cache_limit_mb(files_gb: float) -> int:
    """gcsfuse's own cap on the file cache, below the emptyDir's sizeLimit: past the limit the
    kubelet evicts the pod, while gcsfuse past its cap only evicts cached files."""
    return int(cache_gi(files_gb) * 1024 * 0.95)


def with_cache_limit(volume: Mapping[str, Any], files_gb: float) -> dict[str, Any]:
    """The bucket volume with its unbounded file cache capped for one server's files."""
    csi = dict(volume["csi"])
    attributes = dict(csi["volumeAttributes"])
    attributes["mountOptions"] = attributes["mountOptions"].replace(
        "file-cache:max-size-mb:-1", f"file-cache:max-size-mb:{cache_limit_mb(files_gb)}")
    csi["volumeAttributes"] = attributes
    return {**volume, "csi": csi}


# --- who may read what in the bucket ------------------------------------------------------------
# Cloud Storage FUSE needs storage.objects.list on the bucket to mount it (Google's "Mount a
# bucket" page), which yields object names, not contents: every reader gets that, bucket-wide. On a
# hierarchical-namespace bucket (this one) it also lists and reads folders, which roles/storage.
# objectViewer held before: their names and metadata only, never an object's bytes.
LIST_PERMISSIONS = ("storage.objects.list", "storage.folders.list", "storage.folders.get",
                    "storage.managedFolders.list", "storage.managedFolders.get")
# An IAM condition holds at most 12 logical operators: 13 terms OR-ed per conditional binding.
TERMS_PER_CONDITION = 13


def reader_prefixes(models: Sequence[ModelSpec]) -> list[str]:
    """The bucket folders the servers of these models open: each model's (every revision, the
    canary's included), each of its adapters' (its servers load them all, --lora-modules) and its
    speculative draft's (every revision of it, as the model's)."""
    return sorted({f"{m.name}/" for m in models} | {
        f"{PurePosixPath(adapter_dir(m, a)).parent.relative_to(MOUNT_PATH)}/" for m in models for a in m.adapters} | {
        f"{PurePosixPath(d).parent.relative_to(MOUNT_PATH)}/" for m in models if (d := draft_dir(m)) is not None})


def reader_terms(prefixes: Sequence[str]) -> list[tuple[str, str]]:
    """What a reader of these folders may get: ("==", name) for each folder above one (Cloud
    Storage FUSE looks each path component up as an object and as a folder, and a 403 there is
    no "not found": the lookup fails), ("startsWith", folder) for the folders themselves. The
    names above hold no object's bytes."""
    terms: set[tuple[str, str]] = set()
    for prefix in prefixes:
        parts = prefix.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            above = "/".join(parts[:i])
            terms.add(("==", above))
            if i < len(parts):
                terms.add(("==", f"{above}/"))
        terms.add(("startsWith", prefix))
    return sorted(terms, key=lambda t: (t[1], t[0]))


def term_chunks(terms: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The terms, TERMS_PER_CONDITION at a time: one conditional binding each."""
    return [list(terms[i:i + TERMS_PER_CONDITION]) for i in range(0, len(terms), TERMS_PER_CONDITION)]


def object_condition(bucket: str, terms: Sequence[tuple[str, str]]) -> str:
    """An IAM condition true only for these names: IAM names an object
    projects/_/buckets/<bucket>/objects/<object> (IAM Conditions' Cloud Storage resource names)."""
    def term(op: str, name: str) -> str:
        full = f"projects/_/buckets/{bucket}/objects/{name}"
        return f'resource.name == "{full}"' if op == "==" else f'resource.name.startsWith("{full}")'

    return " || ".join(term(op, name) for op, name in terms)
