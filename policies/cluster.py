"""The cluster and its node pools: GPU pools tainted, MIG profiles valid, the control plane restricted."""

from __future__ import annotations

from typing import Iterator, Sequence

from ..components.model.catalog import ACCELERATORS
from .base import NODE_POOL, Finding, Resource

# TPU host machine families (ct5lp- v5e, ct6e- v6e, ct5p- v5p): their chips come with the machine type.
TPU_MACHINE_PREFIXES = ("ct5lp-", "ct6e-", "ct5p-", "ct4p-", "tpu7x-")


def gpu_node_pools_tainted(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != NODE_POOL:
            continue
        config = r.props.get("nodeConfig") or {}
        tpu = str(config.get("machineType", "")).startswith(TPU_MACHINE_PREFIXES)
        if not config.get("guestAccelerators") and not tpu:
            continue
        key, what = ("google.com/tpu", "TPU") if tpu else ("nvidia.com/gpu", "GPU")
        taints = config.get("taints") or []
        if not any(t.get("key") == key and t.get("effect") == "NO_SCHEDULE" for t in taints):
            yield r, (f"{what} node pool '{r.props.get('name', r.name)}' has no {key} NO_SCHEDULE taint: "
                      f"CPU pods would land on (and block) {what} nodes")


def mig_partition_valid(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != NODE_POOL:
            continue
        for acc in (r.props.get("nodeConfig") or {}).get("guestAccelerators") or []:
            size = acc.get("gpuPartitionSize")
            if not size:
                continue
            known = ACCELERATORS.get(acc.get("type", ""))
            if known is None:
                yield r, f"gpuPartitionSize '{size}' on unknown accelerator '{acc.get('type')}'"
            elif size not in known.mig_profiles:
                valid = ", ".join(known.mig_profiles) or "none: it has no MIG"
                yield r, f"gpuPartitionSize '{size}' is not a MIG profile of {known.gke_type}; valid: {valid}"


def control_plane_restricted(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != "gcp:container/cluster:Cluster":
            continue
        private = (r.props.get("privateClusterConfig") or {}).get("enablePrivateEndpoint")
        blocks = (r.props.get("masterAuthorizedNetworksConfig") or {}).get("cidrBlocks")
        if not private and not blocks:
            yield r, (f"cluster '{r.props.get('name', r.name)}': the control plane's public endpoint accepts any "
                      "source address; set authorized networks or a private endpoint")
