"""Model swapping on a time-shared GPU with vLLM's sleep mode (models[].sleepMode on a node pool
with gpuSharing): the flag, the guard's swap config, the pod's lease identity, and the figures the
plan shows - the memory each swap group holds, the wake time against a cold start.

How a swap runs (images/vllm_gke_guard/swap.py): one lease per GPU (per node: a shared pool has one
GPU per node) in the limit store. A request admitted by the tenant guard to a sleeping model
records that it wants the GPU and waits; the awake model, once its requests finish (and it has
been awake minAwakeSeconds), sleeps through vLLM's engine client and drops the lease; the waiter
takes it and wakes. Past waitSeconds the request gets a 503 with Retry-After. The entrypoint takes
the lease before vLLM starts, so no server starts (and fails vLLM's free-memory check) while
another is awake.

Figures (estimates, stated in the plan):
  wake, level 1   the weights copied back from pinned host memory over PCIe (H2D_GB_S) plus the
                  engine's resume (RESUME_S): vLLM 0.34 cumem.py wake_up copies each backed-up
                  allocation with cudaMemcpy
  wake, level 2   the weights read again from the weights share at its throughput (the cold
                  start's read, without the image, the engine start or the node)
  host memory     level 1 keeps each sleeping model's weights in the pod's RAM (its memory
                  request): counted against the node's memory, one share per shared client
  GPU residue     what a sleeping server keeps on the GPU (its CUDA context, graphs, allocations
                  outside the sleep pool): the awake one must fit beside the others' residue
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog import MACHINE_TYPES
from .machine_prices import MACHINE_PRICES
from .specs import ModelSpec, NodePoolSpec

if TYPE_CHECKING:
    from .stack_config import StackConfig

# Host-to-device copy from pinned memory, GB/s: about half of PCIe Gen4 x16's 32 (an estimate;
# cumem copies allocation by allocation).
H2D_GB_S = 12.0
# The engine's own resume after the copy: the KV cache re-mapped, the scheduler resumed (estimate).
RESUME_S = 2.0
# GB a sleeping vLLM server keeps on its GPU (CUDA context, CUDA graphs, non-pool allocations; vLLM
# logs it as "Sleep mode freed X GiB memory, Y GiB memory is still in use"): an estimate.
SLEEP_RESIDUE_GB = 1.0
# GB of a server pod's RAM beyond the weights it backs up: the API server, the engine-core process,
# the tokenizer, pinned staging buffers (an estimate).
HOST_OVERHEAD_GB = 6.0
# The lease's time to live: a holder that stops renewing it (its pod gone) frees the GPU after this.
LEASE_SECONDS = 15
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


def swap_guard_config(model: ModelSpec) -> dict[str, Any]:
    """The guard's `swap` section (images/vllm_gke_guard/swap.py); empty for a model that never sleeps."""
    sleep = model.sleep_mode
    if sleep is None:
        return {}
    return {"swap": {"level": sleep.level, "waitSeconds": sleep.wait_seconds,
                     "minAwakeSeconds": sleep.min_awake_seconds, "leaseSeconds": LEASE_SECONDS}}


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
    from .cold_start import MIB, read_mib_s  # not at import: vllm_server imports this module, capacity it

    assert model.sleep_mode is not None
    if model.sleep_mode.level == 1:
        return RESUME_S + model.weights_gb / H2D_GB_S
    return RESUME_S + model.weights_gb * 1e9 / (read_mib_s(cfg) * MIB)


def residue_room(node_pool: NodePoolSpec) -> float:
    """The largest gpuMemoryUtilization an awake model may have beside the others asleep: vLLM's
    startup check wants that share of the GPU free (vLLM 0.34 v1/worker/utils.py request_memory)."""
    acc = node_pool.machine.accelerator
    assert acc is not None and node_pool.gpu_sharing is not None
    others = node_pool.gpu_sharing.max_shared_clients_per_gpu - 1
    return round(1 - others * SLEEP_RESIDUE_GB / node_pool.slice_memory_gb, 2)


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


def swap_rows(cfg: "StackConfig") -> list[SwapRow]:
    """Each model that sleeps: its memory, its wake time against its cold start (node ready to
    serving), and how long a request may wait for its turn."""
    from .cold_start import cold_start_seconds

    rows: list[SwapRow] = []
    for model in cfg.models:
        if model.sleep_mode is None:
            continue
        rows.append(SwapRow(model.name, model.node_pool, model.sleep_mode.level, model.weights_gb, host_gb(model),
                            wake_seconds(cfg, model), cold_start_seconds(cfg, model), model.sleep_mode.wait_seconds))
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
        for r in group:
            lines.append(f"    {r.model}: level {r.level}, {r.weights_gb:.1f} GB weights, host {r.host_gb:.1f} GB; "
                         f"wake ~{r.wake_s:.0f} s vs cold start ~{r.cold_start_s:.0f} s "
                         f"({r.cold_start_s / r.wake_s:.0f}x); waits up to {r.wait_s} s, then 503 + Retry-After")
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
