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
- It stores every newly computed block as it is computed (the offloading scheduler's
  _build_store_jobs; store_threshold 0 by default, v1/kv_offload/cpu/spec.py:155-159): the tier
  mirrors the GPU's cache, so only what it holds beyond the GPU's tokens is added prefix reach, and
  the default sizes it from the server's estimated need, not its proportional share of the node.
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
# The default size leaves a tenth of what is free beside the server's need for what the estimate misses.
DEFAULT_SHARE = 0.9
# The server's own host memory beside the tier (server_need_gib): per GPU worker, its CUDA context,
# torch, NCCL and the engine's CPU-side state (a few GiB each on a loaded H100 worker); the API
# server, engine core and tokenizer; and /dev/shm's default (tmpfs, charged to the container).
WORKER_GIB = 6.0
FRONTEND_GIB = 8.0
LMCACHE_REFUSED = (
    "vLLM 0.34 runs backend lmcache as LMCacheMPConnector, a client of a separate LMCache server "
    "(tcp://localhost:5555 unless told otherwise: config/vllm.py:1097-1103) that vllm-gke does not deploy, and "
    "the server image (images/Dockerfile) adds no lmcache package; use backend: native (LMCache pays for KV "
    "shared across replicas, disk or remote tiers, and prefill/decode hand-off: docs/guides/kv-offload.md)")


@dataclass(frozen=True)
class HostTier:
    """One replica's host tier: its size (vLLM's --kv-offloading-size), what each of its pods holds
    (its hosts' share), what each pod's server container may take on the node (room_gib), the
    server's estimated need beside the tier, the memory it is given beside it, and the host bytes a
    token takes over all the replica's workers (tokens: whole chunks, as vLLM counts them)."""

    size_gib: float
    pod_gib: float
    room_gib: float
    need_gib: float
    server_gib: int
    hosts: int
    bytes_per_token: float
    block_tokens: int = 16

    @property
    def tokens(self) -> int:
        return host_tokens(self.size_gib, self.bytes_per_token, self.block_tokens)

    @property
    def fits(self) -> bool:
        """The pod's part of the tier beside the server's need, within what the pod may take, in the
        whole GiB its memory request is written in (the contract row checks that request)."""
        return 0 < self.pod_gib and math.ceil(self.pod_gib) <= self.free_per_pod_gib

    @property
    def free_per_pod_gib(self) -> int:
        """Whole GiB each pod may add beside its server's need."""
        return free_gib(self.room_gib, self.need_gib)


def host_tokens(size_gib: float, bytes_per_token: float, block_tokens: int = 16) -> int:
    """Tokens vLLM's CPU spec holds in `size_gib`: whole chunks of a block over every worker, each
    chunk rounded up to a page (v1/kv_offload/cpu/spec.py:109-122), one block a chunk."""
    chunk = math.ceil(bytes_per_token * block_tokens / PAGE) * PAGE
    return int(size_gib * GIB) // chunk * block_tokens


PAGE = 4096
# The server container asks its estimated need and this tenth more (at most the rest of its room), not
# all the room beside the tier: what the estimate misses, and GKE's GPU-node DaemonSets (metadata
# server, DCGM, the NVIDIA device plugin) that GKE_PER_NODE_MEMORY_MI leaves out, keep room on the node.
NEED_MARGIN = 1.1


def free_gib(room_gib: float, need_gib: float) -> int:
    """Whole GiB a pod may add beside its server: its room rounded down, the need rounded up."""
    return math.floor(room_gib) - math.ceil(need_gib)


def default_size_gib(room_gib: float, need_gib: float, hosts: int) -> float:
    """DEFAULT_SHARE of what each pod has beside its server's need, over the replica's hosts; never more
    than the whole GiB that fit."""
    return float(max(0, min(math.floor(DEFAULT_SHARE * (room_gib - need_gib) * hosts),
                            free_gib(room_gib, need_gib) * hosts)))


def _pod_devices(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    return min(model.devices_per_replica, node_pool.slices_per_node)


def server_memory_gib(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    """The server container's memory without offload: its devices' share of the node."""
    limit = container_resources(node_pool, _pod_devices(model, node_pool))["limits"]["memory"]
    return int(limit.removesuffix("Gi"))


def room_per_pod_gib(model: ModelSpec, node_pool: NodePoolSpec) -> float:
    """What each server container may take: the node's allocatable (the kernel's share, GKE's
    reservations and its own pods out, node_shapes.node_free) over the pods that fill its devices,
    less each pod's other containers."""
    pods = max(1, node_pool.slices_per_node // _pod_devices(model, node_pool))
    free = node_free(node_pool.machine_type, node_pool.disk_size_gb)[1] / 1024
    return free / pods - OTHER_CONTAINERS_GIB


def server_need_gib(model: ModelSpec, node_pool: NodePoolSpec) -> float:
    """An estimate of the server's own host memory beside the tier, not its proportional share of the
    node (792 GiB for a TP-4 70B on an a3-highgpu-8g, far more than it uses): the pod's part of the
    weights (the shard's pages pass through host memory while loading), WORKER_GIB a GPU worker,
    FRONTEND_GIB and /dev/shm's default. A 70B at TP 4: 131 + 24 + 8 + 16 = 179 GiB. Never more than
    the plain share, which the same server runs in without offload (a small machine's 9 GiB)."""
    hosts = max(1, -(-model.devices_per_replica // node_pool.slices_per_node))
    shm = 16 if model.devices_per_replica > 1 else 2  # pods/server.py's default
    weights = model.weights_gb * 1e9 / GIB / hosts
    need = weights + WORKER_GIB * _pod_devices(model, node_pool) + FRONTEND_GIB + shm
    return min(need, server_memory_gib(model, node_pool))


def host_bytes_per_token(model: ModelSpec) -> float:
    """Host bytes a token takes: every worker stores its own shard, so KV heads replicated over
    tensor-parallel ranks beyond their count are stored once per rank (spec.py:111-113)."""
    tp = model.tensor_parallel_size
    return model.kv_bytes_per_token * tp / min(tp, model.model_shape.kv_heads)


def host_tier(model: ModelSpec, node_pool: NodePoolSpec) -> Optional[HostTier]:
    """The model's host tier on `node_pool`, None without kvOffload or on an accelerator-less pool.
    Default: DEFAULT_SHARE of what the pod has beside its server's need; the server is given its need
    and NEED_MARGIN (at most the rest of its room and its plain share), so all of a node's pods fit its
    allocatable beside each other with room to spare."""
    if model.kv_offload is None or node_pool.machine.accelerator is None:
        return None
    hosts = max(1, -(-model.devices_per_replica // node_pool.slices_per_node))
    room, need = room_per_pod_gib(model, node_pool), server_need_gib(model, node_pool)
    size = model.kv_offload.size_gb
    if size is None:
        size = default_size_gib(room, need, hosts)
    server = min(server_memory_gib(model, node_pool), math.floor(room) - math.ceil(size / hosts),
                 math.ceil(need * NEED_MARGIN))
    return HostTier(size, size / hosts, room, need, server, hosts, host_bytes_per_token(model))


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
    room = max(0, tier.free_per_pod_gib * tier.hosts)
    where = (f"each {node_pool.machine_type} node of {node_pool.name} has {tier.room_gib:.0f} GiB a server pod after the "
             f"kernel's and GKE's reservations, its own pods and every pod's other containers, and the server needs about "
             f"{tier.need_gib:.0f} of it (kv_offload.server_need_gib)")
    if offload.size_gb is None:
        return [("sizeGb", f"{where}: nothing left for a host tier; remove kvOffload or use a machine with more memory")]
    default = default_size_gib(tier.room_gib, tier.need_gib, tier.hosts)
    return [("sizeGb", f"is {offload.size_gb:g} GiB, but {where}: lower sizeGb to at most {room}, or leave it unset "
                       f"for {default:g}")]
