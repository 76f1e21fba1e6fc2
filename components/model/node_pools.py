"""A cluster's accelerator node pools as data: the GKE pools each configured pool becomes (a spot
pool and its on-demand twin), their labels and taints, the ComputeClasses that choose between
them, and how a pod lands on one (Placement). GpuCluster declares them; VllmService places pods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .k8s_objects import COMPUTE_CLASS_LABEL, NODE_POOL_LABEL
from .specs import NodePoolSpec

# The pool GKE Volume Populator's transfer Jobs run on (Hyperdisk ML weights).
TRANSFER_POOL = "hdml-transfer"
# Taints as (key, value), each NoSchedule.
GPU_TAINT = ("nvidia.com/gpu", "present")
# What GKE puts on TPU nodes itself; declared so only pods that tolerate it land there.
TPU_TAINT = ("google.com/tpu", "present")


def twin_name(pool: str) -> str:
    """The on-demand twin of a pool with a fallback pool (NodePoolSpec keeps it within GKE's 40 characters)."""
    return f"{pool}-ondemand"


@dataclass(frozen=True)
class Placement:
    """How a pod lands on a configured GPU pool: node selector plus tolerations."""

    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, str]]


def placement_for(pool: NodePoolSpec) -> Placement:
    acc = pool.machine.accelerator
    assert acc is not None
    if acc.is_tpu:
        # GKE's TPU node labels: the chip and the slice's topology (a multi-host slice's nodes share it).
        selector = {"cloud.google.com/gke-tpu-accelerator": acc.gke_type,
                    "cloud.google.com/gke-tpu-topology": pool.topology or ""}
    else:
        selector = {"cloud.google.com/gke-accelerator": acc.gke_type}
    tolerations = [{"key": acc.resource, "operator": "Exists", "effect": "NoSchedule"}]
    if pool.gpu_partition_size:
        selector["cloud.google.com/gke-gpu-partition-size"] = pool.gpu_partition_size
    if pool.gpu_sharing:
        # GKE's labels on time-shared nodes; a pod without them is not placed on a shared GPU.
        selector["cloud.google.com/gke-gpu-sharing-strategy"] = pool.gpu_sharing.strategy.lower().replace("_", "-")
        selector["cloud.google.com/gke-max-shared-clients-per-gpu"] = str(pool.gpu_sharing.max_shared_clients_per_gpu)
    if pool.has_fallback_pool:
        # The ComputeClass chooses spot first, then the on-demand twin.
        selector[COMPUTE_CLASS_LABEL] = pool.name
        tolerations.append({"key": COMPUTE_CLASS_LABEL, "operator": "Equal", "value": pool.name,
                            "effect": "NoSchedule"})
    else:
        selector[NODE_POOL_LABEL] = pool.name
    return Placement(selector, tolerations)


@dataclass(frozen=True)
class GkePool:
    """One GKE node pool of a configured pool: the pool itself, or (with a fallback pool) its
    on-demand twin, which keeps no floor of its own."""

    spec: NodePoolSpec
    name: str
    spot: bool

    @property
    def is_twin(self) -> bool:
        return self.name != self.spec.name

    @property
    def min_nodes(self) -> int:
        return 0 if self.is_twin else self.spec.min_nodes

    @property
    def is_tpu(self) -> bool:
        acc = self.spec.machine.accelerator
        assert acc is not None
        return acc.is_tpu

    def node_labels(self) -> dict[str, str]:
        labels = {NODE_POOL_LABEL: self.spec.name}
        if self.spec.has_fallback_pool:
            labels[COMPUTE_CLASS_LABEL] = self.spec.name
        return labels

    def taints(self) -> list[tuple[str, str]]:
        """(key, value) of each NoSchedule taint: the accelerator's, and the ComputeClass's where
        one chooses between the pool and its twin (only pods placed by the class land there)."""
        taint = TPU_TAINT if self.is_tpu else GPU_TAINT
        if self.spec.has_fallback_pool:
            return [taint, (COMPUTE_CLASS_LABEL, self.spec.name)]
        return [taint]


def gke_pools(pools: Sequence[NodePoolSpec]) -> list[GkePool]:
    """Each configured pool, followed by its on-demand twin where it has a fallback pool."""
    out: list[GkePool] = []
    for pool in pools:
        out.append(GkePool(pool, pool.name, pool.spot))
        if pool.has_fallback_pool:
            out.append(GkePool(pool, twin_name(pool.name), False))
    return out


def compute_class_spec(pools: Sequence[str], migrate: Optional[bool] = None) -> dict[str, Any]:
    """A ComputeClass choosing `pools` in order (`migrate`: move pods back to an earlier one when
    it has room again); never creating a pool and never scaling up another."""
    return {
        "priorities": [{"nodepools": [p]} for p in pools],
        **({"activeMigration": {"optimizeRulePriority": migrate}} if migrate is not None else {}),
        "nodePoolAutoCreation": {"enabled": False},
        "whenUnsatisfiable": "DoNotScaleUp",
    }


def compute_classes(pools: Sequence[NodePoolSpec]) -> dict[str, dict[str, Any]]:
    """Per pool with a fallback pool, its ComputeClass (named as the pool): spot first, then the
    on-demand twin."""
    return {pool.name: compute_class_spec([pool.name, twin_name(pool.name)], pool.spot_return_migration)
            for pool in pools if pool.has_fallback_pool}
