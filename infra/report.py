"""Plan-time verdicts: policy violations, GPU capacity per serving pool, and cost."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ..components.model.capacity import PoolCapacity
from ..components.model.capacity_report import capacity_report
from ..components.model.picker import picker_migration_notes
from ..components.model.picker_prefix import precise_restart_notes
from ..components.model.rollouts import canary_dollars
from ..components.model.serving_plan import pool_rollout, servings
from ..components.model.specs import TenantSpec
from ..components.model.stack_config import StackConfig
from ..components.model.tenant_urls import TenantUrl, tenant_urls, url_notes
from ..policies.rules import POLICIES, Violation, evaluate, resolve_levels
from .accelerator_options import AcceleratorOption, cloud_run_options, model_options, stack_options
from .advice import plan_warnings
from .cost import CostReport, ReplicaCost, cost_report
from .plan import Plan
from .pricing import MACHINE_PRICES


@dataclass(frozen=True)
class RolloutRow:
    """How a change reaches one serving pool (components/model/rollouts.py's RolloutPlan) and, for a
    Flagger canary, what it takes: its ceiling in replicas and devices, its largest share, the
    analysis, and what one rollout's canary costs at most (its ceiling for the whole analysis)."""

    model: str
    pool: str  # short | long
    tenant: Optional[str]  # a tenant's dedicated copy
    node_pool: str
    mode: str  # canary | in-place
    canary_replicas: int
    devices: int  # the canary's GPUs, MIG slices or TPU chips at its ceiling
    primary_max: int  # the primary's ceiling while a canary runs (the pool's, less a borrowed replica)
    max_replicas: int
    max_weight: int  # percent
    analysis_seconds: int
    progress_deadline_seconds: int
    # A replica above the floor, as the cost report prices the peak (on-demand where a spot pool
    # bursts onto its twin): a canary's replicas are over the floor.
    replica_usd_per_hour: float
    usd_per_rollout: float
    # Why it rolls in place, or what the canary gave up to fit ('' for a full canary).
    note: str


@dataclass
class Verdicts:
    levels: dict[str, str]
    violations: list[Violation]
    capacity: list[PoolCapacity]
    cost: CostReport
    warnings: list[str]
    urls: list[TenantUrl]
    ceilings: list[TenantCeiling]
    # Each model's GPU and TPU options (infra/accelerator_options.py), at the cost report's utilisation.
    options: list[AcceleratorOption] = field(default_factory=list[AcceleratorOption])
    # How a change reaches each serving pool and what its canary costs (none where rollouts are off).
    rollouts: list[RolloutRow] = field(default_factory=list[RolloutRow])

    @property
    def mandatory(self) -> list[Violation]:
        return [v for v in self.violations if v.level == "mandatory"]

    def to_json(self) -> dict[str, Any]:
        return {
            "policies": [{"name": p.name, "level": self.levels[p.name],
                          "violations": [asdict(v) for v in self.violations if v.policy == p.name]}
                         for p in POLICIES],
            "capacity": [_camel({**asdict(row), "fits": row.fits}) for row in self.capacity],
            "warnings": list(self.warnings),
            "tenantUrls": [asdict(u) for u in self.urls],
            "tenantCeilings": [_camel(asdict(c)) for c in self.ceilings],
            "cost": {
                "pricesAsOf": self.cost.prices_as_of,
                "pools": [_camel({**asdict(p), "baseline_month": p.baseline_month, "peak_month": p.peak_month,
                                  "capped": p.capped}) for p in self.cost.pools],
                "fixedMonth": self.cost.fixed_month,
                "baselineMonth": self.cost.baseline_month,
                "peakMonth": self.cost.peak_month,
                "usdPerMillionTokens": self.cost.usd_per_million_tokens,
                "baselineTokensPerSecond": self.cost.baseline_tokens_per_second,
                "throughputSource": self.cost.throughput_source,
            },
            "acceleratorOptions": [_camel({**asdict(o), "usd_per_million_tokens": o.usd_per_million_tokens(
                self.cost.utilization)}) for o in self.options],
            "rollouts": [_camel(asdict(r)) for r in self.rollouts],
        }


def _camel(row: dict[str, Any]) -> dict[str, Any]:
    """The document's keys as the stack config spells them (camelCase)."""
    return {k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): v for k, v in row.items()}


def load_policy_config(path: Optional[Path]) -> Mapping[str, Any]:
    if path is None:
        return {}
    return json.loads(path.read_text())


def capped_peaks(cost: CostReport) -> list[str]:
    """A peak the node pool cannot reach: the replicas beyond it stay pending."""
    return [f"vllm-gke:nodePools[{p.pool}].maxNodes: every serving pool at maxReplicas needs {p.wanted_peak_nodes} "
            f"nodes but the pool reaches {p.reach_nodes}"
            + (f" (maxNodes {p.reach_nodes // 2}, and as many on its on-demand twin)" if p.on_demand_twin
               else f" (maxNodes {p.reach_nodes})")
            + ", so the peak is capped there and the replicas beyond it stay pending; raise the pool's maxNodes or "
            "lower maxReplicas" for p in cost.pools if p.capped]


@dataclass(frozen=True)
class TenantCeiling:
    """The most a tenant can use in a month (a ceiling, not a forecast): the tokens its rate limit
    lets it make generate (tokensPerMinute, else requestsPerMinute x maxTokens), unless the stack
    cannot make that many even at peak, at the plan's $ per million tokens. `vllm-gke report`
    gives what it did use and cost, from the metrics."""

    tenant: str
    tokens_month: float  # the least of what the limit allows and what its replicas make at peak
    dollars_month: float
    # What the limit allows, as a share of what the replicas it can reach make in a month at peak (at
    # the target utilisation): above 1, the limit is not what bounds the tenant.
    capacity_share: float
    limit_tokens_month: float = 0.0
    bound_by: str = "rate limit"  # or "capacity": the stack at peak makes fewer than the limit allows


def dedicated_month(cfg: StackConfig, tenant: TenantSpec, hours: float) -> Optional[float]:
    """What a tenant that calls only its own replicas costs at most in a month: every pool of its
    models at maxReplicas, each pod its slots of the node pool's machine; None for a tenant that
    also calls shared pools."""
    if tenant.dedicated is None or not set(tenant.models) <= set(tenant.dedicated.models):
        return None
    pool = cfg.pool(tenant.dedicated.node_pool)
    price = MACHINE_PRICES[pool.machine_type]
    slot_hour = (price.spot_hour if pool.spot else price.on_demand_hour) / pool.slices_per_node
    return sum(getattr(m, w).max_replicas * m.devices_per_replica * slot_hour * hours
               for m in (cfg.model(n) for n in tenant.dedicated.models) for w in m.pool_names)


def _reachable(cfg: StackConfig, tenant: TenantSpec, cost: CostReport) -> list[tuple[ReplicaCost, float]]:
    """The replicas a tenant's requests can reach (its own copy of a model where it has one, else the
    shared pools), each with the share of its peak its node pool can hold (a capped pool, less than 1)."""
    hold = {p.pool: min(1.0, p.reach_nodes / p.wanted_peak_nodes) if p.wanted_peak_nodes else 1.0 for p in cost.pools}
    own: set[str] = set(tenant.dedicated.models) if tenant.dedicated is not None else set()
    return [(r, hold.get(r.node_pool, 1.0)) for r in cost.replicas if r.model in tenant.models
            and r.tenant == (tenant.name if r.model in own else None)]


def tenant_ceilings(cfg: StackConfig, cost: CostReport) -> list[TenantCeiling]:
    """Per tenant: what its rate limit allows in a month, what the replicas it can reach make at peak
    (every pool it calls at maxReplicas, as far as its node pool holds them), and what that many
    tokens cost on those replicas."""
    out: list[TenantCeiling] = []
    hours = cost.hours_per_month
    for t in cfg.tenants:
        limit = (t.rate_limit.tokens_per_minute or t.rate_limit.requests_per_minute * t.max_tokens) * hours * 60
        reach = _reachable(cfg, t, cost)
        peak = sum(r.tokens_per_second * r.max_replicas * held for r, held in reach) * cost.utilization * 3600 * hours
        peak_dollars = sum(r.peak_usd_per_hour * held for r, held in reach) * hours
        tokens = min(limit, peak)
        dollars = min(tokens / peak * peak_dollars if peak else 0.0, cost.peak_month)
        # A tenant on its own replicas alone can cost no more than they do at their ceiling.
        if (own := dedicated_month(cfg, t, hours)) is not None:
            dollars = min(dollars, own)
        out.append(TenantCeiling(t.name, tokens, dollars, limit / peak if peak else 0.0, limit,
                                 "capacity" if limit > peak else "rate limit"))
    return out


def over_budget(cfg: StackConfig, cost: CostReport) -> list[str]:
    """The month's baseline (and peak) against the stack's budget. The price table is in USD; a
    budget in another currency is not compared."""
    budget = cfg.budget
    if budget is None:
        return []
    if budget.currency != "USD":
        return [f"vllm-gke:budget.currency is {budget.currency}: the plan prices in USD and does not compare "
                "the cost with the budget; set the amount from the plan's USD figures converted"]
    if cost.baseline_month > budget.monthly_amount:
        return [f"vllm-gke:budget.monthlyAmount is {budget.monthly_amount:,} USD but the baseline costs "
                f"{cost.baseline_month:,.0f} USD a month (list prices): the budget's alerts will fire every month; "
                "raise the amount, or lower minReplicas or the node pools' minNodes"]
    if cost.peak_month > budget.monthly_amount:
        return [f"vllm-gke:budget.monthlyAmount is {budget.monthly_amount:,} USD: a month at peak would cost "
                f"{cost.peak_month:,.0f} USD, so sustained peaks cross it (the baseline, "
                f"{cost.baseline_month:,.0f} USD, does not)"]
    return []


def accelerator_options(cfg: StackConfig, cost: CostReport) -> list[AcceleratorOption]:
    """Each model's replica as the stack runs it, then the catalog's options but the one that is the
    same replica at the same price (it would be a second row of the same)."""
    here = stack_options(cfg, cost.replicas)
    same = {(o.model, o.machine_type, o.topology, o.tensor_parallel, o.pipeline_parallel, round(o.usd_per_hour, 6))
            for o in here}
    return here + [o for m in cfg.models for o in model_options(m) if (
        o.model, o.machine_type, o.topology, o.tensor_parallel, o.pipeline_parallel, round(o.usd_per_hour, 6)) not in same
    ] + cloud_run_options(cfg) + [o for m in cfg.cloud_run_models for o in model_options(m.as_model())]


def rollout_rows(cfg: StackConfig, cost: CostReport) -> list[RolloutRow]:
    """Each serving pool's rollout, where rollouts are on (off, every pool rolls in place and the
    plan says nothing of it), priced with the cost report's own replicas."""
    if not cfg.rollouts.enabled:
        return []
    price = {(r.model, r.pool, r.tenant): r.burst_usd_per_hour or r.usd_per_hour
             for r in cost.replicas if not r.canary}
    out: list[RolloutRow] = []
    for serving in servings(cfg):
        model = serving.model
        for which in model.pool_names:
            plan = pool_rollout(cfg, serving, which)
            hour = price[(model.name, which, serving.tenant)]
            out.append(RolloutRow(
                model.name, which, serving.tenant, serving.node_pool, plan.mode, plan.canary_replicas,
                plan.canary_replicas * model.devices_per_replica, plan.primary_max,
                getattr(model, which).max_replicas, plan.max_weight, plan.analysis_seconds,
                plan.progress_deadline_seconds, hour, canary_dollars(plan, hour), plan.note))
    return out


def verdicts(plan: Plan, policy_config: Optional[Mapping[str, Any]] = None) -> Verdicts:
    store = plan.platform.store
    cost = cost_report(plan.config, store.tier, store.capacity_gb)
    return Verdicts(
        levels=dict(resolve_levels(policy_config)),
        violations=evaluate(plan.policy_resources(), policy_config),
        capacity=capacity_report(plan.config),
        cost=cost,
        warnings=plan_warnings(plan.config, store.tier, store.capacity_gb) + capped_peaks(cost) + over_budget(plan.config, cost)
        + url_notes(plan.config) + picker_migration_notes(plan.config) + precise_restart_notes(plan.config),
        urls=tenant_urls(plan.config),
        ceilings=tenant_ceilings(plan.config, cost),
        options=accelerator_options(plan.config, cost),
        rollouts=rollout_rows(plan.config, cost),
    )
