"""Replicas across hosts: the LeaderWorkerSet controller, and how vLLM (CUDA, and the TPU build)
spans the hosts of a group."""

from __future__ import annotations

import re
from typing import Any

from ...components.leader_worker_set import WEBHOOK_PORT
from ...components.model.specs.base import gke_version
from ...components.model.vllm_server import RAY_HEAD_ENV, RAY_HEALTH_ENV, RAY_JOIN_ENV, XLA_CACHE_ENV, XLA_CACHE_MAX_ENV
from ..manifests import pod_templates
from ..plan import Plan
from .base import Contract, _docs, _env, _flag

LWS = "LeaderWorkerSet"
# What the controller's pod webhook gives every container of a group (lws v0.10.0
# pkg/utils/pod/pod_utils.go:131-179); nothing else of the form LWS_* exists (no LWS_NAME).
LWS_ENV = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}


def _containers(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(role, c) for role, template in pod_templates(doc) for c in template["spec"]["containers"]]


def _is_tpu(doc: dict[str, Any]) -> bool:
    selector = doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].get("nodeSelector") or {}
    return "cloud.google.com/gke-tpu-accelerator" in selector


def lws_headless_service_is_its_own(plan: Plan) -> list[str]:
    services = {(s["metadata"].get("namespace"), s["metadata"]["name"]) for s in _docs(plan, "Service")}
    return [f"{d['metadata'].get('namespace')}/{d['metadata']['name']}: a Service of the set's name exists; the "
            "controller would reuse it as the group's headless Service (never updating it)"
            for d in _docs(plan, LWS) if (d["metadata"].get("namespace"), d["metadata"]["name"]) in services]


def lws_env_is_what_the_webhook_injects(plan: Plan) -> list[str]:
    out = []
    for d in _docs(plan, LWS):
        for role, c in _containers(d):
            own = set(_env(c))
            texts = [str(a) for a in c.get("args") or []] + [str(v) for v in _env(c).values() if v]
            for ref in {m for t in texts for m in re.findall(r"\$\((\w+)\)", t)}:
                if ref not in LWS_ENV and ref not in own:
                    out.append(f"{d['metadata']['name']} {role}: $({ref}) is neither injected by the LeaderWorkerSet "
                               "webhook nor in the container's env: the kubelet leaves it unexpanded")
    return out


def lws_scales_groups_by_their_leaders(plan: Plan) -> list[str]:
    groups = {d["metadata"]["name"] for d in _docs(plan, LWS)}
    out = []
    for so in _docs(plan, "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]
        if target.get("kind") != LWS:
            continue
        if target["name"] not in groups:
            out.append(f"{so['metadata']['name']}: scales LeaderWorkerSet {target['name']}, which the plan lacks")
        for trigger in so["spec"]["triggers"]:
            for pattern in re.findall(r'pod=~"([^"]+)"', str(trigger["metadata"].get("query", ""))):
                if "standby" in pattern:
                    continue
                if not re.fullmatch(pattern, f"{target['name']}-0") or re.fullmatch(pattern, f"{target['name']}-0-1"):
                    out.append(f"{so['metadata']['name']}: its query's pods /{pattern}/ are not the leaders "
                               f"({target['name']}-<index>): workers export no vLLM metric")
    return out


def lws_webhook_reachable(plan: Plan) -> list[str]:
    if not _docs(plan, LWS) or not plan.config.cluster.private_nodes:
        return []
    rules = [r.props for r in plan.of_type("gcp:compute/firewall:Firewall")]
    master = plan.config.cluster.master_cidr
    if any(master in (r.get("sourceRanges") or []) and any(str(WEBHOOK_PORT) in (a.get("ports") or [])
                                                            for a in r.get("allows") or []) for r in rules):
        return []
    return [f"no firewall rule lets the control plane ({master}) reach the nodes on tcp:{WEBHOOK_PORT}: the "
            "LeaderWorkerSet webhooks fail closed, so no group pod could be created"]


def vllm_group_launch(plan: Plan) -> list[str]:
    out = []
    for d in _docs(plan, LWS):
        if _is_tpu(d):
            continue
        size = d["spec"]["leaderWorkerTemplate"]["size"]
        for role, c in _containers(d):
            args = [str(a) for a in c.get("args") or []]
            name = f"{d['metadata']['name']} {role}"
            nnodes, tp, pp = _flag(args, "--nnodes"), _flag(args, "--tensor-parallel-size"), _flag(
                args, "--pipeline-parallel-size") or "1"
            if nnodes != str(size):
                out.append(f"{name}: --nnodes {nnodes} is not the group's {size} hosts")
            elif tp and (int(tp) * int(pp)) % size:
                out.append(f"{name}: tp x pp {tp} x {pp} is not divisible by --nnodes {size} (vLLM refuses)")
            if _flag(args, "--master-addr") != "$(LWS_LEADER_ADDRESS)":
                out.append(f"{name}: --master-addr is not the leader's address")
            rank = _flag(args, "--node-rank")
            if role == "leader" and (rank != "0" or "--headless" in args):
                out.append(f"{name}: the leader must be rank 0 with the API server (not --headless)")
            if role == "worker" and (rank != "$(LWS_WORKER_INDEX)" or "--headless" not in args):
                out.append(f"{name}: a worker must be headless at its own rank ($(LWS_WORKER_INDEX))")
    return out


def vllm_tpu_spans_hosts_through_ray(plan: Plan) -> list[str]:
    out = []
    for d in _docs(plan, LWS):
        if not _is_tpu(d):
            continue
        size = d["spec"]["leaderWorkerTemplate"]["size"]
        for role, c in _containers(d):
            env = _env(c)
            name = f"{d['metadata']['name']} {role}"
            if env.get("TPU_MULTIHOST_BACKEND") != "ray":
                out.append(f"{name}: TPU_MULTIHOST_BACKEND is not ray: vLLM's TPU build would run one host alone")
            if not (c.get("resources") or {}).get("limits", {}).get("google.com/tpu"):
                out.append(f"{name}: requests no TPU chips (the engine and every Ray worker need a TPU host)")
            if role == "leader" and env.get(RAY_HEAD_ENV) != str(size):
                out.append(f"{name}: does not wait for the group's {size} hosts in its Ray cluster")
            if role == "worker" and env.get(RAY_JOIN_ENV) != "$(LWS_LEADER_ADDRESS):6379":
                out.append(f"{name}: does not join its leader's Ray head")
    return out


def _tpu_pods(plan: Plan) -> list[tuple[str, dict[str, Any], int]]:
    """(name, pod spec, hosts) of every pod whose vLLM container holds TPU chips."""
    out = []
    for d in [*_docs(plan, "Deployment"), *_docs(plan, LWS)]:
        hosts = d["spec"]["leaderWorkerTemplate"]["size"] if d["kind"] == LWS else 1
        for role, template in pod_templates(d):
            pod = template["spec"]
            limits = (pod["containers"][0].get("resources") or {}).get("limits") or {}
            if limits.get("google.com/tpu"):
                out.append((f"{d['metadata']['name']} {role}", pod, hosts))
    return out


def tpu_containers_reach_the_chips(plan: Plan) -> list[str]:
    out = []
    version = plan.config.cluster.min_master_version
    if _tpu_pods(plan) and version is not None and (parsed := gke_version(version)) and parsed[:2] < (1, 28):
        out.append(f"minMasterVersion {version}: before GKE 1.28 a TPU container must be privileged to reach the chips")
    for name, pod, _hosts in _tpu_pods(plan):
        sc = pod["containers"][0].get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged, which GKE needs for TPUs only before 1.28")
        if sc.get("runAsUser") != 0:
            out.append(f"{name}: runs as user {sc.get('runAsUser')}, not root as GKE's TPU examples do: libtpu may "
                       "not open the chips' device nodes")
    return out


def _cache_survives(pod: dict[str, Any], path: Any) -> bool:
    """`path` is a mount of a node directory (hostPath): it outlives the pod, unlike an emptyDir."""
    host = {v["name"] for v in pod.get("volumes") or [] if "hostPath" in v}
    return any(m["name"] in host and m["mountPath"] == path for m in pod["containers"][0].get("volumeMounts") or [])


def vllm_tpu_keeps_its_xla_cache(plan: Plan) -> list[str]:
    out = []
    for name, pod, _hosts in _tpu_pods(plan):
        env = _env(pod["containers"][0])
        if env.get("VLLM_DISABLE_COMPILE_CACHE") not in (None, "0"):
            out.append(f"{name}: VLLM_DISABLE_COMPILE_CACHE turns off the XLA compilation cache")
        if not _cache_survives(pod, env.get(XLA_CACHE_ENV)):
            out.append(f"{name}: {XLA_CACHE_ENV} ({env.get(XLA_CACHE_ENV)}) is not on a node directory: a recreated "
                       "group compiles every program again")
    return out


def jax_bounds_and_locks_the_xla_cache(plan: Plan) -> list[str]:
    out = []
    for name, pod, _hosts in _tpu_pods(plan):
        size = str(_env(pod["containers"][0]).get(XLA_CACHE_MAX_ENV) or "")
        if not size.isdigit() or int(size) <= 0:
            out.append(f"{name}: {XLA_CACHE_MAX_ENV} is {size}: JAX's cache has no size (no eviction, no file lock) "
                       "or is off (0)")
    return out


def ray_health_checks_outlast_a_compile(plan: Plan) -> list[str]:
    out = []
    for name, pod, hosts in _tpu_pods(plan):
        if hosts <= 1:
            continue
        env = _env(pod["containers"][0])
        period, threshold = (int(env.get(k) or default) for k, default in (
            ("RAY_health_check_period_ms", 3000), ("RAY_health_check_failure_threshold", 5)))
        if period * threshold < 600_000 or env.get("RAY_health_check_timeout_ms") != dict(RAY_HEALTH_ENV)[
                "RAY_health_check_timeout_ms"]:
            out.append(f"{name}: Ray's GCS would call a host dead after {period * threshold / 1000:.0f} s of missed "
                       "checks, shorter than an XLA compile may keep it busy")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("LeaderWorkerSet", "v0.10.0",
             "the controller makes a headless Service named after the set for the group's DNS, and reuses a "
             "Service of that name as it is, never updating it",
             "kubernetes-sigs/lws@v0.10.0:pkg/utils/controller/controller_utils.go:33-65, "
             "pkg/controllers/leaderworkerset_controller.go:213-221",
             "the set is named <pool>-group; the pool's own Service keeps <pool>",
             lws_headless_service_is_its_own),
    Contract("LeaderWorkerSet", "v0.10.0",
             "its pod webhook puts LWS_LEADER_ADDRESS (<set>-<group>.<set>.<namespace>), LWS_GROUP_SIZE and "
             "LWS_WORKER_INDEX in every container's env (there is no LWS_NAME); the kubelet expands $(VAR) from it",
             "kubernetes-sigs/lws@v0.10.0:pkg/utils/pod/pod_utils.go:104-179, "
             "api/leaderworkerset/v1/leaderworkerset_types.go:67-75",
             "the leader's address and each worker's index reach vLLM's --master-addr/--node-rank (and the Ray "
             "worker's head address) only through those three",
             lws_env_is_what_the_webhook_injects),
    Contract("LeaderWorkerSet", "v0.10.0",
             "the scale subresource counts groups, and its status.hpaPodSelector selects the leaders only "
             "(name, worker-index=0); only the leader runs vLLM's API server and /metrics",
             "kubernetes-sigs/lws@v0.10.0:config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml:"
             "17907-17912, pkg/controllers/leaderworkerset_controller.go:541-556",
             "KEDA targets the set and reads the leaders' series (<set>-<index>), never the workers'",
             lws_scales_groups_by_their_leaders),
    Contract("LeaderWorkerSet", "v0.10.0",
             "five admission webhooks on port 9443, failurePolicy Fail: no group pod is created without them",
             "kubernetes-sigs/lws@v0.10.0:config/webhook/manifests.yaml, config/webhook/service.yaml",
             "a private cluster opens tcp:9443 from the control plane's range to the nodes",
             lws_webhook_reachable),
    Contract("vLLM", "0.34.0",
             "--nnodes > 1 launches one engine over several hosts through the mp backend: every host runs "
             "vllm serve with the group's host count, its rank and the leader as torch.distributed master "
             "(--master-addr, port 29501); tp x pp must divide by --nnodes; --headless hosts run ranks, no API server",
             "vllm@v0.34.0:vllm/engine/arg_utils.py:2424-2460, vllm/entrypoints/cli/serve.py:181-233, "
             "vllm/config/parallel.py:335-346",
             "a GPU group's leader is rank 0 with the guard; its workers are --headless at $(LWS_WORKER_INDEX)",
             vllm_group_launch),
    Contract("vLLM TPU (vllm-tpu, tpu-inference)", "0.32.0",
             "spans hosts only through Ray: TPU_MULTIHOST_BACKEND=ray picks the Ray executor, which needs the "
             "engine on a TPU host and places one worker per TPU host of the cluster it finds at start; "
             "--tensor-parallel-size counts the slice's JAX devices (one a chip on v5e, v6e and v5p)",
             "tpu-inference@0.32.0 (its PyPI wheel):tpu_inference/platforms/tpu_platform.py:481-513, "
             "executors/ray_distributed_executor.py:182-231, envs.py:246-247",
             "a TPU group's leader starts Ray's head and waits for every host before vLLM; workers join it",
             vllm_tpu_spans_hosts_through_ray),
    Contract("GKE TPU device access", "GKE 1.28+",
             "a container that requests google.com/tpu reaches the chips without privileged mode from GKE 1.28 "
             "(before: privileged); GKE's TPU examples run their containers as the image's root user",
             "https://cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning (About node pool "
             "auto-creation: its TPU example Deployment, no runAsUser, \"privileged: true # Required for GKE versions "
             "earlier than 1.28 to access TPUs\")",
             "TPU servers run as root, never privileged, with no capabilities, no privilege escalation and a "
             "read-only root filesystem; pods-hardened allows root to TPU containers alone",
             tpu_containers_reach_the_chips),
    Contract("vLLM TPU (vllm-tpu, tpu-inference)", "0.32.0",
             "VLLM_XLA_CACHE_PATH (default $XDG_CACHE_HOME/vllm/xla_cache) becomes JAX's persistent compilation "
             "cache unless VLLM_DISABLE_COMPILE_CACHE; its entries are content-addressed (HLO and compile options)",
             "vllm-tpu 0.32.0 (its PyPI sdist):vllm/envs.py:339-343, 1096-1103; tpu-inference@0.32.0 (its PyPI "
             "wheel):tpu_inference/runner/compilation_manager.py:88-91; vllm-project/tpu-inference@releases/v0.27.0:"
             ".buildkite/xla_autotune/README.md:100-106 (cold ~90 min, warm ~10 min for a 397B)",
             "every TPU pod points it at its own pool's node directory (hostPath <root>/<namespace>/<model>-<pool>, "
             "pods-hardened holds the shape) that a group recreated on the slice finds again; the start-up probe "
             "budgets a cold compile (components/model/cold_start.py)",
             vllm_tpu_keeps_its_xla_cache),
    Contract("JAX (jax==0.11.2, pinned by the tpu-inference 0.32.0 wheel's requirements)", "0.11.0",
             "JAX_COMPILATION_CACHE_MAX_SIZE (bytes) sets jax_compilation_cache_max_size (default -1: no limit, "
             "no eviction, no lock; 0: caching off); any other value makes the file cache an LRU that evicts "
             "the least recently used entries past the size and takes a file lock (.lockfile in the directory, "
             "needs the filelock package, which torch and huggingface_hub require) around every read and write",
             "jax-ml/jax@jax-v0.11.0:jax/_src/config.py:663-699 (int_state: the flag's name upper-cased is its "
             "environment variable), 1584-1594; jax/_src/compilation_cache.py:104-110; jax/_src/lru_cache.py:54-82, "
             "84-161; jax/_src/compiler.py:750-822 (a failed read or write, a lock timed out included, is a warning)",
             "every TPU pod sets it to XLA_CACHE_MAX_GI (10 GiB) for its pool's directory; the node-disk check "
             "reserves that per serving pool on a TPU node pool",
             jax_bounds_and_locks_the_xla_cache),
    Contract("Ray (ray[default], unpinned in vllm-tpu 0.32.0 requirements/tpu.txt:10)", "2.60.0",
             "the GCS calls a node dead after health_check_failure_threshold (5) failed checks of its raylet, "
             "every health_check_period_ms (3000) with health_check_timeout_ms (10000), each overridable as "
             "RAY_<name>; a dead node fails the engine's Ray executor",
             "ray-project/ray@0006bd6c3d2307e54fba33dae9ee4258008dbb67:src/ray/common/ray_config_def.h "
             "(RAY_CONFIG health_check_initial_delay_ms .. health_check_failure_threshold; the names are in 2.60.0's "
             "_raylet.so)",
             "a TPU group's pods set RAY_health_check_* so a host is dead only after 10 minutes of missed checks; "
             "Kubernetes recreates a group whose pod dies",
             ray_health_checks_outlast_a_compile),
)
