"""HyperdiskWeights: ReadOnlyMany Hyperdisk ML disks that GKE Volume Populator fills from the bucket.

GKE's "Automate data transfer from Cloud Storage to a Hyperdisk ML volume using GKE Volume
Populator" is the path followed here:
- a StorageClass of `type: hyperdisk-ml` with the cluster's zones in allowedTopologies and
  `enable-multi-zone-provisioning` (one disk per zone, so a replica in any zone reads a local
  copy), Immediate binding (the transfer starts when the claim is created, not when a pod
  needs it);
- per consumer namespace (a GCPDataSource must share its claim's namespace) a service account
  the transfer Job authenticates as, with read access to this bucket only: the serving pods'
  own identity gets none;
- per weight set (a model revision, an adapter revision) a GCPDataSource on its folder of the
  bucket and a ReadOnlyMany claim whose dataSourceRef names it. The claim is created only after
  its loader Job has completed (the populator copies what the bucket holds at that moment), and
  its name carries the set's source and revision: a populated disk never changes, so a new
  revision is a new claim that the Deployment rolls onto, and the old one goes after it.
The transfer Jobs run in GKE's own namespace on nodes of the `gcs-to-hdml-compute-class`
compute class (GpuCluster's transfer pool). HyperdiskStorage is the `hyperdisk-ml` backend of a
ModelStore: the weights bucket (weights_bucket.py) and these disks.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.catalog import populator_vcpus
from .model.specs import ModelSpec
from .model.vllm_versions import VllmRelease
from .model.weights_backends import STORAGE_API
from .model.weights_layout import MOUNT_PATH, WeightCopy, loader_command, model_dir, reads, side_copies, weight_copies
from .model.weights_mount import WeightsMount, claims_mount
from .options import child_opts
from .weights_bucket import BucketStorage
from .workload_identity import workload_principal

CSI_DRIVER = "pd.csi.storage.gke.io"
# The class's name carries a digest of its spec: a StorageClass is immutable, and changing the
# zones or the throughput must give new disks (new claims), not leave the old ones as they were.
STORAGE_CLASS_PREFIX = "vllm-gke-hyperdisk-ml"
POPULATOR_SA = "weights-populator"
# The transfer Job asks for 24 vCPUs unless told otherwise (the guide's default).
DEFAULT_TRANSFER_CPUS = 24
CPU_REQUEST_ANNOTATION = "volume-populator.datalayer.gke.io/cpu-request"
# Hyperdisk ML takes 4 GiB to 64 TiB; room for the file system and tokenizer files.
MIN_DISK_GIB = 8
HEADROOM = 1.15
# What of a disk the copied files may fill: the PD CSI driver formats ext4, whose inode tables
# (1.6% at the default inode ratio), journal (up to 1 GiB) and possible 5% root reserve come off
# the top. The loader refuses a selection above this, naming the key, instead of the populator
# retrying a copy that can never fit.
USABLE_SHARE = 0.93
FS_OVERHEAD_GIB = 1.0
# The populator can take as long as the data's size needs; Pulumi awaits a claim with Immediate
# binding until it is Bound (pulumi-kubernetes #895/#3130), which here is after the copy.
CLAIM_TIMEOUT_S = 4 * 3600


class WeightSet(Protocol):
    """One folder of the bucket that becomes one disk (ModelStore's WeightCopy): its loader
    wrote it under `directory`, the mount path; the bucket folder is the same path below the
    mount root."""

    @property
    def key(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def revision(self) -> str: ...
    @property
    def directory(self) -> str: ...
    @property
    def weights_gb(self) -> float: ...


def claim_name(ws: WeightSet, storage_class: str, reads: str) -> str:
    """Unique to what the disk holds and how it is provisioned: anything else is a new claim. The
    size is part of it: a claim's size cannot change while the populator fills it (the spec of an
    unbound claim is immutable), so a raised diskGb must be a new claim."""
    identity = f"{ws.source}\n{ws.revision}\n{ws.directory}\n{storage_class}\n{reads}\n{disk_size_gib(ws.weights_gb)}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    # 63 characters at most: a name the populator may reuse in labels and Job names stays valid.
    slug = re.sub(r"[^a-z0-9-]+", "-", ws.key.lower()).strip("-")[:44].rstrip("-")
    return f"weights-{slug}-{digest}"


def disk_size_gib(weights_gb: float) -> int:
    return max(MIN_DISK_GIB, math.ceil(weights_gb * HEADROOM) + 1)


def usable_gib(weights_gb: float) -> float:
    """The most the loader may put in the folder the disk of `weights_gb` is filled from. With
    diskGb set to the loaded size (what the loader asks for), the disk holds it."""
    return disk_size_gib(weights_gb) * USABLE_SHARE - FS_OVERHEAD_GIB


def bucket_folder(directory: str, mount_root: str) -> str:
    return directory.removeprefix(mount_root).strip("/")


def storage_class_spec(zones: Sequence[str], throughput_mib_s: int) -> dict[str, Any]:
    params = {"type": "hyperdisk-ml", "provisioned-throughput-on-create": f"{throughput_mib_s}Mi"}
    if len(zones) > 1:
        params["enable-multi-zone-provisioning"] = "true"
    return {
        "provisioner": CSI_DRIVER,
        "parameters": params,
        # A populated disk is never resized or rewritten: a new weight set is a new claim.
        "allowVolumeExpansion": False,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.gke.io/zone", "values": list(zones)}]}],
    }


def storage_class_name(spec: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return f"{STORAGE_CLASS_PREFIX}-{digest}"


def transfer_cpu_request(populator_vcpus: int) -> str:
    """The transfer Job's CPU request: the default where the node fits it, else what leaves room
    for the node's system pods."""
    return str(min(DEFAULT_TRANSFER_CPUS, populator_vcpus - 2))


@dataclass
class HyperdiskWeightsArgs:
    zones: Sequence[str]
    bucket: pulumi.Input[str]
    # Workload Identity pool and project number: the transfer identity's principal.
    workload_pool: pulumi.Input[str]
    project_number: pulumi.Input[str]
    provider: k8s.Provider
    # consumer key -> (namespace, the weight sets its pods mount)
    consumers: Mapping[str, tuple[pulumi.Input[str], Sequence[WeightSet]]]
    # weight set key -> the loader Job that writes it
    loaders: Mapping[str, pulumi.Resource]
    # weight set key -> which files its loader selected (load_weights.py --reads)
    reads: Mapping[str, str]
    mount_root: str
    throughput_mib_s: int = 2400
    populator_vcpus: int = 44
    apis: Sequence[pulumi.Resource] = field(default_factory=list[pulumi.Resource])
    # The transfer node pool and its compute class: a claim made before them would start a
    # transfer Job with nowhere to run.
    transfer_ready: Sequence[pulumi.Resource] = field(default_factory=list[pulumi.Resource])


class HyperdiskWeights(pulumi.ComponentResource):
    storage_class: k8s.storage.v1.StorageClass
    # consumer key -> mount directory -> claim name
    claims: dict[str, dict[str, str]]

    def __init__(self, name: str, args: HyperdiskWeightsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:HyperdiskWeights", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        class_spec = storage_class_spec(args.zones, args.throughput_mib_s)
        self.storage_class_name = class_name = storage_class_name(class_spec)
        self.storage_class = k8s.storage.v1.StorageClass(
            f"{name}-class", metadata=meta(class_name), **_snake(class_spec), opts=k8s_opts)
        self.claims = {}
        for key, (namespace, sets) in args.consumers.items():
            sa = k8s.core.v1.ServiceAccount(
                f"{name}-{key}-populator", metadata={**meta(POPULATOR_SA), "namespace": namespace},
                # Only GKE's transfer Job uses this identity, through Workload Identity Federation.
                automount_service_account_token=False, opts=k8s_opts)
            reader = gcp.storage.BucketIAMMember(
                f"{name}-{key}-reader", bucket=args.bucket, role="roles/storage.objectViewer",
                member=workload_principal(args.project_number, args.workload_pool, namespace, POPULATOR_SA),
                opts=child_opts(self, opts, depends_on=list(args.apis)))
            self.claims[key] = {}
            for ws in sets:
                claim = claim_name(ws, class_name, args.reads[ws.key])
                folder = bucket_folder(ws.directory, args.mount_root)
                source = custom_resource(
                    f"{name}-{key}-{ws.key}-source", "datalayer.gke.io/v1", "GCPDataSource",
                    {**meta(claim), "namespace": namespace},
                    pulumi.Output.from_input(args.bucket).apply(lambda b, f=folder: {"cloudStorage": {
                        "serviceAccountName": POPULATOR_SA, "uri": f"gs://{b}/{f}/"}}),
                    child_opts(self, opts, provider=args.provider, depends_on=[sa]))
                loader = args.loaders.get(ws.key)
                k8s.core.v1.PersistentVolumeClaim(
                    f"{name}-{key}-{ws.key}-claim",
                    metadata={**meta(claim, annotations={
                        CPU_REQUEST_ANNOTATION: transfer_cpu_request(args.populator_vcpus),
                        "pulumi.com/timeoutSeconds": str(CLAIM_TIMEOUT_S)}), "namespace": namespace},
                    spec=api_body({"accessModes": ["ReadOnlyMany"], "storageClassName": class_name,
                                   "resources": {"requests": {"storage": f"{disk_size_gib(ws.weights_gb)}Gi"}},
                                   "dataSourceRef": {"apiGroup": "datalayer.gke.io", "kind": "GCPDataSource",
                                                     "name": claim}}),
                    # The copy is of what the bucket holds when the claim appears: after the loader.
                    # Deleting the data source first would leave the claim stuck (the guide's caution):
                    # depending on it makes Pulumi delete the claim first.
                    opts=child_opts(self, opts, provider=args.provider,
                                    depends_on=[source, reader, self.storage_class, *args.transfer_ready,
                                                *([loader] if loader else [])]))
                self.claims[key][ws.directory] = claim
        self.register_outputs({"storageClass": class_name, "claims": self.claims})


class HyperdiskStorage(BucketStorage):
    """The `hyperdisk-ml` backend: the loaders fill the bucket (each folder no larger than its disk
    takes), then HyperdiskWeights has GKE Volume Populator copy each folder onto the disks the
    consumer namespaces mount."""

    disks: HyperdiskWeights

    def loader_command(self, copy: WeightCopy, release: VllmRelease) -> list[Any]:
        return loader_command(copy, release, usable_gib(copy.weights_gb), dest_uri=self.dest_uri(copy))

    def after_loaders(self, loaders: Mapping[str, pulumi.Resource]) -> None:
        site = self.site
        args, wanted = site.args, site.args.consumer_models
        copies = weight_copies(args.models)
        consumers = {key: (ns, [c for c in copies if wanted is None or c.model in wanted.get(key, ())])
                     for key, ns in args.consumer_namespaces.items()}
        self.disks = HyperdiskWeights(f"{site.name}-hdml", HyperdiskWeightsArgs(
            zones=list(args.zones) or [args.zone], bucket=self.bucket.name,
            workload_pool=args.workload_pool, project_number=self.project_number, provider=args.provider,
            consumers=consumers, loaders=loaders, mount_root=MOUNT_PATH,
            reads={c.key: reads(c, args.vllm_release) for c in copies},
            transfer_ready=list(args.transfer_ready),
            throughput_mib_s=args.weights.hyperdisk_throughput_mib_s,
            populator_vcpus=populator_vcpus(args.weights.populator_machine_type) or 44,
            apis=args.apis.needs(STORAGE_API) if args.apis else []),
            opts=child_opts(site.store, site.opts))

    def claims_for(self, consumer: str, model: ModelSpec) -> dict[str, str]:
        """Mount directory -> claim, for the model's weights, its adapters and its draft in the consumer's namespace."""
        claims = self.disks.claims[consumer]
        return {d: claims[d] for d in (model_dir(model), *(a.directory for a in side_copies(model)))}

    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        return claims_mount(self.claims_for(consumer, model))


def _snake(spec: dict[str, Any]) -> dict[str, Any]:
    """StorageClass fields are top-level keyword arguments in pulumi-kubernetes."""
    names = {"allowVolumeExpansion": "allow_volume_expansion", "reclaimPolicy": "reclaim_policy",
             "volumeBindingMode": "volume_binding_mode", "allowedTopologies": "allowed_topologies"}
    return {names.get(k, k): v for k, v in spec.items()}
