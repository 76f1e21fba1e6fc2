"""Cloud Run with a GPU, as the plan prices and sizes it (components/model/cloud_run_capacity.py): the
billing the cost report assumes, the startup probe's limits, the concurrency the capacity model gives."""

from __future__ import annotations

from typing import Any, Iterator

from ...components.model import cloud_run_capacity as cloud_run
from ...components.model.cloud_run import service_name
from ...components.model.specs.cloud_run import CloudRunModelSpec
from ..plan import Plan
from .base import Contract

SERVICE = "gcp:cloudrunv2/service:Service"
# Cloud Run's most requests an instance may take at once (https://docs.cloud.google.com/run/docs/about-concurrency).
MAX_CONCURRENCY = 1000


def _services(plan: Plan) -> Iterator[tuple[CloudRunModelSpec, dict[str, Any]]]:
    """Each Cloud Run model and its service's template, where the plan declares one."""
    by_name = {r.props.get("name"): r.props for r in plan.resources if r.type == SERVICE}
    for m in plan.config.cloud_run_models:
        if (props := by_name.get(service_name(m))) is not None:
            yield m, props["template"]


def _gib(memory: str) -> float:
    return float(memory.removesuffix("Gi")) if memory.endswith("Gi") else float(memory.removesuffix("G")) * 1e9 / 2 ** 30


def cloud_run_gpu_billed_as_priced(plan: Plan) -> list[str]:
    """The service is what the cost report priced: its GPU zonal redundancy, its vCPUs and memory
    (instance-based billing and the GPU's minimums: cloud_run_service.gpu_service_is_instance_billed)."""
    out: list[str] = []
    for m, template in _services(plan):
        (c,) = [c for c in template["containers"] if (c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")]
        limits = c["resources"]["limits"]
        if bool(template.get("gpuZonalRedundancyDisabled")) == m.gpu_zonal_redundancy:
            out.append(f"{m.name}: gpuZonalRedundancyDisabled is {template.get('gpuZonalRedundancyDisabled')} but the "
                       f"cost report priced gpuZonalRedundancy {m.gpu_zonal_redundancy}")
        cpu, gib = float(limits["cpu"]), _gib(limits["memory"])
        if (cpu, gib) != (cloud_run.instance_cpu(m), cloud_run.instance_memory_gib(m)):
            out.append(f"{m.name}: the service takes {cpu:g} vCPUs and {gib:g} GiB, the cost report priced "
                       f"{cloud_run.instance_cpu(m)} and {cloud_run.instance_memory_gib(m)}")
    return out


def cloud_run_startup_probe_within_limits(plan: Plan) -> list[str]:
    """The probe waits within a service's limit (initial delay + failureThreshold x periodSeconds, 480 s)
    and no less than the cold-start estimate, or the whole limit where the estimate is longer."""
    out: list[str] = []
    limit = cloud_run.STARTUP_PROBE_LIMIT_S
    for m, template in _services(plan):
        for c in template["containers"]:
            probe = c.get("startupProbe")
            if not probe or not (c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu"):
                continue
            window = cloud_run.probe_window_seconds({"initial_delay_seconds": probe.get("initialDelaySeconds", 0),
                                                     "period_seconds": probe.get("periodSeconds", 10),
                                                     "failure_threshold": probe.get("failureThreshold", 3)})
            if window > limit:
                out.append(f"{m.name}: the startup probe waits {window} s, which exceeds {limit} s (a service's "
                           f"{cloud_run.PROBE_INITIAL_DELAY_MAX_S} s initial delay + {cloud_run.PROBE_WINDOW_MAX_S} s "
                           "of failureThreshold x periodSeconds)")
            if window < min(cloud_run.cold_start(m).total_s, limit):
                out.append(f"{m.name}: the startup probe gives up after {window} s, before the estimated cold start "
                           f"({cloud_run.cold_start(m).total_s:.0f} s): every cold instance would be stopped")
    return out


def cloud_run_concurrency_is_the_capacity_models(plan: Plan) -> list[str]:
    out: list[str] = []
    for m, template in _services(plan):
        got, want = template.get("maxInstanceRequestConcurrency"), cloud_run.concurrency(m)
        if got is None or int(got) != want or want > MAX_CONCURRENCY:
            out.append(f"{m.name}: maxInstanceRequestConcurrency is {got}, not the capacity model's {want} "
                       f"(at most {MAX_CONCURRENCY})")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Run (GPU pricing)", "pricing page, 2026-12",
             "under instance-based billing an instance is billed per second from start to shutdown, idle or not: an "
             "L4 $0.0001867 a second ($0.0002909 with GPU zonal redundancy), an RTX PRO 6000 $0.00036522 "
             "($0.00056913), plus $0.000018 a vCPU-second and $0.000002 a GiB-second (Tier 1 regions)",
             "https://cloud.google.com/run/pricing (the vCPU rate read there; the GPU and memory rates as published "
             "in its tables, quoted by two third-party reads of it, not read in Google's page here)",
             "the cost report, the options table and the break-even price the service's own zonal-redundancy flag, "
             "vCPUs and memory (components/model/cloud_run_capacity.py)",
             cloud_run_gpu_billed_as_priced),
    Contract("Cloud Run (startup probes)", "docs and v2 API, 2026-12",
             "a service's startup probe may wait at most 240 s of initialDelaySeconds and 240 s of failureThreshold x "
             "periodSeconds; past that window Cloud Run shuts the instance down (the 1,800 s for a GPU on the jobs "
             "page is a job task's)",
             "https://cloud.google.com/run/docs/configuring/healthchecks; pulumi_gcp 10.2.0 "
             "cloudrunv2 ServiceTemplateContainerStartupProbeArgs",
             "the probe waits twice the cold-start estimate, 240 s at least, 480 s at most, the initial delay "
             "holding what is past 240 s (cloud_run_capacity.startup_probe); the plan says where the estimate is "
             "longer than 480 s",
             cloud_run_startup_probe_within_limits),
    Contract("Cloud Run (concurrency)", "v2 API, 2026-12",
             "maxInstanceRequestConcurrency bounds the requests Cloud Run sends one instance (at most 1,000) and is "
             "what it scales out against",
             "https://docs.cloud.google.com/run/docs/about-concurrency",
             "the batch one instance decodes (maxNumSeqs, or the sequences its KV cache holds), or "
             "cloudRun.models[].concurrency (cloud_run_capacity.concurrency)",
             cloud_run_concurrency_is_the_capacity_models),
)
