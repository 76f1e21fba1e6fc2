"""Precise prefix-cache routing as data: vLLM publishes what its KV cache holds (KV-cache events over
ZMQ) and the endpoint picker (llm-d-router v0.10.0) indexes them, scoring each replica by the prompt
blocks it really holds, where the approximate scorer only guesses from what the picker sent where.

Both sides are here, so they cannot drift apart: vLLM's flags (its block size, the events' ports and
topic), the picker's plugins (a producer fed by the pool's endpoints, a real tokenizer, an index
bounded by what the pool can hold), the tokenizer's render server (its own Deployment, which the
picker calls and never waits for), and who may read the events - they carry every tenant's prompt
tokens and cache_salt in plain text, with no authentication (vLLM 0.34
distributed/kv_events.py:437-458), so only the picker's pods may connect.

Upstream file:line: llm-d-router at v0.10.0 (P/ = pkg/epp/framework/plugins/requestcontrol/
dataproducer/) and vLLM 0.34.0 (vllm/...), unless named otherwise."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from .capacity import pool_capacity
from .k8s_objects import CONTAINER_SECURITY
from .kv_offload import host_tier
from .picker import PickerExtension, picker_labels, picker_name
from .specs import ModelSpec, NodePoolSpec, PickerSpec
from .vllm_server import PORT
from .vllm_versions import VllmRelease
from .weights_layout import MOUNT_PATH, SERVER_UID, model_dir
from .weights_mount import WeightsMount

if TYPE_CHECKING:
    from .stack_config import StackConfig

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
# default of 1e8 keys (pkg/kvcache/kvblock/index.go:61-70; cost_aware_memory.go:41-50). It never
# needs more than the blocks the pool's replicas can hold at once (BlockRemoved evicts the rest,
# a deleted endpoint's are cleared): a block costs the key's string, the pod cache's 64 bytes and
# ~70 per pod entry (cost_aware_memory.go:185-222), ristretto's own item cost on top - about 250
# bytes held by one replica; INDEX_BYTES_PER_BLOCK leaves twice that.
INDEX_BYTES_PER_BLOCK = 512
# Floor: a pool whose capacity the model cannot say (an unknown shape) or a tiny one still indexes.
INDEX_MIN_MIB = 32
# What the index costs before it holds a block, outside its size: ristretto's count-min sketch of
# NumCounters 1e8 (cost_aware_memory.go:36,71-77), 4 rows x next2Power(1e8)/2 bytes = 256 MiB
# (dgraph-io/ristretto v2 sketch.go newCmSketch/newCmRow), and its TinyLFU doorkeeper, a bloom
# filter for 1e8 keys at 1% (~128 MiB, ristretto's z.NewBloomFilter): ~0.4 GiB, which the picker's
# memory limit and GOMEMLIMIT gain with precise on (the review of issue 39 item 3 measured the sketch).
INDEX_FIXED_MIB = 512

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
# --enable-scale-out (vllm/entrypoints/scale_out/factories.py:94-98). Its own Deployment behind a
# ClusterIP Service, which the token-producer's URL may name (P/tokenizer/vllm_http.go:62-64): the
# picker's pod mounts no weights and pulls no vLLM image, so neither can keep a picker from
# starting. The token-producer posts each body there with `model` set to its modelName
# (vllm_http.go:133-181); a render failure only costs the request its precise score
# (pkg/epp/requestcontrol/director.go:321-326).
RENDER_PORT = 8000  # the token-producer's default URL's port (vllm_http.go:42)
RENDER_CONTAINER = "vllm-render"
# Two, on different nodes: a node's drain or a crash leaves one serving the pickers.
RENDER_REPLICAS = 2
# The producers run synchronously after flow control admits a request (pkg/epp/requestcontrol/
# director.go:300-326): every picked request waits for its render, up to this (vllm_http.go:206-213).
# A miss costs the precise score; a wait costs TTFT. 500 ms: a 16k-token chat renders in tens of ms on
# one core, so only a render queued behind a burst is cut, and then the request is scored without it.
RENDER_TIMEOUT = "500ms"
# vLLM's CPU build of the same release: the CUDA image's vLLM refuses an x86 CPU without a GPU
# ("vLLM on x86 CPUs requires Triton (triton-cpu)", vllm/platforms/cpu.py:243), which the system
# pool is. The llm-d chart runs the same image for this sidecar (config/charts/routerlib/values.yaml:80-116).
RENDER_IMAGE_REPOSITORY = "vllm/vllm-openai-cpu"
# Flags of the model's extraArgs that change how a prompt becomes tokens: the render server takes
# them too, so its tokens are the server's (a chat template of its own would never match a block).
RENDER_FLAGS = ("--tokenizer", "--tokenizer-mode", "--tokenizer-revision", "--revision", "--chat-template",
                "--chat-template-content-format", "--trust-remote-code", "--hf-overrides",
                "--default-chat-template-kwargs")
RENDER_HOME = "/home/vllm"
# What the render server occupies: vLLM's frontend and one tokenizer (1.4 GiB resident for a 131k
# vocabulary, measured with vLLM 0.34's render server), no weights, no KV cache. One uvicorn process
# tokenizes on one core at a time (the Rust tokenizer may take a second): a request of 1 CPU each,
# two replicas, so a burst that queues past RENDER_TIMEOUT loses precise scores, not TTFT; a stack
# with more picked requests a second than two cores render gives the render more replicas.
RENDER_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "3Gi"}}
# The render server writes only these: its HOME and scratch (the root filesystem is read-only).
RENDER_SCRATCH = "render-scratch"
# Its pods' labels (not the picker's: the events' NetworkPolicy admits the picker's pods alone).
RENDER_NAME_LABEL = ("app.kubernetes.io/name", "vllm-gke-render")
# gcsfuse's file cache off on the render's mount: it opens a few tokenizer and config files, and
# where config.json names no dtype vLLM reads every *.safetensors header (vllm/transformers_utils/
# model_arch_config_convertor.py:221-223): a range-read cache would copy the model onto the node.
NO_FILE_CACHE = "file-cache:max-size-mb:0"
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
    """The bucket folder the render server opens: its model's revision (tokenizer, config, chat
    template), not the model's other revisions or its adapters."""
    return [f"{model_dir(model).removeprefix(MOUNT_PATH + '/')}/"]


def pool_blocks(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    """The KV blocks the picker's pool (the model's short pool, components/model/picker_wake.py) holds
    at its most replicas, by the capacity model (components/model/capacity.py). With models[].kvOffload
    the host tier's too: vLLM publishes its BlockStored/BlockRemoved (medium CPU) on the same stream and
    llm-d-router v0.10.0 indexes each as a (pod, cpu) entry beside the GPU's (pkg/kvevents/pool.go
    handleDeviceTierUpdate)."""
    row = pool_capacity(model, "short", model.short, node_pool)
    tier = host_tier(model, node_pool)
    tokens = row.tokens_fit + (tier.tokens if tier else 0)
    return model.short.max_replicas * (tokens // BLOCK_SIZE_TOKENS)


def index_mib(model: ModelSpec, node_pool: NodePoolSpec) -> int:
    """costAwareMemoryConfig's size: the pool's blocks at INDEX_BYTES_PER_BLOCK, INDEX_MIN_MIB at least."""
    return max(INDEX_MIN_MIB, math.ceil(pool_blocks(model, node_pool) * INDEX_BYTES_PER_BLOCK / 2 ** 20))


def render_name(model_name: str) -> str:
    """The render server's Deployment, Service, NetworkPolicy and identity."""
    return f"{model_name}-render"


def render_labels(model_name: str) -> dict[str, str]:
    return {RENDER_NAME_LABEL[0]: RENDER_NAME_LABEL[1], "vllm-gke.io/render": model_name}


def render_url(model_name: str) -> str:
    """Its Service, in the picker's namespace."""
    return f"http://{render_name(model_name)}:{RENDER_PORT}"


def precise_extension(served_model_name: str, weight: int, index_size_mib: int) -> PickerExtension:
    """The picker's plugins for precise prefix scoring at `weight` (the approximate prefix-cache-scorer
    then off: the documented recipe scores with the precise producer alone,
    deploy/config/epp-precise-prefix-cache-config.yaml), the index bounded to `index_size_mib`
    (index_mib), and the picker's memory raised by the index's fixed cost and its bound."""
    producer = {"type": PRODUCER, "parameters": {
        "tokenProcessorConfig": {"blockSizeTokens": BLOCK_SIZE_TOKENS},
        "indexerConfig": {"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": f"{index_size_mib}MiB"},
                                                 "enableMetrics": True}},
        # Per-pod mode: a subscriber per endpoint the notification source reports, dropped (and
        # its blocks cleared) when the endpoint goes (P/preciseprefixcache/extractor.go:35-64).
        "kvEventsConfig": {"engineType": "vllm", "topicFilter": TOPIC_PREFIX, "discoverPods": True,
                           "podDiscoveryConfig": {"socketPort": EVENTS_PORT, "replaySocketPort": REPLAY_PORT}}}}
    # mmTimeout too: any message whose content is an array of parts (most Messages bodies) takes it,
    # 30 s by default (tokenizer/vllm_http.go:44,183-213); the catalog's models are text-only.
    render = {"url": render_url(served_model_name), "timeout": RENDER_TIMEOUT, "mmTimeout": RENDER_TIMEOUT}
    tokens = {"type": TOKEN_PRODUCER, "parameters": {"modelName": served_model_name, "vllm": render}}
    scorer = {"name": SCORER, "type": SCORER_TYPE, "parameters": {"prefixMatchInfoProducerName": PRODUCER}}
    return PickerExtension(
        plugins=({"type": NOTIFICATIONS}, tokens, producer, scorer),
        profile_plugins=({"pluginRef": SCORER, "weight": weight},),
        # Added to the metrics source the loader still injects (pkg/epp/config/loader/defaults.go:298-330).
        data_sources=({"pluginRef": NOTIFICATIONS, "extractors": [{"pluginRef": PRODUCER}]},),
        memory_mib=INDEX_FIXED_MIB + index_size_mib)


def _flag_values(extra_args: list[str], flags: tuple[str, ...]) -> list[str]:
    """The `flags` among extraArgs, each with its value (`--flag value` or `--flag=value`)."""
    kept: list[str] = []
    for i, arg in enumerate(extra_args):
        if arg.split("=", 1)[0] in flags:
            kept.append(arg)
            if "=" not in arg and i + 1 < len(extra_args) and not extra_args[i + 1].startswith("--"):
                kept.append(extra_args[i + 1])
    return kept


def render_args(model: ModelSpec) -> list[str]:
    """`vllm launch render` of the model's own files, under its served name (the token-producer's
    modelName), with the extraArgs that shape its tokens and the server's --dtype (without it vLLM
    reads every safetensors header for one where config.json names none)."""
    dtype = ["--dtype", model.dtype] if model.dtype in ("bfloat16", "float16") else []
    return [model_dir(model), "--served-model-name", model.name, "--host", "0.0.0.0", "--port", str(RENDER_PORT),
            *dtype, *_flag_values(list(model.extra_args), RENDER_FLAGS)]


def chat_template_outside_weights(model: ModelSpec) -> list[str]:
    """--chat-template paths not under the weights mount: the render server's CPU image has none of
    the server image's files, so it would crash-loop and precise would score nothing."""
    values = _flag_values(list(model.extra_args), ("--chat-template",))
    paths = [v.split("=", 1)[1] if "=" in v else v for v in values if v != "--chat-template"]
    # A value with Jinja in it is the template itself (vLLM takes one inline), not a file.
    return [p for p in paths if "{" not in p and not p.startswith(MOUNT_PATH + "/")]


def without_file_cache(mount: WeightsMount) -> WeightsMount:
    """`mount` with gcsfuse's file cache off on its bucket volumes (others as they are)."""
    def volume(v: Mapping[str, Any]) -> Mapping[str, Any]:
        csi: dict[str, Any] = dict(v.get("csi") or {})
        attributes: dict[str, Any] = dict(csi.get("volumeAttributes") or {})
        options = attributes.get("mountOptions")
        if not isinstance(options, str):
            return v
        kept = [o for o in options.split(",") if not o.startswith("file-cache:")]
        attributes["mountOptions"] = ",".join([*kept, NO_FILE_CACHE])
        return {**v, "csi": {**csi, "volumeAttributes": attributes}}
    return replace(mount, volumes=tuple(volume(v) for v in mount.volumes))


def render_container(model: ModelSpec, release: VllmRelease, weights: WeightsMount) -> dict[str, Any]:
    home = [{"name": RENDER_SCRATCH, "mountPath": RENDER_HOME}, {"name": RENDER_SCRATCH, "mountPath": "/tmp",
                                                                  "subPath": "tmp"}]
    health = {"httpGet": {"path": "/health", "port": RENDER_PORT}}
    return {
        "name": RENDER_CONTAINER, "image": f"{RENDER_IMAGE_REPOSITORY}:{release.image_tag}",
        "command": ["vllm", "launch", "render"], "args": render_args(model),
        "ports": [{"name": "render-http", "containerPort": RENDER_PORT}],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                {"name": "VLLM_NO_USAGE_STATS", "value": "1"}, {"name": "HOME", "value": RENDER_HOME},
                {"name": "XDG_CACHE_HOME", "value": f"{RENDER_HOME}/.cache"}, {"name": "USER", "value": "vllm"}],
        # Out of the Service until its tokenizer answers; restarted if it hangs.
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**health, "initialDelaySeconds": 60, "periodSeconds": 20, "failureThreshold": 6},
        "resources": RENDER_RESOURCES,
        # As the servers read the weights (the bucket's FUSE mount is theirs, gcs_weights.weights_volume).
        "securityContext": {**CONTAINER_SECURITY, "runAsUser": SERVER_UID, "runAsGroup": SERVER_UID},
        "volumeMounts": [*home, *(dict(m) for m in weights.mounts)],
    }


def render_deployment_spec(model: ModelSpec, release: VllmRelease, weights: WeightsMount) -> dict[str, Any]:
    """`weights`: the model's files as the store hands a reader in the picker's namespace
    (ModelStore.reader_for): the one read-only copy, never a download (offline), its file cache off.
    Outside the mesh, as the picker that calls it (its NetworkPolicy, render_ingress, admits the picker
    alone); no Kubernetes API token (it calls no API)."""
    labels, mount = render_labels(model.name), without_file_cache(weights)
    one_per_node = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "minDomains": 2,
                    "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                    "labelSelector": {"matchLabels": labels}, "matchLabelKeys": ["pod-template-hash"]}
    return {
        "replicas": RENDER_REPLICAS,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": {**labels, "sidecar.istio.io/inject": "false"}, "annotations": dict(mount.annotations)},
            "spec": {
                "serviceAccountName": render_name(model.name), "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": SERVER_UID, "runAsGroup": SERVER_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "topologySpreadConstraints": [one_per_node],
                "containers": [render_container(model, release, mount)],
                "volumes": [*(dict(v) for v in mount.volumes), {"name": RENDER_SCRATCH, "emptyDir": {"sizeLimit": "1Gi"}}],
            },
        },
    }


def render_service_spec(model_name: str) -> dict[str, Any]:
    return {"type": "ClusterIP", "selector": render_labels(model_name),
            "ports": [{"name": "http", "protocol": "TCP", "port": RENDER_PORT, "targetPort": RENDER_PORT}]}


def render_ingress(model_name: str) -> dict[str, Any]:
    """The render server's NetworkPolicy: its port to its model's picker's pods (same namespace) alone.
    Each body it renders is a client's prompt, verbatim."""
    picker = {"podSelector": {"matchLabels": picker_labels(picker_name(model_name))}}
    return {"podSelector": {"matchLabels": render_labels(model_name)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [picker], "ports": [{"protocol": "TCP", "port": RENDER_PORT}]}]}


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
    if outside := chat_template_outside_weights(model):
        problems.append(("extraArgs", f"sets --chat-template {', '.join(outside)}, outside the weights ({MOUNT_PATH}/): "
                         "the picker's render server (vLLM's CPU image) has none of the server image's files and "
                         "would never start; put the template in the model's weights folder, pass it inline, or "
                         "set picker.prefixCache: approximate"))
    return problems



def precise_models(cfg: "StackConfig") -> list[ModelSpec]:
    return [m for m in cfg.models if reads_kv_events(cfg.picker, m)]


def adapters_miss(cfg: "StackConfig") -> list[str]:
    """The plan's warning for a precise model with LoRA adapters: vLLM puts the adapter into every
    block's extra keys (vllm/v1/core/kv_cache_utils.py:586-603,655-700), the picker folds only the
    salt into a request's keys (P/preciseprefixcache/blockkeys.go:141-153): adapter requests never hit."""
    return [f"{m.name}: picker.prefixCache precise never matches a request for one of its LoRA adapters "
            f"({', '.join(a.name for a in m.adapters)}): vLLM keys every block of one by the adapter, the picker "
            "does not; those requests are scored by the other scorers alone" for m in precise_models(cfg) if m.adapters]


def precise_restart_notes(cfg: "StackConfig") -> list[str]:
    """What turning picker.prefixCache precise on (or off) does to the servers: new vLLM args."""
    names = [m.name for m in precise_models(cfg)]
    if not names:
        return []
    return [f"{', '.join(names)}: picker.prefixCache precise gives these models' picker pools' servers vLLM's "
            "KV-events flags (--block-size, --kv-events-config): the `pulumi up` that turns it on (or off) rolls "
            "every GPU replica of those pools, each reloading its weights, as any change of vLLM's args does"]
