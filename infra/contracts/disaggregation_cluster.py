"""Prefill/decode disaggregation, the cluster side: llm-d-router v0.10.0's routing sidecar on the decode
pods (its flags, ports and headers), the picker's P/D plugins (their parameters, decoded strictly, and the
role label their filters read), and the paths to the prefill pods. File:line are llm-d/llm-d-router at
v0.10.0 (tag commit 71f4f09) unless named otherwise; the model side's rows (vLLM's connector, flags and
environment) are disaggregation.py's."""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

import yaml

from ...components.model.disaggregation import ROLE_LABEL, SIDECAR_KV_CONNECTOR
from ...components.model.disaggregation_cluster import (
    DECIDER,
    DECODE_FILTER,
    ENVOY_PEER,
    GUARD_KV_TRANSFER,
    HANDLER,
    PD_FRONT_NAME,
    PREFILL_FILTER,
    ROUTING_HEADERS,
    SIDECAR_IMAGE,
    SIDECAR_PEER,
)
from ...components.model.fallback import shared_callers
from ...components.model.identity_extension import CONFIG_FILE as IDENTITY_FILE
from ...components.model.identity_extension import NAME as IDENTITY_NAME
from ...components.model.picker import CONFIG_FILE, EPP_VERSION
from ...components.model.serving_api import picker_routes
from ...components.model.vllm_server import GUARD_CONFIG_ENV
from ..plan import Plan
from .base import Contract, _docs, _flag

SRC = "llm-d/llm-d-router@v0.10.0:"
PROXY = "pkg/sidecar/proxy/"
DISAGG = "pkg/epp/framework/plugins/scheduling/profilehandler/disagg/"
# The sidecar's flags (pkg/sidecar/proxy/options.go:262-344, and controller-runtime's zap flags bound at
# :257-261): pflag stops the sidecar at start on any other.
SIDECAR_FLAGS = {"port", "model-server-port", "vllm-port", "data-parallel-size", "kv-connector", "ec-connector",
                 "secure-proxy", "cert-path", "enable-ssrf-protection", "enable-prefiller-sampling", "pool-group",
                 "decode-chunk-size", "tracing", "metrics-port", "enable-tls", "tls-insecure-skip-verify",
                 "inference-pool", "max-idle-conns-per-host", "prefill-max-retries", "prefill-retry-backoff",
                 "configuration", "configuration-file", "mooncake-bootstrap-port", "p2p-connector-port",
                 "enable-p2p-pull", "zap-encoder", "zap-log-level", "zap-devel", "zap-stacktrace-level",
                 "zap-time-encoding"}
SIDECAR_KV_CONNECTORS = {"nixlv2", "shared-storage", "sglang", "mooncake", "offloading"}  # options.go:165-171
# The plugins' parameters, JSON tag by tag (decoded strictly: pkg/epp/config/loader/configloader.go:257,279).
DECIDER_FIELDS = {"nonCachedTokens", "promptTokens"}  # prefix_based_pd_decider.go:23-31
HANDLER_FIELDS = {"stageOrder": None, "profiles": {"decode", "prefill", "encode"},  # disagg_profile_handler.go:73-88
                  "deciders": {"prefill", "encode"}}


def _templates(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each serving workload's pod template that serves (a Deployment's, a group's leader), named
    <namespace>/<name>."""
    for d in _docs(plan, "Deployment"):
        yield f"{d['metadata'].get('namespace')}/{d['metadata']['name']}", d["spec"]["template"]
    for s in _docs(plan, "LeaderWorkerSet"):
        t = s["spec"]["leaderWorkerTemplate"]
        yield f"{s['metadata'].get('namespace')}/{s['metadata']['name']}", t.get("leaderTemplate") or t["workerTemplate"]


def _role_templates(plan: Plan, role: str) -> list[tuple[str, dict[str, Any]]]:
    return [(n, t) for n, t in _templates(plan) if (t["metadata"].get("labels") or {}).get(ROLE_LABEL) == role]


def _vllm(template: dict[str, Any]) -> Optional[dict[str, Any]]:
    return next((c for c in template["spec"]["containers"] if c["name"] == "vllm"), None)


def _sidecars(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in template["spec"].get("initContainers") or [] if c["image"].split(":")[0] == SIDECAR_IMAGE.repository]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pool_port(plan: Plan, labels: dict[str, str]) -> Optional[int]:
    for p in _docs(plan, "InferencePool"):
        if _selects(p["spec"]["selector"]["matchLabels"], labels):
            return int(p["spec"]["targetPorts"][0]["number"])
    return None


def sidecar_fronts_decode_vllm(plan: Plan) -> list[str]:
    out = []
    for name, t in _role_templates(plan, "decode"):
        sidecars, vllm = _sidecars(t), _vllm(t)
        if len(sidecars) != 1 or vllm is None:
            out.append(f"{name}: a decode pod needs one routing sidecar in front of vLLM")
            continue
        (s,) = sidecars
        flags = dict(a.removeprefix("--").split("=", 1) for a in s.get("args") or [])
        out += [f"{name}: routing sidecar flag --{f} is not one v0.10.0 defines" for f in flags if f not in SIDECAR_FLAGS]
        if s["image"] != SIDECAR_IMAGE.uri:
            out.append(f"{name}: routing sidecar image {s['image']}, not the release's {SIDECAR_IMAGE.uri}")
        if s.get("restartPolicy") != "Always":
            out.append(f"{name}: the routing sidecar is not a native sidecar (restartPolicy Always)")
        out += _front_problems(name, t, flags.get("port"), _pool_port(plan, t["metadata"]["labels"]))
        if flags.get("model-server-port") != _flag(vllm["args"], "--port"):
            out.append(f"{name}: routing sidecar --model-server-port {flags.get('model-server-port')} is not vLLM's "
                       f"--port {_flag(vllm['args'], '--port')} (its default is 8200)")
        if flags.get("kv-connector", SIDECAR_KV_CONNECTOR) != SIDECAR_KV_CONNECTOR:
            out.append(f"{name}: routing sidecar --kv-connector {flags['kv-connector']}, not NIXL's {SIDECAR_KV_CONNECTOR}")
        if flags.get("secure-proxy") != "false":
            out.append(f"{name}: routing sidecar serves TLS with a self-signed certificate (--secure-proxy defaults "
                       "to true): the load balancer's and the picker's plain HTTP fails")
    return out


def _front_problems(name: str, template: dict[str, Any], sidecar_port: Optional[str], pool_port: Optional[int]) -> list[str]:
    """The sidecar routes exact unprefixed paths only (proxy.go:627-635): the P/D front, on the pool's port,
    takes the tenant URL's prefix off and passes the request to the sidecar's --port."""
    front = next((c for c in template["spec"].get("initContainers") or [] if c["name"] == PD_FRONT_NAME), None)
    if front is None:
        return [f"{name}: no P/D front before the routing sidecar: tenant URLs (/<tenant>/<model>/v1/...) match "
                "none of its P/D routes and go straight to vLLM"]
    args = dict(a.removeprefix("--").split("=", 1) for a in front.get("command") or [] if a.startswith("--"))
    out: list[str] = []
    if pool_port is None or int(args.get("port", 0)) != pool_port:
        out.append(f"{name}: the P/D front listens on {args.get('port')}, not the InferencePool's targetPort {pool_port}")
    if args.get("upstream-port") != sidecar_port:
        out.append(f"{name}: the P/D front sends to {args.get('upstream-port')}, not the routing sidecar's --port "
                   f"{sidecar_port} (its default is 8000)")
    return out


def _plugins(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p.get("name") or p["type"]: p for p in config.get("plugins") or []}


def _pd_config_problems(name: str, config: dict[str, Any]) -> Iterator[str]:
    plugins = _plugins(config)
    handlers = [p for p in plugins.values() if p["type"] == HANDLER]
    if len(handlers) != 1:
        yield f"{name}: a P/D pool's picker needs one {HANDLER} (without it the single profile handler runs)"
        return
    params = handlers[0].get("parameters") or {}
    for key, value in params.items():
        inner = HANDLER_FIELDS.get(key, ...)
        if inner is ...:
            yield f"{name}: {HANDLER} parameter {key} is not a field (decoded strictly)"
        elif inner is not None and set(value) - inner:
            yield f"{name}: {HANDLER} {key} fields {sorted(set(value) - inner)} (decoded strictly)"
    decider = plugins.get((params.get("deciders") or {}).get("prefill", ""))
    if decider is None or decider["type"] != DECIDER:
        yield f"{name}: {HANDLER} deciders.prefill names no {DECIDER} plugin: every request decodes without P/D"
    else:
        dp = decider.get("parameters") or {}
        yield from (f"{name}: {DECIDER} parameter {k} is not a field (decoded strictly)" for k in set(dp) - DECIDER_FIELDS)
        if int(dp.get("nonCachedTokens") or 0) <= 0:
            yield f"{name}: {DECIDER} nonCachedTokens 0 turns P/D off (prefix_based_pd_decider.go:111-113)"
    profiles = {p["name"]: p for p in config.get("schedulingProfiles") or []}
    names = params.get("profiles") or {}
    for role, want in (("prefill", PREFILL_FILTER), ("decode", DECODE_FILTER)):
        profile = profiles.get(names.get(role, role))
        refs = [plugins.get(r["pluginRef"], {}).get("type") for r in (profile or {}).get("plugins") or []]
        if want not in refs:
            yield f"{name}: the {role} profile does not filter by {want}: it may pick any pod of the pool"


def picker_schedules_prefill_and_decode(plan: Plan) -> list[str]:
    out = []
    pd_models = {(t["metadata"]["labels"].get("vllm-gke.io/model")) for _, t in _role_templates(plan, "decode")}
    for cm in _docs(plan, "ConfigMap"):
        name = cm["metadata"]["name"]
        if CONFIG_FILE in (cm.get("data") or {}) and name.removesuffix("-router-epp") in pd_models:
            out += list(_pd_config_problems(name, yaml.safe_load(cm["data"][CONFIG_FILE])))
    return out


def pool_pods_carry_their_role(plan: Plan) -> list[str]:
    """decode-filter takes a pod without the label as a decoder (bylabel/roles.go:47): every pod a P/D pool
    selects must carry its role, and the pool must select both roles."""
    out = []
    for pool in _docs(plan, "InferencePool"):
        sel, name = pool["spec"]["selector"]["matchLabels"], pool["metadata"]["name"]
        members = [(n, t["metadata"]["labels"]) for n, t in _templates(plan) if _selects(sel, t["metadata"]["labels"])]
        roles = {labels.get(ROLE_LABEL) for _, labels in members}
        if roles <= {None}:
            continue
        out += [f"InferencePool {name}: {n} has no {ROLE_LABEL} label" for n, labels in members if ROLE_LABEL not in labels]
        if not {"prefill", "decode"} <= roles:
            out.append(f"InferencePool {name}: selects {sorted(r for r in roles if r)} pods, not both prefill and decode")
    return out


def _identity_config(plan: Plan) -> Optional[dict[str, Any]]:
    cm = next((c for c in _docs(plan, "ConfigMap") if c["metadata"]["name"] == IDENTITY_NAME), None)
    return json.loads(cm["data"][IDENTITY_FILE]) if cm else None


def client_cannot_route_the_sidecar(plan: Plan) -> list[str]:
    """The identity extension (before the picker) strips the routing headers from every request and reads
    the body of every POST route of a P/D model's tenant URLs (refusing kv_transfer_params there)."""
    models = {t["metadata"]["labels"].get("vllm-gke.io/model") for _, t in _role_templates(plan, "decode")}
    if not models:
        return []
    config = _identity_config(plan)
    if config is None:
        return ["a disaggregated model without the identity extension: nothing strips a client's routing headers"]
    strip = set(config["headers"]["strip"])
    out = [f"the identity extension does not strip {h}: a client's copy would send its prompt where it names"
           for h in ROUTING_HEADERS if h not in strip]
    posts = {r.path for r in picker_routes() if r.method == "POST"}
    for prefix, entry in config["prefixes"].items():
        unread = sorted(posts - set(entry.get("saltedPaths") or ()))
        if prefix.rsplit("/", 1)[-1] in models and unread:
            out.append(f"{prefix}: the identity extension reads no body on {unread}: a client's kv_transfer_params "
                       "would reach the decode pod there")
    return out


def _policy_for(plan: Plan, kind: str, labels: dict[str, str], namespace: str) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, kind) if d["metadata"].get("namespace") == namespace and _selects(
        (d["spec"].get("podSelector") or d["spec"].get("selector") or {}).get("matchLabels") or {}, labels)]


def prefill_pods_admit_their_decoders(plan: Plan) -> list[str]:
    out = []
    for name, t in _role_templates(plan, "prefill"):
        labels, model = t["metadata"]["labels"], t["metadata"]["labels"].get("vllm-gke.io/model")
        vllm = _vllm(t)
        port = int(_flag(vllm["args"], "--port") or 0) if vllm else 0
        namespace = name.split("/")[0]
        policies = _policy_for(plan, "NetworkPolicy", labels, namespace)
        if not policies:
            out.append(f"{name}: no NetworkPolicy on the prefill pods: any pod reaches vLLM's port and NIXL's")
        for pol in policies:
            for rule in pol["spec"].get("ingress") or []:
                peers = rule.get("from") or [{}]
                decoders = all((p.get("podSelector") or {}).get("matchLabels") == {"vllm-gke.io/model": model,
                                                                                  ROLE_LABEL: "decode"} for p in peers)
                if not decoders and any(int(x.get("port", 0)) != port or "endPort" in x for x in rule.get("ports") or [{}]):
                    out.append(f"{name}: NetworkPolicy {pol['metadata']['name']} opens more than vLLM's port to "
                               "peers other than the model's decode pods")
        mesh = [p for p in _policy_for(plan, "AuthorizationPolicy", labels, namespace) if p["spec"].get("action") == "DENY"]
        if not mesh:
            out.append(f"{name}: no DENY AuthorizationPolicy keeps all but the server pods off the prefill pods")
        out += _token_problems(plan, name, namespace, model)
        if not [s for s in _docs(plan, "Service") if s["spec"].get("clusterIP") == "None"
                and s["metadata"].get("namespace") == namespace and _selects(s["spec"].get("selector") or {"": "-"}, labels)]:
            out.append(f"{name}: no headless Service over the prefill pods: the mesh knows their port as no "
                       "Service's")
    return out


def _token_problems(plan: Plan, name: str, namespace: str, model: Optional[str]) -> list[str]:
    """The prefill leg carries the tenant's token only where the decode pod's mesh forwards it (the
    tenants' allow policies on the prefill pods need a verified token)."""
    spec = next((m for m in plan.config.models if m.name == model), None)
    if spec is None:
        return []
    forwarded = {r["issuer"]: r.get("forwardOriginalToken", False) for ra in _docs(plan, "RequestAuthentication")
                 if ra["metadata"].get("namespace") == namespace for r in ra["spec"].get("jwtRules") or []}
    return [f"{name}: tenant {t.name}'s token stops at the decode pod's mesh (forwardOriginalToken off): the "
            "prefill pod's mesh refuses the prefill leg" for t in shared_callers(plan.config, spec)
            if not forwarded.get(t.jwt.issuer)]


def _guard(template: dict[str, Any]) -> dict[str, Any]:
    vllm = _vllm(template) or {"env": []}
    env = next((e for e in vllm.get("env") or [] if e["name"] == GUARD_CONFIG_ENV), None)
    return json.loads(env["value"]) if env else {}


def guard_admits_only_the_sidecars_kv_params(plan: Plan) -> list[str]:
    out = []
    for name, t in _templates(plan):
        guard = _guard(t)
        if not guard:
            continue
        role = (t["metadata"].get("labels") or {}).get(ROLE_LABEL)
        want = GUARD_KV_TRANSFER.get(role, "refuse") if role else "refuse"
        if guard.get("kvTransfer", "refuse") != want:
            out.append(f"{name}: the guard's kvTransfer is {guard.get('kvTransfer', 'refuse')}, not {want}")
        peers = guard.get("trustedPeers") or [ENVOY_PEER]
        if role == "decode" and peers != [SIDECAR_PEER]:
            out.append(f"{name}: the decode pod's guard trusts {peers}: a request past the routing sidecar "
                       "(straight to vLLM's port) would pass with kv_transfer_params")
    return out  # the guard's prefill leg is the sidecar's: tests/test_disaggregation_cluster.py


ROWS: tuple[Contract, ...] = (
    Contract("llm-d-router routing sidecar (pd-sidecar)", EPP_VERSION,
             "listens on --port (default 8000), routes POST /v1/chat/completions, /v1/completions, /v1/messages, "
             "/v1/responses and /inference/v1/generate (exact paths) to its P/D handler and anything else to "
             "the model server on localhost:--model-server-port "
             "(default 8200); --kv-connector nixlv2 is its default; --secure-proxy defaults to true (TLS, "
             "self-signed); pflag refuses unknown flags; upstream runs it as a native sidecar; the release "
             "image is ghcr.io/llm-d/llm-d-router-disagg-sidecar, /app/pd-sidecar as 65532",
             f"{SRC}{PROXY}options.go:58-71,91-92,165-171,213-218,257-344, {PROXY}proxy.go:624-635, "
             "pkg/sidecar/constants/constants.go:21, Dockerfile.sidecar:39-49, Makefile:22,26,32, "
             "deploy/components/vllm-decode/deployment.yaml:20-55,67",
             "decode pods run it as an init container with restartPolicy Always on its own port (8100) behind the "
             "P/D front on the pool's port (the tenant URL's prefix off: the sidecar routes exact /v1/... paths "
             "only), vLLM on 8200 behind it, --secure-proxy=false (plain HTTP: the prefill leg to a pod IP is not "
             "encrypted), nixlv2, the release's tag",
             sidecar_fronts_decode_vllm),
    Contract("llm-d-router endpoint picker (P/D)", EPP_VERSION,
             "disagg-profile-handler runs the decode profile, then, where deciders.prefill (a prefix-based-pd-"
             "decider) finds at least nonCachedTokens uncached prompt tokens (0: never), the prefill profile, "
             "and sets x-prefiller-host-port to the prefill pod's address and the pool's port; parameters are "
             "decoded strictly; prefill-filter and decode-filter are Beta",
             f"{SRC}{DISAGG}disagg_profile_handler.go:32-35,73-88,144-193,556-573, "
             f"{DISAGG}prefix_based_pd_decider.go:19-31,105-160, pkg/epp/config/loader/configloader.go:257,279, "
             "pkg/epp/config/loader/defaults.go:163-200, cmd/epp/runner/runner.go:577-578,620,622, "
             "deploy/config/pd-epp-config.yaml:1-37",
             "the P/D model's picker config adds the filters, the decider (nonCachedTokens = minPromptTokens) and "
             "the handler, and splits its profile into prefill and decode, each its filter then the same scorers",
             picker_schedules_prefill_and_decode),
    Contract("llm-d-router endpoint picker (P/D)", EPP_VERSION,
             "prefill-filter keeps pods labelled llm-d.ai/role prefill (or a both-roles value); decode-filter keeps "
             "decode ones and any pod without the label",
             f"{SRC}pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go:11-16,33-35,46-58",
             "the P/D model's InferencePool selects both pools (model label), each pod labelled with its role",
             pool_pods_carry_their_role),
    Contract("llm-d-router routing sidecar (pd-sidecar)", EPP_VERSION,
             "sends the prefill to whatever host:port x-prefiller-host-port names (and pulls from x-kv-cache-"
             "source-host-port; E/P/D and data-parallel headers likewise), checked only by the optional SSRF "
             "allowlist, which needs the Kubernetes API; the picker's handler sets the header only when it "
             "picks a prefill pod",
             f"{SRC}pkg/common/routing/common.go:14-25, {PROXY}chat_completions.go:86-150, "
             f"{PROXY}options.go:667-672, {DISAGG}disagg_profile_handler.go:556-573",
             "the identity extension strips every client copy of those headers before the picker, and reads (and "
             "refuses with kv_transfer_params) the body of every POST route of a P/D model's tenant URLs",
             client_cannot_route_the_sidecar),
    Contract("llm-d-router routing sidecar (pd-sidecar) / vLLM NixlConnector", EPP_VERSION,
             "the decode pod's sidecar reaches the prefill pod on the pool's port (HTTP), then its vLLM reaches "
             "the prefill engine's NIXL side channel and UCX ports; nothing else needs to reach a prefill pod "
             "but the picker's and Managed Prometheus' scrapes",
             f"{SRC}docs/disaggregation.md:94-118, {PROXY}connector_nixlv2.go:192-214; vllm-project/vllm@v0.34.0:"
             "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-79",
             "a NetworkPolicy admits the model's decode pods alone to those ports, the scrapers to vLLM's; a DENY "
             "AuthorizationPolicy refuses all but a server's mTLS identity or a pod address; a headless Service gives the mesh "
             "the pods' IPs; the callers' tokens are forwarded, so the prefill pod checks the tenant again",
             prefill_pods_admit_their_decoders),
    Contract("llm-d-router routing sidecar (pd-sidecar) / vLLM", EPP_VERSION,
             "the sidecar's prefill leg carries kv_transfer_params of its own (do_remote_decode true, every remote "
             "field null), overwriting the client's; the decode leg carries the prefill's answer; a request the "
             "picker sends no prefill pod passes to vLLM as the client sent it; vLLM reads kv_transfer_params "
             "from the chat, completions, responses and messages bodies, and the engine reads kv_transfer_params, "
             "ec_transfer_params and kv_cache_report_mode from vllm_xargs too (extra_args; the top-level fields "
             "written over it only where set)",
             f"{SRC}{PROXY}connector_nixlv2.go:161-170,276-290, {PROXY}chat_completions.go:103-108; "
             "vllm-project/vllm@v0.34.0:vllm/entrypoints/openai/chat_completion/protocol.py:523,785-791, "
             "vllm/entrypoints/openai/completion/protocol.py:248,400-406, vllm/entrypoints/openai/responses/"
             "protocol.py:460,624-628, vllm/entrypoints/anthropic/protocol.py:337,347, vllm/v1/request.py:123-131",
             "the identity extension, the P/D front and the guard (every pod, the decode pod's too) refuse "
             "vllm_xargs naming any of those (400); the identity extension and the P/D front refuse a body with "
             "kv_transfer_params (400); the guard refuses them on every pod but a prefill pod's (the sidecar's "
             "prefill leg alone) and a decode pod's, where it trusts only the sidecar's loopback peer",
             guard_admits_only_the_sidecars_kv_params),
)
