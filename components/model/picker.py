"""GKE Inference Gateway's endpoint picker (EPP) and its InferencePool as data: llm-d-router v0.10.0's
picker (the picker left gateway-api-inference-extension for llm-d; GKE's Inference Gateway is
"powered by llm-d") as its chart's routerlib templates deploy it, in the API's own field names. Why
it runs as it does (outside the mesh, highly available with one ready leader, no
PodDisruptionBudget): components/inference_pool.py, which declares them. Upstream file:line below
are llm-d/llm-d-router at v0.10.0 unless named otherwise; infra/contracts/picker.py checks the plan
against each.

A namespace here is whatever the program names it by (a Pulumi Output where the namespace is
made in the same program): it passes through as given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import yaml

from .k8s_objects import CONTAINER_SECURITY
from .specs import ImageRef, PickerSpec

if TYPE_CHECKING:
    from .stack_config import StackConfig

POOL_API = "inference.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
# llm-d's own API (apix/v1alpha2/doc.go:22): the picker reads objectives of this group once its CRD
# exists and then ignores the old one (pkg/epp/server/controller_config.go:71-88).
OBJECTIVE_API = "llm-d.ai/v1alpha2"
LEGACY_OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
CONFIG_API = "llm-d.ai/v1alpha1"  # apix/config/v1alpha1/zz_generated.register.go:37-40
# The release the contracts (infra/contracts/picker.py) were read at.
EPP_VERSION = "v0.10.0"
# The release workflow tags the image with the git tag (.github/workflows/ci-release.yaml:33-41);
# no digest of it is published anywhere in the repository, so the tag it is.
EPP_IMAGE = ImageRef(repository="ghcr.io/llm-d/llm-d-router-endpoint-picker", tag=EPP_VERSION)
EXT_PROC_PORT = 9002  # pkg/epp/server/options.go:41
HEALTH_PORT = 9003  # options.go:151
METRICS_PORT = 9090  # options.go:150
EPP_UID = 65532  # Dockerfile.epp:50 (USER 65532:65532)
CONFIG_FILE = "default-plugins.yaml"
REPLICAS = 2
# The manager's stop, which runs before the drain window (cmd/epp/runner/runner.go:313-324) and which the
# picker leaves at controller-runtime's default GracefulShutdownTimeout (pkg/epp/server/controller_manager.go:
# 106-128 sets none; controller-runtime v0.23.3, its go.mod's, pkg/manager/internal.go:57, manager.go:575-578):
# its runnables stop and the lease is released within it.
MANAGER_STOP_S = 30
# The load balancer's gRPC health check of the picker's Service: every 2 s, as the chart checks "for faster
# switch over during EPP rollout" (config/charts/llm-d-router-gateway/templates/gke.yaml:16-19); a pod
# NOT_SERVING leaves after 2 failures, a new leader enters at its first pass.
HEALTH_CHECK_INTERVAL_S = 2
HEALTH_CHECK_UNHEALTHY = 2
# The managed collectors of Google Cloud Managed Service for Prometheus run in one of these.
GMP_NAMESPACES = ("gmp-system", "gke-gmp-system")
# The label that tells llm-d-router's pods from the v1.2.0 picker's, which a stack coming from
# v1.2.0 still runs until the end of its first `pulumi up` (picker_migration_notes).
PICKER_LABEL = ("vllm-gke.io/picker", "llm-d-router")

# Plugin types (each a registered type at v0.10.0; the name defaults to the type, loader/defaults.go:108-113).
SCORERS = ("queue-scorer",  # scheduling/scorer/queuedepth/queue.go:30
           "kv-cache-utilization-scorer",  # scorer/kvcacheutilization/kvcache_utilization.go:29
           "prefix-cache-scorer")  # scorer/prefix/plugin.go:59
DETECTOR = "utilization-detector"  # flowcontrol/saturationdetector/utilization/detector.go:43
FAIRNESS = "round-robin-fairness-policy"  # flowcontrol/fairness/roundrobin/roundrobin.go:36
ORDERING = "fcfs-ordering-policy"  # flowcontrol/ordering/fcfs/fcfs.go:34
# By path suffix (openai.go:90-104: chat/completions, completions, responses, embeddings, ...;
# anthropic.go:68-73: messages). No passthrough-parser: a path no parser claims stays a 400
# (handlers/parsers.go:97-101) rather than reaching a replica unparsed.
PARSERS = ("openai-parser",  # requesthandling/parsers/openai/openai.go:35
           "anthropic-parser")  # parsers/anthropic/anthropic.go:34
FLOW_CONTROL_GATE = "flowControl"  # pkg/epp/flowcontrol/config.go:27 (default off, cmd/epp/runner/runner.go:752)

# What the picker reads (pools, objectives, rewrites, pods) and, for leader election, writes: the
# chart's Roles (config/charts/llm-d-router-gateway/templates/rbac.yaml:8-17,
# routerlib/templates/_rbac.yaml:41-75, _leader-election-rbac.yaml:11-17).
ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["llm-d.ai"], "resources": ["inferenceobjectives", "inferencemodelrewrites"],
     "verbs": ["get", "watch", "list"]},
    # The old group, as the chart grants it too: a v1.2.0 picker still running during the move
    # (picker_migration_notes) keeps reading its objectives until it stops. Dropped with the old CRD.
    {"apiGroups": [LEGACY_OBJECTIVE_GROUP], "resources": ["inferenceobjectives"], "verbs": ["get", "watch", "list"]},
    {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": ["get", "watch", "list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


@dataclass(frozen=True)
class PickerExtension:
    """What another concern adds to the picker's config (the KV-events prefix cache,
    components/model/picker_prefix.py): plugins, scheduling-profile entries ({pluginRef, weight})
    and data-layer sources ({pluginRef, extractors})."""

    plugins: tuple[Mapping[str, Any], ...] = ()
    profile_plugins: tuple[Mapping[str, Any], ...] = ()
    data_sources: tuple[Mapping[str, Any], ...] = ()
    # What its plugins hold in the picker's memory beyond its own (MiB): limit and GOMEMLIMIT gain it.
    memory_mib: int = 0


def picker_name(pool_name: str) -> str:
    """The picker's Service (the InferencePool's endpointPickerRef), identity and RBAC."""
    return f"{pool_name}-epp"


def picker_workload(pool_name: str) -> str:
    """llm-d-router's Deployment and ConfigMap: not the v1.2.0 picker's names, so a stack coming
    from it gets the new picker beside the old one, serving, before the old one is deleted."""
    return f"{pool_name}-router-epp"


def picker_labels(epp: str) -> dict[str, str]:
    return {"inferencepool": epp, "app.kubernetes.io/name": "vllm-gke-epp"}


def drain_seconds(request_timeout_seconds: int) -> int:
    """--drain-timeout: how long a stopping picker still takes new ext_proc streams after it turns
    NotServing and releases its lease (options.go:167-170; cmd/epp/runner/runner.go:279-336): the
    longest stream, the load balancer's backend timeout."""
    return request_timeout_seconds


def grace_seconds(request_timeout_seconds: int) -> int:
    """The manager's stop (MANAGER_STOP_S), the drain, then GracefulStop waits for every open stream with
    no bound of its own (internal/runnable/grpc.go:61-82): one begun at the drain's end lasts up to the timeout."""
    return MANAGER_STOP_S + drain_seconds(request_timeout_seconds) + request_timeout_seconds


def _band(priority: int, max_requests: int, max_bytes_mib: int) -> dict[str, Any]:
    # Quantities as strings (resource.Quantity), endpointpickerconfig_types.go:483-511.
    return {"priority": priority, "maxRequests": str(max_requests), "maxBytes": f"{max_bytes_mib}Mi",
            "fairnessPolicyRef": FAIRNESS, "orderingPolicyRef": ORDERING}


def flow_control_config(spec: PickerSpec, priorities: Iterable[int]) -> dict[str, Any]:
    """The config's flowControl: the detector alone without the gate (the legacy admission reads it,
    loader/configloader.go:195-207); with it one band per priority >= 0 (priority 0 always,
    registry/config.go:345-354), negative ones from the small sheddable template as their
    objectives appear (registry.go:367-390), bounds across all bands, and the queue TTL."""
    out: dict[str, Any] = {"saturationDetector": {"pluginRef": DETECTOR}}
    fc = spec.flow_control
    if not fc.enabled:
        return out
    bands = sorted({0, *(p for p in priorities if p >= 0)}, reverse=True)
    return {
        **out, "maxRequests": str(fc.max_requests), "maxBytes": f"{fc.max_bytes_mib}Mi",
        "defaultRequestTTL": f"{fc.queue_ttl_seconds}s",
        "defaultPriorityBand": _band(0, fc.band_max_requests, fc.band_max_bytes_mib),
        "defaultNegativePriorityBand": _band(-1, fc.sheddable_max_requests, fc.sheddable_max_bytes_mib),
        "priorityBands": [_band(p, fc.band_max_requests, fc.band_max_bytes_mib) for p in bands],
    }


def picker_config_data(spec: PickerSpec, priorities: Iterable[int] = (),
                       extension: PickerExtension | None = None) -> dict[str, Any]:
    """The EndpointPickerConfig (apix/config/v1alpha1/endpointpickerconfig_types.go; decoded
    strictly, loader/configloader.go:235-242: every key must be one of its JSON tags). The metrics
    source and extractor, the profile handler and the picker are the loader's defaults
    (loader/defaults.go:123-141,298-331); the extractor's built-in vllm engine names are what vLLM
    0.34 exports (datalayer/extractor/metrics/factories.go:89-97)."""
    ext = extension or PickerExtension()
    weights = dict(zip(SCORERS, (spec.scorers.queue, spec.scorers.kv_cache_utilization, spec.scorers.prefix_cache)))
    if spec.prefix_cache == "precise":
        # The extension's precise scorer takes the prefix weight; the approximate one is left out,
        # as upstream's recipe does (deploy/config/epp-precise-prefix-cache-config.yaml).
        weights.pop(SCORERS[2])
    scorers = [(t, w) for t, w in weights.items() if w]
    sat = spec.saturation
    detector = {"type": DETECTOR, "parameters": {  # saturationdetector/utilization/config.go:55-77
        "queueDepthThreshold": sat.queue_depth_threshold, "kvCacheUtilThreshold": sat.kv_cache_util_threshold,
        "metricsStalenessThreshold": f"{sat.metrics_staleness_ms}ms"}}
    policies = [{"type": FAIRNESS}, {"type": ORDERING}] if spec.flow_control.enabled else []
    config: dict[str, Any] = {"apiVersion": CONFIG_API, "kind": "EndpointPickerConfig"}
    if spec.flow_control.enabled:
        config["featureGates"] = [FLOW_CONTROL_GATE]
    config["plugins"] = [*({"type": t} for t, _ in scorers), detector, *policies,
                         *({"type": p} for p in PARSERS), *(dict(p) for p in ext.plugins)]
    config["schedulingProfiles"] = [{"name": "default", "plugins": [
        *({"pluginRef": t, "weight": w} for t, w in scorers), *(dict(p) for p in ext.profile_plugins)]}]
    if ext.data_sources:
        config["dataLayer"] = {"sources": [dict(s) for s in ext.data_sources]}
    config["requestHandler"] = {"parsers": [{"pluginRef": p} for p in PARSERS]}
    config["flowControl"] = flow_control_config(spec, priorities)
    return config


def picker_config(spec: PickerSpec, priorities: Iterable[int] = (), extension: PickerExtension | None = None) -> str:
    return yaml.safe_dump(picker_config_data(spec, priorities, extension), sort_keys=False)


def gmp_collectors() -> list[dict[str, Any]]:
    """NetworkPolicy peers for Managed Prometheus' collectors: their namespace on either kind of
    install (gke-gmp-system where GKE manages them)."""
    return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}} for n in GMP_NAMESPACES]


def picker_container(pool_name: str, namespace: object, image: str, request_timeout_seconds: int,
                     extra_memory_mib: int = 0) -> dict[str, Any]:
    """No metric-name flags: v0.10.0 exits at start if one is set (options.go:46-54,395-400).
    `extra_memory_mib`: what an extension's plugins hold (PickerExtension.memory_mib)."""

    # With leader election only the leader is ready; liveness holds on every replica, draining
    # included (cmd/epp/runner/health.go:82-100).
    def grpc_probe(service: str) -> dict[str, Any]:
        return {"grpc": {"port": HEALTH_PORT, "service": service}}

    return {
        "name": "epp", "image": image,
        "args": ["--pool-name", pool_name, "--pool-namespace", namespace,
                 "--zap-encoder", "json", "--config-file", f"/config/{CONFIG_FILE}",
                 "--v", "1", "--tracing=false",
                 # /metrics without auth, for Managed Prometheus: the NetworkPolicy keeps 9090 to
                 # the scrapers. /debug/plugins/state is served there too, with no flag to turn it
                 # off (pkg/epp/server/plugin_state_debug.go:30,54-62); pprof is off.
                 "--metrics-endpoint-auth=false", "--enable-pprof=false",
                 "--ha-enable-leader-election", "--drain-timeout", f"{drain_seconds(request_timeout_seconds)}s"],
        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                # It decodes every body whole (and holds queued ones) before any JWT is checked:
                # the Go runtime collects harder before the container's limit.
                {"name": "GOMEMLIMIT", "value": f"{3072 + extra_memory_mib}MiB" if extra_memory_mib else "3GiB"}],
        "livenessProbe": {**grpc_probe("liveness"), "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**grpc_probe("readiness"), "periodSeconds": 2},
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                      "limits": {"cpu": "4", "memory": f"{4096 + extra_memory_mib}Mi" if extra_memory_mib else "4Gi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config", "readOnly": True}],
    }


def picker_deployment_spec(epp: str, container: dict[str, Any], config_digest: str,
                           request_timeout_seconds: int, config_map: str) -> dict[str, Any]:
    """`config_digest`: of the plugin config, which the picker reads once, at start, from `config_map`.
    One container, no other volume: whatever the plugins call (the tokenizer's render server,
    picker_prefix) runs apart, so it never keeps the picker from starting."""
    selector = {"inferencepool": epp, PICKER_LABEL[0]: PICKER_LABEL[1]}
    return {
        "replicas": REPLICAS,
        # A new pod turns ready only once the old leader has released the lease, and the
        # old leader is the one available pod: with maxUnavailable below 100% the
        # Deployment would never scale it down and the rollout would never finish (the
        # chart uses Recreate for it, routerlib/templates/_deployment.yaml:328-345). 100%
        # surge starts the new pods while the old ones drain: a draining leader releases the
        # lease at once and keeps serving ext_proc for --drain-timeout (runner.go:279-336).
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
        "selector": {"matchLabels": selector},
        "template": {
            # Outside the mesh: see components/inference_pool.py. The config's digest rolls the
            # picker when its plugins change (it reads the file once, at start).
            "metadata": {"labels": {**picker_labels(epp), **selector, "sidecar.istio.io/inject": "false"},
                         "annotations": {"vllm-gke.io/config-sha256": config_digest,
                                         # Every stop of the leader is a handover: not for the
                                         # autoscaler to tidy nodes.
                                         "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
            "spec": {
                "serviceAccountName": epp,
                # The manager's stop, the drain and the longest stream begun in it (grace_seconds).
                "terminationGracePeriodSeconds": grace_seconds(request_timeout_seconds),
                "securityContext": {"runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "topologySpreadConstraints": [one_per_node(epp)],
                "containers": [container],
                "volumes": [{"name": "plugins-config", "configMap": {"name": config_map}}],
            },
        },
    }


def one_per_node(epp: str) -> dict[str, Any]:
    """One replica per node, so a node's drain or failure takes one, never both: per revision (a
    rollout's new pods may share nodes with the stopping ones), among the nodes it tolerates (not
    the tainted GPU and TPU nodes, which would otherwise count as empty domains and leave it
    unschedulable)."""
    return {
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        # Two nodes at least: on a system pool shrunk to one node the second
        # replica waits (and the autoscaler adds a node) rather than share it.
        "minDomains": 2,
        "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
        "labelSelector": {"matchLabels": {"inferencepool": epp}},
        "matchLabelKeys": ["pod-template-hash"]}


def picker_ingress(epp: str, load_balancer_sources: Sequence[object], metrics_sources: Sequence[str]) -> dict[str, Any]:
    """The picker's NetworkPolicy: ext_proc and its health port for the load balancer's proxies and
    health checks, 9090 (/metrics, and the unauthenticated /debug/plugins/state) for Managed
    Prometheus' collectors (and host-network scrapers) only."""
    ip_blocks = [{"ipBlock": {"cidr": c}} for c in load_balancer_sources]
    return {"podSelector": {"matchLabels": {"inferencepool": epp}}, "policyTypes": ["Ingress"],
            "ingress": [
                {"from": ip_blocks, "ports": [{"protocol": "TCP", "port": EXT_PROC_PORT},
                                              {"protocol": "TCP", "port": HEALTH_PORT}]},
                {"from": [*gmp_collectors(), *({"ipBlock": {"cidr": c}} for c in metrics_sources)],
                 "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ]}


def picker_service_spec(epp: str) -> dict[str, Any]:
    # The v1.2.0 picker's pods and llm-d-router's alike (inferencepool): both serve while a stack moves.
    return {"type": "ClusterIP", "selector": {"inferencepool": epp},
            "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT},
                      {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]}


def picker_health_check(epp: str) -> dict[str, Any]:
    """The load balancer's HealthCheckPolicy on the picker's Service. At SIGTERM a leader reports every
    check but liveness NOT_SERVING (cmd/epp/runner/health.go:60-64,82-100), and with flow control on answers
    whatever still reaches it 503 rejected-shutting-down (flowcontrol/controller/controller.go:271-275): the
    sooner the load balancer sees it, the fewer such answers. GKE's own check of a picker is gRPC on 9003
    at its default interval (the chart's note, gke.yaml:38-41, declares one only for another port,
    :42-60); this one asks for the leader-only 'readiness' service by name, every 2 s."""
    return {"default": {"checkIntervalSec": HEALTH_CHECK_INTERVAL_S, "timeoutSec": HEALTH_CHECK_INTERVAL_S,
                        "healthyThreshold": 1, "unhealthyThreshold": HEALTH_CHECK_UNHEALTHY,
                        "config": {"type": "GRPC", "grpcHealthCheck": {
                            "portSpecification": "USE_FIXED_PORT", "port": HEALTH_PORT,
                            "grpcServiceName": "readiness"}}},
            "targetRef": {"group": "", "kind": "Service", "name": epp}}


def picker_monitoring_spec(epp: str) -> dict[str, Any]:
    return {"selector": {"matchLabels": {"inferencepool": epp}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}


def pool_spec(epp: str, port: int, selector: Mapping[str, str], failure_mode: str = "FailClose") -> dict[str, Any]:
    """`failure_mode`: picker.failureMode (the trade-off: components/model/specs/picker.py)."""
    return {"targetPorts": [{"number": port}], "selector": {"matchLabels": dict(selector)},
            "endpointPickerRef": {"name": epp, "port": {"number": EXT_PROC_PORT}, "failureMode": failure_mode}}


def objective_spec(pool_name: str, priority: int) -> dict[str, Any]:
    # The picker matches poolRef's name and group (inferenceobjective_reconciler.go:68-73; the group
    # is the CRD's default, spelt out).
    return {"poolRef": {"name": pool_name, "group": POOL_GROUP}, "priority": priority}


def pool_ref(pool_name: str) -> dict[str, str]:
    """What the load balancer's policies target, and an HTTPRoute's backendRef to the pool."""
    return {"group": POOL_GROUP, "kind": "InferencePool", "name": pool_name}


def picker_migration_notes(cfg: "StackConfig") -> list[str]:
    """What the first `pulumi up` of this release does to a stack whose pickers are v1.2.0's, in order,
    and the seconds at its end when requests fail: the old pods stop taking ext_proc at SIGTERM
    (gateway-api-inference-extension v1.2.0 internal/runnable/grpc.go:50-55) while the Service, which
    selects both pickers, still sends to them until the load balancer's health check marks them down."""
    picked = sorted(m.name for m in cfg.models if m.routing == "inference-gateway")
    if not picked:
        return []
    down = HEALTH_CHECK_INTERVAL_S * HEALTH_CHECK_UNHEALTHY
    return [f"{', '.join(picked)}: from the v1.2.0 endpoint picker, one `pulumi up` moves to llm-d-router {EPP_VERSION}: "
            "(1) installs llm-d.ai's InferenceObjective and InferenceModelRewrite CRDs (the old objective CRD stays, "
            "for a rollback); (2) creates each tenant's llm-d.ai objective; (3) starts the new picker under names "
            "of its own (<model>-router-epp: Deployment, ConfigMap and lease, not the old <model>-epp ones, which is "
            "why Pulumi creates it before it deletes them), both pickers serving ext_proc behind the Service "
            "<model>-epp, and waits for its leader, then updates the tenants' routes (they take the identity "
            "extension's headers and, for this release only, the tenant's own objective in the x-gateway-inference-"
            "objective header clients sent to the old routes) and only then programs the identity extension, which "
            "strips that header from then on; the mesh and the replicas' guard, updated first, accept the tenant's "
            "own objective under either name, so nothing is refused on the way; (4) at the end of the update deletes "
            "the old picker, its ConfigMap and the old objectives. Beyond that, requests fail only for a few seconds "
            "there: the old pods stop taking new "
            "ext_proc streams at once, and the load balancer still sends some to them until its health check marks "
            f"them down (about {down} s once GKE applies the picker's HealthCheckPolicy, created in this update; "
            "longer at GKE's default check before): 500 under FailClose. If no request may fail, run this `pulumi "
            "up` with `vllm-gke:picker.failureMode: FailOpen` (those requests are served without priorities, "
            "queueing or load awareness) and set FailClose back in the next. The old picker bounds its stop to "
            "30 s: a stream it began in the update's last seconds and longer than that is cut, as on each of its "
            "own rollouts. A rollback to the previous release reverses it."]
