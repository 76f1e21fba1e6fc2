"""Where models run: the pool each names exists and holds it (GPUs, memory, context), the pools
offer the slots and disk the replicas need, and scale to zero takes the nodes too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import gpu_slots_by_pool, hosts_per_replica, placements, pool_capacity
from ..k8s_objects import group_name_of, service_name_of
from ..specs import ModelSpec, NodePoolSpec, ServingPoolSpec, item_key
from ..vllm_server import XLA_CACHE_MAX_GI, scratch_gi
from ..weights_backends import backend_of
from ..weights_layout import BASIC_TIERS, TIER_MIN_GB, needed_gb
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def check_placement(cfg: "StackConfig", add: Add, key: str, model: ModelSpec, pool_name: str,
                     model_key: str = "") -> None:
    """`key` names where the placement is chosen (a model's, or a tenant's dedicated.nodePool);
    `model_key` the model, when that is elsewhere."""
    pools = {p.name: p for p in cfg.node_pools}
    pool = pools.get(pool_name)
    if pool is None:
        add(f"{key}.nodePool", f"node pool '{pool_name}' does not exist; use one of "
            f"{', '.join(pools)} or add it under vllm-gke:nodePools")
        return
    if model_key:
        check_fit(lambda _k, problem: add(f"{key}.nodePool", f"{model_key}: {problem}"), model_key, model, pool)
    else:
        check_fit(add, key, model, pool)


def check_fit(add: Add, key: str, model: ModelSpec, pool: NodePoolSpec) -> None:
    """The model on the devices of `pool`: parallelism the pool can give (one host's GPUs, whole
    nodes of GPUs for a multi-host group, a whole TPU slice), and weights plus KV cache that fit
    each device (components/model/capacity.py). Also run by the package's VllmService."""
    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    devices, per_node = model.devices_per_replica, pool.slices_per_node
    shape = f"tensorParallelSize x pipelineParallelSize is {tp} x {pp} = {devices}"
    if pool.gpu_partition_size and devices > 1:
        add(f"{key}.tensorParallelSize", f"{shape} but pool '{pool.name}' is MIG-partitioned "
            f"({pool.gpu_partition_size}); MIG slices cannot be joined, so set both to 1 or use a pool "
            "without gpuPartitionSize")
    elif pool.is_tpu and model.dtype == "gptq":
        add(f"{key}.dtype", "gptq weights do not run on vLLM's TPU build (its quantisation methods have no GPTQ "
            "kernel); use awq, int8 or bfloat16 on TPUs, or a GPU pool")
    elif pool.is_tpu:
        chips = per_node * pool.hosts
        if devices != chips:
            add(f"{key}.tensorParallelSize", f"{shape} but a replica on pool '{pool.name}' is its whole "
                f"{pool.topology} slice of {chips} {pool.machine.accelerator.gke_type if pool.machine.accelerator else ''}"
                f" chip(s); set tensorParallelSize to {chips} (pipelineParallelSize 1), or pick the pool's "
                "tpuTopology for the chips the model needs")
        elif pp > 1:
            add(f"{key}.pipelineParallelSize", f"is {pp}, but vLLM's TPU build shards a model over a slice by "
                f"tensor parallelism; set it to 1 and tensorParallelSize to {chips}")
    elif devices <= per_node and per_node % devices:
        add(f"{key}.tensorParallelSize", f"{shape} but {pool.machine_type} has {per_node} GPU(s) per node; use "
            "a divisor of that, or a larger machine type")
    elif devices > per_node and devices % per_node:
        add(f"{key}.tensorParallelSize", f"{shape}, more than {pool.machine_type}'s {per_node} GPUs per node but "
            f"not a multiple of them: a replica across hosts takes whole nodes; use a multiple of {per_node}")
    check_multi_host(add, key, model, pool)
    kv_heads, heads = model.model_shape.kv_heads, model.model_shape.attention_heads
    if tp > 1 and heads is not None and heads % tp:
        # vLLM shards the query heads over the tensor-parallel ranks: they must divide evenly
        # (vllm 0.34.0 config/model.py:1577-1581).
        add(f"{key}.tensorParallelSize", f"{tp} does not divide the model's {heads} attention heads: vLLM refuses "
            "to start; use a divisor of them")
    elif tp > 1 and kv_heads % tp and tp % kv_heads:
        # vLLM splits or replicates KV heads over tensor-parallel ranks: one count must divide the other.
        add(f"{key}.tensorParallelSize", f"{tp} neither divides nor is a multiple of the model's {kv_heads} KV "
            "heads: vLLM refuses to shard it; use a divisor or multiple of them")
    where = (f"one {pool.gpu_partition_size} MIG slice" if pool.gpu_partition_size
             else f"one {pool.machine_type} {'TPU chip' if pool.is_tpu else 'GPU'}")
    for which in model.pool_names:
        row = pool_capacity(model, which, getattr(model, which), pool)
        if row.fits:
            continue
        if row.kv_budget_gb <= 0:  # the weights alone overflow: same for both pools
            add(key, f"model '{model.name}' on {where} of pool '{pool.name}': {row.problem}; {row.fix()}")
            break
        add(f"{key}.{which}" if key.startswith("models") else key,
            f"model '{model.name}' ({which} pool) on {where} of pool '{pool.name}': {row.problem}; {row.fix()}")


def check_multi_host(add: Add, key: str, model: ModelSpec, pool: NodePoolSpec) -> None:
    """A replica that spans hosts is a choice (multiHost: true), never the side effect of a
    parallelism that outgrows a node: on most GPU machines its hosts talk over plain TCP."""
    if model.multi_host or pool.gpu_partition_size:
        return
    devices, per_node, machine = model.devices_per_replica, pool.slices_per_node, pool.machine
    if pool.is_tpu:
        if pool.hosts > 1 and devices == per_node * pool.hosts:
            add(f"{key}.multiHost", f"is not set, but pool '{pool.name}' is a {pool.topology} slice of {pool.hosts} "
                f"{pool.machine_type} hosts: each replica would span them as a LeaderWorkerSet group (over the "
                f"slice's ICI); set multiHost: true on the model to mean it, or use a single-host pool "
                f"(tpuTopology {machine.tpu_topologies[0]}, or a larger host) if the model fits one")
        return
    if devices > per_node and devices % per_node == 0:
        fabric = (f"{machine.gpudirect} needs GKE multi-networking, which vllm-gke does not set up" if machine.gpudirect
                  else "no GPUDirect interconnect")
        add(f"{key}.multiHost", f"is not set, but tensorParallelSize x pipelineParallelSize is "
            f"{model.tensor_parallel_size} x {model.pipeline_parallel_size} = {devices}, more than "
            f"{pool.machine_type}'s {per_node} GPU(s) per node: each replica would span {devices // per_node} hosts "
            f"as a LeaderWorkerSet group over TCP at {machine.nic_gbps:g} Gbps ({fabric}); set multiHost: true on "
            f"the model to mean it, or lower tensorParallelSize x pipelineParallelSize to {per_node} or fewer "
            "(or use a machine type with more GPUs per node)")


def model_placements(cfg: "StackConfig", add: Add) -> None:
    for i, model in enumerate(cfg.models):
        key = item_key("models", cfg.models, i)
        check_placement(cfg, add, key, model, model.node_pool)
        check_pool_lengths(add, key, model)


def check_pool_lengths(add: Add, key: str, model: ModelSpec) -> None:
    """Each pool's context within the model's, and with chunked prefill off, a batch that holds a
    whole prompt (vLLM refuses to start otherwise). Also run by the package's VllmService."""
    for pool_name in model.pool_names:
        check_pool_length(add, key, f"{key}.{pool_name}", model, getattr(model, pool_name))


def check_pool_length(add: Add, key: str, at: str, model: ModelSpec, pool: ServingPoolSpec) -> None:
    """One pool's, at its key `at` (a disaggregated model's prefill pool too: config_rules/disaggregation.py)."""
    if pool.max_model_len and pool.max_model_len > model.max_model_len:
        add(f"{at}.maxModelLen", f"{pool.max_model_len} exceeds the model's "
            f"maxModelLen {model.max_model_len}; lower it or raise {key}.maxModelLen")
    length = model.pool_max_model_len(pool)
    if not model.enable_chunked_prefill and pool.max_num_batched_tokens and pool.max_num_batched_tokens < length:
        add(f"{at}.maxNumBatchedTokens",
            f"{pool.max_num_batched_tokens} is below the pool's maxModelLen {length} with chunked prefill "
            "off: vLLM refuses to start (a prompt must fit one batch); raise it to at least the context "
            "length or set enableChunkedPrefill: true")


def gpu_slots(cfg: "StackConfig", add: Add) -> None:
    pools = {p.name: p for p in cfg.node_pools}
    for name, needed in gpu_slots_by_pool(cfg).items():
        pool = pools.get(name)
        if pool is None:
            continue  # reported as an unknown nodePool
        offered = pool.max_nodes * pool.slices_per_node
        if needed > offered:
            idx = cfg.node_pools.index(pool)
            add(f"{item_key('nodePools', cfg.node_pools, idx)}.maxNodes", f"pool '{name}' offers at most {offered} "
                f"GPU slot(s) ({pool.max_nodes} node(s) x {pool.slices_per_node}) but its models' minReplicas need "
                f"{needed}; raise maxNodes or lower minReplicas")


# Of a node's boot disk, what the OS, the kubelet and the images (the multi-GB server image among
# them) keep, before pods' emptyDirs get any: a conservative share.
SYSTEM_DISK_GB = 60


def node_disks(cfg: "StackConfig", add: Add) -> None:
    """Every replica requests the node disk its emptyDirs may fill (scratch, and on the bucket
    backend the file cache): the replicas a node can hold must fit its boot disk, or the
    scheduler leaves GPU slices idle (and without requests the kubelet would evict them)."""
    pools = {p.name: p for p in cfg.node_pools}
    bucket_cache = backend_of(cfg.weights).servers_read_through_fuse
    worst: dict[str, tuple[int, int, str]] = {}  # node pool -> (GiB a full node asks, replicas, model)
    # A TPU node keeps one XLA cache directory (XLA_CACHE_MAX_GI at most) for each serving pool that
    # ran on it (components/model/vllm_server.py xla_cache_host_path): a hostPath, which no pod requests.
    caches: dict[str, int] = {}
    for model, pool_name, _tenant in placements(cfg):
        pool = pools.get(pool_name)
        if pool is None:
            continue
        if pool.is_tpu:
            caches[pool_name] = caches.get(pool_name, 0) + len(model.pool_names)
        # A multi-host group puts one pod on each of its nodes.
        per_node = max(1, pool.slices_per_node // model.devices_per_replica)
        need = per_node * scratch_gi(model, bucket_cache)
        if per_node and need > worst.get(pool_name, (0, 0, ""))[0]:
            worst[pool_name] = (need, per_node, model.name)
    for pool_name, (need, per_node, model_name) in worst.items():
        pool = pools[pool_name]
        usable = pool.disk_size_gb - SYSTEM_DISK_GB
        cache = caches.get(pool_name, 0) * XLA_CACHE_MAX_GI
        if need + cache > usable:
            xla = f", plus {cache} GiB for the XLA caches of its {caches[pool_name]} serving pools" if cache else ""
            add(f"{item_key('nodePools', cfg.node_pools, cfg.node_pools.index(pool))}.diskSizeGb",
                f"{pool.disk_size_gb} GB holds {usable} GB for pods, but {per_node} replicas of {model_name} on a "
                f"node ask {need} GiB (compile caches{' and the bucket file cache' if bucket_cache else ''}){xla}; "
                f"raise diskSizeGb to {need + cache + SYSTEM_DISK_GB} or more")


# A LeaderWorkerSet's worker StatefulSet is <set>-<group index>, and its pods' revision label
# <statefulset>-<10-char hash> must stay within a label's 63 characters.
MAX_GROUP_NAME = 63 - len("-99") - len("-") - 10


def multi_host_groups(cfg: "StackConfig", add: Add) -> None:
    """Per group across hosts: its names fit Kubernetes' limits, and a GPU pool's node upgrades
    surge a whole group's hosts (one at a time, each upgrade would restart the group once a host:
    every restart a full reload of the weights)."""
    pools = {p.name: p for p in cfg.node_pools}
    widest: dict[str, int] = {}
    for model, pool_name, _tenant in placements(cfg):
        pool = pools.get(pool_name)
        if pool is None:
            continue
        hosts = hosts_per_replica(model, pool)
        if hosts <= 1:
            continue
        widest[pool_name] = max(widest.get(pool_name, 0), hosts)
        canary = model.revision != cfg.model(model.name).revision
        for which in model.pool_names:
            group = group_name_of(service_name_of(model.name, which, canary))
            if len(group) > MAX_GROUP_NAME:
                add(f"{item_key('models', cfg.models, cfg.models.index(cfg.model(model.name)))}.name",
                    f"its replicas span hosts, and LeaderWorkerSet '{group}' ({len(group)} characters) would name "
                    f"pods whose revision label exceeds 63 characters; use a name at most "
                    f"{len(model.name) - (len(group) - MAX_GROUP_NAME)} characters long")
    if widest and not cfg.cluster.dataplane_v2:
        groups = ", ".join(sorted({m.name for m, p, _t in placements(cfg) if p in widest
                                   and hosts_per_replica(m, pools[p]) > 1}))
        add("cluster.dataplaneV2", f"is false, so GKE enforces no NetworkPolicy (it does with Dataplane V2 or the "
            f"Calico add-on, which this cluster does not declare), but {groups} span hosts: each group's NetworkPolicy "
            "is the only lock on the ports its pods open outside the mesh (torch.distributed, NCCL, Ray's head, which "
            "runs what is submitted to it); set dataplaneV2 true, which only a new cluster can have (changing it "
            "recreates the cluster), or keep each replica within one node")
    for name, hosts in widest.items():
        pool = pools[name]
        zones = cfg.cluster.zones
        if not pool.is_tpu and len(zones) > 1:
            add("cluster.zones", f"lists {len(zones)} zones, over which GPU pool '{name}' spreads its nodes, but a "
                f"replica on it spans {hosts} hosts: a LeaderWorkerSet group's hosts could land in different zones "
                "(every step's traffic then crosses zones, slower and billed per GB); list one zone for a cluster "
                "that runs GPU groups across hosts, or keep each replica within one node")
        if not pool.is_tpu and pool.upgrade.strategy == "SURGE" and pool.upgrade.max_surge < hosts:
            add(f"{item_key('nodePools', cfg.node_pools, cfg.node_pools.index(pool))}.upgrade.maxSurge",
                f"is {pool.upgrade.max_surge}, but a replica on '{name}' spans {hosts} hosts: upgraded one node at a "
                f"time, each group restarts {hosts} times; set maxSurge to {hosts} or strategy BLUE_GREEN")


def scale_to_zero(cfg: "StackConfig", add: Add) -> None:
    """A node pool whose every serving pool may scale to zero must itself go to zero nodes, or
    the GPU node stays (and is billed) with nothing on it."""
    floors: dict[str, list[int]] = {}
    for model, pool_name, _tenant in placements(cfg):
        floors.setdefault(pool_name, []).extend(getattr(model, w).min_replicas for w in model.pool_names)
    for i, pool in enumerate(cfg.node_pools):
        mins = floors.get(pool.name, [])
        if mins and not any(mins) and pool.min_nodes > 0:
            add(f"{item_key('nodePools', cfg.node_pools, i)}.minNodes", f"is {pool.min_nodes}, but every serving "
                f"pool on '{pool.name}' may scale to zero (minReplicas 0): set it to 0 so the GPU node goes too")


def filestore_size(cfg: "StackConfig", add: Add) -> None:
    """The share holds every copy and a new one of the largest beside it (a new revision or
    source loads before the servers roll and the old copy goes): a share sized below that fails
    the loader of any such change (it checks the free space first), so an explicit size below it
    is refused. A Basic share's size is the key's alone (it only grows)."""
    weights = cfg.weights
    if not backend_of(weights).has_filestore_share or (weights.tier not in BASIC_TIERS and weights.capacity_gb is None):
        return  # derived from the models: never below what they need
    size = max(TIER_MIN_GB[weights.tier], weights.capacity_gb or 0)
    if (needed := needed_gb(cfg.models)) <= size:
        return
    why = (f"the models' weights need a {needed} GiB share (every copy, plus the largest again for a new revision "
           f"loading beside the current one, plus 30%), but the {weights.tier} share is {size} GiB; set "
           f"weights.capacityGb to {needed} or more")
    add("weights.capacityGb", why + (". A Basic share only grows, so its size is this key's, never derived from the "
                                     "models: lowering it later is refused" if weights.tier in BASIC_TIERS else
                                     ", or remove the key to derive the size from the models"))
