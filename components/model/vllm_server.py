"""The vLLM server in its pod: the `vllm serve` command line, its port, environment, markers and
node resources, and how long it drains - what VllmService's Deployment runs, apart from the
Kubernetes objects around it."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from . import disaggregation, gcs_weights
from .sleep_mode import sleep_args
from .specs import ModelSpec, NodePoolSpec, ServingPoolSpec
from .speculative import speculative_args
from .vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release, ttft_buckets_with
from .weights_layout import SERVER_UID, adapter_copies, model_dir, ready_marker, served_files_gb, side_copies

PORT = 8000
WARM_MARKER = "/tmp/vllm-gke-warm"
# How long a stopping replica keeps serving before vLLM gets SIGTERM: the load balancer takes the
# endpoint out of its NEG meanwhile, so no new request arrives once vLLM starts to drain.
PRE_STOP_S = 20
# On a spot node GKE's graceful shutdown gives pods 15 s of the preemption notice
# (cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown): a
# 20 s preStop would be cut and vLLM never signalled. There the window is short, leaving vLLM
# 10 s to finish; longer requests are lost on preemption (the plan says so).
SPOT_PRE_STOP_S = 5
SPOT_SHUTDOWN_S = 15


def pre_stop_seconds(node_pool: NodePoolSpec) -> int:
    return SPOT_PRE_STOP_S if node_pool.spot else PRE_STOP_S
# The platform's own variables: not VLLM_*, which vLLM validates as its own and warns (or, with
# --fail-on-environ-validation, fails) on.
GUARD_CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
WARM_MARKER_ENV = "GKE_LLM_WARM_MARKER"
# The startup probe's window (its failureThreshold x periodSeconds): how long the entrypoint waits for
# vLLM's /health, so a slow start (a 405B's weights and a cold XLA compile) is never given up early.
STARTUP_WINDOW_ENV = "GKE_LLM_STARTUP_WINDOW_SECONDS"
GUARD_MIDDLEWARE = "vllm_gke_guard.GuardMiddleware"
WAITING_FOR_WEIGHTS = (
    'until [ -f "{marker}" ]; do echo "waiting for weights at {marker}"; sleep 15; done'
)


# Bucket-backed weights: the markers the entrypoint (images/serve.py) waits for before vLLM starts.
WEIGHTS_MARKERS_ENV = "GKE_LLM_WEIGHTS_MARKERS"


def weights_markers(model: ModelSpec) -> list[str]:
    return [ready_marker(model), *(c.marker for c in side_copies(model))]


def wait_for_weights(model: ModelSpec) -> str:
    """The init container's script: every marker (model, then adapters and draft) present. The paths are made
    of validated names and git revisions only ([A-Za-z0-9._/-]), so quoting them is enough."""
    return "; ".join(WAITING_FOR_WEIGHTS.format(marker=m) for m in weights_markers(model))


# The server runs as this unprivileged user; HOME and the caches live on emptyDirs because the
# root filesystem is read-only. USER is set too: torch's compile cache calls getpass.getuser(),
# which fails for a UID with no passwd entry.
HOME = "/home/vllm"
NON_ROOT = {"runAsNonRoot": True, "runAsUser": SERVER_UID, "runAsGroup": SERVER_UID}
RUNTIME_ENV = ({"name": "HOME", "value": HOME}, {"name": "USER", "value": "vllm"},
               {"name": "XDG_CACHE_HOME", "value": f"{HOME}/.cache"})


def drain_seconds(request_timeout_seconds: int) -> int:
    """How long a stopping replica may still be answering a request it accepted: the preStop
    window plus the longest request the load balancer lets run (its backend timeout)."""
    return PRE_STOP_S + request_timeout_seconds


def sidecar_config() -> dict[str, str]:
    """Pod annotations that keep the Istio sidecar up while vLLM finishes what it accepted. As a
    native sidecar (an init container that Kubernetes stops only after vLLM has exited; its
    injected preStop starts the drain and its listeners keep accepting) it outlives vLLM by
    construction. As a classic one, pilot-agent's default would exit 5 s after SIGTERM; with
    EXIT_ON_ZERO_ACTIVE_CONNECTIONS it exits once no connection is open, bounded by the grace
    period (istio 1.24.6/1.30.3 pkg/envoy/agent.go:152-230)."""
    proxy = {"holdApplicationUntilProxyStarts": True, "proxyMetadata": {"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true"}}
    return {"proxy.istio.io/config": json.dumps(proxy, sort_keys=True), "sidecar.istio.io/nativeSidecar": "true"}


def vllm_args(model: ModelSpec, pool: ServingPoolSpec, rel: Optional[VllmRelease] = None,
              request_timeout_seconds: int = 600, ttft_slo_seconds: Optional[float] = None,
              traces_endpoint: Optional[str] = None) -> list[str]:
    """Flags for `vllm serve` of release `rel` (default the newest supported), following GKE's vLLM
    serving guides; `ttft_slo_seconds`, a TTFT objective to have among the TTFT histogram's bounds;
    `traces_endpoint`, the collector's OTLP/HTTP traces URL."""
    rel = rel or release(DEFAULT_VLLM_VERSION)
    args = [
        model_dir(model),
        "--served-model-name", model.name,
        "--host", "0.0.0.0", "--port", str(PORT),
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        *(["--pipeline-parallel-size", str(model.pipeline_parallel_size)] if model.pipeline_parallel_size > 1 else []),
        "--max-model-len", str(model.pool_max_model_len(pool)),
        "--max-num-seqs", str(pool.max_num_seqs),
        "--gpu-memory-utilization", f"{model.gpu_memory_utilization:g}",
        "--enable-prefix-caching" if model.enable_prefix_caching else rel.disable_prefix_caching,
        # Explicit either way: releases differ in their defaults and in the off switch's name.
        "--enable-chunked-prefill" if model.enable_chunked_prefill else rel.disable_chunked_prefill,
    ]
    if pool.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(pool.max_num_batched_tokens)]
    if model.dtype in ("bfloat16", "float16"):
        args += ["--dtype", model.dtype]
    else:
        args += ["--quantization", "compressed-tensors" if model.dtype == "int8" else model.dtype]
    if model.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", model.kv_cache_dtype]
    if model.adapters:
        # Loaded at start from the share (never from the hub); clients pick one with `model`.
        args += ["--enable-lora", "--max-loras", str(model.lora_slots), "--max-lora-rank", str(model.max_lora_rank),
                 "--max-cpu-loras", str(max(model.lora_slots, len(model.adapters))),
                 "--lora-modules", *(f"{a.name}={c.directory}" for a, c in zip(model.adapters, adapter_copies(model)))]
    if rel.shutdown_timeout_flag:
        # On SIGTERM the engine keeps generating what it accepted for up to this long, streams
        # included, instead of aborting it (0.34's default of 0).
        args += [rel.shutdown_timeout_flag, str(request_timeout_seconds)]
    if ttft_slo_seconds is not None and rel.histogram_buckets_flag \
            and (buckets := ttft_buckets_with(ttft_slo_seconds)) is not None:
        # The TTFT SLO counts requests under its threshold from this histogram, which Cloud
        # Monitoring can cut only at a bucket bound (components/model/service_levels.py).
        args += [rel.histogram_buckets_flag, json.dumps({"time_to_first_token": buckets}, separators=(",", ":"))]
    if traces_endpoint:
        # Its spans and the guard's, through the OTLP/HTTP exporter trace_env selects.
        args += ["--otlp-traces-endpoint", traces_endpoint]
    # Prefill/decode disaggregation: NIXL's role for this pool's engine (components/model/disaggregation.py).
    args += disaggregation.pool_kv_args(model, pool)
    args += sleep_args(model)  # models[].sleepMode: --enable-sleep-mode
    # Speculative decoding: the draft read from the share (components/model/speculative.py).
    args += speculative_args(model)
    args += ["--middleware", GUARD_MIDDLEWARE]
    return args + list(model.extra_args)


def trace_env(sample_ratio: float, service_name: str) -> list[dict[str, Any]]:
    """The OpenTelemetry SDK's settings for the tracer provider vLLM creates (vllm 0.34.0
    vllm/tracing/otel.py:76-99): OTLP over HTTP (its default is gRPC; the URL then ends in
    /v1/traces, as the SDK's HTTP exporter posts to it as given), the service name Cloud Trace
    shows, and sampling by ratio for root spans - the guard's - with every child following its
    parent; the pod and namespace as resource attributes (a tenant's dedicated pool has the
    shared one's name). OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is not set: vLLM sets it from its flag."""
    return [{"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
            {"name": "OTEL_SERVICE_NAME", "value": service_name},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            # $(VAR): Kubernetes expands variables defined before this one.
            {"name": "OTEL_RESOURCE_ATTRIBUTES",
             "value": "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"},
            {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
            {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{sample_ratio:g}"}]


# The node-disk emptyDirs a server writes - compile caches and scratch (/tmp) and its home - at
# most (their sizeLimits), and what they typically hold (the request).
TMP_GI, HOME_GI = 8, 16
SCRATCH_REQUEST_GI = 4


def scratch_gi(model: ModelSpec, bucket_cache: bool) -> int:
    """Node disk to request for one replica: its compile caches, plus, on the bucket backend,
    Cloud Storage FUSE's file cache (an emptyDir sized to the model and its adapters, which the
    sidecar fills with the whole model on the first read)."""
    return SCRATCH_REQUEST_GI + (gcs_weights.cache_gi(served_files_gb(model)) if bucket_cache else 0)


def container_resources(node_pool: NodePoolSpec, gpus: int, scratch: int = 0) -> dict[str, dict[str, str]]:
    """A pod's share of the node's CPU and RAM, in proportion to the accelerator units (GPUs, MIG
    slices or TPU chips) it takes, and the node disk its emptyDirs may fill (`scratch` GiB):
    requested, so the scheduler never packs more replicas on a node than its boot disk holds (the
    kubelet would evict them under DiskPressure)."""
    machine = node_pool.machine
    assert machine.accelerator is not None
    units = node_pool.slices_per_node
    cpu = max(1, math.floor((machine.vcpus - 2) / units)) * gpus
    memory = max(8, math.floor((machine.memory_gb * 0.85 - 4) / units)) * gpus
    # requests == limits: Guaranteed QoS, so the kubelet never evicts a loaded model first.
    res = {"cpu": str(cpu), "memory": f"{memory}Gi", machine.accelerator.resource: str(gpus)}
    requests = {**res, **({"ephemeral-storage": f"{scratch}Gi"} if scratch else {})}
    return {"requests": requests, "limits": dict(res)}


# A replica across hosts (a LeaderWorkerSet group, components/vllm_service.py). The LeaderWorkerSet
# webhook gives every pod of a group its leader's DNS name and its own index (lws v0.10.0
# pkg/utils/pod/pod_utils.go:131-179); the kubelet expands $(VAR) in args from the pod's env.
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# vLLM TPU across hosts runs on a Ray cluster of the group (tpu-inference 0.32.0
# platforms/tpu_platform.py:495-507, TPU_MULTIHOST_BACKEND=ray); its head's port on the leader.
RAY_PORT = 6379
RAY_HEAD_ENV, RAY_JOIN_ENV = "GKE_LLM_RAY_HEAD_NODES", "GKE_LLM_RAY_JOIN"


def group_args(hosts: int, rel: VllmRelease, role: str) -> list[str]:
    """What a multi-host group's `vllm serve` adds for `role` (leader or worker). CUDA: vLLM's own
    multi-node launch (0.34 engine/arg_utils.py:2424-2460, entrypoints/cli/serve.py:181-230): every
    host runs `vllm serve` with the group's host count and its rank, the leader's address as the
    torch.distributed master; the workers headless (no API server, the leader's engine drives
    them). TPU: the leader's `vllm serve` drives the Ray cluster of the group; workers run no vLLM."""
    if hosts <= 1 or rel.platform == "tpu":
        return []
    rank = "0" if role == "leader" else WORKER_INDEX
    args = ["--distributed-executor-backend", "mp", "--nnodes", str(hosts), "--node-rank", rank,
            "--master-addr", LEADER_ADDRESS]
    return args + (["--headless"] if role == "worker" else [])


def group_env(hosts: int, rel: VllmRelease, role: str) -> list[dict[str, Any]]:
    """The TPU group's Ray roles for the entrypoint (images/serve.py): the leader starts Ray's head
    and waits for every host before vLLM starts; a worker joins it and blocks."""
    if hosts <= 1 or rel.platform != "tpu":
        return []
    ray = {"name": "TPU_MULTIHOST_BACKEND", "value": "ray"}
    if role == "leader":
        return [ray, {"name": RAY_HEAD_ENV, "value": str(hosts)}]
    return [ray, {"name": RAY_JOIN_ENV, "value": f"{LEADER_ADDRESS}:{RAY_PORT}"}]


# TPU pods. libtpu opens the chips' device nodes (/dev/vfio/*, /dev/accel*), root's on the node,
# that the TPU device plugin hands the container; GKE's TPU example Deployment (About node pool
# auto-creation) runs its container as the image's root user, and privileged only "for GKE
# versions earlier than 1.28" (infra/contracts/lws.py). Until a run as
# an unprivileged user is shown to reach the chips, the server on a TPU runs as root, never
# privileged, and keeps the rest: no privilege escalation, no capabilities, a read-only root
# filesystem, RuntimeDefault seccomp (policies/workloads.py allows root to TPU containers alone).
TPU_ROOT = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
# vLLM TPU's persistent XLA (JAX) compilation cache: VLLM_XLA_CACHE_PATH, which tpu-inference hands
# to jax_compilation_cache_dir (vllm-tpu 0.32.0 vllm/envs.py:1096-1103, tpu-inference 0.32.0
# runner/compilation_manager.py:88-91); by default under the home emptyDir, lost whenever a group
# is recreated (RecreateGroupOnPodRestart) and so recompiled on every restart. A directory of the
# node instead: a group recreated on the same slice (one group to a slice) finds its executables;
# a pool woken from zero on a new slice starts empty. One directory per namespace and serving pool
# (xla_cache_host_path): a pod, root in its container, can write only what its own pool's replicas
# load, never another tenant's or model's (pods-hardened holds every hostPath to that shape).
XLA_CACHE_ENV = "VLLM_XLA_CACHE_PATH"
XLA_CACHE_DIR = "/var/cache/vllm-gke/xla"
XLA_CACHE_HOST_ROOT = "/var/lib/vllm-gke/xla-cache"
# JAX's cache has no bound by default; a size (JAX_COMPILATION_CACHE_MAX_SIZE, bytes, jax 0.11
# _src/config.py jax_compilation_cache_max_size) turns on its LRU eviction and the file lock that
# orders reads, writes and evictions of pods sharing a directory (_src/lru_cache.py). The node disk
# check (config_rules/placement.py node_disks) reserves this much for each pool's directory.
XLA_CACHE_MAX_ENV = "JAX_COMPILATION_CACHE_MAX_SIZE"
XLA_CACHE_MAX_GI = 10


def xla_cache_host_path(namespace: str, service: str) -> str:
    """The node directory of one serving pool's XLA cache: <root>/<namespace>/<model>-<pool>."""
    return f"{XLA_CACHE_HOST_ROOT}/{namespace}/{service}"
# Ray's GCS declares a node dead after health_check_failure_threshold (5) missed checks of its
# raylet, every 3 s with a 10 s timeout by default (Ray's src/ray/common/ray_config_def.h; row in
# infra/contracts/lws.py): 20 to 55 s. A host busy compiling XLA for minutes can miss them, and a node declared dead fails the
# engine, which recreates the whole group. Kubernetes already recreates a group whose pod dies, so
# Ray need only never call a slow host dead: checks every 10 s, 30 s each, 60 misses (10 min or more).
RAY_HEALTH_ENV = (("RAY_health_check_period_ms", "10000"), ("RAY_health_check_timeout_ms", "30000"),
                  ("RAY_health_check_failure_threshold", "60"))


def tpu_pod(template: dict[str, Any], hosts: int, cache_path: Any) -> None:
    """Make a TPU server pod (a replica, or a group's leader or worker) what the TPU build needs:
    root in its vLLM container, its pool's node directory (`cache_path`, xla_cache_host_path) as
    the XLA cache, bounded, and, across hosts, Ray's patient health checks."""
    pod = template["spec"]
    container = pod["containers"][0]
    container["securityContext"] = {**container["securityContext"], **TPU_ROOT}
    ray = [{"name": k, "value": v} for k, v in RAY_HEALTH_ENV] if hosts > 1 else []
    container["env"] = [*container["env"], {"name": XLA_CACHE_ENV, "value": XLA_CACHE_DIR},
                        {"name": XLA_CACHE_MAX_ENV, "value": str(XLA_CACHE_MAX_GI * 1024 ** 3)}, *ray]
    container["volumeMounts"] = [*container["volumeMounts"], {"name": "xla-cache", "mountPath": XLA_CACHE_DIR}]
    pod["volumes"] = [*pod["volumes"], {"name": "xla-cache",
                                        "hostPath": {"path": cache_path, "type": "DirectoryOrCreate"}}]
