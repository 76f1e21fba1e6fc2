"""The endpoint picker (llm-d-router v0.10.0): its flags, config file, ports, health and lease, drain,
what it parses, the headers and objectives it reads, flow control and the RBAC and CRDs it needs.
File:line are llm-d/llm-d-router at v0.10.0 (tag commit 71f4f09) unless named otherwise."""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import yaml

from ...components.inference_objective_crd import CRD_URLS
from ...components.model.picker import (
    CONFIG_FILE,
    EPP_UID,
    EPP_VERSION,
    EXT_PROC_PORT,
    FAIRNESS,
    FLOW_CONTROL_GATE,
    HEALTH_CHECK_INTERVAL_S,
    HEALTH_CHECK_UNHEALTHY,
    HEALTH_PORT,
    MANAGER_STOP_S,
    METRICS_PORT,
    OBJECTIVE_API,
    POOL_GROUP,
)
from ...components.model.serving_api import IDENTITY_STRIPS, LEGACY_OBJECTIVE_HEADER, OBJECTIVE_HEADER
from ..plan import Plan
from .base import Contract, _docs, _exported, _flag

SRC = "llm-d/llm-d-router@v0.10.0:"
TYPES = "apix/config/v1alpha1/endpointpickerconfig_types.go"

# EndpointPickerConfig's JSON tags, struct by struct (TYPES, file:line of each tag); decoding is
# strict (pkg/epp/config/loader/configloader.go:235-242): any other key stops the picker at start.
CONFIG_FIELDS: dict[str, dict[str, int]] = {
    "EndpointPickerConfig": {"apiVersion": 34, "kind": 34, "featureGates": 40, "plugins": 45,
                             "schedulingProfiles": 51, "dataLayer": 55, "flowControl": 60, "requestHandler": 64},
    "PluginSpec": {"name": 116, "type": 121, "parameters": 127},
    "SchedulingProfile": {"name": 147, "plugins": 153},
    "SchedulingPlugin": {"pluginRef": 174, "weight": 178},
    "SaturationDetectorConfig": {"pluginRef": 217},
    "DataLayerConfig": {"injectDefaults": 232, "sources": 235, "discovery": 242,
                        "crossReplicaSyncerPluginRef": 248, "crossReplicaSyncInterval": 253},
    "DiscoveryConfig": {"pluginRef": 270},
    "DataLayerSource": {"pluginRef": 287, "extractors": 294},
    "DataLayerExtractor": {"pluginRef": 313},
    "RequestHandlerConfig": {"parsers": 325},
    "ParserConfig": {"pluginRef": 358},
    "FlowControlConfig": {"maxBytes": 369, "maxRequests": 377, "defaultRequestTTL": 387, "defaultPriorityBand": 396,
                          "defaultNegativePriorityBand": 406, "priorityBands": 411, "usageLimitPolicyPluginRef": 417,
                          "saturationDetector": 422, "enableEviction": 430},
    "PriorityBandConfig": {"priority": 486, "maxBytes": 493, "maxRequests": 500, "fairnessPolicyRef": 505,
                           "orderingPolicyRef": 510},
}
# Tags that still decode but are deprecated (moved under flowControl and requestHandler,
# loader/configloader.go:98-122): the check refuses them as it refuses unknown ones.
DEPRECATED_FIELDS: dict[str, dict[str, int]] = {"EndpointPickerConfig": {"saturationDetector": 71, "parser": 78}}
# Which struct a key's value (or each item of it) decodes into.
CONFIG_NESTING: dict[tuple[str, str], str] = {
    ("EndpointPickerConfig", "plugins"): "PluginSpec", ("EndpointPickerConfig", "schedulingProfiles"): "SchedulingProfile",
    ("SchedulingProfile", "plugins"): "SchedulingPlugin", ("EndpointPickerConfig", "dataLayer"): "DataLayerConfig",
    ("DataLayerConfig", "sources"): "DataLayerSource", ("DataLayerConfig", "discovery"): "DiscoveryConfig",
    ("DataLayerSource", "extractors"): "DataLayerExtractor", ("EndpointPickerConfig", "requestHandler"):
    "RequestHandlerConfig", ("RequestHandlerConfig", "parsers"): "ParserConfig",
    ("EndpointPickerConfig", "flowControl"): "FlowControlConfig",
    ("FlowControlConfig", "saturationDetector"): "SaturationDetectorConfig",
    ("FlowControlConfig", "defaultPriorityBand"): "PriorityBandConfig",
    ("FlowControlConfig", "defaultNegativePriorityBand"): "PriorityBandConfig",
    ("FlowControlConfig", "priorityBands"): "PriorityBandConfig",
}
# Plugin types registered as Beta at v0.10.0 (cmd/epp/runner/runner.go, the line of each
# registration): what the stack's config (and the prefix cache's) may name without
# --allow-experimental-plugins (pkg/epp/framework/interface/plugin/registry.go:106-119).
PLUGIN_TYPES: dict[str, int] = {
    "prefix-cache-scorer": 611, "max-score-picker": 612, "single-profile-handler": 615,
    "kv-cache-utilization-scorer": 624, "queue-scorer": 625, "precise-prefix-cache-scorer": 631,
    "precise-prefix-cache-producer": 633, "global-strict-fairness-policy": 649, "round-robin-fairness-policy": 650,
    "fcfs-ordering-policy": 652, "static-usage-limit-policy": 655, "approx-prefix-cache-producer": 664,
    "token-producer": 669, "metrics-data-source": 692, "core-metrics-extractor": 693,
    "endpoint-notification-source": 701, "openai-parser": 706, "anthropic-parser": 709, "utilization-detector": 716,
    # P/D scheduling (models[].disaggregation; infra/contracts/disaggregation_cluster.py checks their parameters).
    "decode-filter": 577, "prefill-filter": 578, "disagg-profile-handler": 620, "prefix-based-pd-decider": 622,
}
# The utilization-detector's parameters (flowcontrol/saturationdetector/utilization/config.go:55-95).
DETECTOR_PARAMETERS = {"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold", "headroom"}
FEATURE_GATES = {FLOW_CONTROL_GATE, "haPopulateNonLeaderDatastore"}  # flowcontrol/config.go:27; controller_config.go:33
# The metric-name flags: registered, deprecated, and fatal when set (pkg/epp/server/options.go:46-54,395-400).
METRIC_FLAGS = ("--total-queued-requests-metric", "--total-running-requests-metric",
                "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric")
# What the core-metrics-extractor reads from an unlabelled pod (the built-in vllm engine,
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go:89-97).
VLLM_ENGINE_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                       "vllm:lora_requests_info", "vllm:cache_config_info")
# Path suffixes each parser claims (first match wins; parsers.go:89-102): openai/openai.go:90-104,
# anthropic/anthropic.go:68-73.
PARSER_PATHS: dict[str, tuple[str, ...]] = {
    "openai-parser": ("/chat/completions", "/completions", "/embeddings", "/responses", "/conversations",
                      "/chat/completions/render", "/completions/render", "/images/generations"),
    "anthropic-parser": ("/messages", "/messages/count_tokens"),
}


def _pickers(plan: Plan) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, "Deployment") if (d["spec"]["template"]["metadata"].get("labels") or {})
            .get("app.kubernetes.io/name") == "vllm-gke-epp"]


def _picker_container(d: dict[str, Any]) -> dict[str, Any]:
    # The picker's own, beside a precise prefix cache's tokenizer sidecar.
    (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    return c


def _config_of(plan: Plan, d: dict[str, Any]) -> dict[str, Any]:
    """The EndpointPickerConfig the picker's pod mounts."""
    (volume,) = [v for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    name, ns = volume["configMap"]["name"], d["metadata"]["namespace"]
    (cm,) = [c for c in _docs(plan, "ConfigMap") if c["metadata"]["name"] == name and c["metadata"]["namespace"] == ns]
    return yaml.safe_load(cm["data"][CONFIG_FILE])


def _backend_timeout(plan: Plan, d: dict[str, Any]) -> Optional[int]:
    """The load balancer's timeoutSec on the picker's pool: the longest stream and queue wait."""
    pool = _flag(_picker_container(d)["args"], "--pool-name")
    for bp in _docs(plan, "GCPBackendPolicy"):
        ref = bp["spec"].get("targetRef") or {}
        if ref.get("kind") == "InferencePool" and ref.get("name") == pool \
                and bp["metadata"]["namespace"] == d["metadata"]["namespace"]:
            return int(bp["spec"]["default"]["timeoutSec"])
    return None


def _seconds(duration: str) -> float:
    return float(duration[:-2]) / 1000 if duration.endswith("ms") else float(duration.rstrip("s"))


def picker_reads_exported_metrics(plan: Plan) -> list[str]:
    out = []
    missing = sorted(set(VLLM_ENGINE_METRICS) - _exported(plan)) if _pickers(plan) else []
    if missing:
        out.append(f"the picker's built-in vllm engine reads {', '.join(missing)}, which vLLM "
                   f"{plan.config.vllm_version} does not export: set core-metrics-extractor's engineConfigs")
    for d in _pickers(plan):
        args = [str(a) for a in _picker_container(d)["args"]]
        for flag in METRIC_FLAGS:
            if flag in args or any(a.startswith(flag + "=") for a in args):
                out.append(f"{d['metadata']['name']}: {flag} set: {EPP_VERSION} exits at start")
    return out


def picker_without_pprof(plan: Plan) -> list[str]:
    out = [f"{d['metadata']['name']}: pprof on (served without auth on :{METRICS_PORT})" for d in _pickers(plan)
           if "--enable-pprof=false" not in _picker_container(d)["args"]]
    for d in _pickers(plan):
        labels = d["spec"]["template"]["metadata"]["labels"]
        policies = [p for p in _docs(plan, "NetworkPolicy") if p["metadata"]["namespace"] == d["metadata"]["namespace"]
                    and p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
        open_metrics = [r for p in policies for r in p["spec"].get("ingress") or []
                        if not r.get("from") and any(x.get("port") == METRICS_PORT for x in r.get("ports") or [{}])]
        if not policies or open_metrics:
            out.append(f"{d['metadata']['name']}: :{METRICS_PORT} (/debug/plugins/state, no auth) open to any pod")
    return out


def picker_highly_available(plan: Plan) -> list[str]:
    out = []
    leases = any("leases" in rule.get("resources", []) and "update" in rule.get("verbs", [])
                 for role in _docs(plan, "Role") for rule in role.get("rules") or [])
    for d in _pickers(plan):
        c = _picker_container(d)
        name = d["metadata"]["name"]
        if d["spec"].get("replicas", 1) < 2 or "--ha-enable-leader-election" not in c["args"]:
            out.append(f"{name}: one replica without leader election: every restart is an outage")
        if (c.get("readinessProbe") or {}).get("grpc", {}).get("service") != "readiness":
            out.append(f"{name}: readiness is not the leader-only 'readiness' service")
        if (c.get("livenessProbe") or {}).get("grpc", {}).get("service") != "liveness":
            out.append(f"{name}: liveness is not the 'liveness' service (SERVING on every replica, draining too)")
        if not leases:
            out.append(f"{name}: no Role lets it take a lease")
    return out


def picker_rolls_and_drains_with_one_ready_pod(plan: Plan) -> list[str]:
    """Only the leader is Ready: the rollout may take it (maxUnavailable 100%), no budget holds its
    node's drain (one counting a single Ready pod allows no eviction), and the two never share a node."""
    out = []
    budgets = _docs(plan, "PodDisruptionBudget")
    for d in _pickers(plan):
        name, spec = d["metadata"]["name"], d["spec"]
        labels = spec["template"]["metadata"]["labels"]
        if (spec.get("strategy") or {}).get("rollingUpdate", {}).get("maxUnavailable") != "100%":
            out.append(f"{name}: a rollout could not scale down the old leader, its one available pod")
        mine = [b for b in budgets if b["metadata"].get("namespace") == d["metadata"].get("namespace")
                and (b["spec"].get("selector") or {}).get("matchLabels", {}).items() <= labels.items()]
        if mine:
            out.append(f"{name}: a PodDisruptionBudget counts its one Ready pod, the leader, and allows no "
                       "eviction of it: its node's drain would wait for GKE's hour")
        spread = [c for c in spec["template"]["spec"].get("topologySpreadConstraints") or []
                  if c.get("topologyKey") == "kubernetes.io/hostname" and c.get("whenUnsatisfiable") == "DoNotSchedule"]
        if not spread:
            out.append(f"{name}: its replicas may share a node, which one drain or failure takes whole")
    return out


def picker_stops_within_its_grace(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        name = d["metadata"]["name"]
        grace = d["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        drain_flag, longest = _flag(_picker_container(d)["args"], "--drain-timeout"), _backend_timeout(plan, d)
        if drain_flag is None or longest is None:
            out.append(f"{name}: --drain-timeout unset (30 s) or no backend timeout on its pool to drain for")
            continue
        drain = _seconds(drain_flag)
        if drain < longest:
            out.append(f"{name}: --drain-timeout {drain_flag} is under the longest stream ({longest} s)")
        need = MANAGER_STOP_S + drain + longest
        if not need <= grace <= need + 60:
            out.append(f"{name}: terminationGracePeriodSeconds {grace}; the manager's stop ({MANAGER_STOP_S} s), the "
                       f"drain ({drain:g} s) and a stream begun at its end ({longest} s) need {need:g} s: give it that, "
                       "not much more")
    return out


def _picker_service(plan: Plan, d: dict[str, Any]) -> Optional[str]:
    """The Service its pool calls the picker by (endpointPickerRef)."""
    pool, ns = _flag(_picker_container(d)["args"], "--pool-name"), d["metadata"]["namespace"]
    return next((p["spec"]["endpointPickerRef"]["name"] for p in _docs(plan, "InferencePool")
                 if p["metadata"]["name"] == pool and p["metadata"]["namespace"] == ns), None)


def picker_leaves_the_load_balancer_fast(plan: Plan) -> list[str]:
    """The load balancer checks the picker's Service by the leader-only readiness, often enough that a
    stopping leader (NOT_SERVING, answering 503 rejected-shutting-down) leaves within seconds."""
    out = []
    for d in _pickers(plan):
        name, service = d["metadata"]["name"], _picker_service(plan, d)
        checks = [h["spec"]["default"] for h in _docs(plan, "HealthCheckPolicy")
                  if h["metadata"]["namespace"] == d["metadata"]["namespace"]
                  and h["spec"]["targetRef"] == {"group": "", "kind": "Service", "name": service}]
        if not checks:
            out.append(f"{name}: no HealthCheckPolicy on its Service {service}: GKE checks it every 5 s by default")
            continue
        (check,) = checks
        grpc = (check.get("config") or {}).get("grpcHealthCheck") or {}
        if check.get("config", {}).get("type") != "GRPC" or grpc.get("port") != HEALTH_PORT \
                or grpc.get("grpcServiceName") != "readiness":
            out.append(f"{name}: its Service's health check is not gRPC 'readiness' on {HEALTH_PORT}")
        # The load balancer's defaults: 5 s, 2 failures (the CRD's checkIntervalSec; Compute's threshold).
        interval, failures = check.get("checkIntervalSec", 5), check.get("unhealthyThreshold", 2)
        if interval * failures > HEALTH_CHECK_INTERVAL_S * HEALTH_CHECK_UNHEALTHY:
            out.append(f"{name}: a stopping leader stays in the load balancer {interval * failures} s (every {interval} s, "
                       f"{failures} failures), answering 503 rejected-shutting-down")
    return out


def picker_ports(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        ports = {p["containerPort"] for p in _picker_container(d).get("ports") or []}
        if ports != {EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT}:
            out.append(f"{d['metadata']['name']}: ports {sorted(ports)} are not the picker's defaults")
        if d["spec"]["template"]["spec"].get("securityContext", {}).get("runAsUser") != EPP_UID:
            out.append(f"{d['metadata']['name']}: not the image's nonroot user {EPP_UID}")
    for pool in _docs(plan, "InferencePool"):
        if pool["spec"]["endpointPickerRef"]["port"]["number"] != EXT_PROC_PORT:
            out.append(f"InferencePool {pool['metadata']['name']} calls the picker on another port")
    return out


def _pool_rules(plan: Plan) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for route in _docs(plan, "HTTPRoute"):
        for rule in route["spec"]["rules"]:
            if any(b.get("kind") == "InferencePool" for b in rule.get("backendRefs") or []):
                yield route, rule


def _claimed(plan: Plan) -> tuple[str, ...]:
    parsers = {p["pluginRef"] for d in _pickers(plan) for p in _config_of(plan, d)["requestHandler"]["parsers"]}
    return tuple(s for p in sorted(parsers) for s in PARSER_PATHS.get(p, ()))


def _extension_bounded(plan: Plan) -> tuple[str, ...]:
    """Path prefixes under which the tenant identity extension bounds every body (its config's
    salted prefixes, with a limit): its body chain runs in FullDuplexStreamed, where Envoy removes
    Content-Length before the route is chosen (envoy#39035), so no route there can match on it."""
    return tuple(f"{prefix}/v1/" for c in _docs(plan, "ConfigMap") if "identity.json" in (c.get("data") or {})
                 for prefix, v in yaml.safe_load(c["data"]["identity.json"]).get("prefixes", {}).items()
                 if int(v.get("maxBodyBytes") or 0) > 0 and v.get("saltedPaths"))


def picker_gets_what_it_parses(plan: Plan) -> list[str]:
    out = []
    claimed = _claimed(plan)
    bounded = _extension_bounded(plan)
    for route, rule in _pool_rules(plan):
        name = route["metadata"]["name"]
        for m in rule.get("matches") or [{}]:
            path = (m.get("path") or {})
            value = path.get("value", "")
            bodiless = value.endswith("/v1/models")  # GET: no body, no parser (handlers/request.go:42-47)
            if path.get("type") != "Exact" or not (bodiless or value.endswith(claimed)):
                out.append(f"HTTPRoute {name}: {path.get('type')} {value} reaches the picker, which parses only the "
                           "paths its parsers claim (400 on any other body)")
            length = [h for h in m.get("headers") or [] if h.get("name", "").lower() == "content-length"]
            if not bodiless and not length and not (bounded and value.startswith(bounded)):
                out.append(f"HTTPRoute {name}: a body of any size (or chunked) reaches the picker, which buffers it whole")
    return out


def picker_objective_is_the_tenants(plan: Plan) -> list[str]:
    out = []
    if OBJECTIVE_HEADER != "x-llm-d-inference-objective":
        out.append(f"routes set {OBJECTIVE_HEADER}, but the picker reads x-llm-d-inference-objective first: a "
                   "client's copy of it would win")
    for route, rule in _pool_rules(plan):
        for m in rule.get("matches") or [{}]:
            # One release: the move from bf329cd's routes (issue 39); drop next release. The compat
            # match on the old header is dead once the identity extension runs: it strips that header.
            dead = LEGACY_OBJECTIVE_HEADER in IDENTITY_STRIPS
            if not any(h.get("name") in (OBJECTIVE_HEADER, *([LEGACY_OBJECTIVE_HEADER] if dead else []))
                       and h.get("type", "Exact") == "Exact" for h in m.get("headers") or []):
                out.append(f"HTTPRoute {route['metadata']['name']}: the picker would read a client-chosen objective")
    gated = all(FLOW_CONTROL_GATE in (_config_of(plan, d).get("featureGates") or []) for d in _pickers(plan))
    for objective in _docs(plan, "InferenceObjective"):
        if objective["spec"].get("priority", 0) > 0 and not gated:
            out.append(f"InferenceObjective {objective['metadata']['name']}: a positive priority the picker ignores "
                       "without flow control")
    return out


def picker_finds_the_objectives(plan: Plan) -> list[str]:
    out = []
    pools = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in _docs(plan, "InferencePool")}
    routed = {(route["metadata"]["namespace"], h["value"]) for route, rule in _pool_rules(plan)
              for m in rule.get("matches") or [] for h in m.get("headers") or [] if h.get("name") == OBJECTIVE_HEADER}
    objectives = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in _docs(plan, "InferenceObjective")}
    for (ns, name), o in objectives.items():
        ref = o["spec"].get("poolRef") or {}
        if (ns, ref.get("name")) not in pools or ref.get("group", POOL_GROUP) != POOL_GROUP:
            out.append(f"InferenceObjective {ns}/{name}: its poolRef names no InferencePool of its namespace")
        if o["apiVersion"] != OBJECTIVE_API:
            out.append(f"InferenceObjective {ns}/{name}: {o['apiVersion']}, ignored once llm-d.ai's CRD is installed")
    for ns, value in routed:
        if (ns, value) not in objectives:
            out.append(f"routes require objective {value}, but no InferenceObjective of that name is in {ns}")
    return out


def _unknown_keys(value: Any, struct: str, where: str) -> Iterator[str]:
    fields = CONFIG_FIELDS[struct]
    for key, item in (value or {}).items():
        if key not in fields:
            yield f"{where}.{key} is not a field of {struct}"
            continue
        inner = CONFIG_NESTING.get((struct, key))
        if inner is not None:
            for i, x in enumerate(item if isinstance(item, list) else [item]):
                yield from _unknown_keys(x, inner, f"{where}.{key}[{i}]" if isinstance(item, list) else f"{where}.{key}")


def picker_config_is_strictly_decodable(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        name, config = d["metadata"]["name"], _config_of(plan, d)
        out += [f"{name}: {p}" for p in _unknown_keys(config, "EndpointPickerConfig", "config")]
        out += [f"{name}: plugin type {p.get('type')} is not a Beta type registered at {EPP_VERSION}"
                for p in config.get("plugins") or [] if p.get("type") not in PLUGIN_TYPES]
        out += [f"{name}: featureGate {g} is not registered" for g in config.get("featureGates") or []
                if g.split("=")[0] not in FEATURE_GATES]
        for p in config.get("plugins") or []:
            if p.get("type") == "utilization-detector" and set(p.get("parameters") or {}) - DETECTOR_PARAMETERS:
                out.append(f"{name}: utilization-detector parameters {sorted(set(p['parameters']) - DETECTOR_PARAMETERS)}")
    return out


def picker_flow_control_bands(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        name, config = d["metadata"]["name"], _config_of(plan, d)
        if FLOW_CONTROL_GATE not in (config.get("featureGates") or []):
            continue
        fc, longest = config.get("flowControl") or {}, _backend_timeout(plan, d) or 0
        pool = _flag(_picker_container(d)["args"], "--pool-name")
        wanted = {o["spec"].get("priority", 0) for o in _docs(plan, "InferenceObjective")
                  if (o["spec"].get("poolRef") or {}).get("name") == pool} | {0}
        bands = {b["priority"] for b in fc.get("priorityBands") or []}
        if missing := sorted(p for p in wanted - bands if p >= 0):
            out.append(f"{name}: no band for priorities {missing}: they take the system defaults (5000 requests, 1 GB)")
        templates = [fc.get("defaultPriorityBand") or {}, fc.get("defaultNegativePriorityBand") or {}]
        if any(b.get("fairnessPolicyRef") != FAIRNESS for b in [*(fc.get("priorityBands") or []), *templates]):
            out.append(f"{name}: a band without {FAIRNESS}: one tenant's flood would starve the others of its band")
        if not fc.get("maxBytes") or not fc.get("maxRequests"):
            out.append(f"{name}: no global bound: queued bodies could outgrow the picker's memory")
        ttl = _seconds(str(fc.get("defaultRequestTTL", "60s")))
        if not 0 < ttl < longest:
            out.append(f"{name}: queue TTL {ttl:g} s is not below the pool's backend timeout ({longest} s): the load "
                       "balancer would cut a queued request before the picker sheds it")
    return out


def picker_reads_llm_d_objectives(plan: Plan) -> list[str]:
    out = []
    crds = [r for r in plan.resources if r.type == "kubernetes:yaml/v2:ConfigFile" and r.props.get("file") in CRD_URLS]
    for d in _pickers(plan):
        ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
        sa = d["spec"]["template"]["spec"].get("serviceAccountName")
        roles = {b["roleRef"]["name"] for b in _docs(plan, "RoleBinding") if b["metadata"]["namespace"] == ns
                 and any(s.get("name") == sa for s in b.get("subjects") or [])}
        rules = [r for role in _docs(plan, "Role") if role["metadata"]["namespace"] == ns
                 and role["metadata"]["name"] in roles for r in role.get("rules") or []]
        for group, resource in (("llm-d.ai", "inferenceobjectives"), ("llm-d.ai", "inferencemodelrewrites"),
                                (POOL_GROUP, "inferencepools"), ("", "pods")):
            if not any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
                       and {"get", "list", "watch"} <= set(r.get("verbs", [])) for r in rules):
                out.append(f"{name}: cannot list {resource or ''}.{group or 'core'}: its informer never syncs")
        resource = next(r for r in plan.kubernetes() if r.props.get("kind") == "Deployment"
                        and r.props["metadata"]["name"] == name)
        if {c.props["file"] for c in crds if plan.waits_for(resource, c)} != set(CRD_URLS):
            out.append(f"{name}: may start before llm-d.ai's CRDs: it would read no objective until restarted")
    return out



# What the picker exports for a pool's queue (pkg/epp/metrics/llm_d_router_metrics.go:28,356-362,402-408:
# subsystem llm_d_epp; modelLabels model_name, target_model_name), and namespace, which Managed
# Prometheus adds from the scraped pod.
PICKER_SERIES = {
    "llm_d_epp_flow_control_queue_size": {"fairness_id", "priority", "inference_pool", "model_name",
                                          "target_model_name", "namespace"},
    "llm_d_epp_flow_control_requests_total": {"outcome", "priority", "inference_pool", "namespace"},
}


def _wake_series(query: str) -> Iterator[tuple[str, set[str], Optional[str]]]:
    """(metric, label names, inference_pool) of each picker series a query selects."""
    for metric, labels in re.findall(r"(llm_d_epp_\w+)\{([^}]*)\}", query):
        pool = re.search(r'inference_pool="([^"]+)"', labels)
        yield metric, set(re.findall(r"(\w+)\s*[!=]~?", labels)), pool.group(1) if pool else None


def picker_wake_reads_what_the_picker_exports(plan: Plan) -> list[str]:
    """KEDA's picker triggers read series the pinned picker exports, by labels they carry, from a picker
    whose flow control is on (the series exist only then) and whose /metrics needs no token."""
    out = []
    pickers = {(d["metadata"]["namespace"], _flag(_picker_container(d)["args"], "--pool-name")): d
               for d in _pickers(plan)}
    for so in _docs(plan, "ScaledObject"):
        name = f"ScaledObject {so['metadata']['name']}"
        for trigger in so["spec"].get("triggers") or []:
            for metric, used, pool in _wake_series(str((trigger.get("metadata") or {}).get("query", ""))):
                known = PICKER_SERIES.get(metric)
                if known is None or not used <= known:
                    out.append(f"{name}: {metric} by {sorted(used)} is not a series the picker exports")
                picker = pickers.get((so["metadata"]["namespace"], pool))
                if picker is None:
                    out.append(f"{name}: no picker of its namespace serves pool {pool}")
                elif "--metrics-endpoint-auth=false" not in _picker_container(picker)["args"] or \
                        FLOW_CONTROL_GATE not in (_config_of(plan, picker).get("featureGates") or []):
                    out.append(f"{name}: its picker exports no queue a scraper can read")
    return out

ROWS: tuple[Contract, ...] = (
    Contract("endpoint picker", EPP_VERSION,
             "exports llm_d_epp_flow_control_queue_size{fairness_id,priority,inference_pool,model_name,"
             "target_model_name} (requests held in flow control, on the leader only) and "
             "llm_d_epp_flow_control_requests_total{outcome,priority,inference_pool}, both only with the flowControl "
             "gate; /metrics needs a Kubernetes token unless --metrics-endpoint-auth=false",
             f"{SRC}pkg/epp/metrics/llm_d_router_metrics.go:28,356-362,402-408; "
             "pkg/epp/flowcontrol/controller/controller.go:244-251; pkg/epp/server/options.go:154",
             "KEDA's wake triggers read those names by those labels (namespace as Managed Prometheus adds it), "
             "from a picker with flow control on and metrics auth off",
             picker_wake_reads_what_the_picker_exports),
    Contract("endpoint picker", EPP_VERSION,
             "the metric-name flags are deprecated and fatal when set (exit 1 at start); metric names come from the "
             "core-metrics-extractor, whose built-in vllm engine reads vllm:num_requests_waiting, "
             "vllm:num_requests_running, vllm:kv_cache_usage_perc, vllm:lora_requests_info, vllm:cache_config_info",
             f"{SRC}pkg/epp/server/options.go:46-54,194-207,395-400; cmd/epp/runner/runner.go:223-226; "
             "pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go:89-97",
             "no metric-name flag; the built-in names are all exported by the pinned vLLM (and its TPU build)",
             picker_reads_exported_metrics),
    Contract("endpoint picker", EPP_VERSION,
             "--enable-pprof defaults to true, on the metrics server (:9090), behind the same (here disabled) auth; "
             "/debug/plugins/state is always served there, with no flag to turn it off",
             f"{SRC}pkg/epp/server/options.go:152,216-217; cmd/epp/runner/runner.go:426-439; "
             "pkg/epp/server/plugin_state_debug.go:30,54-62",
             "--enable-pprof=false; a NetworkPolicy keeps 9090 to Managed Prometheus' collectors and the nodes",
             picker_without_pprof),
    Contract("endpoint picker", EPP_VERSION,
             "--ha-enable-leader-election (default off): only the leader runs the controllers; the 'readiness' gRPC "
             "health service passes on the leader only (and not while draining), 'liveness' on every replica; the "
             "lease is epp-<ns>-<pool>.llm-d.ai, released on cancel",
             f"{SRC}pkg/epp/server/options.go:165-166; cmd/epp/runner/health.go:82-100; "
             "pkg/epp/server/controller_manager.go:109-116",
             "two replicas with the flag, readiness on 'readiness', liveness on 'liveness', a Role for leases",
             picker_highly_available),
    Contract("endpoint picker", EPP_VERSION,
             "with leader election one replica is Ready (the leader) and a new one turns Ready only after the old "
             "leader releases the lease: a PodDisruptionBudget counts that one Ready pod, and a rolling update with "
             "maxUnavailable under 100% never scales the old leader down (the chart uses Recreate for that reason)",
             f"{SRC}cmd/epp/runner/health.go:82-100; config/charts/routerlib/templates/_deployment.yaml:328-345",
             "maxSurge and maxUnavailable 100%; one replica per node (topology spread on hostname, DoNotSchedule); "
             "no budget (it would hold the leader's node drain for GKE's hour, then be forced with the same handover)",
             picker_rolls_and_drains_with_one_ready_pod),
    Contract("endpoint picker", EPP_VERSION,
             "on SIGTERM it turns NotServing and stops its manager (controller-runtime's GracefulShutdownTimeout, "
             "30 s by default, which the picker does not set), releasing the lease; then keeps serving ext_proc (new "
             "streams too) for --drain-timeout (default 30 s), then GracefulStop waits for every open stream with no "
             "bound of its own (a stream lasts its whole response); with flow control on, queued requests are "
             "answered 503 rejected-shutting-down at SIGTERM",
             f"{SRC}pkg/epp/server/options.go:43,167-170; cmd/epp/runner/runner.go:279-336; "
             "pkg/epp/server/controller_manager.go:106-128; internal/runnable/grpc.go:61-82; "
             "pkg/epp/flowcontrol/controller/controller.go:271-275; kubernetes-sigs/controller-runtime@v0.23.3 (the "
             "picker's go.mod):pkg/manager/internal.go:57; pkg/manager/manager.go:575-578",
             "--drain-timeout at least the pool's backend timeout (the longest stream); terminationGracePeriodSeconds "
             f"{MANAGER_STOP_S} s + the drain + the longest stream",
             picker_stops_within_its_grace),
    Contract("endpoint picker", EPP_VERSION,
             "from SIGTERM every gRPC health check but 'liveness' reports NOT_SERVING ('readiness' and the empty "
             "name pass on the leader only), and with flow control on every request still reaching the stopping "
             "leader is answered 503 rejected-shutting-down; GKE checks a picker on gRPC 9003 unless a "
             "HealthCheckPolicy on its Service says otherwise; the chart checks every 2 s for faster switch-over "
             "during an EPP rollout",
             f"{SRC}cmd/epp/runner/health.go:60-64,82-100; pkg/epp/flowcontrol/controller/controller.go:271-275; "
             "pkg/epp/requestcontrol/admission.go:269-270; config/charts/llm-d-router-gateway/templates/gke.yaml:16-19,38-60",
             "a HealthCheckPolicy on the picker's Service: gRPC on 9003 asking for 'readiness', every "
             f"{HEALTH_CHECK_INTERVAL_S} s, out after {HEALTH_CHECK_UNHEALTHY} failures",
             picker_leaves_the_load_balancer_fast),
    Contract("endpoint picker", EPP_VERSION,
             f"serves ext_proc on {EXT_PROC_PORT}, gRPC health on {HEALTH_PORT}, metrics on {METRICS_PORT}; "
             f"the image runs as {EPP_UID}:{EPP_UID}",
             f"{SRC}pkg/epp/server/options.go:41,150-151; Dockerfile.epp:50-57",
             "the Deployment's ports, the InferencePool's endpointPickerRef and runAsUser",
             picker_ports),
    Contract("endpoint picker", EPP_VERSION,
             "buffers the whole body with no limit and picks its parser by path suffix (openai-parser: chat and "
             "completions, responses, embeddings, ...; anthropic-parser: messages); a body on a path no parser "
             "claims is a 400 (passthrough-parser, not configured here, would forward it unparsed)",
             f"{SRC}pkg/epp/handlers/server.go:445-466; pkg/epp/handlers/parsers.go:89-102; "
             "pkg/epp/framework/plugins/requesthandling/parsers/openai/openai.go:90-104; "
             "parsers/anthropic/anthropic.go:68-73",
             "routes to a pool match exactly paths the configured parsers claim (or GET /v1/models), bodies only with "
             "a bounded Content-Length or on a path whose body the identity extension bounds",
             picker_gets_what_it_parses),
    Contract("endpoint picker", EPP_VERSION,
             "reads the objective, fairness id, model rewrite and SLO headers x-llm-d-* first, the x-gateway-* "
             "spelling only when that is absent; priority 0 without an objective; positive priorities are ordered "
             "only with the flowControl feature gate (default off)",
             f"{SRC}pkg/epp/metadata/consts.go:37-77,89-101; pkg/epp/requestcontrol/director.go:221-236,261-298; "
             "cmd/epp/runner/runner.go:752",
             f"routes to a pool require the tenant's own {OBJECTIVE_HEADER} (set by the tenant identity extension, "
             "which strips every client copy of both spellings); a positive priority only with flow control on",
             picker_objective_is_the_tenants),
    Contract("endpoint picker", EPP_VERSION,
             "finds an objective by metadata.name among llm-d.ai/v1alpha2 objectives in the pool's namespace whose "
             "poolRef names the pool and its group; the old inference.networking.x-k8s.io group is read only while "
             "llm-d.ai's CRD is absent (probed once, at start); an unknown objective is priority 0",
             f"{SRC}pkg/epp/datastore/datastore.go:229-239; pkg/epp/controller/inferenceobjective_reconciler.go:68-73; "
             "pkg/epp/server/controller_config.go:71-88; pkg/epp/requestcontrol/director.go:221-236",
             "each required objective exists beside its pool as llm-d.ai/v1alpha2, poolRef name and group spelt out",
             picker_finds_the_objectives),
    Contract("endpoint picker", EPP_VERSION,
             "decodes EndpointPickerConfig strictly (an unknown key stops it at start), accepts only registered "
             "plugin types and feature gates, and Alpha plugins only with --allow-experimental-plugins",
             f"{SRC}pkg/epp/config/loader/configloader.go:235-242,257; {TYPES}:33-511; "
             "pkg/epp/config/loader/validation.go:32-49,138-159; pkg/epp/framework/interface/plugin/registry.go:106-119",
             "every key of the planned config is a JSON tag of its struct (CONFIG_FIELDS, file:line), every plugin a "
             "Beta type registered at the tag, every gate registered",
             picker_config_is_strictly_decodable),
    Contract("endpoint picker", EPP_VERSION,
             "with flowControl on: bands per priority (missing ones provisioned from defaultPriorityBand or, below 0, "
             "defaultNegativePriorityBand; 5000 requests / 1 GB each by default), dispatched highest first while the "
             "pool is saturated; fairness global-strict unless set; queue full 429 rejected-saturated, TTL expiry 429 "
             "rejected-ttl-expired, 503 rejected-no-endpoints while the pool is empty",
             f"{SRC}{TYPES}:362-511; pkg/epp/flowcontrol/registry/config.go:33-55,345-354; "
             "pkg/epp/flowcontrol/controller/internal/processor.go:402-414; pkg/epp/requestcontrol/admission.go:246-285",
             "a band per tenant priority >= 0 with the stack's bounds, small sheddable bounds for negative ones, "
             "round-robin fairness in every band, global bounds, a queue TTL below the backend timeout",
             picker_flow_control_bands),
    Contract("endpoint picker", EPP_VERSION,
             "watches llm-d.ai inferenceobjectives and inferencemodelrewrites, inferencepools and pods (the chart's "
             "Roles); which objective group it reads is decided once, at start, by the CRDs installed then",
             f"{SRC}config/charts/llm-d-router-gateway/templates/rbac.yaml:8-17; "
             "config/charts/routerlib/templates/_rbac.yaml:41-75; pkg/epp/server/controller_config.go:71-88; "
             "cmd/epp/runner/runner.go:361-366",
             "a Role bound to its ServiceAccount granting get/list/watch on each; the Deployment waits for llm-d.ai's "
             "CRDs (installed by URL at the tag)",
             picker_reads_llm_d_objectives),
)
