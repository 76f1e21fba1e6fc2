"""Model swapping on a time-shared GPU with vLLM's sleep mode (models[].sleepMode on a node pool
with gpuSharing): the flag, the guard's swap config, the pod's lease identity, and the figures the
plan shows - the memory each swap group holds, the wake time against a cold start.

How a swap runs (images/vllm_gke_guard/swap.py): one lease per GPU (per node: a shared pool has one
GPU per node) in the limit store. A request admitted by the tenant guard to a sleeping model
records that it wants the GPU and waits; the awake model, once its requests finish (and it has
been awake minAwakeSeconds), sleeps through vLLM's engine client and drops the lease; the waiter
takes it and wakes, renewing it meanwhile. Past waitSeconds the request gets a 503 with
Retry-After. The entrypoint takes the lease before vLLM starts, so no server loads beside an awake
one: vLLM 0.34 does not refuse to (its extensible KV cache, on by default on CUDA, skips the
free-memory check: vllm-project/vllm@v0.34.0:vllm/v1/worker/utils.py:759-762,783-786) but sizes
its KV cache from what is free after warm-up (v1/worker/extensible_kv_cache.py:592-618), so it
would fail to load or keep a tiny cache until restarted.

Figures (estimates, stated in the plan):
  wake, level 1   the weights copied back from pinned host memory over PCIe (H2D_GB_S) plus the
                  engine's resume (RESUME_S): vLLM 0.34 cumem.py wake_up copies each backed-up
                  allocation with cudaMemcpy
  wake, level 2   the weights read again from the weights share at its throughput (the cold
                  start's read, without the image, the engine start or the node)
  host memory     level 1 keeps each sleeping model's weights in the pod's RAM (its memory
                  request): counted against the node's memory, one share per shared client
  GPU residue     what a sleeping server keeps on the GPU (its CUDA context, cuBLAS and NCCL
                  buffers, CUDA graphs - kept by default, vLLM 0.34 config/model.py:398 - and
                  allocations outside the sleep pool): unmeasured; the awake server's own such
                  baseline (taken before its budget, v1/worker/gpu_worker.py:520-556) counts too
  lease           a pool's lease outlives its slowest wake by half again (renewed meanwhile, it
                  still covers a wake whose store went away): a server gone frees the GPU after
                  two leases (the lapse, then the fence every missing lease gets)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog import MACHINE_TYPES
from .cold_start import MIB, cold_start_seconds, read_mib_s
from .machine_prices import MACHINE_PRICES
from .specs import ModelSpec, NodePoolSpec

if TYPE_CHECKING:
    from .stack_config import StackConfig

# Host-to-device copy from pinned memory, GB/s: about half of PCIe Gen4 x16's 32 (an estimate;
# cumem copies allocation by allocation).
H2D_GB_S = 12.0
# The engine's own resume after the copy: the KV cache re-mapped, the scheduler resumed (estimate).
RESUME_S = 2.0
# GB a sleeping vLLM server keeps on its GPU (CUDA context, cuBLAS/NCCL buffers, CUDA graphs,
# non-pool allocations; vLLM logs it as "Sleep mode freed X GiB memory, Y GiB memory is still in
# use"): an estimate, not measured here. The awake server's baseline outside its budget is as large.
SLEEP_RESIDUE_GB = 1.0
# GB of a server pod's RAM beyond the weights it backs up: the API server, the engine-core process,
# the tokenizer, pinned staging buffers (an estimate).
HOST_OVERHEAD_GB = 6.0
# The lease's least time to live: a holder that stops renewing it (its pod gone) frees the GPU after
# this and the fence (as long again) that a missing lease gets.
LEASE_SECONDS = 15
# The lease outlives the pool's slowest wake estimate by this factor: a server whose store went away
# (or restarted) mid-wake finishes its wake, then sleeps, before the fence lets another wake.
LEASE_MARGIN = 1.5
# The weights share's read a package user's VllmService assumes for a level-2 wake (it knows no
# stack's share): a slow one, MiB/s, so the lease errs long.
FACADE_READ_MIB_S = 200.0
# Env the guard reads: the node (the lease's GPU) and the pod (the lease's holder).
NODE_ENV, HOLDER_ENV = "GKE_LLM_SWAP_NODE", "GKE_LLM_SWAP_HOLDER"


def sleep_args(model: ModelSpec) -> list[str]:
    """`--enable-sleep-mode` for a model that sleeps (vLLM 0.34 config/model.py enable_sleep_mode;
    on CUDA it turns on the cumem allocator the swap needs)."""
    return ["--enable-sleep-mode"] if model.sleep_mode is not None else []


def swap_env(model: ModelSpec) -> list[dict[str, Any]]:
    """The pod's node and name (the downward API): the lease is per node, held by a pod."""
    if model.sleep_mode is None:
        return []
    return [{"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": HOLDER_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def swap_guard_config(model: ModelSpec, lease_s: int = LEASE_SECONDS) -> dict[str, Any]:
    """The guard's `swap` section (images/vllm_gke_guard/swap.py); empty for a model that never sleeps."""
    sleep = model.sleep_mode
    if sleep is None:
        return {}
    return {"swap": {"level": sleep.level, "waitSeconds": sleep.wait_seconds,
                     "minAwakeSeconds": sleep.min_awake_seconds, "leaseSeconds": lease_s}}


def lease_for(wakes_s: list[float]) -> int:
    """The lease of a GPU whose models wake in `wakes_s`: the slowest with LEASE_MARGIN, at least LEASE_SECONDS."""
    return max(LEASE_SECONDS, math.ceil(LEASE_MARGIN * max(wakes_s, default=0.0)))


def package_lease_seconds(node_pool: NodePoolSpec) -> int:
    """A package user's VllmService: the same lease for every model of the pool (a take's fence is the
    taker's lease, so one shorter than another's wake lets a model wake beside it reloading). A lone
    service knows not the pool's other models, so the pool's bound: a level-2 wake of the GPU's whole
    memory, read at FACADE_READ_MIB_S."""
    return lease_for([RESUME_S + node_pool.slice_memory_gb * 1e9 / (FACADE_READ_MIB_S * 1024 ** 2)])


def lease_seconds(cfg: "StackConfig", node_pool: str) -> int:
    """One lease for a shared pool's models: a take's fence is the taker's lease, so it must cover the
    slowest model's wake, whoever holds the GPU."""
    return lease_for([wake_seconds(cfg, m) for m in cfg.models if m.node_pool == node_pool and m.sleep_mode])


def pod_memory_gb(node_pool: NodePoolSpec) -> float:
    """RAM one server pod of a shared pool requests (vllm_server.container_resources' share: the
    node's allocatable estimate over its shared clients), GiB."""
    machine = node_pool.machine
    return max(8, math.floor((machine.memory_gb * 0.85 - 4) / node_pool.slices_per_node))


def host_gb(model: ModelSpec) -> float:
    """RAM a server of `model` needs: at level 1 its weights while asleep, plus the processes."""
    assert model.sleep_mode is not None
    return HOST_OVERHEAD_GB + (model.weights_gb if model.sleep_mode.level == 1 else 0.0)


def wake_seconds(cfg: "StackConfig", model: ModelSpec) -> float:
    """From a request to a sleeping model until it can serve, once the GPU is free."""
    return wake_at(model, read_mib_s(cfg) * MIB)


def wake_at(model: ModelSpec, read_bytes_s: float) -> float:
    """The wake with the weights share read at `read_bytes_s` (level 2's reload)."""
    assert model.sleep_mode is not None
    if model.sleep_mode.level == 1:
        return RESUME_S + model.weights_gb / H2D_GB_S
    return RESUME_S + model.weights_gb * 1e9 / read_bytes_s


def residue_room(node_pool: NodePoolSpec) -> float:
    """The largest gpuMemoryUtilization an awake model may have beside the others asleep, rounded down:
    its budget (that share of the GPU) plus its own baseline taken before it (CUDA context, cuBLAS,
    NCCL: vLLM 0.34 v1/worker/gpu_worker.py:520-556) plus the others' residue fit the GPU; vLLM does
    not check this at start (its extensible KV cache skips the free-memory check, see above)."""
    acc = node_pool.machine.accelerator
    assert acc is not None and node_pool.gpu_sharing is not None
    servers = node_pool.gpu_sharing.max_shared_clients_per_gpu  # the others asleep and the awake one's baseline
    return math.floor(100 * (1 - servers * SLEEP_RESIDUE_GB / node_pool.slice_memory_gb)) / 100


def package_problems(model: ModelSpec, node_pool: NodePoolSpec, global_limits: bool) -> list[tuple[str, str]]:
    """A package user's VllmService with sleepMode: (input, problem) for what the stack's config rules
    refuse and the component cannot run with (the lease's store, one lease per GPU)."""
    if model.sleep_mode is None:
        return []
    out: list[tuple[str, str]] = []
    if not global_limits:
        out.append(("globalLimits", "model.sleepMode takes its GPU's lease in the LimitStore: set globalLimits "
                    "true (and declare a LimitStore with this namespace among its clients)"))
    if node_pool.gpu_sharing is None:
        out.append(("nodePool.gpuSharing", "model.sleepMode swaps models on a time-shared GPU: give the node pool "
                    "gpuSharing, or remove sleepMode"))
    if node_pool.gpu_partition_size is not None or node_pool.machine.gpus > 1:
        out.append(("nodePool.gpuPartitionSize" if node_pool.gpu_partition_size else "nodePool.machineType",
                    "model.sleepMode takes one lease per node, which would serialise a node's independent GPUs "
                    "or MIG partitions: use a machine type with one whole GPU (no gpuPartitionSize)"))
    return out


# A wake longer than this share of waitSeconds leaves little of the wait for the awake model's requests.
WAKE_NEAR_WAIT = 0.5


@dataclass(frozen=True)
class SwapRow:
    """One model of a swap group, as the plan shows it."""

    model: str
    node_pool: str
    level: int
    weights_gb: float
    host_gb: float
    wake_s: float
    cold_start_s: float
    wait_s: int
    lease_s: int


def swap_rows(cfg: "StackConfig") -> list[SwapRow]:
    """Each model that sleeps: its memory, its wake time against its cold start (node ready to
    serving), and how long a request may wait for its turn."""
    rows: list[SwapRow] = []
    for model in cfg.models:
        if model.sleep_mode is None:
            continue
        rows.append(SwapRow(model.name, model.node_pool, model.sleep_mode.level, model.weights_gb, host_gb(model),
                            wake_seconds(cfg, model), cold_start_seconds(cfg, model), model.sleep_mode.wait_seconds,
                            lease_seconds(cfg, model.node_pool)))
    return rows


def swap_lines(cfg: "StackConfig") -> list[str]:
    """The plan's section: per swap group (a time-shared pool), what each model holds and how fast
    it wakes, then the trade-off."""
    rows = swap_rows(cfg)
    if not rows:
        return []
    lines = ["Model swapping (sleep mode on time-shared GPUs; one model awake per GPU):"]
    for pool in sorted({r.node_pool for r in rows}):
        spec = cfg.pool(pool)
        group = [r for r in rows if r.node_pool == pool]
        ram = sum(r.host_gb for r in group)
        lines.append(f"  pool {pool} ({spec.machine_type}, {spec.machine.memory_gb} GB RAM, "
                     f"{_shared(spec)} pods per GPU, {pod_memory_gb(spec):.0f} GiB each): "
                     f"{len(group)} model(s), {ram:.1f} GB of host RAM asleep and awake")
        lines.append("    " + _cost_line(spec, len(group)))
        lines.append(f"    lease {group[0].lease_s} s (the slowest wake x {LEASE_MARGIN:g}): a server gone frees the "
                     f"GPU after ~{2 * group[0].lease_s} s (the lease, then its fence)")
        for r in group:
            lines.append(f"    {r.model}: level {r.level}, {r.weights_gb:.1f} GB weights, host {r.host_gb:.1f} GB; "
                         f"wake ~{r.wake_s:.0f} s vs cold start ~{r.cold_start_s:.0f} s "
                         f"({r.cold_start_s / r.wake_s:.0f}x); waits up to {r.wait_s} s for its turn, then 503 + "
                         f"Retry-After (a wake begun by then runs its ~{r.wake_s:.0f} s)")
            if r.wake_s > WAKE_NEAR_WAIT * r.wait_s:
                lines.append(f"    warning: {r.model} wakes in ~{r.wake_s:.0f} s, near its waitSeconds {r.wait_s}: a "
                             "request that waits for the awake model's requests first may get 503; raise waitSeconds"
                             + (" or use level 1" if r.level == 2 else ""))
    lines.append("  trade-off: a request to a sleeping model waits for the awake one's requests to finish plus "
                 "its wake; the models of one GPU never serve at once (no concurrency across them), so it pays "
                 "only for rarely used models whose traffic seldom overlaps: a model busy most of the time "
                 "wants its own GPU")
    return lines


def _hourly(machine_type: str, spot: bool) -> float:
    price = MACHINE_PRICES[machine_type]
    return price.spot_hour if spot else price.on_demand_hour


def _cost_line(pool: NodePoolSpec, models: int) -> str:
    """The group's node against a GPU of the same kind for each model (the cheapest one-GPU machine)."""
    acc = pool.machine.accelerator
    own = min((m for m in MACHINE_TYPES.values() if m.accelerator == acc and m.gpus == 1 and m.name in MACHINE_PRICES),
              key=lambda m: _hourly(m.name, pool.spot))
    shared, apart = _hourly(pool.machine_type, pool.spot), models * _hourly(own.name, pool.spot)
    verdict = "saves" if shared < apart else "costs"
    return (f"cost: ${shared:.2f}/h a shared GPU node against ${apart:.2f}/h for a GPU each ({models} x {own.name}): "
            f"{verdict} ${abs(apart - shared):.2f}/h; at zero replicas instead each costs nothing idle but its next "
            "request waits a cold start")


def _shared(pool: NodePoolSpec) -> int:
    return pool.gpu_sharing.max_shared_clients_per_gpu if pool.gpu_sharing else 1
