"""SloMetrics: a Job that makes the metrics the SLOs read known to Cloud Monitoring before the SLOs.

Cloud Monitoring refuses an SLO whose filter names a metric without a descriptor ("The metric
referenced by the provided filter is unknown"), and prometheus.googleapis.com descriptors cannot
be created through the API: a user-defined metric type is custom.googleapis.com or
external.googleapis.com (MetricDescriptor.type,
https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.metricDescriptors); Managed
Prometheus creates one when it first ingests the metric. On a new project no replica has been
scraped when the SLOs are created, and a pool at minReplicas 0 may never run one. So this Job
serves every Managed Prometheus metric the SLO filters name, with the label keys they name, at
zero, scraped by its own PodMonitoring, and succeeds once each descriptor exists (read with
roles/monitoring.viewer by Workload Identity). Pulumi waits for a Job to succeed; the SLOs depend
on it. Its series have their own label values, which no SLO selects, and stay at zero.
(components/scripts/seed_slo_metrics.py)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, cast

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.picker import gmp_collectors
from .model.specs import ImageRef
from .options import child_opts
from .project_apis import ProjectApis
from .standby import DEFAULT_IMAGE
from .workload_identity import workload_principal

NAMESPACE = "vllm-gke-slo-metrics"
NAME = "slo-metrics"
PORT = 9090
PROGRAM = "seed_slo_metrics.py"
# Each series' own value of every label: no SLO filter selects it.
SEED = "vllm-gke-seed"
UID = 65534
# Managed Prometheus's scrape, ingestion and descriptor creation take minutes; past this the
# Job fails and `pulumi up` with it, saying which metric never arrived.
DEADLINE_SECONDS = 1800
GMP = "prometheus.googleapis.com/"


def prometheus_metrics(slis: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Each Managed Prometheus metric type the SLIs' filters name, with the metric labels they name."""
    out: dict[str, set[str]] = {}
    for flt in (f for sli in slis for f in _strings(sli)):
        kind = re.search(r'metric\.type="([^"]+)"', flt)
        if kind and kind.group(1).startswith(GMP):
            out.setdefault(kind.group(1), set()).update(re.findall(r'metric\.label\."([^"]+)"', flt))
    return {t: sorted(labels) for t, labels in sorted(out.items())}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in cast(dict[str, Any], value).values() for s in _strings(v)]
    return []


def exposition(metric_type: str, labels: Sequence[str], bounds: Sequence[float] = ()) -> str:
    """One zero series of the metric, as Prometheus' text format names it for that Managed
    Prometheus type (prometheus.googleapis.com/NAME/KIND). A histogram has a bucket per finite
    bound, `le` written as the servers' client library writes it, and +Inf: Managed Prometheus
    drops a histogram with no finite bound (prometheus-engine v0.12.0 pkg/export/transform.go:332-335),
    so its descriptor would never be created."""
    name, kind = metric_type[len(GMP):].rsplit("/", 1)
    pairs = ",".join(f'{k}="{SEED}"' for k in labels)
    if kind == "histogram":
        if not bounds:
            raise ValueError(f"{metric_type}: a seeded histogram needs the servers' finite bucket bounds")
        rows: list[str] = []
        for le in [*(le_value(b) for b in bounds), "+Inf"]:
            with_le = ",".join([pairs, f'le="{le}"'] if pairs else [f'le="{le}"'])
            rows.append(f"{name}_bucket{{{with_le}}} 0\n")
        buckets = "".join(rows)
        return f"# TYPE {name} histogram\n{buckets}{name}_sum{{{pairs}}} 0\n{name}_count{{{pairs}}} 0\n"
    prom_kind = {"counter": "counter", "gauge": "gauge"}[kind]
    return f"# TYPE {name} {prom_kind}\n{name}{{{pairs}}} 0\n"


def le_value(bound: float) -> str:
    """A bucket bound as prometheus_client writes `le` (utils.floatToGoString: repr of the float,
    Go's exponent form from 1e7), so the seeded buckets are the servers' own."""
    s = repr(float(bound))
    dot = s.find(".")
    if bound > 0 and dot > 6:
        return f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.") + f"e+0{dot - 1}"
    return s


def seed_config(project: str, slis: Sequence[dict[str, Any]],
                histogram_bounds: Optional[Mapping[str, Sequence[float]]] = None) -> dict[str, Any]:
    """`histogram_bounds`: per histogram type, the finite bounds the servers export it with."""
    bounds = histogram_bounds or {}
    return {"project": project, "port": PORT,
            "metrics": [{"type": t, "text": exposition(t, labels, bounds.get(t, ()))}
                        for t, labels in prometheus_metrics(slis).items()]}


def program_text() -> str:
    return (Path(__file__).parent / "scripts" / PROGRAM).read_text()


@dataclass
class SloMetricsArgs:
    project: str
    provider: k8s.Provider
    workload_pool: pulumi.Input[str]
    # The SLOs' request-based SLIs (Objective.sli): what their filters name is seeded.
    slis: Sequence[dict[str, Any]]
    # Per histogram the SLIs read, the finite bucket bounds the servers export it with.
    histogram_bounds: Mapping[str, Sequence[float]] = field(default_factory=dict[str, Sequence[float]])
    # The node subnet: collectors on the host network scrape from a node's address.
    metrics_sources: Sequence[str] = ()
    image: ImageRef = DEFAULT_IMAGE
    apis: Optional[ProjectApis] = None


class SloMetrics(pulumi.ComponentResource):
    """Depend on `job` before creating SLOs on Managed Prometheus metrics."""

    job: k8s.batch.v1.Job
    config: dict[str, Any]

    def __init__(self, name: str, args: SloMetricsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:SloMetrics", name, None, opts)
        self.config = seed_config(args.project, args.slis, args.histogram_bounds)
        labels = {"app.kubernetes.io/name": "vllm-gke-slo-metrics"}
        k8s_opts = child_opts(self, opts, provider=args.provider)
        needs = args.apis.needs("cloudresourcemanager.googleapis.com", "monitoring.googleapis.com") if args.apis else []
        number = gcp.organizations.get_project_output(project_id=args.project).number
        # Reads monitoring data (the descriptors the Job waits for are what it needs).
        grant = gcp.projects.IAMMember(
            f"{name}-viewer", project=args.project, role="roles/monitoring.viewer",
            member=workload_principal(number, args.workload_pool, NAMESPACE, NAME),
            opts=child_opts(self, opts, depends_on=needs))
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        in_ns = child_opts(self, opts, provider=args.provider, depends_on=[ns])

        def md(obj: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(obj, labels=labels), "namespace": ns.metadata.name}

        # Outside the mesh: only Managed Prometheus' collectors may connect, to the metrics port.
        k8s.networking.v1.NetworkPolicy(f"{name}-scrape-only", metadata=md("scrape-only"),
                                        spec=api_body(scrape_only(args.metrics_sources)), opts=in_ns)
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=md(NAME), automount_service_account_token=False,
                                        opts=in_ns)
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=md(NAME), opts=in_ns,
                                       data={"seed.json": json.dumps(self.config, indent=1), PROGRAM: program_text()})
        monitoring = custom_resource(
            f"{name}-podmonitoring", "monitoring.googleapis.com/v1", "PodMonitoring", md(NAME),
            {"selector": {"matchLabels": labels}, "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]},
            in_ns)
        self.job = k8s.batch.v1.Job(
            f"{name}-job", metadata={**md(NAME), "annotations": {"pulumi.com/timeoutSeconds": str(DEADLINE_SECONDS + 300)}},
            spec=api_body(job_spec(args.image.uri, labels, content_digest(json.dumps(self.config, sort_keys=True)))),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa, monitoring, grant]))
        self.register_outputs({"metrics": [m["type"] for m in self.config["metrics"]]})


def scrape_only(metrics_sources: Sequence[str]) -> dict[str, Any]:
    """Ingress to the metrics port from Managed Prometheus' collectors only: their namespace on
    either kind of install (gmp_collectors: gke-gmp-system where GKE manages them) and the node
    subnet, as the picker's metrics port admits them (model/picker.py)."""
    sources = [*gmp_collectors(), *({"ipBlock": {"cidr": c}} for c in metrics_sources)]
    return {"podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": sources, "ports": [{"port": PORT, "protocol": "TCP"}]}]}


def job_spec(image: str, labels: dict[str, str], digest: str) -> dict[str, Any]:
    """The seeding Job: on the system pool, outside the mesh, the program from its ConfigMap; a
    new metric (`digest`, of what it seeds) replaces it, so it runs again before the new SLO."""
    return {
        "backoffLimit": 6,
        "activeDeadlineSeconds": DEADLINE_SECONDS,
        "template": {
            # Its token requests go to the GKE metadata server; no sidecar to wait for or to stop.
            "metadata": {"labels": labels, "annotations": {"sidecar.istio.io/inject": "false",
                                                           "vllm-gke.io/config-sha256": digest}},
            "spec": {
                "serviceAccountName": NAME,
                "automountServiceAccountToken": False,
                "restartPolicy": "OnFailure",
                "nodeSelector": {"vllm-gke.io/role": "system"},
                "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "seed", "image": image, "command": ["python", f"/etc/seed/{PROGRAM}"],
                    "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                    "ports": [{"name": "metrics", "containerPort": PORT}],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                  "limits": {"cpu": "200m", "memory": "128Mi"}},
                    "securityContext": CONTAINER_SECURITY,
                    "volumeMounts": [{"name": "seed", "mountPath": "/etc/seed", "readOnly": True}],
                }],
                "volumes": [{"name": "seed", "configMap": {"name": NAME}}],
            },
        },
    }
