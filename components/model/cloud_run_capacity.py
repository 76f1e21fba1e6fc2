"""Capacity, cost and cold start of a model on Cloud Run with a GPU (vllm-gke:cloudRun), at plan time.

Price. A GPU service must use instance-based billing (CPU always allocated): an instance is billed
for its whole life, from its start to its shutdown, idle or not, at GPU + vCPUs + GiB of memory per
second (https://cloud.google.com/run/pricing; GPU_SECOND, VCPU_SECOND, GIB_SECOND), the vCPUs and memory
of every container in it: the server's and the metrics sidecar's (SIDECAR_CPU, SIDECAR_MEMORY_GIB). The
RTX PRO 6000's per-second prices are not confirmed from a Google page (RTX_PRICES_VERIFIED). There is no
per-request fee and no GPU free tier; the CPU and memory free tier is left out (a billing account's,
shared with its other services). The GPU's price depends on zonal redundancy. The figures are Tier 1
regions'; Cloud Run offers its GPUs in Tier 2 regions too (asia-*), whose prices are not pinned here:
the plan prices them at Tier 1 and says so.

Throughput. The instance is one GPU: the roofline of components/model/throughput.py on it, through
capacity.pool_capacity (the same fit check and batch as a GKE replica of the model's `short` pool).

Cold start (cold_start): instance start with the GPU driver (Google documents about 5 s), the image
(IMAGE_START_S: an estimate, as on GKE; not measured on Cloud Run), the weights read through the
Cloud Storage volume (VOLUME_READ_MIB_S, an assumption of Cloud Run's own: its volume is Cloud Storage
FUSE without the GKE driver's parallel downloads, and Google's page documents no figure), vLLM's load after
the weights: CUDA graphs, compilation, warm-up (ENGINE_START_S, an
estimate). None of it is measured here; weights.readThroughputMiBps (a GKE node's measured figure)
is not applied to Cloud Run's instances.

Break-even. The same traffic on Cloud Run and on a GKE node pool: a model busy `busy_hours` a day at
one instance's rate. Cloud Run bills the busy hours, and at min 0 each burst's cold start and the idle
time before the instance is shut down (IDLE_TAIL_S, an estimate: Cloud Run keeps an idle instance up to
15 minutes); a warm minimum bills all day. The node pool bills all day (one node kept up: a pool at
zero would pay its node's provisioning on every burst, minutes, as well as the load). Cloud Run is
cheaper below the break-even busy hours, the node pool above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from .capacity import PoolCapacity, pool_capacity
from .catalog import L4, MACHINE_TYPES, Accelerator, MachineType
from .cold_start import ENGINE_START_S, IMAGE_START_S, MIB
from .machine_prices import MACHINE_PRICES
from .specs import NodePoolSpec
from .specs.cloud_run import CLOUD_RUN_POOL, CloudRunModelSpec

PRICING_URL = "https://cloud.google.com/run/pricing"
PRICES_AS_OF = "2026-12-07"
# Tier 1, instance-based billing (services with CPU always allocated), USD a second.
VCPU_SECOND = 0.000018
GIB_SECOND = 0.000002


@dataclass(frozen=True)
class GpuPrice:
    """USD a GPU-second, Tier 1: without and with GPU zonal redundancy."""

    no_redundancy: float
    redundancy: float


CloudRunGpu = Literal["nvidia-l4", "nvidia-rtx-pro-6000"]
GPU_SECOND: dict[CloudRunGpu, GpuPrice] = {
    "nvidia-l4": GpuPrice(0.0001867, 0.0002909),
    "nvidia-rtx-pro-6000": GpuPrice(0.00036522, 0.00056913),
}
# The GPUs whose prices above are read from the pricing page; the RTX PRO 6000's (a Preview) are not
# confirmed there, and the plan and guide mark them unverified.
RTX_PRICES_VERIFIED = False
PRICES_VERIFIED: dict[str, bool] = {"nvidia-l4": True, "nvidia-rtx-pro-6000": RTX_PRICES_VERIFIED}
# The Managed Service for Prometheus sidecar beside every server (cloud_run_monitoring.SIDECAR_LIMITS, which
# tests/test_cloud_run_capacity.py holds to these): billed, and counted in the instance's maximum.
SIDECAR_CPU = 1
SIDECAR_MEMORY_GIB = 0.5
# The regions where Cloud Run offers a GPU, by pricing tier
# (https://cloud.google.com/run/docs/configuring/services/gpu lists the regions; the tiers are the
# pricing page's). Tier 2's GPU, vCPU and memory prices are not pinned here.
TIER_1_REGIONS = frozenset({"us-central1", "us-east4", "europe-west1", "europe-west4"})
TIER_2_REGIONS = frozenset({"asia-southeast1", "asia-south1", "asia-south2"})

# NVIDIA RTX PRO 6000 Blackwell (not in the GKE catalog: no G4 machine there): 96 GB GDDR7 at 1,792 GB/s
# (512-bit at 28 Gbps, NVIDIA's announced figures); dense 16-bit and FP8 peaks derived from its 4,000
# FP4 TOPS (with sparsity): halved for dense, halved again per doubling of the element width.
RTX_PRO_6000 = Accelerator("nvidia-rtx-pro-6000", 96, {}, 1792, 500, fp8_tflops=1000)
GPUS: dict[str, Accelerator] = {"nvidia-l4": L4, "nvidia-rtx-pro-6000": RTX_PRO_6000}
# The fewest vCPUs and GiB of memory an instance with the GPU may have
# (https://docs.cloud.google.com/run/docs/configuring/workerpools/gpu: 4 and 16 with an L4, 20 and 80 with
# an RTX PRO 6000).
GPU_MIN_RESOURCES: dict[str, tuple[int, int]] = {"nvidia-l4": (4, 16), "nvidia-rtx-pro-6000": (20, 80)}

# Cold start parts (see the module's docstring): documented, then estimates.
INSTANCE_START_S = 5.0  # "start in approximately 5 seconds" (cloud.google.com/run/docs/configuring/services/gpu)
# The weights' read through Cloud Run's Cloud Storage volume, MiB/s: an assumption. Google's GPU best practices
# (https://cloud.google.com/run/docs/configuring/services/gpu-best-practices) say the FUSE mount "does not
# parallelize the download" and is fast only with the network optimisations (Direct VPC egress of all
# traffic to a subnet with Private Google Access: cloud_run.egress_of); no figure is published. The GKE
# driver's 1,000 MiB/s (weights_backends.GCS_FUSE_READ_MIB_S) assumes its parallel downloads, which
# Cloud Run's volume does not take; a single sequential stream is assumed at a fifth of it.
VOLUME_READ_MIB_S = 200.0
# A Cloud Run service's startup probe (https://cloud.google.com/run/docs/configuring/healthchecks, the
# services page: failureThreshold x periodSeconds may not exceed 240 s; pulumi_gcp 10.2.0 cloudrunv2
# ServiceTemplateContainerStartupProbeArgs: periodSeconds and initialDelaySeconds at most 240 each): at
# most 240 s of probing after at most 240 s of initial delay. Past that window Cloud Run shuts the
# instance down, and starts another for the requests waiting. The 1,800 s the jobs page allows a GPU
# (https://docs.cloud.google.com/run/docs/configuring/jobs/healthchecks) is a job task's, not a service's.
PROBE_WINDOW_MAX_S = 240
PROBE_INITIAL_DELAY_MAX_S = 240
STARTUP_PROBE_LIMIT_S = PROBE_INITIAL_DELAY_MAX_S + PROBE_WINDOW_MAX_S
PROBE_PERIOD_S = 10
# The probe waits twice the estimate (it is not measured) and never less than Cloud Run's 240 s default.
PROBE_MARGIN = 2.0
PROBE_FLOOR_S = 240
# An idle instance's life before Cloud Run shuts it down (up to 15 minutes, Cloud Run's documentation on
# idle instances; billed throughout under instance-based billing). An estimate of the typical tail.
IDLE_TAIL_S = 15 * 60.0


class CloudRunInstancePool(NodePoolSpec):
    """A Cloud Run instance as the capacity model reads a node: one GPU, the instance's vCPUs and memory
    (no GKE machine type: `machine` is the instance's own)."""

    @property
    def machine(self) -> MachineType:
        name, cpu, memory = self.machine_type.rsplit(":", 2)
        return MachineType(name, GPUS[name.removeprefix("cloud-run-")], 1, int(cpu), int(memory))


def instance_pool(m: CloudRunModelSpec) -> NodePoolSpec:
    """The instance as a one-GPU node pool (built without NodePoolSpec's GKE machine check)."""
    machine = f"cloud-run-{m.gpu}:{instance_cpu(m)}:{instance_memory_gib(m)}"
    return CloudRunInstancePool.model_construct(name=CLOUD_RUN_POOL, machine_type=machine, max_nodes=m.max_instances)


def instance_cpu(m: CloudRunModelSpec) -> int:
    """The instance's vCPUs: the config's, at least the GPU's minimum."""
    return max(m.cpu, GPU_MIN_RESOURCES[m.gpu][0])


def instance_memory_gib(m: CloudRunModelSpec) -> int:
    return max(m.memory_gib, GPU_MIN_RESOURCES[m.gpu][1])


def billed_cpu(m: CloudRunModelSpec) -> float:
    """vCPUs billed a second: the server's and the sidecar's."""
    return instance_cpu(m) + SIDECAR_CPU


def billed_memory_gib(m: CloudRunModelSpec) -> float:
    return instance_memory_gib(m) + SIDECAR_MEMORY_GIB


def instance_capacity(m: CloudRunModelSpec) -> PoolCapacity:
    """The fit (weights and KV cache on the GPU) and the roofline's tokens/s of one instance."""
    model = m.as_model()
    return pool_capacity(model, "short", model.short, instance_pool(m))


def batch(m: CloudRunModelSpec) -> int:
    """Sequences one instance decodes at once: maxNumSeqs, or what its KV cache holds if fewer."""
    row = instance_capacity(m)
    return max(1, min(m.max_num_seqs, row.seqs_fit))


def concurrency(m: CloudRunModelSpec) -> int:
    """Requests Cloud Run sends one instance at once (containerConcurrency): `concurrency` where set,
    else the batch it decodes. More would wait in vLLM's queue on a full instance while Cloud Run, which
    scales on the requests in flight against this figure, would not start another."""
    return m.concurrency or batch(m)


def price_tier(region: str) -> Optional[int]:
    """1 or 2 for a region where Cloud Run offers a GPU, None elsewhere."""
    return 1 if region in TIER_1_REGIONS else 2 if region in TIER_2_REGIONS else None


def instance_usd_per_second(m: CloudRunModelSpec, redundancy: Optional[bool] = None) -> float:
    """What one instance costs a second (Tier 1): its GPU (with or without zonal redundancy: the
    model's own choice by default), the vCPUs and memory of all its containers."""
    gpu = GPU_SECOND[m.gpu]
    zonal = m.gpu_zonal_redundancy if redundancy is None else redundancy
    return (gpu.redundancy if zonal else gpu.no_redundancy) + billed_cpu(m) * VCPU_SECOND + billed_memory_gib(m) * GIB_SECOND


def instance_usd_per_hour(m: CloudRunModelSpec, redundancy: Optional[bool] = None) -> float:
    return instance_usd_per_second(m, redundancy) * 3600


@dataclass(frozen=True)
class ColdStart:
    """Seconds from a request finding no instance to the instance serving, by part."""

    instance_s: float
    image_s: float
    weights_s: float
    engine_s: float

    @property
    def total_s(self) -> float:
        return self.instance_s + self.image_s + self.weights_s + self.engine_s


def cold_start(m: CloudRunModelSpec) -> ColdStart:
    model = m.as_model()
    return ColdStart(INSTANCE_START_S, IMAGE_START_S, model.weights_gb * 1e9 / (VOLUME_READ_MIB_S * MIB), ENGINE_START_S)


def startup_budget_seconds(m: CloudRunModelSpec) -> int:
    """How long the startup probe lets an instance take: twice the estimate, at least 240 s, at most the
    480 s a Cloud Run service's probe can wait (STARTUP_PROBE_LIMIT_S)."""
    return min(STARTUP_PROBE_LIMIT_S, max(PROBE_FLOOR_S, math.ceil(cold_start(m).total_s * PROBE_MARGIN)))


def startup_probe(m: CloudRunModelSpec) -> dict[str, int]:
    """The startup probe's timing (cloudrunv2 ServiceTemplateContainerStartupProbeArgs' keys): every
    PROBE_PERIOD_S for at most 240 s, after an initial delay holding the rest of the budget. The delay is
    at most the estimate (the budget is twice it, or capped), so a typical start is not held back by it."""
    budget = startup_budget_seconds(m)
    delay = max(0, budget - PROBE_WINDOW_MAX_S)
    return {"initial_delay_seconds": delay, "period_seconds": PROBE_PERIOD_S, "timeout_seconds": PROBE_PERIOD_S - 1,
            "failure_threshold": math.ceil((budget - delay) / PROBE_PERIOD_S)}


def probe_window_seconds(probe: Mapping[str, Any]) -> int:
    """How long a startup probe lets an instance start: its initial delay, then failureThreshold periods."""
    return int(probe.get("initial_delay_seconds", 0)) + int(probe["period_seconds"]) * int(probe["failure_threshold"])


def startup_problem(m: CloudRunModelSpec) -> Optional[str]:
    """The estimate past what a service's startup probe may wait: Cloud Run would shut every cold instance
    down before it serves, and start another, which fails the same way."""
    total = cold_start(m).total_s
    if total <= STARTUP_PROBE_LIMIT_S:
        return None
    return (f"vllm-gke:cloudRun.models[{m.name}]: the cold start is estimated at {total:,.0f} s, longer than the "
            f"{STARTUP_PROBE_LIMIT_S} s a Cloud Run service's startup probe can wait ({PROBE_INITIAL_DELAY_MAX_S} s "
            f"initial delay + {PROBE_WINDOW_MAX_S} s of probes): Cloud Run would shut each new instance down before "
            "it serves and start another, so the model may never serve; use a smaller or quantised model (dtype "
            "fp8, an AWQ revision), or serve it on GKE")


def cheapest_machine(gpu: str) -> Optional[str]:
    """The cheapest GKE machine with one such GPU (g2-standard-4 for the L4); None where the catalog has none."""
    machines = [t for t in MACHINE_TYPES.values() if t.accelerator is not None and t.accelerator.gke_type == gpu
                and t.gpus == 1 and t.name in MACHINE_PRICES]
    return min(machines, key=lambda t: MACHINE_PRICES[t.name].on_demand_hour).name if machines else None


def cloud_run_day_usd(m: CloudRunModelSpec, busy_hours: float, bursts: int) -> float:
    """A day of `busy_hours` at one instance's rate, in `bursts` stretches: a warm minimum bills all day
    (it serves the traffic); at min 0 the busy hours and each burst's cold start and idle tail, at
    most all day."""
    hour = instance_usd_per_hour(m)
    if m.min_instances:
        return max(m.min_instances * 24.0, min(24.0, busy_hours)) * hour
    return min(24.0, busy_hours + bursts * (cold_start(m).total_s + IDLE_TAIL_S) / 3600) * hour


def break_even_busy_hours(m: CloudRunModelSpec, node_usd_hour: float, bursts: int) -> Optional[float]:
    """Busy hours a day from which a node kept up all day (at `node_usd_hour` for the GPU) is cheaper than
    Cloud Run; None where Cloud Run is never cheaper (a warm minimum costing more than the node) and
    24 where it always is."""
    day = 24.0 * node_usd_hour
    if m.min_instances:
        return None if m.min_instances * 24.0 * instance_usd_per_hour(m) >= day else 24.0
    hours = day / instance_usd_per_hour(m) - bursts * (cold_start(m).total_s + IDLE_TAIL_S) / 3600
    if hours <= 0:
        return None
    return min(24.0, hours)


def warm_minimum_month(m: CloudRunModelSpec, hours_per_month: float) -> float:
    """The warm minimum's fixed cost a month (0 at min 0): billed at the full rate even when idle."""
    return m.min_instances * instance_usd_per_hour(m) * hours_per_month
