"""InferencePool: one model's replicas behind the GKE Inference Gateway's endpoint picker.

Declares what the upstream `inferencepool` chart (gateway-api-inference-extension v1.2.0,
config/charts/inferencepool) installs for the GKE provider, as typed Pulumi resources:
  - the InferencePool (inference.networking.k8s.io/v1) selecting the model's vLLM pods;
  - its endpoint picker (EPP): ServiceAccount, a Role that reads pools, objectives and pods,
    the plugin config (queue depth, KV-cache utilisation and prefix-cache affinity scorers),
    Deployment and Service, scraped by Managed Prometheus;
  - one InferenceObjective per tenant, carrying the tenant's priority;
  - the load balancer's HealthCheckPolicy and GCPBackendPolicy, which target the pool
    (GKE's "Deploy GKE Inference Gateway" guide: the default health check asks for '/').

The EPP runs outside the mesh: the load balancer calls it directly (Service Extensions, from
the proxy-only subnet) and it serves its own TLS (--secure-serving, the EPP default); a
sidecar would demand a mesh identity the load balancer does not have. It never serves a
tenant: it only answers "which replica", and the request itself still enters the chosen
replica through that replica's sidecar, JWT and AuthorizationPolicy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s
import yaml

from vllm_gke.components.k8s_meta import CONTAINER_SECURITY, custom_resource, meta, vllm_health_check
from vllm_gke.components.options import child_opts
from vllm_gke.components.specs import ImageRef

POOL_API = "inference.networking.k8s.io/v1"
OBJECTIVE_API = "inference.networking.x-k8s.io/v1alpha2"
EPP_IMAGE = ImageRef(repository="registry.k8s.io/gateway-api-inference-extension/epp", tag="v1.2.0")
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
EPP_UID = 65532  # the distroless image's nonroot user
CONFIG_FILE = "default-plugins.yaml"
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
    objectives: Mapping[str, int] = field(default_factory=dict)
    port: int = 8000
    request_timeout_seconds: int = 600
    image: ImageRef = EPP_IMAGE


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

        def md(obj: str) -> dict:
            return {**meta(obj, labels=labels), "namespace": ns}

        sa = k8s.core.v1.ServiceAccount(f"{name}-epp-sa", metadata=md(epp), opts=k8s_opts)
        role = k8s.rbac.v1.Role(f"{name}-epp-role", metadata=md(epp), rules=[
            {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
             "verbs": ["get", "watch", "list"]},
            {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
             "verbs": ["get", "watch", "list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
        ], opts=k8s_opts)
        k8s.rbac.v1.RoleBinding(
            f"{name}-epp-binding", metadata=md(epp),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp},
            subjects=[{"kind": "ServiceAccount", "name": epp, "namespace": ns}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[role, sa]))
        config = k8s.core.v1.ConfigMap(f"{name}-epp-config", metadata=md(epp),
                                       data={CONFIG_FILE: picker_config()}, opts=k8s_opts)
        grpc_probe = {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"}}
        self.picker = k8s.apps.v1.Deployment(
            f"{name}-epp", metadata=md(epp),
            spec={
                # One active picker: its prefix-cache index lives in memory (the chart's pattern).
                "replicas": 1, "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"inferencepool": epp}},
                "template": {
                    # Outside the mesh: see the module docstring.
                    "metadata": {"labels": {**labels, "sidecar.istio.io/inject": "false"}},
                    "spec": {
                        "serviceAccountName": epp,
                        # Outlast the longest vLLM drain, so in-flight picks complete.
                        "terminationGracePeriodSeconds": 130,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "epp", "image": args.image.uri,
                            "args": ["--pool-name", args.pool_name, "--pool-namespace", ns,
                                     "--zap-encoder", "json", "--config-file", f"/config/{CONFIG_FILE}",
                                     "--v", "1", "--tracing=false", "--metrics-endpoint-auth=false"],
                            "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                                      {"name": "grpc-health", "containerPort": HEALTH_PORT},
                                      {"name": "metrics", "containerPort": METRICS_PORT}],
                            "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                            "livenessProbe": {**grpc_probe, "initialDelaySeconds": 5, "periodSeconds": 10},
                            "readinessProbe": {**grpc_probe, "periodSeconds": 2},
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                          "limits": {"cpu": "4", "memory": "4Gi"}},
                            "securityContext": CONTAINER_SECURITY,
                            "volumeMounts": [{"name": "plugins-config", "mountPath": "/config", "readOnly": True}],
                        }],
                        "volumes": [{"name": "plugins-config", "configMap": {"name": epp}}],
                    },
                },
            },
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa]))
        service = k8s.core.v1.Service(
            f"{name}-epp-svc", metadata=md(epp),
            spec={"type": "ClusterIP", "selector": {"inferencepool": epp},
                  "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT},
                            {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]},
            opts=k8s_opts)
        custom_resource(f"{name}-epp-monitoring", "monitoring.googleapis.com/v1", "PodMonitoring", md(epp),
                        {"selector": {"matchLabels": {"inferencepool": epp}},
                         "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}, k8s_opts)

        pool_meta = {**meta(args.pool_name), "namespace": ns}
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
                            {"poolRef": {"name": args.pool_name}, "priority": priority}, after_pool)

        target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": args.pool_name}
        custom_resource(f"{name}-hc", "networking.gke.io/v1", "HealthCheckPolicy", pool_meta,
                        vllm_health_check(target, args.port), after_pool)
        custom_resource(
            f"{name}-bp", "networking.gke.io/v1", "GCPBackendPolicy", pool_meta,
            {"default": {"timeoutSec": args.request_timeout_seconds, "logging": {"enabled": True}},
             "targetRef": target}, after_pool)

        self.register_outputs({"poolName": args.pool_name, "picker": epp,
                               "objectives": sorted(args.objectives)})
