"""InferencePool: one model's replicas behind the GKE Inference Gateway's endpoint picker.

Declares what the upstream `inferencepool` chart (gateway-api-inference-extension v1.2.0,
config/charts/inferencepool) installs for the GKE provider, as typed Pulumi resources:
  - the InferencePool (inference.networking.k8s.io/v1) selecting the model's vLLM pods;
  - its endpoint picker (EPP): ServiceAccount, a Role that reads pools, objectives and pods
    (and, for leader election, leases and events), the plugin config (queue depth, KV-cache
    utilisation and prefix-cache affinity scorers), Deployment and Service, scraped by Managed
    Prometheus;
  - one InferenceObjective per tenant, carrying the tenant's priority;
  - the load balancer's HealthCheckPolicy and GCPBackendPolicy, which target the pool
    (GKE's "Deploy GKE Inference Gateway" guide: the default health check asks for '/').

The EPP runs outside the mesh: the load balancer calls it directly (Service Extensions, from
the proxy-only subnet) and it serves its own TLS (--secure-serving, the EPP default); a
sidecar would demand a mesh identity the load balancer does not have. It never serves a
tenant: it only answers "which replica", and the request itself still enters the chosen
replica through that replica's sidecar, JWT and AuthorizationPolicy.

Run as upstream runs it highly available (`--ha-enable-leader-election`, the chart's
replicas > 1 path): every replica serves ext_proc, only the leader runs the controllers and
reports ready (cmd/epp/runner/health.go:46-95), and a standby takes the lease once the leader
releases it, at the end of a graceful stop (ReleaseOnCancel), or 15 s after a crashed leader's last
renewal. One Ready pod by design shapes the rest: a rollout must be free to replace the old leader
while it is the only available pod; the two replicas run on different nodes, so no single drain or
node failure takes both; and no PodDisruptionBudget: it counts Ready pods, only the leader, so any
budget (minAvailable 1 or maxUnavailable 1 alike) allows no eviction of the leader and would hold
its node's drain for GKE's hour, only to be forced then with the same handover. Its metric
names come from the vLLM release (the v1.2.0 default KV-cache gauge is gone from 0.34), pprof is
off (it would be served without auth beside /metrics), and a NetworkPolicy admits only the load
balancer's proxies and health checks to ext_proc and the metrics scrapers to 9090.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import yaml

from .gateway import backend_defaults
from .k8s_meta import api_body, custom_resource, meta
from .model.k8s_objects import CONTAINER_SECURITY, content_digest, vllm_health_check
from .model.specs import ImageRef
from .model.vllm_versions import DEFAULT_VLLM_VERSION, release
from .options import child_opts

POOL_API = "inference.networking.k8s.io/v1"
OBJECTIVE_API = "inference.networking.x-k8s.io/v1alpha2"
# The release the contracts (infra/contracts/picker.py) were read at.
EPP_VERSION = "v1.2.0"
EPP_IMAGE = ImageRef(repository="registry.k8s.io/gateway-api-inference-extension/epp", tag=EPP_VERSION)
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
EPP_UID = 65532  # the distroless image's nonroot user
CONFIG_FILE = "default-plugins.yaml"
REPLICAS = 2
# The picker stops within controller-runtime's default graceful shutdown (v0.22.4
# pkg/manager/internal.go:55; the picker sets none, pkg/epp/server/controller_manager.go:88-101):
# gRPC GracefulStop waits for open ext_proc streams until then, then the lease is released.
SHUTDOWN_S = 30
# Room to release the lease after that (an API call); a longer grace would change nothing.
GRACE_S = SHUTDOWN_S + 10
# The managed collectors of Google Cloud Managed Service for Prometheus run in one of these.
GMP_NAMESPACES = ("gmp-system", "gke-gmp-system")
# The chart's default scheduling profile: prefix-cache affinity first, then load.
SCORER_WEIGHTS = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3))


def picker_config() -> str:
    return yaml.safe_dump({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [{"type": name} for name, _ in SCORER_WEIGHTS],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": name, "weight": weight} for name, weight in SCORER_WEIGHTS]}],
    }, sort_keys=False)


@dataclass
class InferencePoolArgs:
    # The pool's name (the HTTPRoute's backendRef); the picker is <name>-epp.
    pool_name: str
    namespace: pulumi.Input[str]
    # Labels of the vLLM pods the pool load-balances.
    selector: Mapping[str, str]
    provider: k8s.Provider
    # InferenceObjective name (the value routes set in x-gateway-inference-objective) -> priority.
    objectives: Mapping[str, int] = field(default_factory=dict[str, int])
    port: int = 8000
    request_timeout_seconds: int = 600
    image: ImageRef = EPP_IMAGE
    # The picker's metric-name flags for the pool's vLLM release (VllmRelease.picker_metrics);
    # the v1.2.0 defaults name a KV-cache gauge vLLM 0.34 no longer exports.
    model_metrics: Mapping[str, str] = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION).picker_metrics)
    # Who may call ext_proc (the load balancer's proxy-only subnet and health-check ranges) and
    # scrape 9090 besides Managed Prometheus' collectors (the nodes' range, for host-network ones).
    load_balancer_sources: Sequence[pulumi.Input[str]] = ()
    metrics_sources: Sequence[str] = ()


class InferencePool(pulumi.ComponentResource):
    pool: k8s.apiextensions.CustomResource
    picker: k8s.apps.v1.Deployment
    pool_name: str

    def __init__(self, name: str, args: InferencePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:InferencePool", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.pool_name = args.pool_name
        epp = f"{args.pool_name}-epp"
        labels = {"inferencepool": epp, "app.kubernetes.io/name": "vllm-gke-epp"}
        ns = args.namespace

        def md(obj: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(obj, labels=labels), "namespace": ns}

        sa = k8s.core.v1.ServiceAccount(f"{name}-epp-sa", metadata=md(epp), opts=k8s_opts)
        role = k8s.rbac.v1.Role(f"{name}-epp-role", metadata=md(epp), rules=api_body([
            {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
             "verbs": ["get", "watch", "list"]},
            {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
             "verbs": ["get", "watch", "list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
            # Leader election (the chart's leader-election-rbac.yaml for replicas > 1).
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ]), opts=k8s_opts)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-epp-binding", metadata=md(epp),
            role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}),
            subjects=[{"kind": "ServiceAccount", "name": epp, "namespace": ns}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[role, sa]))
        plugins = picker_config()
        config = k8s.core.v1.ConfigMap(f"{name}-epp-config", metadata=md(epp),
                                       data={CONFIG_FILE: plugins}, opts=k8s_opts)
        # Only the leader is ready; liveness holds on every replica (health.go:46-95).
        def grpc_probe(service: str) -> dict[str, Any]:
            return {"grpc": {"port": HEALTH_PORT, "service": service}}

        metric_flags = [item for flag, metric in sorted(args.model_metrics.items()) for item in (flag, metric)]
        self.picker = k8s.apps.v1.Deployment(
            # Only the leader turns ready, by design: Pulumi waits for it, not for every replica
            # (its default wait would never end).
            f"{name}-epp", metadata={**md(epp), "annotations": {"pulumi.com/waitFor": "jsonpath={.status.readyReplicas}=1"}},
            spec=api_body({
                "replicas": REPLICAS,
                # A new pod turns ready only once the old leader has released the lease, and the
                # old leader is the one available pod: with maxUnavailable below 100% the
                # Deployment would never scale it down and the rollout would never finish (the
                # chart says so too, epp-deployment.yaml:11-16). 100% surge starts the new pods
                # while the old ones stop, where Recreate would first wait for them to be gone.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
                "selector": {"matchLabels": {"inferencepool": epp}},
                "template": {
                    # Outside the mesh: see the module docstring. The config's digest rolls the
                    # picker when its plugins change (it reads the file once, at start).
                    "metadata": {"labels": {**labels, "sidecar.istio.io/inject": "false"},
                                 "annotations": {"vllm-gke.io/config-sha256": content_digest(plugins),
                                                 # Every stop of the leader is a handover (seconds of
                                                 # a closed pool): not for the autoscaler to tidy nodes.
                                                 "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
                    "spec": {
                        "serviceAccountName": epp,
                        # Its whole graceful stop (SHUTDOWN_S) and the lease release; not the chart's
                        # 130 s: the picker exits by SHUTDOWN_S whatever the grace period.
                        "terminationGracePeriodSeconds": GRACE_S,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        # One replica per node, so a node's drain or failure takes one, never both:
                        # per revision (a rollout's new pods may share nodes with the stopping
                        # ones), among the nodes it tolerates (not the tainted GPU and TPU nodes,
                        # which would otherwise count as empty domains and leave it unschedulable).
                        "topologySpreadConstraints": [{
                            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                            # Two nodes at least: on a system pool shrunk to one node the second
                            # replica waits (and the autoscaler adds a node) rather than share it.
                            "minDomains": 2,
                            "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                            "labelSelector": {"matchLabels": {"inferencepool": epp}},
                            "matchLabelKeys": ["pod-template-hash"]}],
                        "containers": [{
                            "name": "epp", "image": args.image.uri,
                            "args": ["--pool-name", args.pool_name, "--pool-namespace", ns,
                                     "--zap-encoder", "json", "--config-file", f"/config/{CONFIG_FILE}",
                                     "--v", "1", "--tracing=false", "--metrics-endpoint-auth=false",
                                     "--ha-enable-leader-election", "--enable-pprof=false", *metric_flags],
                            "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                                      {"name": "grpc-health", "containerPort": HEALTH_PORT},
                                      {"name": "metrics", "containerPort": METRICS_PORT}],
                            "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    # It decodes every body whole before any JWT is checked: the Go
                                    # runtime collects harder before the container's limit.
                                    {"name": "GOMEMLIMIT", "value": "3GiB"}],
                            "livenessProbe": {**grpc_probe("liveness"), "initialDelaySeconds": 5, "periodSeconds": 10},
                            "readinessProbe": {**grpc_probe("readiness"), "periodSeconds": 2},
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                          "limits": {"cpu": "4", "memory": "4Gi"}},
                            "securityContext": CONTAINER_SECURITY,
                            "volumeMounts": [{"name": "plugins-config", "mountPath": "/config", "readOnly": True}],
                        }],
                        "volumes": [{"name": "plugins-config", "configMap": {"name": epp}}],
                    },
                },
            }),
            # Its RBAC first: without it the picker's watches fail and it restarts until RBAC lands.
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa, binding]))
        if not args.load_balancer_sources:
            # An ingress rule with no sources admits every source: never declare one.
            raise ValueError(f"InferencePool {args.pool_name}: load_balancer_sources (the proxy-only subnet and "
                             "the health-check ranges) are required")
        ip_blocks = [{"ipBlock": {"cidr": c}} for c in args.load_balancer_sources]
        gmp = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}} for n in GMP_NAMESPACES]
        k8s.networking.v1.NetworkPolicy(
            f"{name}-epp-ingress", metadata=md(epp),
            spec=api_body({"podSelector": {"matchLabels": {"inferencepool": epp}}, "policyTypes": ["Ingress"],
                           "ingress": [
                               # ext_proc and its health port: the load balancer's proxies and health checks.
                               {"from": ip_blocks, "ports": [{"protocol": "TCP", "port": EXT_PROC_PORT},
                                                             {"protocol": "TCP", "port": HEALTH_PORT}]},
                               # /metrics: Managed Prometheus' collectors (and host-network scrapers).
                               {"from": [*gmp, *({"ipBlock": {"cidr": c}} for c in args.metrics_sources)],
                                "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
                           ]}),
            opts=k8s_opts)
        service = k8s.core.v1.Service(
            # The standby replicas are unready by design (only the leader is ready): Pulumi's wait
            # for a Service with no unready address would fail every update of it.
            f"{name}-epp-svc", metadata={**md(epp), "annotations": {"pulumi.com/skipAwait": "true"}},
            spec={"type": "ClusterIP", "selector": {"inferencepool": epp},
                  "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT},
                            {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]},
            opts=k8s_opts)
        custom_resource(f"{name}-epp-monitoring", "monitoring.googleapis.com/v1", "PodMonitoring", md(epp),
                        {"selector": {"matchLabels": {"inferencepool": epp}},
                         "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}, k8s_opts)

        pool_meta: k8s.meta.v1.ObjectMetaArgsDict = {**meta(args.pool_name), "namespace": ns}
        self.pool = custom_resource(
            f"{name}-pool", POOL_API, "InferencePool", pool_meta,
            {"targetPorts": [{"number": args.port}], "selector": {"matchLabels": dict(args.selector)},
             # FailClose: with the picker down, requests fail rather than bypass priorities.
             "endpointPickerRef": {"name": epp, "port": {"number": EXT_PROC_PORT}, "failureMode": "FailClose"}},
            child_opts(self, opts, provider=args.provider, depends_on=[service]))
        after_pool = child_opts(self, opts, provider=args.provider, depends_on=[self.pool])
        for objective, priority in sorted(args.objectives.items()):
            custom_resource(f"{name}-objective-{objective}", OBJECTIVE_API, "InferenceObjective",
                            {**meta(objective), "namespace": ns},
                            # The picker matches poolRef's name and group (its default, spelt out).
                            {"poolRef": {"name": args.pool_name, "group": "inference.networking.k8s.io"},
                             "priority": priority}, after_pool)

        target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": args.pool_name}
        custom_resource(f"{name}-hc", "networking.gke.io/v1", "HealthCheckPolicy", pool_meta,
                        vllm_health_check(target, args.port), after_pool)
        custom_resource(
            f"{name}-bp", "networking.gke.io/v1", "GCPBackendPolicy", pool_meta,
            {"default": {**backend_defaults(args.request_timeout_seconds), "logging": {"enabled": True}},
             "targetRef": target}, after_pool)

        self.register_outputs({"poolName": args.pool_name, "picker": epp,
                               "objectives": sorted(args.objectives)})
