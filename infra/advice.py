"""Plan-time warnings: choices that are valid but cost availability, said before `pulumi up`."""

from __future__ import annotations

from vllm_gke.components.model_store import REGIONAL_TIERS
from vllm_gke.infra.capacity import placements
from vllm_gke.infra.config import StackConfig


def plan_warnings(cfg: StackConfig, filestore_tier: str) -> list[str]:
    out: list[str] = []
    zones = cfg.cluster.zones
    if len(zones) > 1 and filestore_tier not in REGIONAL_TIERS:
        out.append(
            f"the weights share is a zonal {filestore_tier} Filestore in {zones[0]} feeding GPU nodes in "
            f"{len(zones)} zones: losing {zones[0]} stops every replica from (re)loading; set "
            "vllm-gke:weights.tier to REGIONAL")
    # With a maintenance window, upgrades wait for it: a single replica is a choice, not a hazard.
    unwindowed = cfg.cluster.maintenance.window is None
    for model, _pool_name, tenant in placements(cfg):
        for which in model.pool_names:
            if unwindowed and getattr(model, which).min_replicas == 1:
                who = f" ({tenant})" if tenant else ""
                out.append(
                    f"{model.name}{who} {which} pool runs one replica: a node upgrade or repair takes it down "
                    f"while the weights reload; its PodDisruptionBudget holds voluntary evictions, so set a "
                    "maintenance window (vllm-gke:cluster.maintenance) or minReplicas 2")
    if not cfg.cluster.authorized_networks and not cfg.cluster.private_endpoint:
        out.append("the control plane's public endpoint accepts connections from any address; list "
                   "vllm-gke:cluster.authorizedNetworks or set privateEndpoint")
    return out
