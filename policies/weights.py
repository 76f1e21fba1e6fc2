"""The model weights: servers read them from a read-only share and never download; Hyperdisk ML
disks are filled by GKE Volume Populator with their own identity, on transfer nodes."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

from ..components.model.hyperdisk_ml import TRANSFER_COMPUTE_CLASS
from ..components.model.k8s_objects import COMPUTE_CLASS_LABEL
from .base import NODE_POOL, Finding, Resource, env_of, kube, meta, namespace_of, vllm_servers, where


def _model_ref(container: Mapping[str, Any]) -> Optional[str]:
    words = [str(x) for x in (container.get("command") or []) + (container.get("args") or [])]
    if "--model" in words and words.index("--model") + 1 < len(words):
        return words[words.index("--model") + 1]
    for entry in ("serve", "/opt/vllm-gke/serve.py"):
        if entry in words and words.index(entry) + 1 < len(words):
            return words[words.index(entry) + 1]
    return None


def weights_read_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod, c in vllm_servers(resources):
        shared = {v["name"]: v for v in pod.get("volumes") or []
                  if "persistentVolumeClaim" in v or "nfs" in v or "csi" in v}
        mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") in shared]
        if not mounts:
            yield r, f"{where(r)}: the vLLM container mounts no shared weights volume"
        for m in mounts:
            volume = shared[m["name"]]
            source = volume.get("persistentVolumeClaim") or volume.get("nfs") or volume.get("csi") or {}
            if not m.get("readOnly") or not source.get("readOnly"):
                yield r, f"{where(r)}: weights volume '{m['name']}' must be mounted readOnly (mount and volume)"
        model = _model_ref(c)
        if not model or not model.startswith("/"):
            yield r, f"{where(r)}: model '{model}' is not a local path on the shared volume; replicas must not download"
        env = env_of(c)
        if env.get("HF_HUB_OFFLINE", {}).get("value") != "1":
            yield r, f"{where(r)}: HF_HUB_OFFLINE=1 must be set so the server can never fetch weights"
        if "HF_TOKEN" in env or "HUGGING_FACE_HUB_TOKEN" in env:
            yield r, f"{where(r)}: the server holds a Hugging Face token; only the loader Job may"
        if any(str(a).startswith("--download-dir") for a in c.get("args") or []):
            yield r, f"{where(r)}: --download-dir makes replicas download their own copy"


def hyperdisk_weights_populated(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A Hyperdisk ML claim serves weights only if GKE Volume Populator fills it: read-only for
    many nodes, a GCPDataSource beside it naming an identity other than the servers' own (that
    one would hand every vLLM pod the bucket), and transfer nodes for the populator's Jobs."""
    classes = {meta(c).get("name"): c for c in kube(resources, "StorageClass")
               if (c.props.get("parameters") or {}).get("type") == "hyperdisk-ml"}
    sources = {(namespace_of(d), meta(d).get("name")): d for d in kube(resources, "GCPDataSource")}
    claims = [c for c in kube(resources, "PersistentVolumeClaim")
              if (c.props.get("spec") or {}).get("storageClassName") in classes]
    for claim in claims:
        spec = claim.props.get("spec") or {}
        if spec.get("accessModes") != ["ReadOnlyMany"]:
            yield claim, (f"{where(claim)} is not ReadOnlyMany: a Hyperdisk ML disk serves many nodes only "
                          "read-only, and the weights must never be written by a server")
        ref = spec.get("dataSourceRef") or {}
        source = sources.get((namespace_of(claim), ref.get("name"))) \
            if ref.get("kind") == "GCPDataSource" and ref.get("apiGroup") == "datalayer.gke.io" else None
        if source is None:
            yield claim, f"{where(claim)} has no GCPDataSource to fill it: the disk would be empty"
            continue
        account = ((source.props.get("spec") or {}).get("cloudStorage") or {}).get("serviceAccountName")
        if account in (None, "", "default"):
            yield source, (f"{where(source)} reads the bucket as the namespace's default service account: every "
                           "vLLM pod there would hold read access to all the weights; give it its own")
    for c in classes.values():
        if c.props.get("volumeBindingMode") != "Immediate":
            yield c, (f"{where(c)} binds WaitForFirstConsumer: the copy would start only when a replica is "
                      "scheduled, and the replica would wait for the whole copy; bind Immediate")
    if claims:
        pools = [r for r in resources if r.type == NODE_POOL and
                 ((r.props.get("nodeConfig") or {}).get("labels") or {}).get(COMPUTE_CLASS_LABEL)
                 == TRANSFER_COMPUTE_CLASS]
        compute_classes = [c for c in kube(resources, "ComputeClass") if meta(c).get("name") == TRANSFER_COMPUTE_CLASS]
        if not pools or not compute_classes:
            yield None, (f"Hyperdisk ML claims are populated by Jobs that run only on nodes of the "
                         f"{TRANSFER_COMPUTE_CLASS} compute class, and the plan has no such "
                         f"{'node pool' if not pools else 'ComputeClass'}: the transfer would never start")
