"""Precise prefix-cache routing as data: vLLM publishes what its KV cache holds (KV-cache events over
ZMQ) and the endpoint picker (llm-d-router v0.10.0) indexes them, scoring each replica by the prompt
blocks it really holds, where the approximate scorer only guesses from what the picker sent where.

Both sides are here, so they cannot drift apart: vLLM's flags (its block size, the events' ports and
topic), the picker's plugins (a producer fed by the pool's endpoints, a real tokenizer, a bounded
index), the tokenizer's render server beside the picker, and who may read the events - they carry
every tenant's prompt tokens and cache_salt in plain text, with no authentication (vLLM 0.34
distributed/kv_events.py:437-458), so only the picker's pods may connect.

Upstream file:line: llm-d-router at v0.10.0 (P/ = pkg/epp/framework/plugins/requestcontrol/
dataproducer/) and vLLM 0.34.0 (vllm/...), unless named otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from .k8s_objects import CONTAINER_SECURITY
from .picker import PickerExtension, picker_labels, picker_name
from .specs import ModelSpec, PickerSpec
from .vllm_server import PORT
from .vllm_versions import VllmRelease
from .weights_layout import SERVER_UID, model_dir
from .weights_mount import WeightsMount

# vLLM binds its PUB socket here (KVEventsConfig.endpoint's default, vllm/config/kv_events.py:23)
# and the picker dials <pod IP>:<port + DP rank> (P/preciseprefixcache/extractor.go:66-94; the
# pool's own default, pkg/kvevents/pool.go:136-141). One engine per pod (data_parallel_size is the
# platform's), so the rank is always 0.
EVENTS_PORT = 5557
# The replay ROUTER socket: on connect and on a sequence gap the picker asks for what it missed
# (pkg/kvevents/zmq_subscriber.go:152-228); without it a lost parent block leaves its children
# unindexable (pool.go:496-512). Away from EVENTS_PORT + rank (vLLM offsets both by the rank,
# vllm/distributed/kv_events.py:362-365), so a rank's PUB never lands on the replay port.
REPLAY_PORT = 5657
EVENTS_PORTS = (EVENTS_PORT, REPLAY_PORT)
# The picker subscribes to this prefix (pool.go:136) and parses kv@<pod>@<model>
# (pkg/kvevents/engineadapter/common.go:36-45); the model segment seeds the block keys on the
# event side (pool.go:453-457) and must equal the request's model after rewrite
# (P/preciseprefixcache/blockkeys.go:63): the served model name, which the picker forwards as is.
TOPIC_PREFIX = "kv@"
# Kubernetes expands $(POD_IP) in args from the container's env; vLLM publishes the topic verbatim
# (kv_events.py:385,511). In per-pod mode the picker keys events by the endpoint it dialled
# (pool.go:316-323), so the pod segment is for a reader of the stream, not for the picker.
POD_IP_ENV = "POD_IP"
# vLLM's block size, set explicitly (0.34's default, vllm/config/cache.py:185, is 64, but a platform
# may pick another when none is given) and the picker's canonical block size, equal: the event
# side copies block 0's extra keys (the tenant's cache_salt) into every canonical sub-block of a
# larger engine block (pool.go:359-364), the request side salts canonical block 0 only
# (blockkeys.go:78-92), so with unequal sizes salted prompts would match one block at most.
BLOCK_SIZE_TOKENS = 64
# The index's memory bound: costAwareMemoryConfig wins over the unbounded-by-bytes in-memory
# default of 1e8 keys (pkg/kvcache/kvblock/index.go:61-70; cost_aware_memory.go:41-50). Within the
# picker's 4 GiB limit, beside its queued bodies.
INDEX_SIZE = "1GiB"

# Plugin types and the instance names the config refers to.
NOTIFICATIONS = "endpoint-notification-source"  # P/../datalayer/source/notifications/endpoint_datasource.go:32
PRODUCER = "precise-prefix-cache-producer"  # P/preciseprefixcache/producer.go:48
# Named exactly so: the producers read the TokenizedPrompt it writes under that name
# (P/tokenizer/tokenizer.go:51,100).
TOKEN_PRODUCER = "token-producer"
SCORER = "precise-prefix-scorer"
SCORER_TYPE = "prefix-cache-scorer"  # scheduling/scorer/prefix/plugin.go:59

# The tokenizer: vLLM's GPU-less render server (`vllm launch render`, vllm/entrypoints/cli/launch.py:
# 46-64), which serves /v1/completions/render and /v1/chat/completions/render without
# --enable-scale-out (vllm/entrypoints/scale_out/factories.py:94-98), beside the picker. The
# token-producer posts each body there with `model` set to its modelName (P/tokenizer/
# vllm_http.go:133-181); a render failure only costs the request its precise score
# (pkg/epp/requestcontrol/director.go:321-326).
RENDER_PORT = 8000  # the token-producer's default URL's port (vllm_http.go:42)
RENDER_CONTAINER = "vllm-render"
# vLLM's CPU build of the same release: the CUDA image's vLLM refuses an x86 CPU without a GPU
# ("vLLM on x86 CPUs requires Triton (triton-cpu)", vllm/platforms/cpu.py:243), which the system
# pool is. The llm-d chart runs the same image for this sidecar (config/charts/routerlib/values.yaml:80-116).
RENDER_IMAGE_REPOSITORY = "vllm/vllm-openai-cpu"
# Flags of the model's extraArgs that change how a prompt becomes tokens: the render server takes
# them too, so its tokens are the server's (a chat template of its own would never match a block).
RENDER_FLAGS = ("--tokenizer-mode", "--chat-template", "--chat-template-content-format", "--trust-remote-code",
                "--hf-overrides", "--default-chat-template-kwargs")
RENDER_HOME = "/home/vllm"
# What the render server occupies: vLLM's frontend and one tokenizer (1.4 GiB resident for a 131k
# vocabulary, measured with vLLM 0.34's render server), no weights, no KV cache.
RENDER_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "3Gi"}}
# The sidecar reads only these: its HOME and scratch (the root filesystem is read-only).
RENDER_SCRATCH = "render-scratch"
# The mesh leaves these ports alone on a server's pod: the picker runs outside the mesh (it has no
# mesh identity an AuthorizationPolicy could name) and the namespace's deny-all would refuse it
# at the sidecar. The NetworkPolicy (events_ingress) admits the picker's pods alone instead.
EXCLUDE_INBOUND = "traffic.sidecar.istio.io/excludeInboundPorts"
# The server pod's ports everyone may still reach once a NetworkPolicy selects it: vLLM's (through
# the sidecar's inbound capture) and the sidecar's own (15006 inbound, 15020 merged metrics,
# 15021 health, 15090 Envoy's stats), as components/model/serving_pool.py group_network_policy.
SERVING_PORTS = (PORT, 15006, 15020, 15021, 15090)


def reads_kv_events(picker: PickerSpec, model: ModelSpec) -> bool:
    """Whether the model's servers publish KV-cache events to its picker: picker.prefixCache
    precise, for the models behind a picker (routing: inference-gateway)."""
    return picker.prefix_cache == "precise" and model.routing == "inference-gateway"


def kv_events_config(served_model_name: str) -> dict[str, Any]:
    """vLLM's KVEventsConfig (vllm/config/kv_events.py:10-54): ZMQ, bound on every address (a `*`
    endpoint binds, kv_events.py:437-448), replay on its own port."""
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{EVENTS_PORT}", "replay_endpoint": f"tcp://*:{REPLAY_PORT}",
            "topic": f"{TOPIC_PREFIX}$({POD_IP_ENV})@{served_model_name}"}


def kv_events_args(served_model_name: str) -> list[str]:
    """What `vllm serve` adds (after --enable-prefix-caching, which events need: vllm/config/vllm.py:1959-1967)."""
    return ["--block-size", str(BLOCK_SIZE_TOKENS),
            "--kv-events-config", json.dumps(kv_events_config(served_model_name), separators=(",", ":"))]


def kv_events_env() -> list[dict[str, Any]]:
    """The server container's env for the topic's $(POD_IP)."""
    return [{"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def kv_events_annotations() -> dict[str, str]:
    """The server pod's: its sidecar leaves the events' ports to the NetworkPolicy."""
    return {EXCLUDE_INBOUND: ",".join(str(p) for p in EVENTS_PORTS)}


def events_ingress(servers: Mapping[str, str], picker_namespace: object,
                   picker_pods: Mapping[str, str]) -> dict[str, Any]:
    """The NetworkPolicy on a pool's servers: the events' ports to the picker's pods alone; the
    serving and sidecar ports to anyone, as before (the mesh judges those). Selecting the pods makes
    everything else closed, so both rules are needed."""
    picker = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": picker_namespace}},
              "podSelector": {"matchLabels": dict(picker_pods)}}
    return {"podSelector": {"matchLabels": dict(servers)}, "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": p} for p in SERVING_PORTS]},
                        {"from": [picker], "ports": [{"protocol": "TCP", "port": p} for p in EVENTS_PORTS]}]}


def pool_events_ingress(servers: Mapping[str, str], namespace: object, picker: str) -> dict[str, Any]:
    """events_ingress for a pool's vLLM pods (`servers`: not its standby) and its picker (`picker`,
    picker.picker_name), both in `namespace`."""
    return events_ingress(servers, namespace, picker_labels(picker))


def pool_picker(model: ModelSpec) -> str:
    """The picker that reads the events of the model's pool: its InferencePool is named after the model."""
    return picker_name(model.name)


def render_weights_prefixes(model: ModelSpec) -> list[str]:
    """The bucket folders the render sidecar opens: its model's (every revision), for the tokenizer."""
    return [f"{model.name}/"]


def precise_extension(served_model_name: str, weight: int) -> PickerExtension:
    """The picker's plugins for precise prefix scoring at `weight` (the approximate prefix-cache-scorer
    then off: the documented recipe scores with the precise producer alone,
    deploy/config/epp-precise-prefix-cache-config.yaml)."""
    producer = {"type": PRODUCER, "parameters": {
        "tokenProcessorConfig": {"blockSizeTokens": BLOCK_SIZE_TOKENS},
        "indexerConfig": {"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": INDEX_SIZE},
                                                 "enableMetrics": True}},
        # Per-pod mode: a subscriber per endpoint the notification source reports, dropped (and
        # its blocks cleared) when the endpoint goes (P/preciseprefixcache/extractor.go:35-64).
        "kvEventsConfig": {"engineType": "vllm", "topicFilter": TOPIC_PREFIX, "discoverPods": True,
                           "podDiscoveryConfig": {"socketPort": EVENTS_PORT, "replaySocketPort": REPLAY_PORT}}}}
    tokens = {"type": TOKEN_PRODUCER, "parameters": {
        "modelName": served_model_name, "vllm": {"url": f"http://localhost:{RENDER_PORT}", "timeout": "5s"}}}
    scorer = {"name": SCORER, "type": SCORER_TYPE, "parameters": {"prefixMatchInfoProducerName": PRODUCER}}
    return PickerExtension(
        plugins=({"type": NOTIFICATIONS}, tokens, producer, scorer),
        profile_plugins=({"pluginRef": SCORER, "weight": weight},),
        # Added to the metrics source the loader still injects (pkg/epp/config/loader/defaults.go:298-330).
        data_sources=({"pluginRef": NOTIFICATIONS, "extractors": [{"pluginRef": PRODUCER}]},))


def render_args(model: ModelSpec) -> list[str]:
    """`vllm launch render` of the model's own files, under its served name (the token-producer's
    modelName), with the extraArgs that shape its tokens."""
    extra = list(model.extra_args)
    kept: list[str] = []
    for i, arg in enumerate(extra):
        if arg.split("=", 1)[0] in RENDER_FLAGS:
            kept.append(arg)
            if "=" not in arg and i + 1 < len(extra) and not extra[i + 1].startswith("--"):
                kept.append(extra[i + 1])
    return [model_dir(model), "--served-model-name", model.name, "--host", "0.0.0.0", "--port", str(RENDER_PORT),
            *kept]


@dataclass(frozen=True)
class RenderSidecar:
    """The render server beside the picker: its container, and what the picker's pod adds for it."""

    container: dict[str, Any]
    volumes: tuple[Mapping[str, Any], ...]
    annotations: Mapping[str, str]


def render_sidecar(model: ModelSpec, release: VllmRelease, weights: WeightsMount) -> RenderSidecar:
    """`weights`: the model's files as the store hands a reader in the picker's namespace
    (ModelStore.reader_for): the one read-only copy, never a download (offline)."""
    home = [{"name": RENDER_SCRATCH, "mountPath": RENDER_HOME}, {"name": RENDER_SCRATCH, "mountPath": "/tmp",
                                                                  "subPath": "tmp"}]
    container: dict[str, Any] = {
        "name": RENDER_CONTAINER, "image": f"{RENDER_IMAGE_REPOSITORY}:{release.image_tag}",
        "command": ["vllm", "launch", "render"], "args": render_args(model),
        "ports": [{"name": "render-http", "containerPort": RENDER_PORT}],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                {"name": "VLLM_NO_USAGE_STATS", "value": "1"}, {"name": "HOME", "value": RENDER_HOME},
                {"name": "XDG_CACHE_HOME", "value": f"{RENDER_HOME}/.cache"}, {"name": "USER", "value": "vllm"}],
        # No readiness probe: the picker serves without it (a request then has no precise score),
        # so a slow tokenizer never keeps the picker out of rotation. Restarted if it hangs.
        "livenessProbe": {"httpGet": {"path": "/health", "port": RENDER_PORT}, "initialDelaySeconds": 60,
                          "periodSeconds": 20, "failureThreshold": 6},
        "resources": RENDER_RESOURCES,
        # As the servers read the weights (the bucket's FUSE mount is theirs, gcs_weights.weights_volume).
        "securityContext": {**CONTAINER_SECURITY, "runAsUser": SERVER_UID, "runAsGroup": SERVER_UID},
        "volumeMounts": [*home, *(dict(m) for m in weights.mounts)],
    }
    return RenderSidecar(container, (*weights.volumes, {"name": RENDER_SCRATCH, "emptyDir": {"sizeLimit": "1Gi"}}),
                         dict(weights.annotations))


def precise_prefix_problems(model: ModelSpec, release: VllmRelease) -> list[tuple[str, str]]:
    """(key, problem and fix) for a model whose picker would score by KV events: what keeps vLLM's
    events or blocks from matching the picker's."""
    problems: list[tuple[str, str]] = []
    if not model.enable_prefix_caching:
        problems.append(("enablePrefixCaching", "is false: vLLM publishes no blocks to route by; set it true or "
                         "picker.prefixCache: approximate"))
    if release.platform != "cuda":
        problems.append(("vllmVersion", f"{release.label} publishes no KV-cache events the picker reads; use "
                         "picker.prefixCache: approximate"))
    taken = [a for a in model.extra_args if a.split("=", 1)[0] in ("--block-size", "--kv-events-config")]
    if taken:
        problems.append(("extraArgs", f"sets {', '.join(taken)}, which precise prefix routing sets (the picker's "
                         "block size must be vLLM's); remove it"))
    return problems

