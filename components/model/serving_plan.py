"""What a stack serves, as data: each model's replicas behind a route (shared, or a tenant's
dedicated copy) and each serving pool's settings. Platform (components/platform.py) declares a
VllmService per PoolService and a route per Serving from these, adding only what exists at
deploy time (namespaces, the weights store, the provider)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, Optional

from .capacity import (
    canary_room,
    hosts_per_replica,
    neighbours,
    prefill_placements,
    prefill_spec,
    rollout_strategy,
    surge_room,
)
from .cold_start import cold_start_seconds, rollout_seconds
from .disaggregation import prefill_node_pool
from .disaggregation_cluster import prefill_service
from .fallback import fallback_guard_config
from .gateway_routes import PickerTarget, RouteTarget
from .k8s_objects import service_name_of
from .picker_prefix import reads_kv_events
from .picker_wake import keeps_standby, picker_queue, wakes_on_picker_queue
from .pods.standby import standby_name
from .rollouts import RolloutPlan, rollout_plan
from .serving_api import objective_name, path_prefix, picker_max_body_bytes, picker_routes, pool_guard_config
from .serving_pool import grace_seconds
from .sleep_mode import lease_seconds, swap_guard_config
from .specs import ImageRef, LoadTestSpec, ModelSpec, NodePoolSpec, ServingPoolSpec, TenantSpec
from .stack_config import StackConfig
from .vllm_versions import VllmRelease

# Where the shared servers run; a dedicated copy runs in its tenant's namespace.
SHARED = "serving"
PoolName = Literal["short", "long", "prefill"]  # prefill: models[].disaggregation's (disaggregation_cluster.py)


def floor_dollars_per_hour(model: ModelSpec, pool: NodePoolSpec,
                           prices: Mapping[str, tuple[float, float]]) -> Optional[float]:
    """What a model's pools cost an hour at their floor (a pool that scales to zero, one replica):
    each replica its GPUs or MIG slices of the node pool's machine, at `prices` (machine type ->
    on-demand and spot $ an hour); None where the machine has no price."""
    if pool.machine_type not in prices:
        return None
    on_demand, spot = prices[pool.machine_type]
    slot = (spot if pool.spot else on_demand) / pool.slices_per_node
    return sum(max(getattr(model, w).min_replicas, 1) * model.devices_per_replica * slot for w in model.pool_names)


def dedicated_models(tenant: TenantSpec) -> list[str]:
    return list(tenant.dedicated.models) if tenant.dedicated else []


def shared_models(tenant: TenantSpec, cfg: Optional[StackConfig] = None) -> list[str]:
    """The models the tenant calls on GKE's shared replicas: not its dedicated copies, nor (given the
    stack's `cfg`) the Cloud Run models it lists, which nothing in the cluster serves or admits."""
    on_cloud_run: set[str] = {m.name for m in cfg.cloud_run_models} if cfg is not None else set()
    skip = set(dedicated_models(tenant)) | on_cloud_run
    return [m for m in tenant.models if m not in skip]


@dataclass(frozen=True)
class Serving:
    """One model's replicas reachable under /<path>/v1: the shared ones (key: the model's name) or
    a tenant's dedicated copy (key: <tenant>-<model>, in the tenant's namespace, on its node pool)."""

    key: str
    path: str
    model: ModelSpec
    node_pool: str
    callers: tuple[TenantSpec, ...]
    tenant: Optional[str] = None

    @property
    def consumer(self) -> str:
        """Whose namespace holds the replicas (the weights store's consumer key)."""
        return self.tenant or SHARED


def servings(cfg: StackConfig) -> list[Serving]:
    """Every model's shared replicas, then each tenant's dedicated copies."""
    out = [Serving(m.name, m.name, m, m.node_pool, tuple(t for t in cfg.tenants if m.name in shared_models(t)))
           for m in cfg.models]
    for t in cfg.tenants:
        for name in dedicated_models(t):
            assert t.dedicated is not None
            model = cfg.model(name)
            out.append(Serving(f"{t.name}-{name}", path_prefix(model, t, dedicated=True), model,
                               t.dedicated.node_pool, (t,), tenant=t.name))
    return out


@dataclass(frozen=True)
class PoolService:
    """One serving pool of a Serving (or of its canary): a VllmService's settings."""

    key: str  # <serving key>[-canary]-<pool>: the component's name after the Platform's prefix
    which: PoolName
    model: ModelSpec
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    image: ImageRef
    release: VllmRelease
    guard_config: Mapping[str, Any]
    load_seconds: float
    rolling: Mapping[str, int | str]
    wait_behind_seconds: float
    # KEDA's wake-up trigger reads the standby's requests where the pool may go to zero and has
    # one (picker_wake.keeps_standby)...
    standby_name: str
    canary: bool
    tenant: Optional[str]
    # How a change reaches it: a Flagger canary, or in place (and why).
    rollout: RolloutPlan = RolloutPlan("in-place")
    # ...or the picker's queue for its InferencePool (named after the model), behind a picker that queues.
    picker_pool: str = ""
    # Its servers publish KV-cache events to the model's picker (picker.prefixCache precise).
    kv_events: bool = False
    # models[].disaggregation: the other role's node pool (the prefill pool's on the decode pool, the model's
    # on the prefill pool), which NIXL's transport depends on (disaggregation.transport).
    kv_peer: Optional[NodePoolSpec] = None


def wait_behind(cfg: StackConfig, node_pool: str, model: ModelSpec, tenant: Optional[str], which: str) -> float:
    """The other pools' whole rollouts on the node pool: a step of an in-place pool may lose every
    freed device to their pending pods (the scheduler favours no waiter) until they are done."""
    grace = grace_seconds(cfg.gateway.request_timeout_seconds)
    pools = [(m, getattr(m, w).max_replicas) for m, w in neighbours(cfg, node_pool, model, tenant, which)]
    # The prefill pools there (models[].disaggregation) roll too, in place from their ceilings.
    pools += [(m, prefill_spec(m).max_replicas) for m, name in prefill_placements(cfg)
              if name == node_pool and (m.name, m.revision, "prefill") != (model.name, model.revision, which)]
    return float(sum(rollout_seconds(n, cold_start_seconds(cfg, m, cfg.pool(node_pool)), grace) for m, n in pools))


def pool_services(cfg: StackConfig, serving: Serving, canary: bool = False,
                  limit_store: Optional[tuple[str, int]] = None) -> list[PoolService]:
    """The pools of the serving's model (its canary revision's with `canary`), each with the
    release and image of its node pool's accelerators (the TPU build on TPUs) and the guard's
    view of its callers (`limit_store`: the shared store's host and port, where limits count
    across replicas)."""
    model = serving.model.canary_model() if canary else serving.model
    assert model is not None
    node_pool, rel = cfg.pool(serving.node_pool), cfg.release_for(serving.node_pool)
    dedicated = serving.tenant is not None
    guard = pool_guard_config(list(serving.callers), model, rel, limit_store, cfg.monitoring.queue_latency_slo_seconds,
                              traces=cfg.monitoring.traces.enabled, dedicated=dedicated,
                              fallback=fallback_guard_config(cfg, model, serving.callers, dedicated))
    guard = {**guard, **swap_guard_config(model, lease_seconds(cfg, serving.node_pool))}  # models[].sleepMode: the guard swaps
    key = f"{serving.key}-canary" if canary else serving.key
    out: list[PoolService] = []
    queue = picker_queue(cfg)
    for which in model.pool_names:
        pool = getattr(model, which)
        standby = standby_name(service_name_of(model.name, which, canary)) if keeps_standby(model, pool, queue) else ""
        out.append(PoolService(
            key=f"{key}-{which}", which=which, model=model, pool=pool, node_pool=node_pool,
            image=cfg.image_for(serving.node_pool), release=rel, guard_config=guard,
            load_seconds=cold_start_seconds(cfg, model, node_pool),
            rolling=rollout_strategy(surge_room(cfg, model, serving.node_pool, serving.tenant, which)),
            wait_behind_seconds=wait_behind(cfg, serving.node_pool, model, serving.tenant, which),
            standby_name=standby, canary=canary, tenant=serving.tenant,
            rollout=pool_rollout(cfg, serving, which) if not canary else RolloutPlan(
                "in-place", "a manual canary's own pool", primary_max=pool.max_replicas),
            picker_pool=model.name if wakes_on_picker_queue(model, pool, queue) else "",
            kv_events=reads_kv_events(cfg.picker, model),
            kv_peer=cfg.pool(prefill_node_pool(model)) if model.disaggregation is not None else None))
    if model.disaggregation is not None and not canary:  # its prefill pool beside the decode (short) pool
        np = cfg.pool(prefill_node_pool(model))
        out.append(prefill_service(out[0], np, cfg.image_for(np.name), cfg.release_for(np.name),
                                   cold_start_seconds(cfg, model, np)))
    return out


def pool_rollout(cfg: StackConfig, serving: Serving, which: str) -> RolloutPlan:
    """How one of the serving's pools takes a change (rollouts.py: a Flagger canary where it can)."""
    model, node_pool = serving.model, cfg.pool(serving.node_pool)
    load = cold_start_seconds(cfg, model, node_pool)
    plan = rollout_plan(cfg.rollouts, model, which, hosts_per_replica(model, node_pool),
                        canary_room(cfg, model, serving.node_pool, serving.tenant, which), load,
                        in_place_promotion=surge_room(cfg, model, serving.node_pool, serving.tenant, which) is not None)
    if not plan.is_canary:
        return plan
    grace = grace_seconds(cfg.gateway.request_timeout_seconds)
    return replace(plan, promotion_seconds=int(rollout_seconds(plan.primary_max, load, grace)))


def rollout_load_tests(cfg: StackConfig, serving: Serving) -> list[LoadTestSpec]:
    """The load tests (of those rollouts.loadTests names, else all) whose route reaches the serving's
    pools: its model's, as a tenant that calls the shared pools, or as the tenant owning the copy."""
    chosen = cfg.rollouts.load_tests
    tenants = {t.name: t for t in cfg.tenants}
    out: list[LoadTestSpec] = []
    for spec in cfg.load_tests:
        tenant = tenants.get(spec.tenant)
        if (chosen is not None and spec.name not in chosen) or tenant is None or spec.model != serving.model.name:
            continue
        owner = tenant.name if spec.model in dedicated_models(tenant) else None
        if owner == serving.tenant:
            out.append(spec)
    return out


def flagger_pools(cfg: StackConfig, serving: Serving) -> tuple[str, ...]:
    """The serving's pools Flagger rolls out (it owns their Services and routes)."""
    return tuple(w for w in serving.model.pool_names if pool_rollout(cfg, serving, w).is_canary)


def _rate_caps(model: ModelSpec, canary: bool = False) -> dict[str, int]:
    """Load balancer target requests/s per replica, by Service, of the pools that set one."""
    return {service_name_of(model.name, w, canary): cap for w in model.pool_names
            if (cap := getattr(model, w).max_rate_per_endpoint)}


def length_route(serving: Serving, namespace: Any, flagger: tuple[str, ...] = ()) -> RouteTarget:
    """The model's route by request length to its two pools, each with its canary's share (`flagger`:
    the pools whose share of the route Flagger declares)."""
    model, canary = serving.model, serving.model.canary_model()
    names = {w: service_name_of(model.name, w) for w in model.pool_names}
    canary_names = {w: service_name_of(canary.name, w, True) for w in canary.pool_names} if canary else {}
    return RouteTarget(
        serving.key, namespace, serving.path, names["short"], names["long"], model.long_request_bytes,
        canary_short_service=canary_names.get("short"), canary_long_service=canary_names.get("long"),
        canary_weight=model.canary.weight if model.canary else 0,
        max_rate_per_endpoint={**_rate_caps(model), **(_rate_caps(canary, True) if canary else {})},
        flagger_pools=flagger)


def picker_objectives(serving: Serving) -> dict[str, int]:
    """The InferenceObjective of each caller (its priority), by name."""
    return {objective_name(t.name, serving.model.name): t.priority for t in serving.callers}


def picker_routes_of(serving: Serving, namespace: Any, salted: tuple[str, ...] = ()) -> list[RouteTarget]:
    """Per caller, a route /<tenant>/<model>/v1 to the model's InferencePool that sets the tenant's
    objective: the tenant must be in the path for its priority to be bound to its token (the load
    balancer cannot read the JWT; the mesh checks the pair). A dedicated copy's route keeps its
    key; a shared model's are one per tenant ('.' never occurs in a name, so they never collide
    with a dedicated <tenant>-<model>). `salted`: the routes whose bodies the identity extension
    salts (serving_api.picker_salted_paths of the pool's release)."""
    model, dedicated = serving.model, serving.tenant is not None
    return [RouteTarget(
        serving.key if dedicated else f"{model.name}.{t.name}", namespace, path_prefix(model, t, dedicated),
        service_name_of(model.name, "short"), "", model.long_request_bytes,
        picker=PickerTarget(model.name, objective_name(t.name, model.name), t.name,
                            routes=tuple((r.path, r.method) for r in picker_routes()),
                            max_body_bytes=picker_max_body_bytes(model), salted_paths=salted))
        for t in serving.callers]


def route_targets(serving: Serving, namespace: Any, flagger: tuple[str, ...] = (),
                  salted: tuple[str, ...] = ()) -> list[RouteTarget]:
    """How the load balancer reaches the serving's replicas (`namespace`: where they run, a name
    or a Pulumi output of one, placed as it is)."""
    if serving.model.routing == "inference-gateway":
        return picker_routes_of(serving, namespace, salted)
    return [length_route(serving, namespace, flagger)]
