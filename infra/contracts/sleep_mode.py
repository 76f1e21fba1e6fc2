"""Model swapping on a time-shared GPU (models[].sleepMode, nodePools[].gpuSharing): vLLM 0.34's
sleep mode and what its server exposes and checks at start, GKE's GPU time-sharing, and the lease's
Redis function within the guards' ACL."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from ...components.model.sleep_mode import HOLDER_ENV, NODE_ENV, lease_seconds, residue_room
from ...components.model.specs import ModelSpec, NodePoolSpec
from ..plan import Plan
from .base import Contract, _docs, _vllm_deployments

SLEEP_FLAG = "--enable-sleep-mode"
SHARING_LABELS = ("cloud.google.com/gke-gpu-sharing-strategy", "cloud.google.com/gke-max-shared-clients-per-gpu")


def _servers(plan: Plan) -> Iterator[tuple[str, ModelSpec, NodePoolSpec, dict[str, Any], dict[str, Any]]]:
    """(name, model, node pool, vllm container, pod spec) of every server, by the platform's labels."""
    models = {m.name: m for m in plan.config.models}
    pools = {p.name: p for p in plan.config.node_pools}
    for d in _vllm_deployments(plan):
        spec = d["spec"]["template"]["spec"]
        model = models.get((d["spec"]["template"]["metadata"].get("labels") or {}).get("vllm-gke.io/model", ""))
        pool = pools.get(model.node_pool) if model is not None else None
        (c,) = [c for c in spec["containers"] if c["name"] == "vllm"]
        if model is not None and pool is not None:
            yield f"{d['metadata']['namespace']}/{d['metadata']['name']}", model, pool, c, spec


def _env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env") or []}


def sleep_mode_driven_by_the_guard(plan: Plan) -> list[str]:
    """A sleeping server's engine is swapped by its guard: the flag, the guard's swap at the model's
    level with the store, and the node and pod the lease names."""
    out = []
    for name, model, _pool, c, _spec in _servers(plan):
        env = _env(c)
        guard = json.loads(env.get("GKE_LLM_GUARD_CONFIG", {}).get("value") or "{}")
        swap = guard.get("swap")
        flag = SLEEP_FLAG in [str(a) for a in c.get("args") or []]
        if model.sleep_mode is None:
            if flag or swap:
                out.append(f"{name}: sleep mode or a swap without models[].sleepMode")
            continue
        if not flag:
            out.append(f"{name}: the guard sleeps and wakes an engine started without {SLEEP_FLAG}")
        if not swap or swap.get("level") != model.sleep_mode.level or not guard.get("globalLimits"):
            out.append(f"{name}: the guard's swap is not at level {model.sleep_mode.level} with the lease's store")
        paths = {k: (v.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") for k, v in env.items()}
        if paths.get(NODE_ENV) != "spec.nodeName" or paths.get(HOLDER_ENV) != "metadata.name":
            out.append(f"{name}: the lease's GPU and holder are not the pod's node and name")
    return out


def sleep_routes_unreachable(plan: Plan) -> list[str]:
    """vLLM's own sleep routes stay unregistered (no dev mode) and off the guard's allow-list."""
    out = []
    for name, _model, _pool, c, _spec in _servers(plan):
        env = _env(c)
        if (env.get("VLLM_SERVER_DEV_MODE") or {}).get("value") not in (None, "0"):
            out.append(f"{name}: VLLM_SERVER_DEV_MODE registers /sleep and /wake_up for anyone who reaches the pod")
        guard = json.loads(env.get("GKE_LLM_GUARD_CONFIG", {}).get("value") or "{}")
        exposed = [p for p in guard.get("routes") or {} if re.match(r"/(sleep|wake_up|is_sleeping|checkpoint)", p)]
        if exposed:
            out.append(f"{name}: the guard admits tenants to vLLM's {', '.join(sorted(exposed))}")
    return out


def awake_model_passes_the_startup_check(plan: Plan) -> list[str]:
    """The awake server's budget, its own baseline and the sleeping servers' residue fit the GPU (vLLM
    does not check it at start), and the guard's lease outlives the pool's slowest wake."""
    out = []
    for name, model, pool, c, _spec in _servers(plan):
        if model.sleep_mode is None or pool.gpu_sharing is None:
            continue
        args = [str(a) for a in c.get("args") or []]
        util = float(args[args.index("--gpu-memory-utilization") + 1])
        if util > residue_room(pool):
            out.append(f"{name}: --gpu-memory-utilization {util:g} is more than is free beside the other "
                       f"{pool.gpu_sharing.max_shared_clients_per_gpu - 1} sleeping servers ({residue_room(pool):g})")
        guard = json.loads(_env(c).get("GKE_LLM_GUARD_CONFIG", {}).get("value") or "{}")
        if (guard.get("swap") or {}).get("leaseSeconds") != lease_seconds(plan.config, pool.name):
            out.append(f"{name}: the guard's lease is not its pool's ({lease_seconds(plan.config, pool.name)} s, "
                       "the slowest wake with margin)")
    return out


def time_shared_pools_and_their_pods(plan: Plan) -> list[str]:
    """The pool time-shares its GPUs as configured; its pods select the labels GKE puts on such nodes
    and take one shared GPU each."""
    out = []
    pools = {p.props.get("name"): p.props for p in plan.of_type("gcp:container/nodePool:NodePool")}
    for spec in plan.config.node_pools:
        sharing = spec.gpu_sharing
        accs = ((pools.get(spec.name) or {}).get("nodeConfig") or {}).get("guestAccelerators") or [{}]
        got = accs[0].get("gpuSharingConfig")
        want = {"gpuSharingStrategy": sharing.strategy, "maxSharedClientsPerGpu": sharing.max_shared_clients_per_gpu} \
            if sharing else None
        if got != want:
            out.append(f"node pool {spec.name}: gpuSharingConfig {got}, not {want}")
    for name, _model, pool, c, spec in _servers(plan):
        if pool.gpu_sharing is None:
            continue
        selector = spec.get("nodeSelector") or {}
        labels = (selector.get(SHARING_LABELS[0]), selector.get(SHARING_LABELS[1]))
        if labels != ("time-sharing", str(pool.gpu_sharing.max_shared_clients_per_gpu)):
            out.append(f"{name}: selects {labels}, not the time-shared nodes' labels")
        if str(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")) != "1":
            out.append(f"{name}: GKE admits at most 1 nvidia.com/gpu per container on time-shared nodes")
    return out


def lease_commands_within_the_acl(plan: Plan) -> list[str]:
    """Every command the store's library calls is one the guards' ACL user may run."""
    out = []
    for cm in _docs(plan, "ConfigMap"):
        data = cm.get("data") or {}
        if "redis.conf" not in data or "limits.lua" not in data:
            continue
        allowed = {m.lower() for line in data["redis.conf"].splitlines() if line.startswith("user ")
                   for m in re.findall(r"\+([a-z|]+)", line)}
        called = {m.lower() for m in re.findall(r"redis\.call\('([A-Za-z]+)'", data["limits.lua"])}
        if missing := sorted(called - allowed):
            out.append(f"the store's functions call {', '.join(missing)}, which the guards' ACL refuses")
        if "vllm_gke_lease_v1" not in data["limits.lua"] and any(m.sleep_mode for m in plan.config.models):
            out.append("the store's library registers no vllm_gke_lease_v1 for the sleeping models' lease")
    return out


V = "vllm-project/vllm@v0.34.0:vllm/"
GKE_TS = "https://cloud.google.com/kubernetes-engine/docs/how-to/timesharing-gpus; " \
         "https://cloud.google.com/kubernetes-engine/docs/concepts/timesharing-gpus"

ROWS: tuple[Contract, ...] = (
    Contract("vLLM", "0.34.0",
             "--enable-sleep-mode turns on the cumem allocator on CUDA; sleep(level) pauses the scheduler (mode wait "
             "lets running requests finish), then level 1 copies the allocations tagged weights to pinned host memory "
             "and discards the KV cache, level 2 discards both; wake_up(tags) maps the memory back, and resumes "
             "scheduling only once all of it is (weights then kv_cache); after level 2, reload_weights with no path "
             "reads the weights again from the model's own directory",
             f"{V}config/model.py:384-386,683-690; {V}device_allocator/cumem.py:261-300,364-380; "
             f"{V}v1/worker/gpu_worker.py:320-371,597,645-666,908; {V}v1/engine/core.py:1090-1172; "
             f"{V}v1/engine/async_llm.py:1212-1251,1272-1280; {V}model_executor/model_loader/reload/inplace.py:34-90",
             "the server runs with the flag; its guard (vllm_gke_guard/swap.py) sleeps it with mode wait once its "
             "requests are done and wakes it through the engine client (level 2: weights, reload_weights, kv_cache) "
             "before it forwards a request; the lease names the pod's node and name",
             sleep_mode_driven_by_the_guard),
    Contract("vLLM", "0.34.0",
             "/sleep, /wake_up and /is_sleeping are registered only with VLLM_SERVER_DEV_MODE; with sleep mode the "
             "/checkpoint routes are registered too",
             f"{V}entrypoints/launchers/api_server/routers.py:46-73; {V}entrypoints/serve/__init__.py:63-65; "
             f"{V}entrypoints/serve/dev/sleep/api_router.py:26-64; {V}envs.py:1551",
             "no server sets VLLM_SERVER_DEV_MODE; the guard's allow-list admits none of these paths (404), so a "
             "model sleeps and wakes only by the guard's own calls, after a tenant request passed its checks",
             sleep_routes_unreachable),
    Contract("vLLM", "0.34.0",
             "a worker does not refuse to start when memory is short: the extensible KV cache, on by default on "
             "CUDA (sleep mode leaves it on), skips the free-memory check, and the KV cache is sized from what is "
             "free after warm-up, capped at gpuMemoryUtilization of the total, so a server loaded beside an awake "
             "one fails to load or keeps a tiny cache; the worker's baseline (CUDA context, cuBLAS, NCCL) is taken "
             "before its budget; a sleeping server keeps its CUDA graphs (sleep_mode_offload_cudagraph off by "
             "default) and what is outside the sleep pool",
             f"{V}config/vllm.py:3180-3263; {V}v1/worker/utils.py:759-762,783-786; "
             f"{V}v1/worker/extensible_kv_cache.py:592-618; {V}v1/worker/gpu_worker.py:520-556,1226-1238; "
             f"{V}config/model.py:398; {V}config/vllm.py:752-762",
             "the entrypoint takes the GPU's lease before vLLM starts (the awake server sleeps first) and hands it "
             "to the guard; the config rule keeps gpuMemoryUtilization under what is left beside the awake server's "
             "baseline and the others' residue (1 GB each, unmeasured); the lease outlives the slowest wake",
             awake_model_passes_the_startup_check),
    Contract("GKE GPU time-sharing", "GKE 1.23.7-gke.1400+",
             "a node pool's gpu_sharing_config (TIME_SHARING, maxSharedClientsPerGpu) offers each GPU as that many "
             "nvidia.com/gpu; its nodes carry cloud.google.com/gke-gpu-sharing-strategy: time-sharing and "
             "cloud.google.com/gke-max-shared-clients-per-gpu; a container may take at most 1 shared GPU; the "
             "clients share the GPU's memory with no isolation",
             GKE_TS,
             "the pool declares it; its pods select both labels and take one GPU each; only sleeping models run there, "
             "one awake per GPU by the lease, one GPU per node so the lease's node is the GPU",
             time_shared_pools_and_their_pods),
    Contract("Redis", "7.4.2",
             "a function's redis.call is checked against the calling user's ACL (commands and key patterns), as a "
             "client's own command would be",
             "redis/redis@7.4.1 (7.4.2 changes none of it):src/script.c:372-384,575-602; src/acl.c:1673",
             "the lease (vllm_gke_lease_v1, in the store's library) calls only HMGET, HSET, HDEL, PEXPIRE and TIME "
             "on its rl: key, all granted to the guards' user",
             lease_commands_within_the_acl),
)
