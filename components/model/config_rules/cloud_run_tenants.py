"""Tenants of the Cloud Run models (vllm-gke:cloudRun): a tenant lists one under tenants[].models as it
lists a GKE model; its cap within what the model serves; no dedicated copy (a Cloud Run service is one
set of instances, shared by its callers); under auth iam each calling tenant names the service accounts
that are it (tenants[].cloudRunInvokers), and an account is one tenant's, since the guard maps the
account Cloud Run verified to exactly one tenant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..specs import CloudRunModelSpec, TenantSpec, item_key
from .base import Add
from .tenants import check_tenant_cap

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def cloud_run_tenants(cfg: "StackConfig", add: Add) -> None:
    models = {m.name: m for m in cfg.cloud_run_models}
    for i, tenant in enumerate(cfg.tenants):
        key = item_key("tenants", cfg.tenants, i)
        called = [models[n] for n in tenant.models if n in models]
        for model in called:
            check_tenant_cap(add, key, tenant, model.as_model())
        _no_dedicated(add, key, tenant, models)
        _invokers(add, key, tenant, called)
    _one_tenant_an_account(cfg, add)


def _no_dedicated(add: Add, key: str, tenant: TenantSpec, models: dict[str, CloudRunModelSpec]) -> None:
    if tenant.dedicated is None:
        return
    for name in tenant.dedicated.models:
        if name in models:
            add(f"{key}.dedicated.models", f"'{name}' runs on Cloud Run (cloudRun.models), which has no dedicated "
                "copies: its one service serves every tenant that lists it, each with its own cap, limits and cache "
                "salt; remove it from dedicated.models, or declare a GKE model under vllm-gke:models for the tenant's "
                "own replicas")


def _invokers(add: Add, key: str, tenant: TenantSpec, called: list[CloudRunModelSpec]) -> None:
    iam = sorted(m.name for m in called if m.auth == "iam")
    if iam and not tenant.cloud_run_invokers:
        add(f"{key}.cloudRunInvokers", f"tenant '{tenant.name}' calls {', '.join(iam)} on Cloud Run with auth iam, "
            "where Cloud Run admits only the service accounts granted roles/run.invoker and the guard tells the tenant "
            "by the account; list the tenant's service accounts (emails) here, or use auth jwt for those models")
    elif tenant.cloud_run_invokers and not iam:
        add(f"{key}.cloudRunInvokers", f"tenant '{tenant.name}' calls no Cloud Run model with auth iam, so these "
            "accounts would be granted nothing; remove them, or list a cloudRun.models[] model with auth iam under "
            "the tenant's models")


def _one_tenant_an_account(cfg: "StackConfig", add: Add) -> None:
    owner: dict[str, str] = {}
    for i, tenant in enumerate(cfg.tenants):
        for email in tenant.cloud_run_invokers:
            if email in owner:
                add(f"{item_key('tenants', cfg.tenants, i)}.cloudRunInvokers", f"'{email}' is also tenant "
                    f"'{owner[email]}''s: the guard maps a verified account to one tenant (its caps, limits and "
                    "usage), so each account must be one tenant's; give each tenant its own service account")
            owner.setdefault(email, tenant.name)
