"""What a stack serves, as data: each model's replicas behind a route (shared, or a tenant's
dedicated copy) and each serving pool's settings. Platform (components/platform.py) declares a
VllmService per PoolService and a route per Serving from these, adding only what exists at
deploy time (namespaces, the weights store, the provider)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .capacity import neighbours, rollout_strategy, surge_room
from .cold_start import cold_start_seconds, rollout_seconds
from .k8s_objects import service_name_of
from .serving_api import path_prefix, pool_guard_config
from .specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec, TenantSpec
from .stack_config import StackConfig
from .vllm_server import drain_seconds
from .vllm_versions import VllmRelease

# Where the shared servers run; a dedicated copy runs in its tenant's namespace.
SHARED = "serving"


def dedicated_models(tenant: TenantSpec) -> list[str]:
    return list(tenant.dedicated.models) if tenant.dedicated else []


def shared_models(tenant: TenantSpec) -> list[str]:
    return [m for m in tenant.models if m not in dedicated_models(tenant)]


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
    which: str  # short | long
    model: ModelSpec
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    image: ImageRef
    release: VllmRelease
    guard_config: Mapping[str, Any]
    load_seconds: float
    rolling: Mapping[str, int | str]
    wait_behind_seconds: float
    # KEDA's wake-up trigger reads the standby's requests where the pool may go to zero.
    standby_name: str
    canary: bool
    tenant: Optional[str]


def wait_behind(cfg: StackConfig, node_pool: str, model: ModelSpec, tenant: Optional[str], which: str) -> float:
    """The other pools' whole rollouts on the node pool: a step of an in-place pool may lose every
    freed device to their pending pods (the scheduler favours no waiter) until they are done."""
    grace = drain_seconds(cfg.gateway.request_timeout_seconds) + 30
    return float(sum(
        rollout_seconds(getattr(m, w).max_replicas, cold_start_seconds(cfg, m, cfg.pool(node_pool)), grace)
        for m, w in neighbours(cfg, node_pool, model, tenant, which)))


def pool_services(cfg: StackConfig, serving: Serving, canary: bool = False,
                  limit_store: Optional[tuple[str, int]] = None) -> list[PoolService]:
    """The pools of the serving's model (its canary revision's with `canary`), each with the
    release and image of its node pool's accelerators (the TPU build on TPUs) and the guard's
    view of its callers (`limit_store`: the shared store's host and port, where limits count
    across replicas)."""
    model = serving.model.canary_model() if canary else serving.model
    assert model is not None
    node_pool, rel = cfg.pool(serving.node_pool), cfg.release_for(serving.node_pool)
    guard = pool_guard_config(list(serving.callers), model, rel, limit_store, cfg.monitoring.queue_latency_slo_seconds,
                              traces=cfg.monitoring.traces.enabled, dedicated=serving.tenant is not None)
    key = f"{serving.key}-canary" if canary else serving.key
    out: list[PoolService] = []
    for which in model.pool_names:
        pool = getattr(model, which)
        standby = f"{service_name_of(model.name, which, canary)}-standby" if pool.min_replicas == 0 else ""
        out.append(PoolService(
            key=f"{key}-{which}", which=which, model=model, pool=pool, node_pool=node_pool,
            image=cfg.image_for(serving.node_pool), release=rel, guard_config=guard,
            load_seconds=cold_start_seconds(cfg, model, node_pool),
            rolling=rollout_strategy(surge_room(cfg, model, serving.node_pool, serving.tenant, which)),
            wait_behind_seconds=wait_behind(cfg, serving.node_pool, model, serving.tenant, which),
            standby_name=standby, canary=canary, tenant=serving.tenant))
    return out

