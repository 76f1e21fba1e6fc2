"""Plan-time warnings: choices that are valid but cost availability, said before `pulumi up`."""

from __future__ import annotations

from typing import Callable, Optional

from ..components.billing_budget import MAX_CHANNELS as MAX_BUDGET_CHANNELS
from ..components.model.capacity import consumer_models, hosts_per_replica, network_cost, placements, rollout_needs
from ..components.model.cold_start import cold_start_seconds, rollout_seconds
from ..components.model.picker_prefix import adapters_miss
from ..components.model.picker_wake import picker_wakes
from ..components.model.service_levels import TTFT_BUCKETS, ttft_bound
from ..components.model.serving_plan import flagger_pools, pool_rollout, rollout_load_tests, servings
from ..components.model.vllm_server import SPOT_PRE_STOP_S, SPOT_SHUTDOWN_S, drain_seconds
from ..components.model.vllm_versions import release
from ..components.model.weights_backends import backend_of
from ..components.model.weights_layout import LOW_RANGE_MAX_GB, REGIONAL_TIERS, weight_copies
from .config import StackConfig
from .pricing import PRICE_REGION
from .speculative_plan import speculative_trade_offs


def hyperdisk_disks(cfg: StackConfig) -> int:
    """Disks the Hyperdisk ML backend creates: each weight set a namespace mounts, in every zone."""
    sets = {m.name: len(weight_copies([m])) for m in cfg.models}
    return sum(sets[m] for models in consumer_models(cfg).values() for m in models) * len(cfg.cluster.zones)


def plan_warnings(cfg: StackConfig, filestore_tier: str, filestore_capacity_gb: int = 0) -> list[str]:
    """Every warning the plan gives about the config, in the order it prints them."""
    return [*zonal_share(cfg, filestore_tier), *share_near_range_top(cfg, filestore_tier, filestore_capacity_gb),
            *(warning for check in CONFIG_CHECKS for warning in check(cfg))]


def _label(model_name: str, tenant: Optional[str]) -> str:
    return f"{model_name}{f' ({tenant})' if tenant else ''}"


def zonal_share(cfg: StackConfig, filestore_tier: str) -> list[str]:
    zones = cfg.cluster.zones
    if not backend_of(cfg.weights).has_filestore_share or len(zones) <= 1 or filestore_tier in REGIONAL_TIERS:
        return []
    return [f"the weights share is a zonal {filestore_tier} Filestore in {zones[0]} feeding GPU nodes in "
            f"{len(zones)} zones: losing {zones[0]} stops every replica from (re)loading; set "
            "vllm-gke:weights.tier to REGIONAL"]


def share_near_range_top(cfg: StackConfig, filestore_tier: str, filestore_capacity_gb: int) -> list[str]:
    if filestore_tier not in ("ZONAL", "REGIONAL") or not backend_of(cfg.weights).has_filestore_share or \
            not 0.9 * LOW_RANGE_MAX_GB < filestore_capacity_gb <= LOW_RANGE_MAX_GB:
        return []
    return [f"the {filestore_tier} share is {filestore_capacity_gb} GiB, near the 9.75 TiB top of its range: it "
            "cannot grow past it in place (10 TiB and up is another range), so growing past it brings up a new "
            "share beside this one and loads every model again; size it 10 TiB now (weights.capacityGb: 10240) "
            "if models will be added"]


def hyperdisk_unpriced(cfg: StackConfig) -> list[str]:
    if not backend_of(cfg.weights).needs_volume_populator:
        return []
    return [f"weights.backend hyperdisk-ml provisions {hyperdisk_disks(cfg)} Hyperdisk ML disks of "
            f"{cfg.weights.hyperdisk_throughput_mib_s} MiB/s (a weight set per consumer namespace, one per zone); "
            "they are not in the cost figures (no price list here): check Hyperdisk ML's capacity and "
            "throughput prices before `pulumi up`"]


def single_replica_pools(cfg: StackConfig) -> list[str]:
    # Disruption budgets let every drain through (one replica down at a time, never none), so a
    # pool of one replica is down while a drained node's replica reloads elsewhere.
    single = {f"{_label(model.name, tenant)} {which}": cold_start_seconds(cfg, model, cfg.pool(pool_name))
              for model, pool_name, tenant in placements(cfg) for which in model.pool_names
              if getattr(model, which).min_replicas == 1}
    if not single:
        return []
    # One warning for all of them: the same hazard and the same fix.
    pools = ", ".join(f"{name} ~{seconds / 60:.0f} min" for name, seconds in single.items())
    when = ("inside the maintenance window" if cfg.cluster.maintenance.window is not None
            else "whenever GKE chooses; set a maintenance window (vllm-gke:cluster.maintenance) to choose when")
    return [f"{'these pools run' if len(single) > 1 else 'this pool runs'} one replica ({pools}): a node upgrade, "
            f"repair or spot preemption drains it and it is down until it reloads elsewhere (the time given), "
            f"{when}; set minReplicas 2 to keep serving through drains"]


def long_rollouts(cfg: StackConfig) -> list[str]:
    """Rollouts at a pool's ceiling past Pulumi's default 45 minutes. A Flagger pool's is its
    primary's promotion, after the analysis: Flagger waits for it, `pulumi up` does not (it updates
    the target, at 0 replicas between rollouts)."""
    out: list[str] = []
    grace = drain_seconds(cfg.gateway.request_timeout_seconds) + 30
    for serving in servings(cfg):
        model = serving.model
        for which in model.pool_names:
            seconds = rollout_seconds(getattr(model, which).max_replicas,
                                      cold_start_seconds(cfg, model, cfg.pool(serving.node_pool)), grace)
            if seconds <= 2700:  # past Pulumi's default 45 min: the pool's own timeout allows it
                continue
            waits = ("after the canary's analysis, Flagger's promotion of the primary (`pulumi up` does not wait "
                     "for it)" if pool_rollout(cfg, serving, which).is_canary else "`pulumi up` waits that long for it")
            out.append(f"rollout of {_label(model.name, serving.tenant)} {which} at its ceiling: up "
                       f"to ~{seconds / 60:.0f} min, a replica at a time (a node, its load); {waits}")
    return out


def spot_pools(cfg: StackConfig) -> list[str]:
    spot = sorted({pool_name for _m, pool_name, _t in placements(cfg) if cfg.pool(pool_name).spot})
    if not spot:
        return []
    return [f"spot node pools ({', '.join(spot)}): a preemption gives pods {SPOT_SHUTDOWN_S} s (GKE's graceful "
            f"shutdown), so their replicas wait {SPOT_PRE_STOP_S} s (not 20) for the load balancer to take them "
            "out before vLLM drains, on every stop: on a preemption requests still running after the 15 s "
            "are cut, and on any stop (rollout, scale-down, drain, also on the on-demand twin) a request "
            "may still reach a replica that has begun to stop; requests it accepted get the full drain"]


def slow_cold_starts(cfg: StackConfig) -> list[str]:
    budget = cfg.weights.cold_start_budget_seconds
    slow: dict[str, float] = {}
    for model, pool_name, tenant in placements(cfg):
        seconds = cold_start_seconds(cfg, model, cfg.pool(pool_name))
        if seconds > budget:
            slow[_label(model.name, tenant)] = seconds
    return [f"{name}: a new replica needs about {seconds / 60:.0f} min from node ready to serving, over the "
            f"{budget / 60:.0f} min budget (vllm-gke:weights.coldStartBudgetSeconds); a faster weights store "
            "(weights.tier BASIC_SSD or a larger ZONAL share, weights.backend gcs, or hyperdisk-ml with more "
            "weights.hyperdiskThroughputMiBps), a quantised dtype, or "
            "minReplicas above 0 to keep one warm" for name, seconds in slow.items()]


def picker_first_requests(cfg: StackConfig) -> list[str]:
    """Pools at zero behind a picker whose first requests after idle do not outlive the wake."""
    return [w for wake in picker_wakes(cfg) if (w := wake.warning()) is not None]


# A Service Extensions callout's per-message timeout: 10 ms to 10 s, 1 s when unset (GKE's
# GCPRoutingExtension/GCPTrafficExtension Extension.timeout, GoogleCloudPlatform/gke-gateway-api
# apis/networking/v1/shared_types.go:269,353-358; networkservices ExtensionChain.Extension.timeout).
CALLOUT_MESSAGE_TIMEOUT_MAX_S = 10


def picker_queue_past_the_callout(cfg: StackConfig) -> list[str]:
    """A request the picker queues holds its answer to one ext_proc message for up to the queue's TTL.
    GKE documents neither the per-message timeout of the callout it makes for an InferencePool nor a
    setting for it (no field of GCPBackendPolicy or the InferencePool): said as unverified, not clamped."""
    flow = cfg.picker.flow_control
    picked = sorted(m.name for m in cfg.models if m.routing == "inference-gateway")
    if not flow.enabled or not picked:
        return []
    return [f"{', '.join(picked)}: picker.flowControl.queueTtlSeconds is {flow.queue_ttl_seconds}, and a request "
            "waits that long in the picker for the answer to one ext_proc message; the load balancer's per-message "
            "timeout for an InferencePool's picker is unverified (GKE documents neither the value nor a setting; "
            f"a Service Extensions callout's is at most {CALLOUT_MESSAGE_TIMEOUT_MAX_S} s, a GCPRoutingExtension's 1 s "
            "unless set). Where it "
            "is shorter, a request queued longer is failed by the load balancer (500 under FailClose, sent past the "
            "picker under FailOpen), first requests at zero included: try a queued request on the cluster "
            "(docs/guides/routing.md) before relying on the queue"]


def ttft_between_buckets(cfg: StackConfig) -> list[str]:
    monitoring = cfg.monitoring
    if not monitoring.slos.enabled or release(cfg.vllm_version).histogram_buckets_flag is not None \
            or (bound := ttft_bound(monitoring.ttft_slo_seconds)) == monitoring.ttft_slo_seconds:
        return []
    return [f"monitoring.ttftSloSeconds is {monitoring.ttft_slo_seconds:g}, between the bounds of vLLM "
            f"{cfg.vllm_version}'s time-to-first-token buckets, which it cannot change: the SLO counts a first "
            f"token as good within {bound:g}s (Cloud Monitoring cuts a histogram at its bounds); set it to one of "
            f"{', '.join(f'{b:g}' for b in TTFT_BUCKETS if 0.1 <= b <= 20)} for an exact objective"]


def budget_channels(cfg: StackConfig) -> list[str]:
    emails = cfg.monitoring.notification_emails
    if not cfg.budget or len(emails) <= MAX_BUDGET_CHANNELS:
        return []
    return [f"vllm-gke:budget alerts go to the first {MAX_BUDGET_CHANNELS} of monitoring.notificationEmails "
            f"(the Budget API takes at most {MAX_BUDGET_CHANNELS} channels): "
            f"{', '.join(emails[MAX_BUDGET_CHANNELS:])} get the SLO alerts only"]


def no_dataplane_v2(cfg: StackConfig) -> list[str]:
    if cfg.cluster.dataplane_v2:
        return []
    pickers = " the endpoint pickers' ext_proc and metrics," if any(
        m.routing == "inference-gateway" for m in cfg.models) else ""
    return ["cluster.dataplaneV2 is false: no NetworkPolicy is enforced, so any pod in the cluster can reach"
            f"{pickers} KEDA's ports and the loaders' and mesh check's pods, which sit outside the mesh; only a "
            "new cluster can have Dataplane V2"]


def uncalled_models(cfg: StackConfig) -> list[str]:
    called = {m for t in cfg.tenants for m in t.models}
    gke = [f"{model.name}: no tenant lists it under models, so its replicas (and GPUs) serve nobody; "
           "allow a tenant to call it, or remove it" for model in cfg.models if model.name not in called]
    run = [f"cloudRun.models[{m.name}]: no tenant lists it under models, so no request reaches its service"
           + (f" and its warm minimum of {m.min_instances} bills all day" if m.min_instances else "")
           + "; allow a tenant to call it, or remove it" for m in cfg.cloud_run_models if m.name not in called]
    return gke + run


def foreign_region_prices(cfg: StackConfig) -> list[str]:
    if cfg.region == PRICE_REGION:
        return []
    return [f"the cost figures are {PRICE_REGION} list prices; {cfg.region}'s differ (GPU machines often by "
            "10-30%): check the region's prices before budgeting"]


def open_control_plane(cfg: StackConfig) -> list[str]:
    if cfg.cluster.authorized_networks or cfg.cluster.private_endpoint:
        return []
    return ["the control plane's public endpoint accepts connections from any address; list "
            "vllm-gke:cluster.authorizedNetworks or set privateEndpoint"]


# Below this share of a replica's tokens/s, TCP between GPUDirect-capable hosts is not worth a warning.
MATERIAL_NETWORK_COST = 0.05


def interconnect_warnings(cfg: StackConfig) -> list[str]:
    """A GPU replica across hosts talks over TCP (vllm-gke sets up no GPUDirect): what that costs,
    always on machines without GPUDirect, on the others where it is material."""
    pools = {p.name: p for p in cfg.node_pools}
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for model, pool_name, _tenant in placements(cfg):
        pool = pools.get(pool_name)
        if pool is None or pool.is_tpu or (model.name, pool_name) in seen:
            continue
        hosts = hosts_per_replica(model, pool)
        if hosts <= 1:
            continue
        seen.add((model.name, pool_name))
        machine = pool.machine
        tcp, fabric = network_cost(model, model.pool_names[0], pool)
        cost = 1 - tcp / fabric
        if machine.gpudirect and cost < MATERIAL_NETWORK_COST:
            continue  # pipeline stages pass little: TCP costs next to nothing
        what = ("its tensor-parallel all-reduces (twice a layer)" if model.tensor_parallel_size > pool.slices_per_node
                else "its pipeline stages' activations")
        why = (f"{pool.machine_type}'s {machine.gpudirect} would carry it, but takes GKE multi-networking and the "
               "NCCL plugin, which vllm-gke does not set up" if machine.gpudirect else
               f"{pool.machine_type} has no GPUDirect interconnect (A3 High/Mega, A3 Ultra and A4 have); keep "
               "tensor parallelism within a node and span hosts by pipelineParallelSize only")
        out.append(f"{model.name}: a replica spans {hosts} {pool.machine_type} hosts, and {what} cross them over TCP "
                   f"at {machine.nic_gbps:g} Gbps: the roofline puts it at {tcp:,.0f} output tokens/s, "
                   f"{max(cost * 100, 1):.0f}% below the same GPUs on one fabric ({fabric:,.0f}); {why}")
    return out


def rollout_trade_offs(cfg: StackConfig) -> list[str]:
    """With rollouts on: each pool whose canary gave something up to fit its node pool, and each pool
    that rolls in place (a change there is neither gated by the SLOs nor rolled back by itself)."""
    if not cfg.rollouts.enabled:
        return []
    out: list[str] = []
    for serving in servings(cfg):
        for which in serving.model.pool_names:
            plan = pool_rollout(cfg, serving, which)
            name = f"{_label(serving.model.name, serving.tenant)} {which}"
            if not plan.is_canary:
                out.append(f"rollout of {name}: rolls in place though rollouts are on, because {plan.note}: its "
                           "changes are not gated by the SLOs and do not roll back by themselves")
            elif plan.note:
                out.append(f"canary of {name}: {plan.note}; raise the maxNodes of node pool '{serving.node_pool}' "
                           "for a full canary beside the pool at its ceiling")
        if flagger_pools(cfg, serving) and not rollout_load_tests(cfg, serving):
            out.append(f"canaries of {_label(serving.model.name, serving.tenant)}: no load test reaches them "
                       "(rollouts.loadTests): a rollout when no tenant calls the model finds no traffic to judge "
                       "and rolls back; add a loadTests entry calling it")
    return out


# The warnings that read the config alone, in the order the plan prints them (after the share's own).
CONFIG_CHECKS: tuple[Callable[[StackConfig], list[str]], ...] = (
    hyperdisk_unpriced, single_replica_pools, rollout_needs, rollout_trade_offs, long_rollouts, spot_pools, slow_cold_starts,
    picker_first_requests, picker_queue_past_the_callout, adapters_miss, ttft_between_buckets, budget_channels,
    no_dataplane_v2, uncalled_models, interconnect_warnings,
    foreign_region_prices, open_control_plane, speculative_trade_offs,
)
