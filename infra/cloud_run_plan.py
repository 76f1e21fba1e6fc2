"""The plan's Cloud Run lines (vllm-gke:cloudRun): per model, what one instance holds and serves, the
concurrency and startup probe the service gets, the cold start by part, the price by the second with
and without GPU zonal redundancy, a warm minimum's month, and the busy hours a day from which a GKE
node pool serving the same traffic is cheaper (components/model/cloud_run_capacity.py)."""

from __future__ import annotations

from typing import Optional

from ..components.model import cloud_run_capacity as cloud_run
from ..components.model.cloud_run import CUDA_COMPAT_ENV, IMAGE_CUDA, SHUTDOWN_S, egress_of, gpu_of, needs_cuda_compat
from ..components.model.cloud_run_gateway import ARMOR_HEADROOM, armor_policy
from ..components.model.cloud_run_store import reaches_store, secret_id
from ..components.model.machine_prices import MACHINE_PRICES
from ..components.model.specs.cloud_run import CLOUD_RUN_POOL, CloudRunModelSpec
from .config import StackConfig

GUIDE = "docs/guides/cloud-run.md"
GPU_QUOTA = "https://cloud.google.com/run/docs/configuring/services/gpu#before-you-begin"
# The bursts a day the break-even assumes at min 0: each pays a cold start and an idle tail.
BURSTS_PER_DAY = 3


def cloud_run_lines(cfg: StackConfig) -> list[str]:
    """The plan's Cloud Run section: one paragraph a model, then what a deploy of them needs and does."""
    lines = [line for m in cfg.cloud_run_models for line in _model_lines(cfg, m)]
    return [*lines, _deploy_line(cfg)] if lines else lines


def _deploy_line(cfg: StackConfig) -> str:
    """Before the first up, and what each up costs: the GPU quota, the store's secret, a cold start a revision."""
    zonal = sorted({"with" if m.gpu_zonal_redundancy else "without" for m in cfg.cloud_run_models})
    secret = (f" Secret Manager's {secret_id(cfg)} (the limit store's client certificate) must exist with a version "
              "before the first up (docs/guides/limits-across-replicas.md#from-cloud-run-models)." if reaches_store(cfg) else "")
    return (f"Cloud Run deploys: the project's Cloud Run GPU quota is zero until requested ({GPU_QUOTA}), per region and "
            f"GPU, {' and '.join(zonal)} zonal redundancy as set, at least maxInstances plus one (a new revision's "
            f"instance starts while the old revision's may still run).{secret} Every up that changes a service's "
            "template (the image, the argv, the guard's config: a new tenant, a changed limit) deploys a new revision, "
            "which starts an instance: a GPU cold start inside `pulumi up`, billed. On SIGTERM vLLM drains for "
            f"{SHUTDOWN_S} s (Cloud Run kills the instance 10 s after it).")


def _model_lines(cfg: StackConfig, m: CloudRunModelSpec) -> list[str]:
    row = cloud_run.instance_capacity(m)
    if not row.fits:
        return [f"{m.name} on Cloud Run ({m.gpu}): does not fit: {row.problem}; {row.fix()}"]
    start = cloud_run.cold_start(m)
    probe = cloud_run.startup_probe(m)
    lines = [
        f"{m.name} on Cloud Run ({m.gpu}, {cfg.cloud_run_region(m)}): one instance decodes {cloud_run.batch(m)} "
        f"sequences at ~{row.decode_tokens_s:,.0f} tokens/s (the roofline's); concurrency {cloud_run.concurrency(m)}"
        f"{' (set)' if m.concurrency else ' (its batch)'}; cold start ~{start.total_s:,.0f} s: instance "
        f"{start.instance_s:.0f} s (documented) + image {start.image_s:.0f} s + weights {start.weights_s:.0f} s through "
        f"the Cloud Storage volume + vLLM load and CUDA graphs {start.engine_s:.0f} s (estimates, not measured); "
        f"startup probe waits {cloud_run.probe_window_seconds(probe)} s ({probe['initial_delay_seconds']} s initial "
        f"delay, {probe['failure_threshold']} probes {probe['period_seconds']} s apart; a service's most is "
        f"{cloud_run.STARTUP_PROBE_LIMIT_S} s).",
        _price_line(cfg, m),
        _break_even_line(cfg, m),
    ]
    if (problem := cloud_run.startup_problem(m)) is not None:
        lines.append(problem)
    lines += [line for line in (_cuda_line(cfg, m), _egress_line(cfg, m)) if line]
    if (armor := _armor_line(cfg, m)) is not None:
        lines.append(armor)
    return lines


def _armor_line(cfg: StackConfig, m: CloudRunModelSpec) -> Optional[str]:
    """What the Cloud Armor policy of an auth jwt model stops, and what one forged token still costs."""
    if (policy := armor_policy(cfg, m)) is None:
        return None
    wake_s = cloud_run.cold_start(m).total_s + cloud_run.IDLE_TAIL_S
    wake = wake_s * cloud_run.instance_usd_per_second(m)
    return (f"{m.name} (auth jwt): Cloud Armor refuses at the load balancer any request without one well-formed "
            f"'Bearer <JWT>' and throttles each client IP to {policy.per_ip_per_minute:,} requests a minute "
            f"({ARMOR_HEADROOM}x what its guards admit of its callers); a forged but well-formed token still reaches "
            f"Cloud Run and, with no instance up, starts one that the guard then refuses: ~${wake:.2f} a wake-up "
            f"(~{wake_s / 60:.0f} min billed: the cold start, then idle until Cloud Run stops it), ~$"
            f"{24 * cloud_run.instance_usd_per_hour(m):,.0f} a day if one arrives every "
            f"{cloud_run.IDLE_TAIL_S / 60:.0f} min, up to {m.max_instances} instances under a flood; auth iam has "
            "Cloud Run verify the token before any instance starts.")


def _cuda_line(cfg: StackConfig, m: CloudRunModelSpec) -> Optional[str]:
    """A GPU whose driver is older than the image's CUDA: what the service sets, and that it is unverified."""
    rel = cfg.release_for(CLOUD_RUN_POOL)
    if not needs_cuda_compat(m, rel):
        return None
    gpu, image = gpu_of(m), IMAGE_CUDA[rel.version]
    return (f"{m.name}: Cloud Run's {m.gpu} driver {gpu.driver} runs CUDA {gpu.driver_cuda[0]}.{gpu.driver_cuda[1]}, "
            f"older than the CUDA {image[0]}.{image[1]} {rel.label}'s image is built on: the service sets "
            f"{CUDA_COMPAT_ENV}=1, so vLLM loads the image's CUDA forward-compatibility libraries (/usr/local/cuda-"
            f"{image[0]}.{image[1]}/compat) first. Unverified on a real {m.gpu} (no GPU instance here): if the first "
            "revision fails to initialise CUDA ('CUDA driver version is insufficient'), check that folder exists in the image; "
            f"if it does not, install NVIDIA's cuda-compat-{image[0]}-{image[1]} package in images/Dockerfile, or "
            "serve a vLLM build on the driver's CUDA major.")


def _egress_line(cfg: StackConfig, m: CloudRunModelSpec) -> Optional[str]:
    """Outside the stack's region the instances have no NAT: private ranges only, the weights read slower."""
    if egress_of(cfg, m) == "ALL_TRAFFIC":
        return None
    return (f"{m.name}: in {cfg.cloud_run_region(m)}, outside the cluster's region and its Cloud NAT, Direct VPC egress "
            "takes private ranges only: Cloud Storage is read over Cloud Run's own path, without the VPC's Private "
            f"Google Access Google recommends for the weights volume, so the cold start's {cloud_run.VOLUME_READ_MIB_S:,.0f} "
            "MiB/s may be optimistic; serve it in the stack's region to have both.")


def _price_line(cfg: StackConfig, m: CloudRunModelSpec) -> str:
    region = cfg.cloud_run_region(m)
    tier = cloud_run.price_tier(region)
    tier_note = ("" if tier == 1 else f"; {region} is a Tier 2 region, whose prices are not pinned: these are Tier 1's "
                 "and understate it")
    plain, zonal = cloud_run.instance_usd_per_hour(m, False), cloud_run.instance_usd_per_hour(m, True)
    warm = cloud_run.warm_minimum_month(m, cfg.cost.hours_per_month)
    floor = (f"a warm minimum of {m.min_instances} costs ${warm:,.0f} a month idle or not" if m.min_instances
             else "min 0: nothing fixed, each burst's first request waits for the cold start")
    unverified = ("" if cloud_run.PRICES_VERIFIED[m.gpu] else
                  f"; the {m.gpu}'s per-second prices are unverified (not confirmed from Google's page)")
    return (f"{m.name}: an instance costs ${plain:.3f}/h without GPU zonal redundancy, ${zonal:.3f}/h with it "
            f"({'on' if m.gpu_zonal_redundancy else 'off'} here; the server's {cloud_run.instance_cpu(m)} vCPUs and "
            f"{cloud_run.instance_memory_gib(m)} GiB and the metrics sidecar's {cloud_run.SIDECAR_CPU} and "
            f"{cloud_run.SIDECAR_MEMORY_GIB:g}), billed by the second from its start to its shutdown (instance-based "
            f"billing, {cloud_run.PRICING_URL} as of {cloud_run.PRICES_AS_OF}{tier_note}{unverified}); {floor}.")


def node_pools_with(cfg: StackConfig, gpu: str) -> list[tuple[str, float]]:
    """(node pool, $ an hour a GPU at its price: spot where spot) of the stack's GKE pools with this GPU."""
    out: list[tuple[str, float]] = []
    for pool in cfg.node_pools:
        acc = pool.machine.accelerator
        if acc is None or acc.gke_type != gpu:
            continue
        price = MACHINE_PRICES[pool.machine_type]
        out.append((pool.name, (price.spot_hour if pool.spot else price.on_demand_hour) / pool.machine.gpus))
    return out


def _against(m: CloudRunModelSpec, what: str, node_hour: float, tokens_s: float, util: float) -> str:
    hours: Optional[float] = cloud_run.break_even_busy_hours(m, node_hour, BURSTS_PER_DAY)
    if hours is None:
        return f"{what} (${node_hour:.3f}/h) is cheaper at any load"
    if hours >= 24:
        return f"Cloud Run is cheaper than {what} (${node_hour:.3f}/h) even busy all day"
    tokens = hours * 3600 * tokens_s * util
    return (f"{what} (${node_hour:.3f}/h) is cheaper from {hours:.1f} busy hours a day "
            f"(~{tokens / 1e6:,.1f}M output tokens a day at {util:.0%})")


def _break_even_line(cfg: StackConfig, m: CloudRunModelSpec) -> str:
    """Cloud Run against a GKE node kept up all day for the same traffic: the cheapest g2-type machine
    with the GPU on-demand, and the stack's own pools with it."""
    tps, util = cloud_run.instance_capacity(m).decode_tokens_s, cfg.cost.target_utilization
    rivals: list[str] = []
    if (machine := cloud_run.cheapest_machine(m.gpu)) is not None:
        rivals.append(_against(m, f"a {machine} node on-demand", MACHINE_PRICES[machine].on_demand_hour, tps, util))
    rivals += [_against(m, f"a GPU of node pool '{name}'", hour, tps, util) for name, hour in node_pools_with(cfg, m.gpu)]
    if not rivals:
        return f"{m.name}: no GKE machine with {m.gpu} in the catalog to weigh Cloud Run against."
    how = (f"{BURSTS_PER_DAY} bursts a day, each paying the cold start and ~{cloud_run.IDLE_TAIL_S / 60:.0f} min idle "
           "before Cloud Run stops the instance" if not m.min_instances else "the warm minimum serving it")
    return (f"{m.name}: against a GKE node kept up all day for the same traffic (one instance's rate, {how}): "
            + "; ".join(rivals) + f"; below that, Cloud Run costs less ({GUIDE}).")
