"""Where each tenant calls each of its models: the path the Gateway routes, and why there.

A model with length routing is shared at /<model>/v1; behind the endpoint picker the tenant is in
the path (/<tenant>/<model>/v1: the tenant identity extension verifies the token as that tenant's
and sets its objective and fairness id, so its priority is bound to its token, and the client sends
no header of its own); a tenant's dedicated copy is at /<tenant>/<model>/v1 too. The program declares
its routes from `path_prefix` (serving_api: the guard and the mesh take the same prefixes), and the
plan prints `tenant_urls`, so they cannot differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cloud_run_gateway import cloud_run_url, is_cloud_run_model
from .cloud_run_tenancy import id_token_audience
from .serving_api import path_prefix
from .stack_config import StackConfig


@dataclass(frozen=True)
class TenantUrl:
    tenant: str
    model: str
    url: str
    # "shared" (length routing), "endpoint picker", "dedicated" or "cloud run"
    via: str
    # A header every request must carry besides its token, or "" (none does: behind the picker the
    # identity extension sets the tenant's objective from the token).
    header: str = ""
    # A Cloud Run model with auth iam: the audience the tenant's Google ID token must be minted for, or "".
    audience: str = ""


def gateway_base(cfg: StackConfig) -> str:
    scheme = "https" if cfg.gateway.tls else "http"
    return f"{scheme}://{cfg.gateway.hostname or '<gatewayAddress>'}"


def tenant_urls(cfg: StackConfig) -> list[TenantUrl]:
    base = gateway_base(cfg)
    out: list[TenantUrl] = []
    for tenant in cfg.tenants:
        dedicated: set[str] = set(tenant.dedicated.models) if tenant.dedicated else set()
        for name in tenant.models:
            if is_cloud_run_model(cfg, name):  # behind the Cloud Run models' load balancer, same scheme
                audience = id_token_audience(cfg, next(m for m in cfg.cloud_run_models if m.name == name))
                out.append(TenantUrl(tenant.name, name, cloud_run_url(cfg, name), "cloud run", audience=audience or ""))
                continue
            model = cfg.model(name)
            via = "dedicated" if name in dedicated else (
                "endpoint picker" if model.routing == "inference-gateway" else "shared")
            out.append(TenantUrl(tenant.name, name, f"{base}/{path_prefix(model, tenant, name in dedicated)}/v1", via))
    return out


def url_notes(cfg: StackConfig) -> list[str]:
    """What a reader of the plan must know before changing routing: the URLs move."""
    picked = sorted(m.name for m in cfg.models if m.routing == "inference-gateway")
    if not picked:
        return []
    return [f"{', '.join(picked)}: behind the endpoint picker each tenant calls /<tenant>/<model>/v1 with its "
            "token (no other header: the identity extension sets its objective from the token), not the shared "
            "/<model>/v1; switching a model's routing moves its tenants' URLs (tell them first)"]
