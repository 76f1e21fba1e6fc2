"""The pod the weights loader and prune Jobs share (components/model_store.py declares the Jobs): the
loader's identity, the writable weights volume, the program, the system pool, and the hardening
(read-only root, no capabilities, seccomp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..k8s_objects import CONTAINER_SECURITY
from ..specs import ImageRef
from ..weights_layout import (
    LOADER_ENV,
    LOADER_MOUNT,
    LOADER_RUNTIME_ENV,
    LOADER_SCRATCH,
    LOADER_SCRATCH_GI,
    LOADER_UID,
)
from ..weights_mount import WeightsMount

PROGRAM_CONFIG_MAP = "weights-loader"
SEQUENTIAL_DOWNLOADS = {"name": "HF_HUB_DISABLE_XET", "value": "1"}


@dataclass(frozen=True)
class LoaderPod:
    """What every loader and prune Job's pod shares."""

    # The loader's Kubernetes service account (a Pulumi output: placed, never read).
    service_account: Any
    # A digest of the program: in the pod template, so a changed program re-runs the (immutable) Jobs.
    program_hash: str
    # The weights, writable: the backend's share or bucket at /models.
    weights: WeightsMount
    node_selector: Mapping[str, str]
    hub_image: ImageRef  # hf:// sources: the server image (huggingface_hub)
    bucket_image: ImageRef  # gs:// sources: the Cloud SDK image


@dataclass(frozen=True)
class LoaderRun:
    """One Job's own part: its model, its argv, what it reads the Hugging Face token from, its size."""

    model: str
    source: str
    command: Sequence[Any]
    env: Sequence[Mapping[str, Any]] = ()
    mounts: Sequence[Mapping[str, Any]] = ()
    volumes: Sequence[Mapping[str, Any]] = ()
    # (request, limit)
    cpu: tuple[str, str] = ("2", "4")
    memory: tuple[str, str] = ("8Gi", "16Gi")


def run_as(weights: WeightsMount) -> dict[str, Any]:
    """Through FUSE the loader writes as LOADER_UID (the mount's uid/gid); Filestore's export is
    root-owned, so there it is root, without capabilities, on a read-only root filesystem."""
    return {"runAsNonRoot": True, "runAsUser": LOADER_UID, "runAsGroup": LOADER_UID} if weights.through_fuse else {}


def loader_container(pod: LoaderPod, run: LoaderRun) -> dict[str, Any]:
    image = pod.hub_image if run.source.startswith("hf://") else pod.bucket_image
    scratch = f"{LOADER_SCRATCH_GI * len(LOADER_SCRATCH)}Gi"
    return {
        "name": "loader",
        "image": image.uri,
        "command": list(run.command),
        # The error (the key to raise) shows in the pod's and Job's status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": run.cpu[0], "memory": run.memory[0], "ephemeral-storage": scratch},
                      "limits": {"cpu": run.cpu[1], "memory": run.memory[1], "ephemeral-storage": scratch}},
        "securityContext": dict(CONTAINER_SECURITY),
        # The server image sets HF_HUB_OFFLINE=1 so replicas never download;
        # the loader is the one place that must.
        "env": [*LOADER_ENV, *LOADER_RUNTIME_ENV, *run.env,
                # Through FUSE, downloads must write in order: gcsfuse streams
                # sequential writes but stages out-of-order ones (hf_xet's
                # parallel reconstruction) whole on the node's disk.
                *([SEQUENTIAL_DOWNLOADS] if pod.weights.through_fuse else [])],
        "volumeMounts": [*pod.weights.mounts,
                         {"name": "program", "mountPath": LOADER_MOUNT, "readOnly": True},
                         *({"name": v, "mountPath": p} for v, p in LOADER_SCRATCH),
                         *run.mounts],
    }


def loader_pod(pod: LoaderPod, run: LoaderRun) -> dict[str, Any]:
    """The Job's pod template."""
    return {
        "metadata": {"labels": {"vllm-gke.io/model": run.model},
                     # No mesh sidecar: it would keep the Job from completing.
                     "annotations": {"sidecar.istio.io/inject": "false",
                                     "vllm-gke.io/loader-program": pod.program_hash,
                                     **pod.weights.annotations}},
        "spec": {
            "serviceAccountName": pod.service_account,
            "automountServiceAccountToken": False,
            # Never: a pod failure policy needs it; a failed pod is retried
            # as a new pod up to backoffLimit.
            "restartPolicy": "Never",
            "nodeSelector": dict(pod.node_selector),
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, **run_as(pod.weights)},
            "containers": [loader_container(pod, run)],
            "volumes": [
                *pod.weights.volumes,
                *({"name": v, "emptyDir": {"sizeLimit": f"{LOADER_SCRATCH_GI}Gi"}} for v, _ in LOADER_SCRATCH),
                {"name": "program", "configMap": {"name": PROGRAM_CONFIG_MAP}},
                *run.volumes,
            ],
        },
    }
