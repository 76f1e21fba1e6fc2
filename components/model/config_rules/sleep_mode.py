"""Model swapping (models[].sleepMode on a node pool with gpuSharing): the two go together, a
shared pool has one GPU per node (the swap's lease is per node: GKE does not say which of a
node's GPUs a time-shared pod gets), each server one whole GPU, the lease's store enabled, and the
memory fits - the awake model beside the sleeping ones' GPU residue, and at level 1 each sleeping
model's weights in its pod's share of the node's RAM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..sleep_mode import HOST_OVERHEAD_GB, SLEEP_RESIDUE_GB, host_gb, pod_memory_gb, residue_room
from ..specs import ModelSpec, NodePoolSpec, item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def sleep_mode(cfg: "StackConfig", add: Add) -> None:
    pools = {p.name: p for p in cfg.node_pools}
    for j, pool in enumerate(cfg.node_pools):
        if pool.gpu_sharing is not None and pool.machine.gpus > 1:
            add(f"{item_key('nodePools', cfg.node_pools, j)}.machineType",
                f"{pool.machine_type} has {pool.machine.gpus} GPUs, but a time-shared pool's models swap by a lease "
                "per node, and GKE does not say which GPU of a node a shared pod gets: use a machine type with one "
                "GPU (g2-standard-4 to -16 or -32 for L4)")
        elif pool.gpu_sharing is not None and pool.gpu_partition_size is not None:
            add(f"{item_key('nodePools', cfg.node_pools, j)}.gpuPartitionSize",
                "a time-shared pool's models swap by one lease per node, which would serialise the node's independent "
                "MIG partitions: remove gpuPartitionSize (one whole GPU per node) or gpuSharing")
    for i, model in enumerate(cfg.models):
        pool = pools.get(model.node_pool)
        if pool is not None and not pool.is_tpu:
            _model(cfg, add, item_key("models", cfg.models, i), model, pool)


def _model(cfg: "StackConfig", add: Add, key: str, model: ModelSpec, pool: NodePoolSpec) -> None:
    if pool.gpu_sharing is None:
        if model.sleep_mode is not None:
            add(f"{key}.sleepMode", f"node pool '{pool.name}' has no gpuSharing, so no other model shares the GPU "
                "this one would give up asleep; add gpuSharing to the pool, or remove sleepMode (minReplicas: 0 "
                "scales an idle model to zero instead)")
        return
    if model.sleep_mode is None:
        add(f"{key}.sleepMode", f"node pool '{pool.name}' time-shares its GPUs (gpuSharing) and GKE isolates no "
            "memory between the pods: every model there must sleep while another serves; add sleepMode: {} or "
            "move the model to a pool without gpuSharing")
        return
    if model.devices_per_replica > 1 or model.multi_host:
        add(f"{key}.tensorParallelSize", "a time-shared GPU serves one GPU per container (GKE refuses more than one "
            "nvidia.com/gpu on shared nodes); set tensorParallelSize and pipelineParallelSize to 1")
    if not cfg.global_limits.enabled:
        add("vllm-gke:globalLimits.enabled", f"models[{model.name}].sleepMode takes its GPU's lease in the limit "
            "store; set globalLimits.enabled: true")
    room = residue_room(pool)
    if model.gpu_memory_utilization > room:
        add(f"{key}.gpuMemoryUtilization", f"{model.gpu_memory_utilization:g} of the GPU, the awake server's own "
            f"baseline (CUDA context, cuBLAS, NCCL) and up to {pool.gpu_sharing.max_shared_clients_per_gpu - 1} "
            f"sleeping servers' residue (about {SLEEP_RESIDUE_GB:g} GB each, unmeasured) do not fit the GPU; set it "
            f"to {room:g} or less, or lower maxSharedClientsPerGpu")
    need, have = host_gb(model), pod_memory_gb(pool)
    if need > have:
        level = model.sleep_mode.level
        fix = ("use level 2 (weights reloaded from the share on wake, none kept in RAM)" if level == 1
               else "use a machine type with more memory")
        add(f"{key}.sleepMode.level", f"a server of '{model.name}' needs {need:.1f} GiB of RAM (level {level}: "
            f"{'its weights while asleep plus ' if level == 1 else ''}{HOST_OVERHEAD_GB:g} GiB for its processes) "
            f"but its pod's share of a {pool.machine_type} node is {have:.0f} GiB; lower the pool's "
            f"maxSharedClientsPerGpu, pick a machine type with more memory, or {fix}")
