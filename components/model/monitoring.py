"""The Cloud Monitoring dashboards and alert policies over Managed Prometheus, as data in the
Cloud Monitoring API's shape (components/observability.py declares them; the offline plan parses
both with the API's own protos, infra/manifests.py, so a misspelt field fails at plan time)."""

from __future__ import annotations

from typing import Any, Sequence

from .service_levels import budget_tiles
from .specs import MonitoringSpec

# An alert policy as gcp.monitoring.AlertPolicy keyword arguments (the API's fields, snake_case).
AlertPolicy = dict[str, Any]


def kv_cache_usage(cluster: str, metric: str = "vllm:kv_cache_usage_perc") -> str:
    """The release's KV-cache gauge (gpu_cache_usage_perc is gone from current vLLM)."""
    return f'max by (model_name, pod) ({metric}{{cluster="{cluster}"}})'


def p95(metric: str, cluster: str) -> str:
    return (f'histogram_quantile(0.95, sum by (le, model_name) '
            f'(rate({metric}_bucket{{cluster="{cluster}"}}[5m])))')


def fb_used_ratio(cluster: str) -> str:
    sel = f'{{cluster="{cluster}"}}'
    return f"max by (Hostname, gpu, GPU_I_ID) (DCGM_FI_DEV_FB_USED{sel} / (DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel}))"


# The guard's count of requests limited per replica because the shared limit store did not answer
# (images/vllm_gke_guard/metrics.py STORE_FALLBACKS), on every vLLM replica's /metrics.
FALLBACKS_METRIC = "vllm_gke_guard_limit_store_fallbacks_total"


def fallbacks(cluster: str) -> str:
    return f'sum by (namespace) (rate({FALLBACKS_METRIC}{{cluster="{cluster}"}}[5m]))'


# Tenant requests the guard refused because they did not come from the sidecar's passthrough
# address (images/vllm_gke_guard/metrics.py UNTRUSTED_PEERS).
UNTRUSTED_PEER_METRIC = "vllm_gke_guard_untrusted_peer_requests_total"


def untrusted_peers(cluster: str) -> str:
    return f'sum by (namespace, pod) (rate({UNTRUSTED_PEER_METRIC}{{cluster="{cluster}"}}[5m]))'


def waiting_and_running(cluster: str) -> str:
    """Both gauges per model, told apart by a `state` label: PromQL's `or` keeps a right-hand
    series only where no left-hand one has the same labels, so a bare `waiting or running`
    never shows running."""
    sel = f'{{cluster="{cluster}"}}'
    return " or ".join(f'label_replace(sum by (model_name) (vllm:num_requests_{state}{sel}), "state", "{state}", "", "")'
                       for state in ("waiting", "running"))


def tpu_panels(cluster: str) -> list[tuple[str, str]]:
    """GKE's TPU system metrics per serving pod and chip (kubernetes.io/container/accelerator/*, as
    Managed Prometheus names them): TensorCore and HBM bandwidth use, busy time, HBM held."""
    # make="cloud-tpu": the same metric types carry the GPUs' too.
    sel = f'{{monitored_resource="k8s_container",cluster_name="{cluster}",make="cloud-tpu"}}'

    def metric(name: str) -> str:
        return f"kubernetes_io:container_accelerator_{name}{sel}"

    return [
        ("TPU TensorCore utilisation (%)", f"avg by (pod_name, accelerator_id) ({metric('tensorcore_utilization')})"),
        ("TPU HBM bandwidth utilisation (%)",
         f"avg by (pod_name, accelerator_id) ({metric('memory_bandwidth_utilization')})"),
        ("TPU duty cycle (%)", f"avg by (pod_name, accelerator_id) ({metric('duty_cycle')})"),
        ("TPU HBM used ratio", f"sum by (pod_name) ({metric('memory_used')}) / sum by (pod_name) ({metric('memory_total')})"),
    ]


def dashboard_panels(cluster: str, kv_metric: str = "vllm:kv_cache_usage_perc",
                     limit_store: bool = False, tpu: bool = False) -> list[tuple[str, str]]:
    sel = f'{{cluster="{cluster}"}}'
    store = [("Requests limited per replica: limit store unreachable (/s)", fallbacks(cluster))] if limit_store else []
    return [*store, *(tpu_panels(cluster) if tpu else []),
        ("Tenant requests refused: not from the mesh sidecar (/s)", untrusted_peers(cluster)),
        # DCGM_FI_DEV_GPU_UTIL is per physical GPU and not reported for MIG instances; the
        # profiling metric is, per instance (GPU_I_ID), and for whole GPUs alike.
        ("GPU utilisation per GPU or MIG slice (DCGM engine active)",
         f"avg by (Hostname, gpu, GPU_I_ID) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel})"),
        ("Tensor cores active (DCGM)", f"avg by (Hostname, gpu, GPU_I_ID) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{sel})"),
        ("GPU memory used ratio (DCGM)", fb_used_ratio(cluster)),
        ("Queue time p95 (s)", p95("vllm:request_queue_time_seconds", cluster)),
        ("Time to first token p95 (s)", p95("vllm:time_to_first_token_seconds", cluster)),
        ("End-to-end latency p95 (s)", p95("vllm:e2e_request_latency_seconds", cluster)),
        ("Generation tokens/s", f"sum by (model_name) (rate(vllm:generation_tokens_total{sel}[5m]))"),
        ("Prompt tokens/s", f"sum by (model_name) (rate(vllm:prompt_tokens_total{sel}[5m]))"),
        ("KV-cache usage", kv_cache_usage(cluster, kv_metric)),
        ("Requests waiting / running", waiting_and_running(cluster)),
        ("Preemptions/s (KV-cache pressure)", f"sum by (model_name) (rate(vllm:num_preemptions_total{sel}[5m]))"),
    ]


# Shed requests the guards sent to a fallback model (models[].fallback), by outcome: served there,
# cut (its answer broke off midway), or refused (the client got the 429, also counted `shed`) -
# images/vllm_gke_guard/metrics.py FALLBACK_REQUESTS.
FALLBACK_REQUESTS_METRIC = "vllm_gke_tenant_fallback_requests_total"


def tenant_panels(cluster: str, fallback: bool = False) -> list[tuple[str, str]]:
    """Per tenant and model, from the guard's counts of each request (vLLM's own token counts);
    with `fallback`, the shed requests sent to a fallback model."""
    sel = f'{{cluster="{cluster}"}}'
    sent = [("Shed requests sent to a fallback model/s (served there, cut midway, or refused: answered 429)",
             f"sum by (tenant, model, fallback, outcome) (rate({FALLBACK_REQUESTS_METRIC}{sel}[5m]))")]
    return [*(sent if fallback else []),
        ("Tenant requests/s by outcome",
         f"sum by (tenant, model, outcome) (rate(vllm_gke_tenant_requests_total{sel}[5m]))"),
        ("Tenant prompt tokens/s", f"sum by (tenant, model) (rate(vllm_gke_tenant_prompt_tokens_total{sel}[5m]))"),
        ("Tenant generated tokens/s",
         f"sum by (tenant, model) (rate(vllm_gke_tenant_generation_tokens_total{sel}[5m]))"),
    ]


def dashboard_json(title: str, cluster: str, kv_metric: str = "vllm:kv_cache_usage_perc",
                   limit_store: bool = False, budgets: Sequence[tuple[str, str]] = (), tpu: bool = False,
                   fallback: bool = False) -> dict[str, Any]:
    """A Mosaic layout, two tiles a row, each a PromQL line chart; then each SLO's error budget
    remaining (`budgets`: title and SLO resource name; `fallback`: a model has a fallback)."""
    queries = [(name, {"prometheusQuery": query}) for name, query in
               [*dashboard_panels(cluster, kv_metric, limit_store, tpu), *tenant_panels(cluster, fallback)]]
    tiles: list[dict[str, Any]] = []
    for i, (name, query) in enumerate([*queries, *budget_tiles(budgets)]):
        tiles.append({
            "xPos": (i % 2) * 24, "yPos": (i // 2) * 16, "width": 24, "height": 16,
            "widget": {"title": name, "xyChart": {
                "chartOptions": {"mode": "COLOR"},
                "dataSets": [{"plotType": "LINE", "targetAxis": "Y1", "timeSeriesQuery": query}],
            }},
        })
    return {"displayName": title, "mosaicLayout": {"columns": 48, "tiles": tiles}}


def tenant_dashboard_json(title: str, cluster: str, tenants: Sequence[str],
                          budgets: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """One row per tenant: its requests by outcome, its tokens as vLLM counted them (per model),
    and its availability SLO's error budget remaining (`budgets`: title and SLO resource name of
    the tenants' objectives, titled "tenant <name>: ...")."""
    tiles: list[dict[str, Any]] = []

    def chart(i: int, name: str, data_sets: list[dict[str, Any]]) -> None:
        tiles.append({"xPos": (i % 3) * 16, "yPos": (i // 3) * 16, "width": 16, "height": 16,
                      "widget": {"title": name, "xyChart": {"chartOptions": {"mode": "COLOR"}, "dataSets": data_sets}}})

    def line(query: dict[str, Any], legend: str = "") -> dict[str, Any]:
        return {"plotType": "LINE", "targetAxis": "Y1", "timeSeriesQuery": query,
                **({"legendTemplate": legend} if legend else {})}

    for row, tenant in enumerate(tenants):
        sel = f'{{cluster="{cluster}",tenant="{tenant}"}}'
        chart(3 * row, f"{tenant}: requests/s by outcome", [line({"prometheusQuery": (
            f"sum by (model, outcome) (rate(vllm_gke_tenant_requests_total{sel}[5m]))")})])
        chart(3 * row + 1, f"{tenant}: tokens/s, as vLLM counted them", [
            line({"prometheusQuery": f"sum by (model) (rate(vllm_gke_tenant_prompt_tokens_total{sel}[5m]))"},
                 "prompt ${labels.model}"),
            line({"prometheusQuery": f"sum by (model) (rate(vllm_gke_tenant_generation_tokens_total{sel}[5m]))"},
                 "generated ${labels.model}")])
        mine = [(t, n) for t, n in budgets if t.startswith(f"tenant {tenant}:")]
        for t, query in budget_tiles(mine)[:1]:
            chart(3 * row + 2, t, [line(query)])
    return {"displayName": title, "mosaicLayout": {"columns": 48, "tiles": tiles}}


def _policy(name: str, query: str, duration_s: int, doc: str, severity: str) -> AlertPolicy:
    condition: dict[str, Any] = {"query": query, "evaluation_interval": "60s"}
    if duration_s:
        condition["duration"] = f"{duration_s}s"
    return {
        "display_name": name,
        "combiner": "OR",
        "severity": severity,
        "documentation": {"content": doc, "mime_type": "text/markdown"},
        "conditions": [{"display_name": name, "condition_prometheus_query_language": condition}],
    }


def shed_rate(cluster: str) -> str:
    """Requests shed for overload per second, per tenant and model: the guard's `shed` outcome (a
    429), and the shed requests a fallback model took instead (not `refused`: those are `shed`
    too). A pool whose overflow the fallback absorbs is as short of replicas as one answering 429.
    Their series differ in labels (outcome, fallback), so `or` keeps both for the sum."""
    return (f'sum by (tenant, model) (rate(vllm_gke_tenant_requests_total{{cluster="{cluster}",outcome="shed"}}[5m]) '
            f'or rate({FALLBACK_REQUESTS_METRIC}{{cluster="{cluster}",outcome!="refused"}}[5m]))')


def alert_policies(cluster: str, spec: MonitoringSpec, kv_metric: str = "vllm:kv_cache_usage_perc",
                   limit_store: bool = False, always_on: Sequence[str] = (),
                   sheddable: bool = False) -> list[AlertPolicy]:
    """The threshold alerts; `always_on`, the models with a replica floor, each paged when no
    replica of it reports at all (its SLOs' signal is then gone, so no burn rate can page);
    `sheddable`, some tenant has a negative priority: a ticket while tenants are shed."""
    sel = f'{{cluster="{cluster}"}}'
    store = [_policy(
        "Shared limit store unreachable", f"{fallbacks(cluster)} > 0", 300,
        "For 5 minutes guards could not reach the shared limit store (LimitStore) and limited tenants per "
        "replica: a tenant may get up to its limit on every replica. Check the limits Deployment in "
        "vllm-gke-limits and its mesh policy.", "ERROR")] if limit_store else []
    return [*store,
        _policy("Tenant requests bypass or miss the mesh sidecar", f"{untrusted_peers(cluster)} > 0", 300,
                "For 5 minutes a vLLM replica's guard refused tenant requests that did not come from the Istio "
                "sidecar's inbound passthrough address (127.0.0.6). Either something in the pod calls vLLM "
                "directly, or the mesh's data plane delivers from another address: the replica's log names it. "
                "Check `gcloud container fleet mesh describe` (controlPlaneManagement.implementation) and the "
                "docs' 'Managed Cloud Service Mesh' (docs/guides/mesh.md).", "ERROR"),
        _policy("vLLM container restarts (GPU OOM or crash)",
                f'sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total'
                f'{{cluster="{cluster}", container="vllm"}}[15m])) > 0', 0,
                "A vLLM container restarted. Check for CUDA OOM in its logs; lower "
                "gpuMemoryUtilization or maxNumSeqs, or cap maxModelLen.", "ERROR"),
        _policy("GPU memory nearly exhausted", f"{fb_used_ratio(cluster)} > 0.98", 300,
                "GPU framebuffer above 98% for 5 minutes: the next long request may OOM.", "WARNING"),
        _policy("Queue latency SLO breached",
                f'{p95("vllm:request_queue_time_seconds", cluster)} > {spec.queue_latency_slo_seconds:g}', 300,
                f"p95 queue time above {spec.queue_latency_slo_seconds:g}s for 5 minutes. KEDA should be "
                "adding replicas; if the pool is at maxReplicas, raise it or add node pool capacity.", "ERROR"),
        _policy("Time-to-first-token SLO breached",
                f'{p95("vllm:time_to_first_token_seconds", cluster)} > {spec.ttft_slo_seconds:g}', 300,
                f"p95 TTFT above {spec.ttft_slo_seconds:g}s for 5 minutes.", "WARNING"),
        _policy("KV cache nearly full",
                f"({kv_cache_usage(cluster, kv_metric)}) > {spec.kv_cache_alert_ratio:g}", 600,
                "KV-cache usage high for 10 minutes: requests are being preempted. Lower maxNumSeqs, "
                f"enable fp8 KV cache, or scale out. Preemptions: vllm:num_preemptions_total{sel}.",
                "WARNING"),
        # Appended, so the policies above keep their resource names on stacks that had them.
        *([_policy("Tenants shed for overload", f"{shed_rate(cluster)} > 0", 600,
                   "For 10 minutes replicas shed requests of negative-priority tenants because their queue "
                   f"time was over {spec.queue_latency_slo_seconds:g}s (tenants[].priority): answered 429, or sent "
                   "to the model's fallback (models[].fallback). Intended, and not counted against availability; "
                   "sustained, it means the pool is short: check KEDA's replicas against maxReplicas and the node "
                   "pool's capacity.", "WARNING")] if sheddable else []),
        *(_policy(f"No replica of {model} reports",
                  f'absent(vllm:num_requests_running{{cluster="{cluster}", model_name="{model}"}})', 600,
                  f"For 10 minutes no vLLM replica of {model} exported metrics, though its pools keep a "
                  "replica floor: every request to it fails at the load balancer, and its SLOs, counted by "
                  "the replicas, see nothing. Check its Deployments, their node pool and the weights.", "CRITICAL")
          for model in always_on),
    ]
