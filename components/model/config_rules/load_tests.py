"""Load tests against what they call: a tenant that calls the model, a gateway hostname to call,
lengths the tenant's cap and the model's context admit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..specs import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def load_tests(cfg: "StackConfig", add: Add) -> None:
    tenants = {t.name: t for t in cfg.tenants}
    models = {m.name: m for m in cfg.models}
    seen: set[str] = set()
    for i, spec in enumerate(cfg.load_tests):
        key = item_key("loadTests", cfg.load_tests, i)
        if spec.name in seen:
            add(f"{key}.name", f"'{spec.name}' names two load tests: give each its own")
        seen.add(spec.name)
        if not cfg.gateway.hostname:
            add(key, "a load test calls the tenant's public URL: set vllm-gke:gateway.hostname")
        tenant, model = tenants.get(spec.tenant), models.get(spec.model)
        if model is None and spec.model in {m.name for m in cfg.cloud_run_models}:
            continue  # config_rules/cloud_run.py refuses it, saying why
        if tenant is None:
            add(f"{key}.tenant", f"'{spec.tenant}' is not a tenant: use one of {', '.join(sorted(tenants)) or '(none)'}")
            continue
        if model is None or spec.model not in tenant.models:
            add(f"{key}.model", f"tenant '{tenant.name}' does not call '{spec.model}': use one of "
                                f"{', '.join(tenant.models)}")
            continue
        if spec.output_tokens.max > tenant.max_tokens:
            add(f"{key}.outputTokens.max", f"{spec.output_tokens.max} is over tenant '{tenant.name}'s maxTokens "
                                           f"{tenant.max_tokens}: the guard would refuse those requests")
        longest = max(model.pool_max_model_len(getattr(model, w)) for w in model.pool_names)
        if spec.prompt_tokens.max + spec.output_tokens.max > longest:
            add(f"{key}.promptTokens.max", f"{spec.prompt_tokens.max} prompt + {spec.output_tokens.max} output "
                                           f"tokens exceed '{model.name}'s longest context, {longest}")
        if (sp := spec.shared_prefix) is not None:
            if sp.output_tokens > tenant.max_tokens:
                add(f"{key}.sharedPrefix.outputTokens", f"{sp.output_tokens} is over tenant '{tenant.name}'s "
                                                        f"maxTokens {tenant.max_tokens}")
            if sp.prefix_tokens + sp.question_tokens + sp.output_tokens > longest:
                add(f"{key}.sharedPrefix.prefixTokens", f"prefix, question and output exceed '{model.name}'s "
                                                        f"longest context, {longest}")
