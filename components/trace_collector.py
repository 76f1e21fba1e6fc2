"""TraceCollector: an OpenTelemetry Collector that takes the vLLM servers' spans (vLLM's own and
the guard's) over OTLP/HTTP and writes them to Cloud Trace.

vLLM exports with the OpenTelemetry SDK's batching OTLP exporter (vllm 0.34.0
vllm/tracing/otel.py:83-99); the collector in between keeps Cloud Trace's API, its credentials and
its retries out of the serving pods: the servers hold no Google credential for it, and a slow
Trace API never backs up into a GPU server's memory (the collector's memory_limiter refuses
spans instead, and the SDK drops them).

Who may send spans is decided by the mesh, as for the limit store: STRICT mTLS and one
AuthorizationPolicy admitting only the vLLM servers' service accounts, so no pod elsewhere can
write into the platform's traces. The collector writes to Cloud Trace as its own Kubernetes
service account, granted roles/cloudtrace.agent by Workload Identity Federation (no Google service
account, no key). Its root filesystem is read-only: it writes nothing to disk (its queues are in
memory unless a storage extension is named).

The exporter is `googlecloud` (GoogleCloudPlatform/opentelemetry-operations-go, in the contrib
distribution), beta and the one Google's collector guide long documented; its upstream has
announced it will be superseded by OTLP to telemetry.googleapis.com (otlphttp with the
googleclientauth extension, both in the same image): a config change here when it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s
import yaml

from .k8s_meta import api_body, meta
from .mesh_namespace import mesh_lock
from .model.gcp_apis import TRACE_API
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.mesh_identity import client_principal
from .model.specs import ImageRef
from .options import child_opts
from .project_apis import ProjectApis
from .workload_identity import workload_principal

NAMESPACE = "vllm-gke-telemetry"
NAME = "traces"
SERVICE_ACCOUNT = "otel-collector"
OTLP_HTTP_PORT = 4318
HEALTH_PORT = 13133
# The collector image's user: otelcol-contrib's image is FROM scratch with USER 10001:10001
# (opentelemetry-collector-releases v0.159.0 distributions/otelcol-contrib/Dockerfile:4-8).
COLLECTOR_UID = 10001
MEMORY_LIMIT_MI = 512
LABELS = {"app.kubernetes.io/name": "vllm-gke-traces"}


def endpoint() -> str:
    """The URL the servers post spans to (the SDK's HTTP exporter posts to it as given)."""
    return f"http://{NAME}.{NAMESPACE}.svc.cluster.local:{OTLP_HTTP_PORT}/v1/traces"


def collector_config(project: str) -> str:
    """The collector's pipeline (v0.159.0): OTLP/HTTP in, memory_limiter first (it refuses spans
    before the pod runs out of memory, from the cgroup's limit), batched as Google's exporter
    README advises (200 spans), to Cloud Trace's v2 API. The receiver and the health check listen
    on all addresses: their defaults are localhost only (opentelemetry-collector v0.159.0
    receiver/otlpreceiver/factory.go:49; contrib's healthcheck config), and the mesh delivers
    to the pod's IP, as the rewritten kubelet probes do. Its own metrics are off (by default a
    listener on :8888 that nothing scrapes)."""
    config = {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"0.0.0.0:{OTLP_HTTP_PORT}"}}}},
        "processors": {
            "memory_limiter": {"check_interval": "1s", "limit_percentage": 80, "spike_limit_percentage": 20},
            "batch": {"send_batch_size": 200, "send_batch_max_size": 200},
        },
        "exporters": {"googlecloud": {"project": project}},
        "extensions": {"health_check": {"endpoint": f"0.0.0.0:{HEALTH_PORT}", "path": "/"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"],
                                     "exporters": ["googlecloud"]}},
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class TraceCollectorArgs:
    project: str
    provider: k8s.Provider
    # The cluster's Workload Identity pool (<project>.svc.id.goog), for the collector's grant.
    workload_pool: pulumi.Input[str]
    # Namespaces whose vLLM servers (service account vllm-server) may send spans.
    client_namespaces: Sequence[str]
    image: ImageRef
    apis: Optional[ProjectApis] = None


class TraceCollector(pulumi.ComponentResource):
    endpoint: str

    def __init__(self, name: str, args: TraceCollectorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:TraceCollector", name, None, opts)
        self.endpoint = endpoint()
        grant = self._grant(name, args, opts)
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=meta(NAMESPACE, labels={"istio-injection": "enabled"}),
            opts=child_opts(self, opts, provider=args.provider))
        in_ns = child_opts(self, opts, provider=args.provider, depends_on=[namespace])

        def md(obj: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(obj, labels=LABELS), "namespace": namespace.metadata.name}

        mesh_lock(name, md, LABELS, ("allow-servers", "allow-vllm-servers"),
                  [client_principal(n) for n in args.client_namespaces],
                  {"ports": [str(OTLP_HTTP_PORT)], "methods": ["POST"], "paths": ["/v1/traces"]}, in_ns)
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=md(SERVICE_ACCOUNT),
                                        automount_service_account_token=False, opts=in_ns)
        text = collector_config(args.project)
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=md(NAME), data={"collector.yaml": text}, opts=in_ns)
        k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata=md(NAME), spec=api_body(deployment_spec(args.image.uri, text)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa, namespace, grant]))
        k8s.core.v1.Service(
            f"{name}-svc", metadata=md(NAME),
            # http- name: the mesh parses it as HTTP, so the AuthorizationPolicy's method and path apply.
            spec=api_body({"type": "ClusterIP", "selector": LABELS,
                           "ports": [{"name": "http-otlp", "port": OTLP_HTTP_PORT, "targetPort": "http-otlp"}]}),
            opts=in_ns)
        self.register_outputs({"endpoint": self.endpoint, "clients": sorted(args.client_namespaces)})

    def _grant(self, name: str, args: TraceCollectorArgs, opts: Optional[pulumi.ResourceOptions]) -> gcp.projects.IAMMember:
        """Writes spans, nothing else (roles/cloudtrace.agent: cloudtrace.traces.patch)."""
        needs = args.apis.needs("cloudresourcemanager.googleapis.com", TRACE_API) if args.apis else []
        number = gcp.organizations.get_project_output(project_id=args.project).number
        return gcp.projects.IAMMember(
            f"{name}-trace-agent", project=args.project, role="roles/cloudtrace.agent",
            member=workload_principal(number, args.workload_pool, NAMESPACE, SERVICE_ACCOUNT),
            opts=child_opts(self, opts, depends_on=needs))


def deployment_spec(image: str, config_text: str) -> dict[str, Any]:
    """The collector's Deployment: two replicas on different nodes where it can, in the mesh, its
    config's digest rolling it (it reads the config once, at start)."""
    health = {"httpGet": {"path": "/", "port": "health"}}
    return {
        # Two, so a node drain leaves one taking spans.
        "replicas": 2,
        "selector": {"matchLabels": LABELS},
        "template": {
            "metadata": {"labels": LABELS, "annotations": {
                # The collector reads its config once, at start.
                "vllm-gke.io/config-sha256": content_digest(config_text),
                # Its token requests reach the GKE metadata server directly, not through Envoy,
                # and it starts once the sidecar can carry its calls to Cloud Trace.
                "traffic.sidecar.istio.io/excludeOutboundIPRanges": "169.254.169.254/32",
                "proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}',
            }},
            "spec": {
                "serviceAccountName": SERVICE_ACCOUNT,
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": COLLECTOR_UID,
                                    "runAsGroup": COLLECTOR_UID, "seccompProfile": {"type": "RuntimeDefault"}},
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                       "labelSelector": {"matchLabels": LABELS}}}]}},
                "containers": [{
                    "name": "collector", "image": image,
                    "args": ["--config=/etc/otelcol/collector.yaml"],
                    "ports": [{"name": "http-otlp", "containerPort": OTLP_HTTP_PORT},
                              {"name": "health", "containerPort": HEALTH_PORT}],
                    # The Go runtime's soft limit under the container's, so it collects
                    # garbage before memory_limiter has to refuse spans.
                    "env": [{"name": "GOMEMLIMIT", "value": f"{MEMORY_LIMIT_MI * 4 // 5}MiB"}],
                    "readinessProbe": {**health, "periodSeconds": 5},
                    "livenessProbe": {**health, "periodSeconds": 15, "failureThreshold": 3},
                    "resources": {"requests": {"cpu": "200m", "memory": f"{MEMORY_LIMIT_MI // 2}Mi"},
                                  "limits": {"cpu": "1", "memory": f"{MEMORY_LIMIT_MI}Mi"}},
                    "securityContext": CONTAINER_SECURITY,
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/otelcol", "readOnly": True}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": NAME}}],
            },
        },
    }
