"""KV-cache offload to host memory (models[].kvOffload) with vLLM 0.34's native backend: its
command line, the host memory it takes from the node, and the tokens the host tier holds.

What vLLM does with it (vllm-project/vllm@v0.34.0):
- `--kv-offloading-size S --kv-offloading-backend native` turn into the OffloadingConnector with
  `cpu_bytes_to_use` = S GiB (config/vllm.py:1072-1106); the size is the replica's, summed over all
  its workers (config/cache.py:407-411), each worker holding its slot of every chunk
  (v1/kv_offload/cpu/spec.py:105-122).
- On CUDA the buffer is one file in /dev/shm of the whole size, checked against the free space there
  before it is created (v1/kv_offload/cpu/shared_offload_region.py:131,170-176), and pinned
  (v1/kv_offload/cpu/gpu_worker.py:794-797): memory the server container's cgroup is charged for.
- It does not raise the batch: a running sequence needs its blocks on the GPU (v1/core/sched/
  scheduler.py:929-994, else the newest is preempted); the host tier is consulted only for a waiting
  sequence's prefix (scheduler.py:1178-1180), which is what a preempted sequence becomes
  (scheduler.py:1876). So it saves recomputing prefixes seen before and preempted sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from .capacity import PoolCapacity
from .node_shapes import node_free
from .specs import ModelSpec, NodePoolSpec
from .vllm_server import container_resources

GIB = 1024 ** 3
# The server pod's other containers on the node: the mesh's Envoy (128 MiB), the weights' init
# container (64 MiB) and Cloud Storage FUSE's sidecar where the weights come through it.
OTHER_CONTAINERS_GIB = 1.0
# The default size leaves a tenth of what is free for the page cache and what the estimate misses.
DEFAULT_SHARE = 0.9
LMCACHE_REFUSED = (
    "vLLM 0.34 runs backend lmcache as LMCacheMPConnector, a client of a separate LMCache server "
    "(tcp://localhost:5555 unless told otherwise: config/vllm.py:1097-1103) that vllm-gke does not deploy, and "
    "the server image (images/Dockerfile) adds no lmcache package; use backend: native (LMCache pays for KV "
    "shared across replicas, disk or remote tiers, and prefill/decode hand-off: docs/guides/kv-offload.md)")


@dataclass(frozen=True)
class HostTier:
    """One replica's host tier: its size (vLLM's --kv-offloading-size), what each of its pods holds
    (its hosts' share), what each pod could take beside the node's other replicas, and the host
    bytes a token takes over all the replica's workers."""

    size_gib: float
    pod_gib: float
    free_per_pod_gib: float
    server_gib: int
    hosts: int
    bytes_per_token: float

    @property
    def tokens(self) -> int:
        return int(self.size_gib * GIB // self.bytes_per_token)

    @property
    def fits(self) -> bool:
        return 0 < self.pod_gib <= self.free_per_pod_gib


def _pod_devices(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    return min(model.devices_per_replica, node_pool.slices_per_node)


def server_memory_gib(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    """The server container's memory without offload: its devices' share of the node."""
    limit = container_resources(node_pool, _pod_devices(model, node_pool))["limits"]["memory"]
    return int(limit.removesuffix("Gi"))


def free_per_pod_gib(model: ModelSpec, node_pool: NodePoolSpec) -> float:
    """What a node has left for each of its server pods once GKE's reservations and its own pods,
    and every pod's server share and other containers are counted (pods fill the node's devices)."""
    pods = max(1, node_pool.slices_per_node // _pod_devices(model, node_pool))
    free = node_free(node_pool.machine_type, node_pool.disk_size_gb)[1] / 1024
    return (free - pods * (server_memory_gib(model, node_pool) + OTHER_CONTAINERS_GIB)) / pods


def host_bytes_per_token(model: ModelSpec) -> float:
    """Host bytes a token takes: every worker stores its own shard, so KV heads replicated over
    tensor-parallel ranks beyond their count are stored once per rank (spec.py:111-113)."""
    tp = model.tensor_parallel_size
    return model.kv_bytes_per_token * tp / min(tp, model.model_shape.kv_heads)


def host_tier(model: ModelSpec, node_pool: NodePoolSpec) -> Optional[HostTier]:
    """The model's host tier on `node_pool`, None without kvOffload or on an accelerator-less pool."""
    if model.kv_offload is None or node_pool.machine.accelerator is None:
        return None
    hosts = max(1, -(-model.devices_per_replica // node_pool.slices_per_node))
    free = free_per_pod_gib(model, node_pool)
    size = model.kv_offload.size_gb
    if size is None:
        size = float(max(0, math.floor(DEFAULT_SHARE * free * hosts)))
    return HostTier(size, size / hosts, free, server_memory_gib(model, node_pool), hosts, host_bytes_per_token(model))


def with_host_tier(row: PoolCapacity, model: ModelSpec, node_pool: NodePoolSpec) -> PoolCapacity:
    """A capacity row with the host tier's size and tokens (unchanged without one)."""
    tier = host_tier(model, node_pool)
    return row if tier is None else replace(row, host_kv_gib=tier.size_gib, host_kv_tokens=tier.tokens)


def offload_args(model: ModelSpec, node_pool: NodePoolSpec) -> list[str]:
    """`vllm serve` flags for the host tier (arg_utils.py:1471-1476); none without one."""
    tier = host_tier(model, node_pool)
    if tier is None or model.kv_offload is None:
        return []
    return ["--kv-offloading-backend", model.kv_offload.backend, "--kv-offloading-size", f"{tier.size_gib:g}"]


def offload_resources(resources: dict[str, dict[str, str]], model: ModelSpec,
                      node_pool: NodePoolSpec) -> dict[str, dict[str, str]]:
    """The server container's resources with its pod's share of the host tier added to the memory
    request and limit (kept equal: Guaranteed QoS); the pinned buffer is charged to this cgroup."""
    tier = host_tier(model, node_pool)
    if tier is None:
        return resources
    memory = f"{tier.server_gib + math.ceil(tier.pod_gib)}Gi"
    return {kind: {**values, "memory": memory} for kind, values in resources.items()}


def shm_size(default_gi: int, model: ModelSpec, node_pool: NodePoolSpec) -> str:
    """/dev/shm's size limit: vLLM refuses to start unless the whole buffer (not a host's share) is
    free there (shared_offload_region.py:170-176), beside what NCCL and the engine keep there."""
    tier = host_tier(model, node_pool)
    return f"{default_gi + (math.ceil(tier.size_gib) if tier else 0)}Gi"


def offload_problems(model: ModelSpec, node_pool: NodePoolSpec) -> list[tuple[str, str]]:
    """(key under models[i].kvOffload, problem and fix) for a host tier vLLM or the node refuses."""
    offload = model.kv_offload
    acc = node_pool.machine.accelerator
    if offload is None or acc is None:
        return []
    if offload.backend == "lmcache":
        return [("backend", LMCACHE_REFUSED)]
    if acc.is_tpu:
        return [("backend", f"native offloading is vLLM's CUDA path; node pool {node_pool.name} is {acc.gke_type}, "
                            "which vLLM's TPU build serves: remove kvOffload or use a GPU node pool")]
    if model.disaggregation is not None:
        return [("backend", "vLLM 0.34 would replace the NIXL connector that disaggregation sets with the offloading "
                            "one (config/vllm.py:1087-1094): remove kvOffload or disaggregation")]
    tier = host_tier(model, node_pool)
    assert tier is not None
    if tier.fits:
        return []
    room = max(0, math.floor(tier.free_per_pod_gib * tier.hosts))
    if offload.size_gb is None:
        return [("sizeGb", f"node pool {node_pool.name} ({node_pool.machine_type}) has no host memory left for it "
                           f"beside its replicas' {tier.server_gib} GiB each: remove kvOffload or use a machine "
                           "with more memory")]
    return [("sizeGb", f"is {offload.size_gb:g} GiB, but each {node_pool.machine_type} node of {node_pool.name} has "
                       f"{room} GiB per replica left after GKE's reservations and its own pods and every replica's "
                       f"{tier.server_gib} GiB server share: lower sizeGb to at most {room}, or leave it unset for "
                       f"{math.floor(DEFAULT_SHARE * room)}")]
