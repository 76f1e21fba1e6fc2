"""Flagger v1.44.0 as the stack installs it (components/flagger.py declares it), as data: the chart's
values, the PromQL endpoint its analysis queries, its loadtester, who may reach them, its own metrics
and the alert on a failed canary. What Flagger does with each is cited in infra/contracts/flagger.py.

Flagger's Prometheus provider authenticates with a static bearer token or basic auth only
(pkg/metrics/providers/prometheus.go:61-103), and Managed Prometheus' query API wants a Google access
token that expires within the hour: Flagger queries Google's PromQL frontend instead
(gke.gcr.io/prometheus-engine/frontend), which forwards each query with its own Workload Identity's
token and answers unauthenticated. So only Flagger's pods may reach it (a tenant must not get a free
PromQL endpoint onto the project's metrics), and the account it runs as may read monitoring data and
nothing else.

The loadtester runs any command POSTed to it (pkg/loadtester/server.go:272-443), with its service
account's rights: only Flagger's pods may reach it, and it may only start the stack's load tests
(rollout_webhooks.py). Flagger itself may create and change Deployments in every namespace (the
chart's ClusterRole), so the loadtester lends it nothing it did not hold.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from .k8s_objects import CONTAINER_SECURITY
from .monitoring import (
    AlertPolicy,
    _policy,  # pyright: ignore[reportPrivateUsage]  # monitoring's one shape of a PromQL alert policy
)
from .picker import gmp_collectors
from .rollouts import FLAGGER_NAMESPACE, FLAGGER_VERSION, GATEWAY_PROVIDER, WORKLOAD_LABEL
from .specs import ImageRef

CHART_VERSION = FLAGGER_VERSION
CHART_REPO = "https://flagger.app"
# The Helm release's name: the chart names its Deployment and service account after it
# (charts/flagger/templates/_helpers.tpl: fullname is the release's name where it holds "flagger").
RELEASE = "flagger"
# The chart's image, by tag: no digest of ghcr.io/fluxcd/flagger:1.44.0 is published where it can be
# checked (the release's manifests and chart name the tag only: artifacts/flagger/deployment.yaml:25).
FLAGGER_IMAGE = ImageRef(repository="ghcr.io/fluxcd/flagger", tag=FLAGGER_VERSION)
# The chart's pod labels (charts/flagger/templates/deployment.yaml:33-35).
FLAGGER_POD_LABELS = {"app.kubernetes.io/name": "flagger", "app.kubernetes.io/instance": RELEASE}
# Flagger's /metrics and /healthz, on the pod port the chart names `http` (deployment.yaml:88-90).
FLAGGER_HTTP_PORT = 8080
# The chart's container runs as this user (values.yaml securityContext.context).
FLAGGER_UID = 10001
FLAGGER_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
# The chart's pod, which the plan does not see, for the system pool's sum (infra/system_pool.py):
# (what, pods, CPU m, memory MiB) at FLAGGER_RESOURCES' requests.
CHART_PODS = (("Flagger", 1, 100, 128),)
SYSTEM_NODES = {"vllm-gke.io/role": "system"}

# Google's PromQL frontend: the release GMP's own example runs (prometheus-engine@v0.17.2,
# examples/frontend.yaml, which GKE's "Query using the Prometheus API or UI" applies), by tag.
FRONTEND = "gmp-frontend"
FRONTEND_IMAGE = ImageRef(repository="gke.gcr.io/prometheus-engine/frontend", tag="v0.15.3-gke.0")
FRONTEND_PORT = 9090
FRONTEND_LABELS = {"app.kubernetes.io/name": FRONTEND}
FRONTEND_UID = 1000

# Flagger's loadtester, at the release its 1.44.0 chart pins (charts/loadtester/values.yaml: 0.38.0);
# its image has bash and kubectl (Dockerfile.loadtester) and runs as user 100, group 101.
LOADTESTER = "flagger-loadtester"
LOADTESTER_IMAGE = ImageRef(repository="ghcr.io/fluxcd/flagger-loadtester", tag="0.38.0")
LOADTESTER_PORT = 8080
LOADTESTER_LABELS = {"app.kubernetes.io/name": LOADTESTER}
LOADTESTER_UID, LOADTESTER_GID = 100, 101
# kubectl caches discovery in $KUBECACHEDIR (infra/contracts/kubectl.py): on the scratch volume.
LOADTESTER_TMP = "/tmp"


def metrics_address() -> str:
    """What the MetricTemplates and Flagger's -metrics-server name: the frontend's Service."""
    return f"http://{FRONTEND}.{FLAGGER_NAMESPACE}.svc.cluster.local:{FRONTEND_PORT}"


def loadtester_url() -> str:
    """The loadtester's Service (port 80); it takes tasks on its root path (server.go:240)."""
    return f"http://{LOADTESTER}.{FLAGGER_NAMESPACE}.svc.cluster.local/"


def chart_values(address: str) -> dict[str, Any]:
    """The flagger chart's values: the Gateway API provider, the frontend for every query, the
    workload label alone as the one Flagger rewrites for the primary (its default list holds
    app.kubernetes.io/name, which every server carries: the primary's pods would then lose it), no
    config tracking (see infra/contracts/flagger.py: flagger_tracks_no_config), no Prometheus of its
    own, the pinned image, a restricted container on the system pool."""
    return {
        "image": {"repository": FLAGGER_IMAGE.repository, "tag": FLAGGER_IMAGE.tag},
        "meshProvider": GATEWAY_PROVIDER,
        "metricsServer": address,
        "selectorLabels": WORKLOAD_LABEL,
        "configTracking": {"enabled": False},
        "prometheus": {"install": False},
        # The gates' MetricTemplates live in flagger-system, the Canaries in the serving namespaces.
        "noCrossNamespaceRefs": False,
        "resources": FLAGGER_RESOURCES,
        "securityContext": {"enabled": True, "context": {
            **CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": FLAGGER_UID, "runAsGroup": FLAGGER_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}},
        "nodeSelector": SYSTEM_NODES,
    }


def _restricted_pod(service_account: str, uid: int, gid: int) -> dict[str, Any]:
    return {"serviceAccountName": service_account, "nodeSelector": SYSTEM_NODES,
            "securityContext": {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid,
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def frontend_deployment_spec(project: str) -> dict[str, Any]:
    """Two replicas: a query that fails counts as a failed check (scheduler_metrics.go:316-325), so
    a drained frontend would fail canaries."""
    probe = {"httpGet": {"path": "/-/ready", "port": "web"}, "periodSeconds": 10}
    return {
        "replicas": 2,
        "selector": {"matchLabels": FRONTEND_LABELS},
        "template": {"metadata": {"labels": FRONTEND_LABELS}, "spec": {
            **_restricted_pod(FRONTEND, FRONTEND_UID, FRONTEND_UID),
            # As GMP's example: the GKE metadata server answers for the pod's service account.
            "automountServiceAccountToken": True,
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                   "labelSelector": {"matchLabels": FRONTEND_LABELS}}}]}},
            "containers": [{
                "name": "frontend", "image": FRONTEND_IMAGE.uri,
                "args": [f"--web.listen-address=:{FRONTEND_PORT}", f"--query.project-id={project}"],
                "ports": [{"name": "web", "containerPort": FRONTEND_PORT}],
                "readinessProbe": probe,
                "livenessProbe": {**probe, "httpGet": {"path": "/-/healthy", "port": "web"}},
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
                "securityContext": CONTAINER_SECURITY}]}},
    }


def service_spec(labels: dict[str, str], port: int, target: str) -> dict[str, Any]:
    return {"selector": dict(labels), "ports": [{"name": "http", "port": port, "targetPort": target}]}


def only_from_flagger(labels: dict[str, str], port: int) -> dict[str, Any]:
    """A NetworkPolicy spec: the pods `labels` select accept Flagger's pods on `port`, nothing else
    (kubelet probes come from the node, which GKE Dataplane V2 always admits)."""
    return {"podSelector": {"matchLabels": dict(labels)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": FLAGGER_POD_LABELS}}],
                         "ports": [{"protocol": "TCP", "port": port}]}]}


def flagger_ingress(metrics_sources: Sequence[str]) -> dict[str, Any]:
    """Flagger's pod serves /metrics only: Managed Prometheus' collectors (and host-network scrapers
    from the node subnet) may reach it."""
    peers = [*gmp_collectors(), *({"ipBlock": {"cidr": c}} for c in metrics_sources)]
    return {"podSelector": {"matchLabels": FLAGGER_POD_LABELS}, "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": FLAGGER_HTTP_PORT}]}]}


def namespace_regexp(namespaces: Sequence[str]) -> str:
    """The loadtester's -namespace-regexp: it refuses tasks for Canaries elsewhere (authorizer.go:35-37)."""
    return "^(" + "|".join(re.escape(n) for n in sorted(set(namespaces))) + ")$"


def loadtester_deployment_spec(canary_namespaces: Sequence[str]) -> dict[str, Any]:
    """The loadtester as its chart runs it (charts/loadtester/templates/deployment.yaml), hardened:
    a read-only root, kubectl's cache on an emptyDir."""
    probe = {"exec": {"command": ["wget", "--quiet", "--tries=1", "--timeout=4", "--spider",
                                  f"http://localhost:{LOADTESTER_PORT}/healthz"]}, "timeoutSeconds": 5}
    return {
        "replicas": 1,
        "selector": {"matchLabels": LOADTESTER_LABELS},
        "template": {"metadata": {"labels": LOADTESTER_LABELS}, "spec": {
            **_restricted_pod(LOADTESTER, LOADTESTER_UID, LOADTESTER_GID),
            # kubectl in its tasks calls the API server as this service account.
            "automountServiceAccountToken": True,
            "containers": [{
                "name": "loadtester", "image": LOADTESTER_IMAGE.uri,
                "command": ["./loadtester", f"-port={LOADTESTER_PORT}", "-log-level=info", "-timeout=5m",
                            f"-namespace-regexp={namespace_regexp(canary_namespaces)}"],
                "ports": [{"name": "http", "containerPort": LOADTESTER_PORT}],
                "env": [{"name": "HOME", "value": LOADTESTER_TMP},
                        {"name": "KUBECACHEDIR", "value": f"{LOADTESTER_TMP}/kube-cache"}],
                "readinessProbe": probe, "livenessProbe": probe,
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
                "securityContext": CONTAINER_SECURITY,
                "volumeMounts": [{"name": "tmp", "mountPath": LOADTESTER_TMP}]}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]}},
    }


def flagger_pod_monitoring() -> dict[str, Any]:
    """Flagger's own metrics (pkg/metrics/recorder.go), from the chart's pod port `http`."""
    return {"selector": {"matchLabels": FLAGGER_POD_LABELS},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}]}


# flagger_canary_status per Canary target and namespace: 0 running, 1 done, 2 failed (recorder.go:86-91,
# 159-171). Flagger's `namespace` label is shadowed by the target's (flagger-system): Managed
# Prometheus keeps it as exported_namespace (infra/contracts/flagger.py: flagger_alert_reads_its_metrics).
CANARY_STATUS = "flagger_canary_status"
CANARY_FAILED = 2


def canary_failed_query(cluster: str) -> str:
    return (f'max by (exported_namespace, name) ({CANARY_STATUS}{{cluster="{cluster}",namespace="{FLAGGER_NAMESPACE}"}})'
            f" == {CANARY_FAILED}")


def canary_failed_alert(cluster: str) -> AlertPolicy:
    """Pages while a pool's last rollout failed: Flagger rolled it back, and the primary serves the
    revision before it until a new one rolls out."""
    return _policy(
        "Canary rolled back", canary_failed_query(cluster), 0,
        "Flagger rolled a serving pool's canary back: a gate broke (TTFT, inter-token latency or errors "
        "against the primary's), the load test or a webhook failed, or the canary did not become ready in "
        "its progress deadline. The pool serves its previous revision. `kubectl -n <namespace> describe "
        "canary <name>` (labels exported_namespace and name) says which check failed; fix the change, "
        "and the next `pulumi up` of it rolls out again.", "ERROR")
