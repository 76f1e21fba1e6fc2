"""GKE Inference Gateway's endpoint picker (EPP) and its InferencePool as data: the upstream
`inferencepool` chart's objects (gateway-api-inference-extension v1.2.0) in the API's own field
names. Why it runs as it does (outside the mesh, highly available with one ready leader, no
PodDisruptionBudget): components/inference_pool.py, which declares them.

A namespace here is whatever the program names it by (a Pulumi Output where the namespace is
made in the same program): it passes through as given."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import yaml

from .k8s_objects import CONTAINER_SECURITY
from .specs import ImageRef

POOL_API = "inference.networking.k8s.io/v1"
OBJECTIVE_API = "inference.networking.x-k8s.io/v1alpha2"
POOL_GROUP = "inference.networking.k8s.io"
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
# What the picker reads (pools, objectives, pods) and, for leader election, writes.
ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
     "verbs": ["get", "watch", "list"]},
    {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
     "verbs": ["get", "watch", "list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
    # Leader election (the chart's leader-election-rbac.yaml for replicas > 1).
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


def picker_name(pool_name: str) -> str:
    return f"{pool_name}-epp"


def picker_labels(epp: str) -> dict[str, str]:
    return {"inferencepool": epp, "app.kubernetes.io/name": "vllm-gke-epp"}


def picker_config() -> str:
    return yaml.safe_dump({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [{"type": name} for name, _ in SCORER_WEIGHTS],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": name, "weight": weight} for name, weight in SCORER_WEIGHTS]}],
    }, sort_keys=False)


def gmp_collectors() -> list[dict[str, Any]]:
    """NetworkPolicy peers for Managed Prometheus' collectors: their namespace on either kind of
    install (gke-gmp-system where GKE manages them)."""
    return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}} for n in GMP_NAMESPACES]


def picker_container(pool_name: str, namespace: object, image: str,
                     model_metrics: Mapping[str, str]) -> dict[str, Any]:
    """`model_metrics`: the picker's metric-name flags for the pool's vLLM release."""
    metric_flags = [item for flag, metric in sorted(model_metrics.items()) for item in (flag, metric)]

    # Only the leader is ready; liveness holds on every replica (health.go:46-95).
    def grpc_probe(service: str) -> dict[str, Any]:
        return {"grpc": {"port": HEALTH_PORT, "service": service}}

    return {
        "name": "epp", "image": image,
        "args": ["--pool-name", pool_name, "--pool-namespace", namespace,
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
    }


def picker_deployment_spec(epp: str, container: dict[str, Any], config_digest: str) -> dict[str, Any]:
    """`config_digest`: of the plugin config, which the picker reads once, at start."""
    return {
        "replicas": REPLICAS,
        # A new pod turns ready only once the old leader has released the lease, and the
        # old leader is the one available pod: with maxUnavailable below 100% the
        # Deployment would never scale it down and the rollout would never finish (the
        # chart says so too, epp-deployment.yaml:11-16). 100% surge starts the new pods
        # while the old ones stop, where Recreate would first wait for them to be gone.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"}},
        "selector": {"matchLabels": {"inferencepool": epp}},
        "template": {
            # Outside the mesh: see components/inference_pool.py. The config's digest rolls the
            # picker when its plugins change (it reads the file once, at start).
            "metadata": {"labels": {**picker_labels(epp), "sidecar.istio.io/inject": "false"},
                         "annotations": {"vllm-gke.io/config-sha256": config_digest,
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
                "topologySpreadConstraints": [one_per_node(epp)],
                "containers": [container],
                "volumes": [{"name": "plugins-config", "configMap": {"name": epp}}],
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
    health checks, /metrics for Managed Prometheus' collectors (and host-network scrapers)."""
    ip_blocks = [{"ipBlock": {"cidr": c}} for c in load_balancer_sources]
    return {"podSelector": {"matchLabels": {"inferencepool": epp}}, "policyTypes": ["Ingress"],
            "ingress": [
                # ext_proc and its health port: the load balancer's proxies and health checks.
                {"from": ip_blocks, "ports": [{"protocol": "TCP", "port": EXT_PROC_PORT},
                                              {"protocol": "TCP", "port": HEALTH_PORT}]},
                # /metrics: Managed Prometheus' collectors (and host-network scrapers).
                {"from": [*gmp_collectors(), *({"ipBlock": {"cidr": c}} for c in metrics_sources)],
                 "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ]}


def picker_service_spec(epp: str) -> dict[str, Any]:
    return {"type": "ClusterIP", "selector": {"inferencepool": epp},
            "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT},
                      {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]}


def picker_monitoring_spec(epp: str) -> dict[str, Any]:
    return {"selector": {"matchLabels": {"inferencepool": epp}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}


def pool_spec(epp: str, port: int, selector: Mapping[str, str]) -> dict[str, Any]:
    return {"targetPorts": [{"number": port}], "selector": {"matchLabels": dict(selector)},
            # FailClose: with the picker down, requests fail rather than bypass priorities.
            "endpointPickerRef": {"name": epp, "port": {"number": EXT_PROC_PORT}, "failureMode": "FailClose"}}


def objective_spec(pool_name: str, priority: int) -> dict[str, Any]:
    # The picker matches poolRef's name and group (its default, spelt out).
    return {"poolRef": {"name": pool_name, "group": POOL_GROUP}, "priority": priority}


def pool_ref(pool_name: str) -> dict[str, str]:
    """What the load balancer's policies target, and an HTTPRoute's backendRef to the pool."""
    return {"group": POOL_GROUP, "kind": "InferencePool", "name": pool_name}
