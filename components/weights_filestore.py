"""The Filestore weights backend: one share holds every copy; the loaders write it through a
ReadWriteMany claim in their namespace, and every consumer namespace gets a ReadOnlyMany PV/PVC
onto it (a PV binds one claim, so one pair per namespace).
"""

from __future__ import annotations

from typing import Any, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, meta
from .model.specs import ModelSpec
from .model.vllm_versions import VllmRelease
from .model.weights_layout import (
    CLAIM_NAME,
    NOMINAL_VOLUME_SIZE,
    REGIONAL_TIERS,
    SHARE_NAME,
    WeightCopy,
    capacity_range,
    loader_command,
    plan_filestore,
    share_identity,
    share_instance_name,
)
from .model.weights_mount import WeightsMount, claim_mount, writable_mount
from .weights_storage import StoreSite, WeightsStorage


def share_ip(networks: Sequence[gcp.filestore.outputs.InstanceNetwork]) -> str:
    addresses = networks[0].ip_addresses
    assert addresses is not None  # Filestore assigns the share's address on creation
    return addresses[0]


class FilestoreWeights(WeightsStorage):
    instance: gcp.filestore.Instance
    # consumer key -> its read-only claim
    claims: dict[str, k8s.core.v1.PersistentVolumeClaim]

    def __init__(self, site: StoreSite):
        args = site.args
        self.site = site
        self.tier, self.capacity_gb = plan_filestore(args.models, args.weights)
        self.location = args.region if self.tier in REGIONAL_TIERS else args.zone
        self.share_identity = share_identity(site.instance_name, self.tier, self.location,
                                             capacity_range(self.tier, self.capacity_gb))
        self.claim_name = f"{CLAIM_NAME}-{self.share_identity}"
        self.instance = gcp.filestore.Instance(
            f"{site.name}-filestore", name=share_instance_name(site.instance_name, self.share_identity),
            project=args.project, location=self.location,
            tier=self.tier,
            file_shares={"name": SHARE_NAME, "capacity_gb": self.capacity_gb},
            networks=[{"network": args.network_name, "modes": ["MODE_IPV4"]}],
            # Losing the share means reloading every model: a tier or zone change re-creates it
            # (a new name, so the new share is made and loaded before the old one goes), so make
            # that an explicit decision (`pulumi state unprotect`), not a side effect.
            opts=site.gcp_opts("file.googleapis.com", protect=args.protect))
        self.server_ip = self.instance.networks.apply(share_ip)
        rw_claim = self._claim("rw", site.system_namespace, read_only=False)
        self.claims = {key: self._claim(key, ns, read_only=True) for key, ns in args.consumer_namespaces.items()}
        self.loader_mount = writable_mount({"name": "weights", "persistentVolumeClaim": {"claimName": rw_claim.metadata.name}})
        self.loader_grants = []

    def loader_command(self, copy: WeightCopy, release: VllmRelease) -> list[Any]:
        return loader_command(copy, release)

    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        return claim_mount(self.claim_name)

    def _claim(self, key: str, namespace: pulumi.Input[str], read_only: bool) -> k8s.core.v1.PersistentVolumeClaim:
        """A PV onto the share and the PVC bound to it; a PV binds one claim, so one pair per namespace."""
        site = self.site
        mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
        # Named by the share's identity: a new share gets new volumes and claims, created beside
        # the old ones (a PV's source and a bound claim cannot change), so pods roll onto them.
        pv_name = f"{site.instance_name}-{self.share_identity}-{key}"
        opts = site.k8s_opts()
        pv = k8s.core.v1.PersistentVolume(
            f"{site.name}-pv-{key}",
            metadata=meta(pv_name),
            spec=api_body({
                "capacity": {"storage": NOMINAL_VOLUME_SIZE},
                "accessModes": [mode],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "mountOptions": ["nconnect=8", "ro"] if read_only else ["nconnect=8"],
                "nfs": {"server": self.server_ip, "path": f"/{SHARE_NAME}", "readOnly": read_only},
            }),
            opts=opts)
        return k8s.core.v1.PersistentVolumeClaim(
            f"{site.name}-pvc-{key}",
            metadata={**meta(self.claim_name if read_only else f"{CLAIM_NAME}-rw-{self.share_identity}"),
                      "namespace": namespace},
            spec=api_body({
                "accessModes": [mode],
                "storageClassName": "",
                "volumeName": pv.metadata.name,
                "resources": {"requests": {"storage": NOMINAL_VOLUME_SIZE}},
            }),
            opts=opts)
