"""Tenants against what they call: declared models, caps within what a model serves, adapters
they may use, limits that need the shared store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..specs import ModelSpec, TenantSpec, item_key
from .base import Add
from .placement import check_placement

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def tenant_models(cfg: "StackConfig", add: Add) -> None:
    models = {m.name: m for m in cfg.models}
    cloud_run = [m.name for m in cfg.cloud_run_models]  # their tenants: cloud_run_tenants.py
    for i, tenant in enumerate(cfg.tenants):
        key = item_key("tenants", cfg.tenants, i)
        for model_name in tenant.models:
            model = models.get(model_name)
            if model is None and model_name not in cloud_run:
                add(f"{key}.models", f"model '{model_name}' is not declared; use one of "
                    f"{', '.join([*models, *cloud_run])} or add it under vllm-gke:models or vllm-gke:cloudRun.models")
            elif model is not None:
                check_tenant_cap(add, key, tenant, model)
        if tenant.dedicated:
            for model_name in tenant.dedicated.models:
                if model_name not in tenant.models:
                    add(f"{key}.dedicated.models", f"'{model_name}' must also be listed in {key}.models")
                elif model_name in models:
                    check_placement(cfg, add, f"{key}.dedicated", models[model_name], tenant.dedicated.node_pool,
                                     model_key=item_key("models", cfg.models,
                                                        next(j for j, m in enumerate(cfg.models) if m.name == model_name)))


def check_tenant_cap(add: Add, key: str, tenant: TenantSpec, model: ModelSpec) -> None:
    """A tenant's maxTokens within what the model serves. Also run by the package's VllmService."""
    if tenant.max_tokens > (served := model.served_max_model_len):
        where = (f"its one pool behind the endpoint picker (short.maxModelLen {served})"
                 if model.routing == "inference-gateway" else f"maxModelLen {served}")
        add(f"{key}.maxTokens", f"{tenant.max_tokens} exceeds what model '{model.name}' serves, "
            f"{where}: no request could use it; lower it to at most {served} or raise the pool's maxModelLen")


def external_gateway(cfg: "StackConfig", add: Add) -> None:
    if cfg.gateway.external and not cfg.tenants:
        add("tenants", "an external Gateway needs at least one tenant: with none, every request is "
            "denied; add a tenant or use gateway.className gke-l7-rilb")


def adapters(cfg: "StackConfig", add: Add) -> None:
    callers: dict[str, set[str]] = {}
    for t in cfg.tenants:
        for m in t.models:
            callers.setdefault(m, set()).add(t.name)
    for i, model in enumerate(cfg.models):
        for j, adapter in enumerate(model.adapters):
            key = f"{item_key('models', cfg.models, i)}.{item_key('adapters', model.adapters, j)}"
            if len(job := f"load-{model.name}-lora-{adapter.name}") > 63:
                add(f"{key}.name", f"the loader Job '{job}' would exceed Kubernetes' 63 characters for a "
                    f"Job's pods; shorten the adapter (or model) name by {len(job) - 63}")
            declared = {t.name for t in cfg.tenants}
            for tenant in adapter.tenants:
                if tenant not in declared:
                    add(f"{key}.tenants", f"tenant '{tenant}' is not declared; use one of "
                        f"{', '.join(sorted(declared)) or '(no tenants)'}")
                elif tenant not in callers.get(model.name, set()):
                    add(f"{key}.tenants", f"tenant '{tenant}' may not call model '{model.name}': list the model "
                        f"under that tenant's models (an adapter runs on the model's replicas), or remove it here")


def global_limits(cfg: "StackConfig", add: Add) -> None:
    for i, tenant in enumerate(cfg.tenants):
        check_tenant_limits(add, item_key("tenants", cfg.tenants, i), tenant, cfg.global_limits.enabled)


def check_tenant_limits(add: Add, tenant_key: str, tenant: TenantSpec, shared_store: bool,
                        store_key: str = "vllm-gke:globalLimits.enabled") -> None:
    """tokensPerMinute needs the shared store and room for one capped request. Also run by the
    package's VllmService."""
    tpm = tenant.rate_limit.tokens_per_minute
    if tpm is not None:
        key = f"{tenant_key}.rateLimit.tokensPerMinute"
        if not shared_store:
            add(key, f"counts tokens across all replicas, which needs the shared store: set {store_key}: true, "
                "or remove tokensPerMinute")
        elif tpm < tenant.max_tokens:
            add(key, f"{tpm} is below the tenant's maxTokens {tenant.max_tokens}: a request at the cap could never "
                "be admitted; raise it to at least maxTokens (a few times more lets requests overlap)")
