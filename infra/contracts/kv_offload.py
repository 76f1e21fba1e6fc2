"""vLLM's native KV-cache offload to host memory (models[].kvOffload): the flags and what vLLM makes of
them, where the buffer lives and who pays for it, and what it does not do for the batch."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ...components.model.capacity import pool_capacity
from ...components.model.capacity_report import capacity_report
from ...components.model.catalog import KV_CACHE_BYTES
from ...components.model.kv_offload import host_tier
from ...components.model.node_shapes import GKE_PER_NODE_MEMORY_MI, node_shape
from ...components.model.specs import ModelSpec, NodePoolSpec
from ..plan import Plan
from .base import Contract, _flag, _vllm_deployments

SIZE, BACKEND, TRANSFER = "--kv-offloading-size", "--kv-offloading-backend", "--kv-transfer-config"


def _gi(quantity: Any) -> float:
    text = str(quantity)
    return float(text.removesuffix("Gi")) if text.endswith("Gi") else float(text) / 2 ** 30


Server = tuple[str, ModelSpec, str, NodePoolSpec, dict[str, Any], dict[str, Any]]


def _servers(plan: Plan) -> Iterator[Server]:
    """(name, the model it serves, its pool, its node pool, its vllm container, its pod spec) for every
    server of the plan, by the labels and node selector the platform sets."""
    models = {m.name: m for m in plan.config.models}
    pools = {p.name: p for p in plan.config.node_pools}
    for d in _vllm_deployments(plan):
        spec = d["spec"]["template"]["spec"]
        labels = d["spec"]["template"]["metadata"].get("labels") or {}
        model = models.get(labels.get("vllm-gke.io/model", ""))
        node_pool = pools.get((spec.get("nodeSelector") or {}).get("vllm-gke.io/node-pool", ""))
        (c,) = [c for c in spec["containers"] if c["name"] == "vllm"]
        if model is not None and node_pool is not None:
            yield (f"{d['metadata']['namespace']}/{d['metadata']['name']}", model,
                   labels.get("vllm-gke.io/serving-pool", "short"), node_pool, c, spec)


def _vllm_host_tokens(size_gib: float, model: ModelSpec) -> int:
    """What vLLM 0.34's CPUOffloadingSpec holds in `size_gib`, from the model's shape alone: every
    worker's 16-token block (its KV heads, at least one a rank, at the KV cache's element size: 1 byte
    for fp8) summed over the world, page-aligned, whole chunks (v1/kv_offload/cpu/spec.py:109-122);
    tests/test_kv_offload.py pins it to vLLM's own."""
    s, tp = model.model_shape, model.tensor_parallel_size
    heads, element = max(1, s.kv_heads // tp), int(KV_CACHE_BYTES[model.kv_cache_dtype])
    worker_block = 2 * s.layers * heads * s.head_dim * element * 16 // model.pipeline_parallel_size
    chunk = -(-worker_block * tp * model.pipeline_parallel_size // 4096) * 4096
    return int(size_gib * 2 ** 30) // chunk * 16


def _rows(plan: Plan) -> dict[tuple[str, str], Any]:
    return {(r.model, r.pool): r for r in capacity_report(plan.config) if not r.tenant and not r.canary}


def offload_flags_are_the_replicas_tier(plan: Plan) -> list[str]:
    out, rows = [], _rows(plan)
    for name, model, which, _node_pool, c, _spec in _servers(plan):
        size, backend = _flag(c["args"], SIZE), _flag(c["args"], BACKEND)
        row = rows.get((model.name, which))
        if model.kv_offload is None:
            if size is not None:
                out.append(f"{name}: passes {SIZE} {size} but its model has no kvOffload")
            continue
        if backend != "native" or size is None:
            out.append(f"{name}: {BACKEND} {backend} {SIZE} {size}, not native with a size")
        elif row is not None and _vllm_host_tokens(float(size), model) != row.host_kv_tokens:
            out.append(f"{name}: {SIZE} {size} holds {_vllm_host_tokens(float(size), model):,} tokens as vLLM counts "
                       f"them over all the replica's workers, the capacity table says {row.host_kv_tokens:,}")
    return out


def offload_buffer_in_shm_and_the_memory_limit(plan: Plan) -> list[str]:
    out = []
    for name, model, _which, node_pool, c, spec in _servers(plan):
        size, tier = _flag(c["args"], SIZE), host_tier(model, node_pool)
        if size is None or tier is None:
            continue
        shm: Optional[dict[str, Any]] = next((v for v in spec.get("volumes") or [] if v["name"] == "dshm"), None)
        if shm is None or _gi(shm["emptyDir"].get("sizeLimit", "0Gi")) < float(size):
            out.append(f"{name}: /dev/shm is smaller than the {size} GiB host KV buffer vLLM creates there whole")
        res = c.get("resources") or {}
        limit, request = (res.get("limits") or {}).get("memory"), (res.get("requests") or {}).get("memory")
        # The pod's part of the argv's buffer (its hosts' share) beside the server's estimated need.
        if limit is None or limit != request or _gi(limit) < tier.need_gib + float(size) / tier.hosts:
            out.append(f"{name}: memory {request}/{limit} does not hold the server's need ({tier.need_gib:.0f} GiB) and "
                       f"its part of the {size} GiB pinned host KV buffer (request = limit)")
    return out


def _pod_memory_mi(spec: dict[str, Any]) -> float:
    """A pod's memory requests as the scheduler sums them: its containers, its sidecar init containers,
    and the mesh's Envoy that Istio injects (its annotation, else 128 MiB)."""
    def mi(c: dict[str, Any]) -> float:
        return _gi(((c.get("resources") or {}).get("requests") or {}).get("memory", "0Gi")) * 1024
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return sum(mi(c) for c in [*spec["containers"], *sidecars]) + 128


def offload_pods_fit_the_node(plan: Plan) -> list[str]:
    out = []
    for name, _model, _which, node_pool, c, spec in _servers(plan):
        if _flag(c["args"], SIZE) is None:
            continue
        shape = node_shape(node_pool.machine_type, node_pool.disk_size_gb)
        gpus = int((c.get("resources") or {}).get("limits", {}).get(node_pool.machine.accelerator.resource, 1)) \
            if node_pool.machine.accelerator else 1
        pods = max(1, shape.devices // max(1, gpus))
        need = pods * _pod_memory_mi(spec) + GKE_PER_NODE_MEMORY_MI
        if need > shape.alloc_memory_mi:
            out.append(f"{name}: {pods} pod(s) a {node_pool.machine_type} node request {need / 1024:.1f} GiB with GKE's "
                       f"pods, more than its {shape.alloc_memory_mi / 1024:.1f} GiB allocatable: the last stays Pending")
    return out


def offload_does_not_raise_the_batch(plan: Plan) -> list[str]:
    out, rows = [], _rows(plan)
    for name, model, which, node_pool, c, _spec in _servers(plan):
        if model.kv_offload is None or which not in model.pool_names:
            continue
        pool = getattr(model, which)
        gpu = pool_capacity(model.model_copy(update={"kv_offload": None}), which, pool, node_pool)
        seqs = int(_flag(c["args"], "--max-num-seqs") or 0)
        if seqs != pool.max_num_seqs:
            out.append(f"{name}: runs {seqs} sequences, not its pool's maxNumSeqs {pool.max_num_seqs}, which the "
                       f"capacity check holds to its GPUs' KV cache ({gpu.seqs_fit} of {gpu.context_tokens:,} tokens)")
        shown = rows.get((model.name, which))
        if shown is not None and (shown.tokens_fit, shown.seqs_fit) != (gpu.tokens_fit, gpu.seqs_fit):
            out.append(f"{name}: the capacity table counts host-tier tokens in the running batch "
                       f"({shown.tokens_fit:,} tokens, {shown.seqs_fit} sequences; the GPU holds {gpu.tokens_fit:,})")
    return out


def offload_takes_the_kv_connector(plan: Plan) -> list[str]:
    out = []
    for name, _model, _which, _node_pool, c, _spec in _servers(plan):
        backend = _flag(c["args"], BACKEND)
        if backend is not None and backend != "native":
            out.append(f"{name}: {BACKEND} {backend} needs a separate LMCache server the platform does not run")
        if _flag(c["args"], SIZE) is not None and _flag(c["args"], TRANSFER) is not None:
            out.append(f"{name}: {SIZE} with {TRANSFER}: vLLM replaces that connector with the offloading one")
    return out


SOURCE = "vllm-project/vllm@v0.34.0:vllm/"
ROWS = (
    Contract("vLLM", "0.34.0",
             "--kv-offloading-size S with --kv-offloading-backend native makes the OffloadingConnector (kv_both) with "
             "cpu_bytes_to_use = S GiB; S is the replica's buffer summed over all its workers, each holding its slot "
             "of every chunk",
             f"{SOURCE}engine/arg_utils.py:1471-1476; vllm/config/cache.py:407-417; vllm/config/vllm.py:1072-1106; "
             "vllm/v1/kv_offload/cpu/spec.py:98-122",
             "a model with kvOffload passes backend native and a size whose tokens, counted as vLLM's CPU spec counts "
             "them from the model's shape (world-size copies of a worker's block, page-aligned chunks), are the "
             "capacity table's host KV tokens; servers without it pass neither flag",
             offload_flags_are_the_replicas_tier),
    Contract("vLLM", "0.34.0",
             "on CUDA the buffer is one /dev/shm file of the whole size, refused at start unless /dev/shm has that "
             "much free; each worker pins its slots, charged to the container's memory cgroup",
             f"{SOURCE}v1/kv_offload/cpu/spec.py:175-202; vllm/v1/kv_offload/cpu/shared_offload_region.py:131,"
             "165-176; vllm/distributed/device_communicators/shm_broadcast.py:245-272; "
             "vllm/v1/kv_offload/cpu/gpu_worker.py:794-797",
             "/dev/shm's sizeLimit holds the whole buffer; the server's memory request = limit holds its estimated "
             "need and its pod's part of the buffer, refused where the node cannot hold it (config_rules/kv_offload.py)",
             offload_buffer_in_shm_and_the_memory_limit),
    Contract("GKE", "1.33",
             "a node's allocatable memory is the OS's total (the machine's less the kernel's 1/64 + 80 MiB and, on "
             "COS, 0.175% up to 248 MiB) less GKE's kube-reserved and the 100 MiB eviction threshold; pods that "
             "request more than is left stay Pending",
             "kubernetes/autoscaler@cluster-autoscaler-1.33.0:cluster-autoscaler/cloudprovider/gce/gce_reserved.go "
             "CalculateKernelReserved, templates.go BuildCapacity; "
             "https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes",
             "the offload server pods that fill a node (its devices over each pod's GPUs), every container, sidecar "
             "and the injected Envoy counted, fit its allocatable beside GKE's own pods",
             offload_pods_fit_the_node),
    Contract("vLLM", "0.34.0",
             "the host tier does not raise the running batch: a running request needs GPU blocks or the newest is "
             "preempted; the connector is asked only for a waiting request's prefix, and a preempted request "
             "restarts from zero computed tokens, so its offloaded blocks load back",
             f"{SOURCE}v1/core/sched/scheduler.py:927-994,1166-1185,1876; "
             "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:1359-1380",
             "the server runs its pool's maxNumSeqs, which the capacity check holds to the GPU's KV cache; the capacity "
             "table's tokens and sequences (capacity_report) are the GPU's alone, the host tier's tokens a column of "
             "their own, and the "
             "plan's note says it helps prefix reuse and preemption only",
             offload_does_not_raise_the_batch),
    Contract("vLLM", "0.34.0",
             "backend lmcache runs LMCacheMPConnector against a separate LMCache server (tcp://localhost:5555), "
             "the size not passed; an offloading size replaces any --kv-transfer-config's connector",
             f"{SOURCE}config/vllm.py:1083-1106",
             "lmcache is refused, and kvOffload with disaggregation (config_rules/kv_offload.py)",
             offload_takes_the_kv_connector),
)
