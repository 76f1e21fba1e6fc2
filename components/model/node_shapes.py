"""What a GKE node offers pods: its machine less GKE's reservations, and what GKE's own pods take.

Allocatable follows GKE's documented reservations (cloud.google.com/kubernetes-engine/docs/concepts/
plan-node-sizes#memory_and_cpu_reservations, #local_ephemeral_storage_reservation):
  CPU     6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% of any above 4
  memory  25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112,
          2% above 128, plus the kubelet's 100 MiB eviction threshold
  disk    the smaller of 50% of the boot disk and 6 GiB + 35% of it (at most 100 GiB), plus the
          10% eviction threshold
  pods    110 (GKE's default maximum per node on a VPC-native cluster)

The kubelet's capacity is not the machine's memory but what the OS reports: the kernel keeps 1/64
of it, 16 MiB, 64 MiB of software IO TLB above 3 GiB, 8 MiB more at 8 GiB or less, and on COS
(GKE's default node image) a measured correction of 0.175% capped at 248 MiB, before GKE's
reservations (the cluster autoscaler's GCE model: kubernetes/autoscaler cluster-autoscaler/
cloudprovider/gce/gce_reserved.go CalculateKernelReserved, lines 107-119 for the correction;
templates.go BuildCapacity `memTotal := mem - CalculateKernelReserved`). On an a3-highgpu-8g that
is about 30 GiB of its 1872. GKE's plan-node-sizes page shows an e2-standard-4 at 13498416Ki allocatable
(13,182 MiB); this model says 13,257 MiB, 75 MiB (0.6%) more (tests/test_kv_offload.py pins the gap).

GKE also runs its own pods on every node (logging, metrics, CSI and network agents) and a few per
cluster (kube-dns, konnectivity, metrics-server): their requests are estimates read off GKE 1.33
clusters (kubectl get pods -n kube-system), not a published figure, so the system pool check keeps
them apart and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .catalog import MACHINE_TYPES

GIB = 1024 ** 3
MAX_PODS = 110

# GKE's own pods: per node (DaemonSets: fluentbit-gke, gke-metrics-agent, pdcsi-node,
# filestore-node, gcsfusecsi-node, anetd/netd, kube-proxy) and per cluster (kube-dns x2 with its
# autoscaler, konnectivity-agent x2, metrics-server, event-exporter, l7-default-backend).
GKE_PER_NODE_CPU_M = 350
GKE_PER_NODE_MEMORY_MI = 520
GKE_PER_CLUSTER_CPU_M = 800
GKE_PER_CLUSTER_MEMORY_MI = 1100


def _tiered(total: float, tiers: tuple[tuple[float, float], ...], rest: float) -> float:
    """A reservation of `total` charged tier by tier: (size of the tier, share of it), then `rest`."""
    reserved, left = 0.0, total
    for size, share in tiers:
        step = min(left, size)
        reserved += step * share
        left -= step
    return reserved + max(left, 0.0) * rest


def cpu_reserved_m(vcpus: int) -> int:
    return round(1000 * _tiered(vcpus, ((1, 0.06), (1, 0.01), (2, 0.005)), 0.0025))


def memory_reserved_mi(memory_gib: float) -> int:
    gib = _tiered(memory_gib, ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06)), 0.02)
    return round(gib * 1024) + 100


def kernel_reserved_mi(memory_gib: float) -> int:
    """What the kernel keeps of the machine's memory before the kubelet counts capacity, on COS
    (gce_reserved.go CalculateKernelReserved)."""
    mi = memory_gib * 1024
    low = 8 if memory_gib <= 8 else 0
    return math.ceil(mi / 64 + 16 + (64 if memory_gib > 3 else 0) + low + min(0.00175 * mi, 248))


def disk_reserved_gib(disk_gib: float) -> float:
    system = min(0.5 * disk_gib, 6 + 0.35 * disk_gib, 100.0)
    return system + 0.1 * disk_gib


@dataclass(frozen=True)
class NodeShape:
    """A node's capacity and allocatable, as the kubelet reports them (CPU in millicores, memory
    in MiB, disk in GiB), with its accelerator devices (GPUs, MIG slices or TPU chips)."""

    machine_type: str
    cpu_m: int
    memory_mi: int
    disk_gib: int
    alloc_cpu_m: int
    alloc_memory_mi: int
    alloc_disk_gib: float
    devices: int
    device_resource: str | None


def node_shape(machine_type: str, disk_gib: int, slices_per_gpu: int = 1) -> NodeShape:
    machine = MACHINE_TYPES[machine_type]
    # Capacity is what the OS reports (less the kernel's share); GKE reserves from the machine's memory.
    cpu_m, memory_mi = machine.vcpus * 1000, machine.memory_gb * 1024 - kernel_reserved_mi(machine.memory_gb)
    acc = machine.accelerator
    return NodeShape(
        machine_type, cpu_m, memory_mi, disk_gib,
        cpu_m - cpu_reserved_m(machine.vcpus), memory_mi - memory_reserved_mi(machine.memory_gb),
        disk_gib - disk_reserved_gib(disk_gib),
        machine.gpus * (1 if acc is None or acc.is_tpu else slices_per_gpu),
        acc.resource if acc is not None else None)


def system_pool_free(machine_type: str, disk_gib: int, nodes: int) -> tuple[int, int]:
    """CPU (m) and memory (MiB) a system pool of `nodes` offers our pods, after GKE's own."""
    shape = node_shape(machine_type, disk_gib)
    cpu = nodes * (shape.alloc_cpu_m - GKE_PER_NODE_CPU_M) - GKE_PER_CLUSTER_CPU_M
    memory = nodes * (shape.alloc_memory_mi - GKE_PER_NODE_MEMORY_MI) - GKE_PER_CLUSTER_MEMORY_MI
    return cpu, memory


def node_free(machine_type: str, disk_gib: int) -> tuple[int, int]:
    """CPU (m) and memory (MiB) one node offers a pod after GKE's reservations and per-node pods."""
    shape = node_shape(machine_type, disk_gib)
    return shape.alloc_cpu_m - GKE_PER_NODE_CPU_M, shape.alloc_memory_mi - GKE_PER_NODE_MEMORY_MI
