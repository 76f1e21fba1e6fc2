"""A model's GPU and TPU options side by side: for each accelerator the catalog knows, the replica
that holds the model (its weights, and the pool's batch of its context in KV cache) at the lowest
cost per output token, what it serves (the roofline's tokens/s, components/model/throughput.py) and what
a million output tokens cost on it at list price - so a team sees which fits and what it costs
before choosing a pool.

Candidates per accelerator: for tensor parallelism 1, 2, 4, 8, 16 the smallest machine with that
many GPUs (a 1-GPU replica on a2-highgpu-1g, not a sixteenth of an a2-megagpu-16g that nobody rents
by the GPU; where no smaller machine exists, its share of the node, as replicas sharing it pay),
then whole nodes of the largest machine (pipeline stages across hosts, up to MAX_HOSTS); each TPU
host's chips and each multi-host slice (tensor parallelism over the slice, as vLLM's TPU build
shards). Candidates the model's serving features refuse are left out (refused_here). Of those that
fit, the cheapest per token, then the fewest hosts. Beside them, each
model's replica as the stack configures it (`this stack`), priced as the cost report prices it
(infra/cost.py ReplicaCost: one computation for both). Where the model fits a GPU Cloud Run offers, a
Cloud Run instance of it (cloud_run_options): one GPU billed by the second with its vCPUs and memory
(instance-based billing), its $ a token at the same utilisation as the rest: a per-second price pays
off when the model is idle (scaled to zero), which the plan's Cloud Run lines weigh (infra/cloud_run_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from ..components.model import cloud_run_capacity as cloud_run
from ..components.model.capacity import pool_capacity
from ..components.model.catalog import ACCELERATORS, MACHINE_TYPES, MachineType, topology_chips
from ..components.model.kv_offload import offload_problems
from ..components.model.machine_prices import MACHINE_PRICES
from ..components.model.specs import ModelSpec, NodePoolSpec
from ..components.model.specs.cloud_run import CLOUD_RUN_POOL, CloudRunModelSpec
from ..components.model.speculative import draft_mismatches
from ..components.model.stack_config import StackConfig
from .cost import ReplicaCost, prefill_share

MAX_HOSTS = 4


@dataclass(frozen=True)
class AcceleratorOption:
    model: str
    accelerator: str
    machine_type: str
    topology: Optional[str]
    devices: int  # GPUs or TPU chips a replica takes (tensorParallelSize x pipelineParallelSize)
    tensor_parallel: int
    pipeline_parallel: int
    hosts: int
    batch: int  # sequences a replica decodes at once (the pool's maxNumSeqs, or what its KV cache holds)
    tokens_per_second: float
    usd_per_hour: float  # on-demand: its share of one node's price, or every host of a multi-host replica
    # The replica the stack configures (its node pool's machine, MIG slice, spot price), not a candidate.
    this_stack: bool = False
    spot: bool = False
    # A Cloud Run instance (billed by the second), not a GKE node's share.
    cloud_run: bool = False

    def usd_per_million_tokens(self, utilization: float) -> float:
        return self.usd_per_hour / (self.tokens_per_second * utilization * 3600) * 1e6


def _candidates(machines: list[MachineType]) -> Iterator[tuple[MachineType, Optional[str], int, int]]:
    """(machine, topology, tensor parallel, pipeline parallel), fewest devices first."""
    by_size = sorted(machines, key=lambda m: m.gpus)
    if by_size[0].is_tpu:
        for m in by_size:
            acc = m.accelerator
            assert acc is not None
            for topology in m.tpu_topologies:
                hosts = topology_chips(topology) // m.gpus
                if hosts <= MAX_HOSTS:
                    yield m, topology, topology_chips(topology), 1
        return
    for tp in (1, 2, 4, 8, 16):
        holding = [m for m in by_size if m.gpus >= tp and m.gpus % tp == 0]
        if holding:
            yield holding[0], None, tp, 1
    largest = by_size[-1]
    for hosts in range(2, MAX_HOSTS + 1):
        yield largest, None, largest.gpus, hosts


def refused_here(model: ModelSpec, pool: NodePoolSpec) -> bool:
    """Whether the model's serving features refuse this candidate, as the config rules would: speculative
    decoding, kvOffload and disaggregation on a TPU, a host tier the machine cannot hold, a draft whose
    heads the tensor parallelism does not divide."""
    if pool.is_tpu and (model.speculative or model.kv_offload or model.disaggregation):
        return True
    return bool(offload_problems(model, pool) or (model.speculative and draft_mismatches(model)))


def model_options(model: ModelSpec) -> list[AcceleratorOption]:
    """Per accelerator, the smallest replica of `model` that fits (its short pool's batch and
    context), cheapest tokens first; accelerators on which nothing up to MAX_HOSTS fits are left out."""
    out: list[AcceleratorOption] = []
    for acc in ACCELERATORS.values():
        machines = [m for m in MACHINE_TYPES.values() if m.accelerator is acc and m.name in MACHINE_PRICES]
        if not machines:
            continue
        fitting: list[AcceleratorOption] = []
        for machine, topology, tp, pp in _candidates(machines):
            hosts_needed = max(1, tp * pp // machine.gpus)
            pool = NodePoolSpec(name="option", machine_type=machine.name, tpu_topology=topology,
                                max_nodes=hosts_needed)
            heads = model.model_shape.attention_heads
            if heads is not None and heads % tp:
                continue  # vLLM would refuse this split (the placement check says so too)
            candidate = model.model_copy(update={"tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                                                 "node_pool": "option"})
            if refused_here(candidate, pool):
                continue
            row = pool_capacity(candidate, "short", candidate.short, pool)
            if not row.fits:
                continue
            node_hour = MACHINE_PRICES[machine.name].on_demand_hour
            # Replicas on one node share it (a 1-GPU replica on an 8-GPU node pays an eighth).
            share = row.hosts if row.hosts > 1 else tp * pp / pool.slices_per_node
            fitting.append(AcceleratorOption(
                model.name, acc.gke_type, machine.name, topology, tp * pp, tp, pp, row.hosts,
                min(candidate.short.max_num_seqs, row.seqs_fit), row.decode_tokens_s, node_hour * share))
        if fitting:
            out.append(min(fitting, key=lambda o: (round(o.usd_per_hour / o.tokens_per_second, 9), o.hosts, o.devices)))
    return sorted(out, key=lambda o: o.usd_per_hour / o.tokens_per_second)


def stack_options(cfg: StackConfig, replicas: tuple[ReplicaCost, ...]) -> list[AcceleratorOption]:
    """Each model's replica of its short pool (a shared one where it has one) as the stack runs it,
    from the cost report's own rows."""
    out: dict[str, AcceleratorOption] = {}
    for r in sorted(replicas, key=lambda r: (r.tenant is not None, r.pool != "short")):
        if r.canary or r.model in out or r.node_pool.startswith(CLOUD_RUN_POOL):  # Cloud Run's: cloud_run_options
            continue
        model, pool = cfg.model(r.model), cfg.pool(r.node_pool)
        acc = pool.machine.accelerator
        machine = r.machine_type + (f" {r.gpu_partition_size}" if r.gpu_partition_size else "")
        out[r.model] = AcceleratorOption(
            r.model, acc.gke_type if acc else "", machine, pool.tpu_topology, r.devices, model.tensor_parallel_size,
            model.pipeline_parallel_size, r.hosts, r.batch, r.tokens_per_second, r.usd_per_hour + prefill_share(r, replicas),
            this_stack=True, spot=r.spot)
    return list(out.values())


def cloud_run_option(m: CloudRunModelSpec, this_stack: bool = False) -> Optional[AcceleratorOption]:
    """One Cloud Run instance of the model on its GPU, None where the model does not fit it."""
    row = cloud_run.instance_capacity(m)
    if not row.fits:
        return None
    zonal = "zonal redundancy" if m.gpu_zonal_redundancy else "no zonal redundancy"
    machine = f"Cloud Run {cloud_run.instance_cpu(m)} vCPU {cloud_run.instance_memory_gib(m)} GiB, {zonal}"
    return AcceleratorOption(m.name, m.gpu, machine, None, 1, 1, 1, 1,
                             cloud_run.batch(m), row.decode_tokens_s, cloud_run.instance_usd_per_hour(m),
                             this_stack=this_stack, cloud_run=True)


def as_cloud_run(model: ModelSpec, gpu: cloud_run.CloudRunGpu) -> Optional[CloudRunModelSpec]:
    """A GKE model as a Cloud Run model on `gpu` (one GPU an instance; the serving features cloudRun.models
    cannot declare: speculative decoding, KV offload, disaggregation, LoRA adapters, are None), priced at
    the spec's vCPUs and memory, at least the GPU's minimum (cloud_run.instance_cpu)."""
    if model.speculative or model.kv_offload or model.disaggregation or model.adapters:
        return None
    return CloudRunModelSpec(
        name=model.name, source=model.source, revision=model.revision, shape=model.shape, dtype=model.dtype,
        disk_gb=model.disk_gb, kv_cache_dtype=model.kv_cache_dtype, max_model_len=model.max_model_len,
        gpu_memory_utilization=model.gpu_memory_utilization, enable_prefix_caching=model.enable_prefix_caching,
        max_num_seqs=model.short.max_num_seqs, gpu=gpu)


def cloud_run_options(cfg: StackConfig) -> list[AcceleratorOption]:
    """Each Cloud Run model's instance as the stack runs it, and for each GKE model the Cloud Run GPUs it fits."""
    here = [o for m in cfg.cloud_run_models if (o := cloud_run_option(m, this_stack=True)) is not None]
    offered = [o for model in cfg.models for gpu in cloud_run.GPU_SECOND
               if (m := as_cloud_run(model, gpu)) is not None and (o := cloud_run_option(m)) is not None]
    return here + offered
