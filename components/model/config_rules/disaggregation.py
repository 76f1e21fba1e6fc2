"""Prefill/decode disaggregation (models[].disaggregation) against the rest of the stack: the
endpoint picker that schedules both pools, the prefill pool's node pool and its fit, the transport
the machines have, and the vLLM options that would take the KV connector's place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import pool_capacity
from ..disaggregation import prefill_node_pool, prefill_pool, rdma_ready
from ..specs import ModelSpec, NodePoolSpec, ServingPoolSpec, item_key, normalise_flag
from .base import Add
from .placement import check_pool_length

if TYPE_CHECKING:
    from ..stack_config import StackConfig

# vLLM options that set or replace the KV connector: --kv-offloading-size swaps it for its
# OffloadingConnector (vllm 0.34.0 config/vllm.py:1079-1106), silently dropping NIXL.
CONNECTOR_FLAGS = ("--kv-transfer-config", "--kv-offloading-size", "--kv-offloading-backend")


def disaggregated_models(cfg: "StackConfig", add: Add) -> None:
    _dataplane(cfg, add)
    _fallback_targets(cfg, add)
    _token_limits(cfg, add)
    dedicated = {m for t in cfg.tenants if t.dedicated for m in t.dedicated.models}
    for i, model in enumerate(cfg.models):
        if model.disaggregation is None:
            continue
        key = item_key("models", cfg.models, i)
        _routing(add, key, model)
        _options(add, key, model)
        if model.name in dedicated:
            add(f"{key}.disaggregation", f"model '{model.name}' is in a tenant's dedicated.models, and dedicated "
                "replicas get no prefill pool yet; remove it from tenants[].dedicated.models or remove disaggregation")
        pools = {p.name: p for p in cfg.node_pools}
        name = prefill_node_pool(model)
        prefill_np, decode_np = pools.get(name), pools.get(model.node_pool)
        if prefill_np is None:
            declared = ", ".join(pools) or "(none)"
            add(f"{key}.disaggregation.prefill.nodePool", f"node pool '{name}' is not declared; use one of {declared} "
                "or add it under vllm-gke:nodePools")
            continue
        if decode_np is not None and not _whole_gpus(add, f"{key}.nodePool", decode_np):
            continue  # the decode pool's machine: the same checks as the prefill pool's
        _prefill_pool(add, key, model, prefill_np)
        if decode_np is not None:
            _transport(add, key, model, prefill_np, decode_np)


def _dataplane(cfg: "StackConfig", add: Add) -> None:
    """NIXL's side channel and UCX's ports bypass the mesh on the prefill pods (and the prefill leg reaches a
    pod IP), so their NetworkPolicy is the only lock there, as placement.py says of multi-host groups."""
    if cfg.cluster.dataplane_v2:
        return
    names = ", ".join(m.name for m in cfg.models if m.disaggregation is not None)
    if names:
        add("cluster.dataplaneV2", f"is false, so GKE enforces no NetworkPolicy (it does with Dataplane V2 or the Calico "
            f"add-on, which this cluster does not declare), but {names} disaggregate: the prefill pods' NetworkPolicy is "
            "the only lock on NIXL's side channel and UCX's ports, which bypass the mesh (any pod could read a tenant's "
            "prompt blocks); set dataplaneV2 true, which only a new cluster can have (changing it recreates the "
            "cluster), or remove disaggregation")


def _fallback_targets(cfg: "StackConfig", add: Add) -> None:
    """A disaggregated model's Service reaches vLLM behind the routing sidecar, whose guard trusts the sidecar's
    loopback peer alone: another model's guard sending a shed request there would get a 403 every time."""
    pd = {m.name for m in cfg.models if m.disaggregation is not None}
    for i, model in enumerate(cfg.models):
        fb = model.fallback
        if fb is not None and fb.model in pd:
            add(f"{item_key('models', cfg.models, i)}.fallback.model", f"'{fb.model}' is disaggregated (disaggregation): "
                "its pods' vLLM admits the routing sidecar's requests alone, so a shed request sent there would be "
                "refused; name a model without disaggregation, or remove fallback")


def _token_limits(cfg: "StackConfig", add: Add) -> None:
    """The routing sidecar's prefill leg asks for one token (connector_nixlv2.go:178-183), and the prefill
    pod's guard takes the tenant's limits before the prefill runs: its tokens-per-minute take would count
    one token a request, and the decode leg takes none, so the limit would not hold for such a tenant."""
    pd = {m.name for m in cfg.models if m.disaggregation is not None}
    for i, tenant in enumerate(cfg.tenants):
        limit = tenant.rate_limit
        calls = sorted(pd & set(tenant.models))
        if limit.tokens_per_minute is not None and calls:
            add(f"{item_key('tenants', cfg.tenants, i)}.rateLimit.tokensPerMinute", f"the tenant calls "
                f"{', '.join(calls)}, disaggregated (disaggregation), whose prefill leg asks for one token, so a "
                "tokens-per-minute limit would not hold; bound it with requestsPerMinute and maxTokens, or serve "
                "the model without disaggregation")


def _routing(add: Add, key: str, model: ModelSpec) -> None:
    if model.routing != "inference-gateway":
        add(f"{key}.routing", f"is '{model.routing}', but disaggregation needs the endpoint picker: llm-d-router's "
            "P/D scheduling picks the decode pod and the prefill pod of each request; set routing: inference-gateway "
            "or remove disaggregation")
    if model.short.min_replicas == 0:
        add(f"{key}.short.minReplicas", "is 0, but the prefill pool keeps at least one replica: its GPUs would idle "
            "while the model sleeps; set short.minReplicas to 1 or more, or remove disaggregation")
    if model.multi_host:
        add(f"{key}.multiHost", "a replica across hosts is a LeaderWorkerSet whose worker pods get no NIXL environment "
            "(side channel, UCX transports and ports), so their ranks could not send or read KV blocks; serve the "
            "model on one host a replica (a larger machine or a smaller tensorParallelSize) or remove disaggregation")
    spec = model.disaggregation
    assert spec is not None
    longest = model.pool_max_model_len(model.short)
    if spec.min_prompt_tokens >= longest:
        add(f"{key}.disaggregation.minPromptTokens", f"{spec.min_prompt_tokens} is not below the decode pool's "
            f"maxModelLen ({longest}): no prompt would ever be prefilled apart; lower it (default 256)")


def _options(add: Add, key: str, model: ModelSpec) -> None:
    """NIXL is the KV connector; anything else that sets one would replace it."""
    for flag in model.extra_args:
        if normalise_flag(flag.split("=", 1)[0]) in CONNECTOR_FLAGS:
            add(f"{key}.extraArgs", f"'{flag}' sets vLLM's KV connector, which disaggregation sets to NixlConnector; "
                "remove it from extraArgs")
    # kvOffload beside disaggregation is refused once, by config_rules/kv_offload.py.


def _whole_gpus(add: Add, at: str, node_pool: NodePoolSpec) -> bool:
    """NIXL's UCX cuda transports move blocks between whole GPUs: either pool on TPUs, MIG slices or CPUs
    is refused (and the transfer's link has no NIC rate to price on a TPU machine)."""
    if node_pool.machine.accelerator is not None and not node_pool.is_tpu and not node_pool.gpu_partition_size:
        return True
    what = "a TPU pool" if node_pool.is_tpu else "MIG slices" if node_pool.gpu_partition_size else "a CPU pool"
    add(at, f"pool '{node_pool.name}' is {what}: NIXL moves the KV cache between whole GPUs (UCX cuda transports) "
        "on both the prefill and the decode pool; use a GPU node pool without gpuPartitionSize")
    return False


def _prefill_pool(add: Add, key: str, model: ModelSpec, node_pool: NodePoolSpec) -> None:
    at = f"{key}.disaggregation.prefill"
    if not _whole_gpus(add, f"{at}.nodePool", node_pool):
        return
    pool = prefill_pool(model)
    check_pool_length(add, key, at, model, pool)  # the per-pool rules the model's own pools get (placement.py)
    speculative_batch(add, at, model, pool)
    if model.devices_per_replica > node_pool.slices_per_node and not model.multi_host:
        add(f"{at}.nodePool", f"a replica takes {model.devices_per_replica} GPUs, more than a {node_pool.machine_type} "
            f"node of pool '{node_pool.name}' has ({node_pool.slices_per_node}); use a larger machine")
        return
    row = pool_capacity(model, "prefill", pool, node_pool)
    if not row.fits:
        add(at, f"model '{model.name}' (prefill pool) on pool '{node_pool.name}': {row.problem}; {row.fix()} "
            "(prefill.maxNumSeqs for the batch)")


def speculative_batch(add: Add, at: str, model: ModelSpec, pool: ServingPoolSpec) -> None:
    """vLLM refuses LoRA with speculative decoding unless a step holds every sequence's k + 1 tokens
    (vllm 0.34.0 engine/arg_utils.py:2747-2761): config_rules/speculative.py checks the model's own pools."""
    spec = getattr(model, "speculative", None)
    if spec is None or not model.adapters or not pool.max_num_batched_tokens:
        return
    need = pool.max_num_seqs * (spec.num_speculative_tokens + 1)
    if pool.max_num_batched_tokens < need:
        add(f"{at}.maxNumBatchedTokens", f"{pool.max_num_batched_tokens}: with adapters and speculative decoding vLLM needs "
            f"at least maxNumSeqs x (numSpeculativeTokens + 1) = {need}; raise it, or lower prefill.maxNumSeqs")


def _transport(add: Add, key: str, model: ModelSpec, prefill_np: NodePoolSpec, decode_np: NodePoolSpec) -> None:
    spec = model.disaggregation
    assert spec is not None
    lacking = [p.name for p in (prefill_np, decode_np) if not rdma_ready(p)]
    if spec.transport == "rdma" and lacking:
        add(f"{key}.disaggregation.transport", f"is rdma, but pool {' and '.join(sorted(set(lacking)))} has no RDMA "
            "NICs vllm-gke sets up (a3-highgpu-8g's GPUDirect-TCPX is not RDMA, and no extra node networks are "
            "attached): set transport: tcp (or auto), and see the plan's P/D table for what TCP costs")
