"""The trace path: vLLM's OpenTelemetry exporter and the OpenTelemetry Collector that takes its
spans to Cloud Trace."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import yaml

from ...components.model.specs.operations import COLLECTOR_VERSION
from ...components.trace_collector import COLLECTOR_UID, SERVICE_ACCOUNT
from ..plan import Plan
from .base import Contract, _docs, _env, _flag, _guard_configs, _vllm_containers

SAMPLER = "parentbased_traceidratio"


def vllm_exports_traces_as_configured(plan: Plan) -> list[str]:
    out = []
    configs = dict(_guard_configs(plan))
    for name, c in _vllm_containers(plan):
        endpoint = _flag(c["args"], "--otlp-traces-endpoint")
        if endpoint is None:
            continue
        env = _env(c)
        if env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") != "http/protobuf" or not endpoint.endswith("/v1/traces"):
            out.append(f"{name}: OTLP/HTTP to a URL ending /v1/traces is what the collector's receiver takes; "
                       f"the exporter is {env.get('OTEL_EXPORTER_OTLP_TRACES_PROTOCOL') or 'grpc'} to {endpoint}")
        if "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in env:
            out.append(f"{name}: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is vLLM's to set (from its flag)")
        if env.get("OTEL_TRACES_SAMPLER") != SAMPLER:
            out.append(f"{name}: sampler {env.get('OTEL_TRACES_SAMPLER') or 'parentbased_always_on'}: every root span "
                       f"is recorded; {SAMPLER} samples at monitoring.traces.sampleRatio")
        if not configs.get(name, {}).get("traces"):
            out.append(f"{name}: the guard starts no span: vLLM's spans carry no tenant")
    return out


def _collectors(plan: Plan) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each collector Deployment and its parsed config."""
    maps = {(m["metadata"]["namespace"], m["metadata"]["name"]): m for m in _docs(plan, "ConfigMap")}
    out = []
    for d in _docs(plan, "Deployment"):
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            if "opentelemetry-collector" not in str(c.get("image")):
                continue
            volume = next(v for v in pod["volumes"] if v.get("configMap"))
            cm = maps[(d["metadata"]["namespace"], volume["configMap"]["name"])]
            out.append((d, yaml.safe_load(next(iter(cm["data"].values())))))
    return out


def collector_listens_and_writes_to_trace(plan: Plan) -> list[str]:
    out = []
    sent = {urlparse(endpoint).hostname for _, c in _vllm_containers(plan)
            if (endpoint := _flag(c["args"], "--otlp-traces-endpoint"))}
    services = {f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local" for s in _docs(plan, "Service")}
    out += [f"vLLM sends spans to {h}, which no Service of the plan is" for h in sorted(str(x) for x in sent - services)]
    collectors = _collectors(plan)
    if sent and not collectors:
        out.append("vLLM sends spans but the plan runs no collector")
    grants = [r for r in plan.resources if r.type == "gcp:projects/iAMMember:IAMMember"
              and r.props.get("role") == "roles/cloudtrace.agent"]
    for d, config in collectors:
        name = d["metadata"]["name"]
        http = config["receivers"]["otlp"]["protocols"].get("http") or {}
        if not str(http.get("endpoint", "localhost")).startswith("0.0.0.0:"):
            out.append(f"{name}: the OTLP receiver listens on {http.get('endpoint', 'localhost:4318')}: "
                       "the mesh delivers to the pod's IP")
        health = (config.get("extensions") or {}).get("health_check") or {}
        if not str(health.get("endpoint", "localhost")).startswith("0.0.0.0:"):
            out.append(f"{name}: health_check listens on localhost: the rewritten probes call the pod's IP")
        pod = d["spec"]["template"]["spec"]
        if pod["securityContext"].get("runAsUser") != COLLECTOR_UID:
            out.append(f"{name}: the image's user is {COLLECTOR_UID}")
        ns = d["metadata"]["namespace"]
        if not any(str(g.props.get("member", "")).endswith(f"/subject/ns/{ns}/sa/{pod.get('serviceAccountName')}")
                   for g in grants) or pod.get("serviceAccountName") != SERVICE_ACCOUNT:
            out.append(f"{name}: its service account has no roles/cloudtrace.agent: Cloud Trace refuses its spans")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("vLLM", "0.34.0",
             "--otlp-traces-endpoint starts a TracerProvider (sampler from OTEL_TRACES_SAMPLER) with a batching "
             "OTLP exporter, gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (which posts to the URL "
             "as given), and sets OTEL_EXPORTER_OTLP_TRACES_ENDPOINT itself; each request's llm_request span "
             "continues the traceparent of its HTTP request; tracing asserts the stat logger's iteration stats",
             "vllm-project/vllm@v0.34.0:vllm/tracing/otel.py:60-102; vllm/entrypoints/serve/engine/serving.py:42-47; "
             "vllm/v1/engine/output_processor.py:944-1004; vllm/v1/engine/async_llm.py:150-152",
             "servers export OTLP/HTTP to the collector's /v1/traces, sample parentbased_traceidratio, the guard "
             "(traces on) hands vLLM its own span's context; extraArgs may not set --disable-log-stats",
             vllm_exports_traces_as_configured),
    Contract("OpenTelemetry Collector (contrib)", COLLECTOR_VERSION,
             "the OTLP receiver and the health_check extension listen on localhost unless told otherwise; the "
             "image runs as 10001 and writes nothing; the googlecloud exporter writes with the pod's "
             "credentials (roles/cloudtrace.agent) to Cloud Trace's v2 API",
             "open-telemetry/opentelemetry-collector@v0.159.0:receiver/otlpreceiver/factory.go:23,49; "
             "open-telemetry/opentelemetry-collector-releases@v0.159.0:distributions/otelcol-contrib/Dockerfile:4-15; "
             "GoogleCloudPlatform/opentelemetry-operations-go@exporter/collector/v0.59.0:exporter/collector/"
             "config.go:391-412, README.md:17-32",
             "the collector listens on 0.0.0.0, runs as 10001 under a read-only root, and its service account "
             "holds roles/cloudtrace.agent by Workload Identity; the servers' endpoint is its Service",
             collector_listens_and_writes_to_trace),
)
