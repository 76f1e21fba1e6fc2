"""Plan-time GPU memory check: do a model's weights and KV cache fit its GPU or MIG slice?

Per device (a GPU, one MIG slice, or a TPU chip), with P = pipelineParallelSize stages each
holding 1/P of the layers:
    usable    = device memory x gpuMemoryUtilization
    weights   = params x bytes per weight / (tensorParallelSize x P)
    lora      = LoRA slots (maxLoras) x the largest adapter rank's A and B matrices / (TP x P)
    draft     = a speculative draft's weights / TP (models[].speculative: all on one stage)
    kv budget = usable - weights - lora - draft - RUNTIME_OVERHEAD_GB (runtime context, activations, graphs)
    kv/token  = 2 x layers x kv_heads x head_dim x kv bytes / (min(TP, kv_heads) x P)
                + the draft's layers' KV per token / min(TP, its kv_heads)
A pool fits when its KV budget holds maxNumSeqs sequences of its stated context
(`contextTokens`, default the pool's maxModelLen) and at least one maxModelLen sequence,
which vLLM itself refuses to start without.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .specs import ModelSpec, NodePoolSpec, PrefillPoolSpec, ServingPoolSpec
from .speculative import draft_kv_per_device, draft_per_device_gb, speculation
from .throughput import Throughput, roofline, slice_of

if TYPE_CHECKING:
    from .stack_config import StackConfig

GB = 1e9
RUNTIME_OVERHEAD_GB = 1.0


@dataclass(frozen=True)
class PoolCapacity:
    model: str
    pool: str  # short | long
    node_pool: str
    tenant: Optional[str]
    gpu_memory_gb: float
    usable_gb: float
    weights_per_gpu_gb: float
    kv_budget_gb: float
    kv_bytes_per_token_per_gpu: float
    tokens_fit: int
    context_tokens: int
    max_model_len: int
    max_num_seqs: int
    seqs_fit: int
    # The revision these replicas serve: a canary's differs from the model's own.
    revision: str = "main"
    canary: bool = False
    # GPU memory set aside for LoRA adapters (per GPU).
    lora_per_gpu_gb: float = 0.0
    # Estimated seconds from node ready to serving (components/model/cold_start.py).
    cold_start_s: float = 0.0
    # What one replica takes: devices (GPUs, MIG slices or TPU chips) and nodes (>1: a multi-host group).
    devices: int = 1
    hosts: int = 1
    accelerator: str = ""
    # The roofline's estimate for one replica (components/model/throughput.py): output tokens a second at
    # the batch the pool runs (maxNumSeqs, or what its KV cache holds if fewer), prompt tokens a second.
    decode_tokens_s: float = 0.0
    prefill_tokens_s: float = 0.0
    decode_bound: str = ""
    # The pool's floor: the replicas that run at baseline (a canary's, its own), and its ceiling.
    min_replicas: int = 0
    max_replicas: int = 0
    # A speculative draft's weights per GPU (models[].speculative, speculative.py); its KV cache is in
    # kv_bytes_per_token_per_gpu beside the model's.
    draft_per_gpu_gb: float = 0.0
    # The host KV tier (models[].kvOffload, kv_offload.with_host_tier): GiB a replica offloads to host memory and the
    # tokens it holds beside the GPU's; it holds prefixes and preempted sequences, not a larger batch.
    host_kv_gib: float = 0.0
    host_kv_tokens: int = 0

    @property
    def fits(self) -> bool:
        return self.problem is None

    @property
    def problem(self) -> Optional[str]:
        if self.kv_budget_gb <= 0:
            lora = f" + {self.lora_per_gpu_gb:.2f} GB of LoRA adapters" if self.lora_per_gpu_gb else ""
            lora += f" + {self.draft_per_gpu_gb:.2f} GB of speculative draft" if self.draft_per_gpu_gb else ""
            return (f"weights need {self.weights_per_gpu_gb:.1f} GB per GPU{lora} + {RUNTIME_OVERHEAD_GB:g} GB runtime "
                    f"overhead, but only {self.usable_gb:.1f} GB of {self.gpu_memory_gb:g} GB is usable")
        if self.tokens_fit < self.max_model_len:
            return (f"the KV cache holds {self.tokens_fit} tokens ({self.kv_budget_gb:.2f} GB), less than one "
                    f"maxModelLen sequence of {self.max_model_len}")
        if self.seqs_fit < self.max_num_seqs:
            return (f"the KV cache holds {self.tokens_fit} tokens ({self.kv_budget_gb:.2f} GB): {self.seqs_fit} "
                    f"sequences of {self.context_tokens} tokens, fewer than maxNumSeqs {self.max_num_seqs}")
        return None

    def fix(self) -> str:
        """What can help this problem: weights that do not fit are not helped by fewer sequences."""
        if self.accelerator.startswith("tpu-"):
            more = "a larger slice (tpuTopology, with tensorParallelSize its chips)"
            if self.kv_budget_gb <= 0:
                return f"use {more} or quantise the weights (int8, an AWQ revision)"
            if self.tokens_fit < self.max_model_len:
                return f"lower maxModelLen, use {more}, or kvCacheDtype fp8"
            return f"lower maxNumSeqs or contextTokens, use kvCacheDtype fp8, or {more}"
        if self.kv_budget_gb <= 0:
            return ("use a larger MIG slice or GPU, raise tensorParallelSize on whole GPUs, or quantise the weights "
                    "(dtype fp8, an AWQ/GPTQ revision)")
        if self.tokens_fit < self.max_model_len:
            return ("lower maxModelLen, use a larger MIG slice or GPU, raise tensorParallelSize on whole GPUs, or "
                    "kvCacheDtype fp8")
        return ("lower maxNumSeqs or contextTokens, use kvCacheDtype fp8, a larger MIG slice or GPU, or raise "
                "tensorParallelSize on whole GPUs")


def pool_capacity(model: ModelSpec, which: str, pool: ServingPoolSpec, node_pool: NodePoolSpec,
                  tenant: Optional[str] = None) -> PoolCapacity:
    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    shape = model.model_shape
    memory = node_pool.slice_memory_gb
    usable = memory * model.gpu_memory_utilization
    weights = model.weights_gb / (tp * pp)
    lora = model.lora_gb() / (tp * pp)
    draft = draft_per_device_gb(model)  # a speculative draft's weights (0 without one)
    budget = usable - weights - lora - draft - RUNTIME_OVERHEAD_GB
    # KV heads shard across tensor-parallel ranks (with fewer heads than ranks they are
    # replicated); each pipeline stage caches only its own layers.
    per_token = model.kv_bytes_per_token / (min(tp, shape.kv_heads) * pp) + draft_kv_per_device(model)
    tokens = max(0, int(budget * GB // per_token))
    max_len = model.pool_max_model_len(pool)
    context = pool.context_tokens or max_len
    acc = node_pool.machine.accelerator
    hosts = hosts_per_replica(model, node_pool)
    speed = _speed(model, pool, node_pool, hosts, tokens, context) if acc else None
    return PoolCapacity(
        model=model.name, pool=which, node_pool=node_pool.name, tenant=tenant, gpu_memory_gb=memory,
        usable_gb=usable, weights_per_gpu_gb=weights, kv_budget_gb=budget,
        kv_bytes_per_token_per_gpu=per_token, tokens_fit=tokens, context_tokens=context,
        max_model_len=max_len, max_num_seqs=pool.max_num_seqs, seqs_fit=tokens // context, revision=model.revision,
        min_replicas=pool.min_replicas, max_replicas=pool.max_replicas,
        lora_per_gpu_gb=lora, devices=model.devices_per_replica, hosts=hosts, accelerator=acc.gke_type if acc else "",
        decode_tokens_s=speed.decode_tokens_s if speed else 0.0,
        prefill_tokens_s=speed.prefill_tokens_s if speed else 0.0, decode_bound=speed.bound if speed else "",
        draft_per_gpu_gb=draft)


def _speed(model: ModelSpec, pool: ServingPoolSpec, node_pool: NodePoolSpec, hosts: int, tokens: int,
           context: int) -> Throughput:
    """The roofline at the pool's batch (maxNumSeqs, or the sequences its KV cache holds if fewer);
    a GPU replica across hosts talks over the machine's TCP bandwidth."""
    acc = node_pool.machine.accelerator
    assert acc is not None
    batch = min(pool.max_num_seqs, max(1, tokens // context))
    return roofline(slice_of(acc, node_pool.gpu_partition_size), model.model_shape, model.dtype,
                    model.kv_cache_dtype, model.devices_per_replica, model.tensor_parallel_size, hosts,
                    batch, context, network_gbps=node_pool.machine.nic_gbps, bytes_per_weight=model.bytes_per_weight,
                    speculation=speculation(model, node_pool, hosts, batch, context))


def network_cost(model: ModelSpec, which: str, node_pool: NodePoolSpec) -> tuple[float, float]:
    """Decode tokens/s of one replica as placed (across hosts over TCP), and of the same devices
    on one fabric: what the data-centre network takes."""
    row = pool_capacity(model, which, getattr(model, which), node_pool)
    one = _speed(model, getattr(model, which), node_pool, 1, row.tokens_fit, row.context_tokens)
    return row.decode_tokens_s, one.decode_tokens_s


def hosts_per_replica(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    """Nodes one replica spans: 1 when its devices fit a node, else its devices over a node's
    (the placement check refuses a count that is not a multiple)."""
    per_node = node_pool.slices_per_node
    return max(1, -(-model.devices_per_replica // per_node))


def placements(cfg: "StackConfig") -> list[tuple[ModelSpec, str, Optional[str]]]:
    """(model, node pool name, tenant) for every set of replicas: shared, canaries, dedicated."""
    out: list[tuple[ModelSpec, str, Optional[str]]] = [(m, m.node_pool, None) for m in cfg.models]
    models = {m.name: m for m in cfg.models}
    for tenant in cfg.tenants:
        if tenant.dedicated:
            out += [(models[name], tenant.dedicated.node_pool, tenant.name)
                    for name in tenant.dedicated.models if name in models]
    # Each copy of a model (shared or dedicated) runs its canary on the same node pool.
    return out + [(c, pool, tenant) for m, pool, tenant in out if (c := m.canary_model()) is not None]


def consumer_models(cfg: "StackConfig") -> dict[str, list[str]]:
    """The models each serving namespace runs, by consumer key: every model has a route in the
    shared namespace ("serving"); a dedicated tenant's namespace (its name) serves its own."""
    out: dict[str, list[str]] = {"serving": [m.name for m in cfg.models]}
    out.update({t.name: list(t.dedicated.models) for t in cfg.tenants if t.dedicated})
    return out


def gpu_slots_by_pool(cfg: "StackConfig", bound: str = "min") -> dict[str, int]:
    """GPU units (whole GPUs or MIG slices) each node pool needs at min or max replicas."""
    slots: dict[str, int] = {}
    for model, pool_name, _tenant in placements(cfg):
        replicas = sum(getattr(getattr(model, which), f"{bound}_replicas") for which in model.pool_names)
        slots[pool_name] = slots.get(pool_name, 0) + replicas * model.devices_per_replica
    for model, name in prefill_placements(cfg):  # models[].disaggregation: the prefill pools
        prefill = prefill_spec(model)
        slots[name] = slots.get(name, 0) + getattr(prefill, f"{bound}_replicas") * model.devices_per_replica
    return slots


def prefill_placements(cfg: "StackConfig") -> list[tuple[ModelSpec, str]]:
    """(model, node pool) of each disaggregated model's prefill pool: the shared copy's alone (dedicated
    copies are refused, config_rules/disaggregation.py; a canary runs without one, serving_plan.pool_services)."""
    return [(m, m.disaggregation.prefill.node_pool or m.node_pool) for m in cfg.models if m.disaggregation is not None]


def prefill_spec(model: ModelSpec) -> PrefillPoolSpec:
    """The prefill pool of a model prefill_placements returned (it has one)."""
    assert model.disaggregation is not None
    return model.disaggregation.prefill


def _prefill_devices(cfg: "StackConfig", node_pool_name: str, model: ModelSpec, which: str) -> int:
    """Devices the prefill pools on a node pool take at their ceilings (this one left out). They roll in
    place (disaggregation_cluster.prefill_service: no surge replica)."""
    return sum(prefill_spec(m).max_replicas * m.devices_per_replica
               for m, name in prefill_placements(cfg)
               if name == node_pool_name and (m.name, m.revision, "prefill") != (model.name, model.revision, which))


def _reach_slots(node_pool: NodePoolSpec) -> int:
    """Devices (GPUs, MIG slices, TPU chips) the node pool reaches: its maxNodes, and its on-demand twin's."""
    return node_pool.max_nodes * (2 if node_pool.has_fallback_pool else 1) * node_pool.slices_per_node


def neighbours(cfg: "StackConfig", node_pool_name: str, model: ModelSpec, tenant: Optional[str],
               which: str) -> list[tuple[ModelSpec, str]]:
    """The other serving pools (model, short or long) on a node pool: canaries and dedicated
    copies included, this one left out."""
    return [(m, w) for m, name, t in placements(cfg) if name == node_pool_name for w in m.pool_names
            if (m.name, m.revision, t, w) != (model.name, model.revision, tenant, which)]


def surge_room(cfg: "StackConfig", model: ModelSpec, node_pool_name: str, tenant: Optional[str],
               which: str) -> Optional[int]:
    """Replicas of this serving pool from which a surge replica finds no device on its node pool,
    with every other pool there at its ceiling and surging too (1: not even beside one); None: one
    more always fits."""
    node_pool = next(p for p in cfg.node_pools if p.name == node_pool_name)
    devices = model.devices_per_replica
    if node_pool.is_tpu and hosts_per_replica(model, node_pool) > 1:
        return 1  # a multi-host slice pool is one slice: never a second one to surge to
    # The others at their ceilings, each with its own surge replica: a change to the template all
    # pools share (image, guard, tenants) rolls them at once.
    others = sum((getattr(m, w).max_replicas + 1) * m.devices_per_replica
                 for m, w in neighbours(cfg, node_pool_name, model, tenant, which))
    others += _prefill_devices(cfg, node_pool_name, model, which)
    room = _reach_slots(node_pool) - others
    if room >= (getattr(model, which).max_replicas + 1) * devices:
        return None
    return max(1, room // devices)


def canary_room(cfg: "StackConfig", model: ModelSpec, node_pool_name: str, tenant: Optional[str], which: str) -> int:
    """Canary replicas this pool may run on its node pool beside every pool there at its ceiling with
    a surge replica of its own (a primary's promotion rolls it while the canaries still run): the
    devices left over, shared among the pools in proportion to their ceilings (a change every pool
    shares, an image or the tenants, rolls them all at once)."""
    node_pool = next(p for p in cfg.node_pools if p.name == node_pool_name)
    mine = getattr(model, which).max_replicas * model.devices_per_replica
    neighbours_ = neighbours(cfg, node_pool_name, model, tenant, which)
    others = sum(getattr(m, w).max_replicas * m.devices_per_replica for m, w in neighbours_)
    others += _prefill_devices(cfg, node_pool_name, model, which)
    surges = model.devices_per_replica + sum(m.devices_per_replica for m, _w in neighbours_)
    free = _reach_slots(node_pool) - others - mine - surges
    if free <= 0:
        return 0
    return int(free * mine / (mine + others)) // model.devices_per_replica


def rollout_strategy(full_at: Optional[int]) -> dict[str, int | str]:
    """A serving pool's rolling update from `surge_room`. A surge replica (maxSurge 1,
    maxUnavailable 0: capacity never dips) where one more always fits; else surge while it fits and
    replace in place from `full_at` replicas: maxUnavailable is a share that rounds down
    (Kubernetes' rule for percentages) to 0 below that count (up to 10 replicas; above, it may turn 1
    a replica or two early, never late) and to at least 1 from it, so an old
    replica goes first only where a surge replica would wait for a node forever (past the
    Deployment's progress deadline, failing `pulumi up`). No room even beside one replica: in
    place throughout (maxSurge 0, maxUnavailable 1)."""
    if full_at is None:
        return {"maxSurge": 1, "maxUnavailable": 0}
    if full_at <= 1:
        return {"maxSurge": 0, "maxUnavailable": 1}
    return {"maxSurge": 1, "maxUnavailable": f"{-(-100 // full_at)}%"}


def rollout_needs(cfg: "StackConfig") -> list[str]:
    """What each serving pool's rollout does, said in the plan where it is not a plain surge."""
    out: list[str] = []
    for model, node_pool_name, tenant in placements(cfg):
        for which in model.pool_names:
            full_at = surge_room(cfg, model, node_pool_name, tenant, which)
            if full_at is None:
                continue
            name = f"{model.name}{f' ({tenant})' if tenant else ''} {which}"
            outage = " (at one replica, an outage while it reloads)" if getattr(model, which).min_replicas <= 1 else ""
            groups = hosts_per_replica(model, cfg.pool(node_pool_name)) > 1  # LeaderWorkerSets: in place
            if full_at <= 1 or groups:
                out.append(f"rollout of {name}: node pool '{node_pool_name}' has no room for a surge replica, so it "
                           f"replaces replicas in place, one at a time{outage}; raise that pool's maxNodes to surge")
            else:
                out.append(f"rollout of {name}: surges a replica while fewer than {full_at} run; from {full_at}, "
                           f"node pool '{node_pool_name}' has no room for one more with its other pools at their "
                           "ceilings, so it takes an old replica down first (one fewer serving while it reloads)")
    return out
