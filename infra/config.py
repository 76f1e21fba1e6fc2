"""Stack config: read from Pulumi config, validated by pydantic, checked across fields.

Every problem becomes a ConfigIssue naming the config key (as written in stacks/*.yaml) and
the fix. ConfigError derives from pulumi.RunError, so `pulumi up` prints it without a stack
trace, and the offline plan prints it and exits 2.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

import pulumi
from pydantic import Field, ValidationError

from infra.capacity import gpu_slots_by_pool, pool_capacity
from components.specs import (
    ClusterSpec, CostSpec, GatewaySpec, ImageRef, ModelSpec, MonitoringSpec, Name, NodePoolSpec,
    Spec, TenantSpec, WeightsSpec,
)

PROJECT = "vllm-gke"
# Fields that live in another provider's namespace in stack config.
FOREIGN_KEYS = {"project": "gcp:project", "region": "gcp:region"}


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


class ConfigError(pulumi.RunError):
    def __init__(self, issues: list[ConfigIssue], source: str = "stack config"):
        self.issues = issues
        self.source = source
        lines = [f"invalid {source} ({len(issues)} problem{'s' if len(issues) != 1 else ''}):"]
        lines += [f"  - {issue}" for issue in issues]
        super().__init__("\n".join(lines))


class StackConfig(Spec):
    project: str
    region: str
    environment: Literal["dev", "staging", "prod"]
    cluster: ClusterSpec
    node_pools: list[NodePoolSpec] = Field(min_length=1)
    models: list[ModelSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(default_factory=list)
    server_image: ImageRef
    serving_namespace: Name = "vllm"
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    cost: CostSpec = Field(default_factory=CostSpec)

    def pool(self, name: str) -> NodePoolSpec:
        return next(p for p in self.node_pools if p.name == name)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)


def config_key(loc: tuple[Any, ...]) -> str:
    """('nodePools', 0, 'machineType') -> 'vllm-gke:nodePools[0].machineType'."""
    if not loc:
        return f"{PROJECT}:<root>"
    head = str(loc[0])
    snake = {f.alias: n for n, f in StackConfig.model_fields.items()}.get(head, head)
    key = FOREIGN_KEYS.get(snake, f"{PROJECT}:{head}")
    for part in loc[1:]:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


def _problem(err: Mapping[str, Any]) -> str:
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "missing":
        return "is required but not set; add it to the stack config"
    if kind == "extra_forbidden":
        return "is not a known setting; remove it or fix its spelling (see README 'Config reference')"
    return msg


def _semantic_issues(cfg: StackConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    add = lambda key, problem: issues.append(ConfigIssue(f"{PROJECT}:{key}", problem))  # noqa: E731
    for field, items in (("nodePools", cfg.node_pools), ("models", cfg.models), ("tenants", cfg.tenants)):
        for name, n in Counter(i.name for i in items).items():
            if n > 1:
                add(field, f"name '{name}' is used {n} times; names must be unique")
    pools = {p.name: p for p in cfg.node_pools}
    models = {m.name: m for m in cfg.models}

    def check_placement(key: str, model: ModelSpec, pool_name: str) -> None:
        pool = pools.get(pool_name)
        if pool is None:
            add(f"{key}.nodePool", f"node pool '{pool_name}' does not exist; use one of "
                f"{', '.join(pools)} or add it under vllm-gke:nodePools")
            return
        tp = model.tensor_parallel_size
        if pool.gpu_partition_size and tp > 1:
            add(f"{key}.tensorParallelSize", f"is {tp} but pool '{pool.name}' is MIG-partitioned "
                f"({pool.gpu_partition_size}); MIG slices cannot be joined, so set it to 1 or use a pool "
                "without gpuPartitionSize")
        elif pool.machine.gpus % tp:
            add(f"{key}.tensorParallelSize", f"is {tp} but {pool.machine_type} has {pool.machine.gpus} "
                "GPU(s) per node; use a divisor of that, or a larger machine type")
        where = (f"one {pool.gpu_partition_size} MIG slice" if pool.gpu_partition_size
                 else f"one {pool.machine_type} GPU")
        for which in ("short", "long"):
            row = pool_capacity(model, which, getattr(model, which), pool)
            if row.fits:
                continue
            if row.kv_budget_gb <= 0:  # the weights alone overflow: same for both pools
                add(key, f"model '{model.name}' on {where} of pool '{pool.name}': {row.problem}; {row.fix()}")
                break
            add(f"{key}.{which}" if key.startswith("models") else key,
                f"model '{model.name}' ({which} pool) on {where} of pool '{pool.name}': {row.problem}; "
                f"{row.fix()}")

    for i, model in enumerate(cfg.models):
        key = f"models[{i}]"
        check_placement(key, model, model.node_pool)
        for pool_name in ("short", "long"):
            pool = getattr(model, pool_name)
            if pool.max_model_len and pool.max_model_len > model.max_model_len:
                add(f"{key}.{pool_name}.maxModelLen", f"{pool.max_model_len} exceeds the model's "
                    f"maxModelLen {model.max_model_len}; lower it or raise models[{i}].maxModelLen")
    for i, tenant in enumerate(cfg.tenants):
        for model_name in tenant.models:
            if model_name not in models:
                add(f"tenants[{i}].models", f"model '{model_name}' is not declared; use one of "
                    f"{', '.join(models)} or add it under vllm-gke:models")
        if tenant.dedicated:
            for model_name in tenant.dedicated.models:
                if model_name not in tenant.models:
                    add(f"tenants[{i}].dedicated.models", f"'{model_name}' must also be listed in "
                        f"tenants[{i}].models")
                elif model_name in models:
                    check_placement(f"tenants[{i}].dedicated", models[model_name], tenant.dedicated.node_pool)
    for name, needed in gpu_slots_by_pool(cfg).items():
        pool = pools.get(name)
        if pool is None:
            continue  # reported above as an unknown nodePool
        offered = pool.max_nodes * pool.slices_per_node
        if needed > offered:
            idx = cfg.node_pools.index(pool)
            add(f"nodePools[{idx}].maxNodes", f"pool '{name}' offers at most {offered} GPU slot(s) "
                f"({pool.max_nodes} node(s) x {pool.slices_per_node}) but its models' minReplicas need "
                f"{needed}; raise maxNodes or lower minReplicas")
    if cfg.gateway.external and not cfg.tenants:
        add("tenants", "an external Gateway needs at least one tenant: with none, every request is "
            "denied; add a tenant or use gateway.className gke-l7-rilb")
    return issues


def parse(values: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Build a StackConfig from {field alias or gcp key: value}; raise ConfigError on any problem."""
    data = {}
    for name, field in StackConfig.model_fields.items():
        key = FOREIGN_KEYS.get(name, f"{PROJECT}:{field.alias}")
        if key in values:
            data[field.alias] = values[key]
    unknown = [k for k in values if k.startswith(f"{PROJECT}:")
               and k.split(":", 1)[1] not in {f.alias for f in StackConfig.model_fields.values()}]
    issues = [ConfigIssue(k, _problem({"type": "extra_forbidden", "msg": ""})) for k in unknown]
    try:
        cfg: Optional[StackConfig] = StackConfig.model_validate(data)
    except ValidationError as exc:
        cfg = None
        issues += [ConfigIssue(config_key(e["loc"]), _problem(e)) for e in exc.errors()]
    if cfg is not None:
        issues += _semantic_issues(cfg)
    if issues:
        raise ConfigError(issues, source)
    assert cfg is not None
    return cfg


def _decode(raw: str) -> Any:
    # Pulumi hands structured config over as JSON text and scalars as plain text.
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def load() -> StackConfig:
    """Read the running stack's config (under `pulumi up` or the offline plan's mocks)."""
    from pulumi.runtime.config import CONFIG, get_config_env

    # The language host sets CONFIG; older hosts only pass PULUMI_CONFIG in the environment.
    raw = {**get_config_env(), **CONFIG.get()}
    values = {k: _decode(v) for k, v in raw.items()
              if k.startswith(f"{PROJECT}:") or k in FOREIGN_KEYS.values()}
    return parse(values, f"config of stack '{pulumi.get_stack()}'")
