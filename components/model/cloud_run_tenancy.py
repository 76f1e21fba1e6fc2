"""The tenants of a Cloud Run model (cloudRun.models[]): the guard's config its instances run with, and
who may invoke its service.

The guard enforces what it enforces on GKE - the tenants' caps, rate limits (the shared store over the
VPC where globalLimits is on: cloud_run_store.py), cache salts, usage on /metrics, the allow-listed
routes - from the same serving_api.guard_config. What differs is who the tenant is: no mesh sidecar
verified a token before the guard, so its trusted-peer check has no sidecar to trust (no peer is
listed) and the config's `cloudRun` section says how the guard tells the tenant itself
(images/vllm_gke_guard/cloud_run.py):

  - auth jwt: each calling tenant's jwt (issuer, JWKS, audiences, subjects), which the guard verifies
    the request's Authorization token against, as Istio and the identity extension do on GKE;
  - auth iam: each calling tenant's service accounts (tenants[].cloudRunInvokers), which are the
    service's roles/run.invoker members (`invoker_members`); the guard maps the account of the ID
    token Cloud Run verified to its tenant.

In both, the mesh's verified-identity headers a client sends are refused, and a /<tenant>/<model>/v1
path admits that tenant alone.
"""

from __future__ import annotations

from typing import Any, Optional

from .cloud_run_gateway import cloud_run_base, cloud_run_callers, cloud_run_prefix_tenants, cloud_run_prefixes, front_name
from .cloud_run_store import guard_store_config
from .serving_api import TENANT_HEADER, VERIFIED_HEADERS, guard_config, guard_max_body_bytes, tenant_routes
from .specs import CLOUD_RUN_POOL, CloudRunModelSpec, TenantSpec
from .stack_config import StackConfig
from .vllm_versions import VllmRelease

# What a client may not send a Cloud Run model: the headers Istio and the identity extension set on
# GKE after verifying a token (the guard reads none of them here; one sent is a forgery).
REFUSED_HEADERS = (*VERIFIED_HEADERS, TENANT_HEADER)


def cloud_run_guard_config(cfg: StackConfig, model: CloudRunModelSpec,
                           rel: Optional[VllmRelease] = None) -> dict[str, Any]:
    """The guard's config (GKE_LLM_GUARD_CONFIG) for `model`'s instances: the GKE guard's for the
    tenants that list it (caps, limits, salts, usage, routes the release salts) with no trusted
    peer, and the `cloudRun` section naming how each tenant is verified."""
    rel = rel if rel is not None else cfg.release_for(CLOUD_RUN_POOL)
    callers = cloud_run_callers(cfg, model.name)
    served = model.as_model()
    base = guard_config(callers, [r for r in tenant_routes() if r.path not in rel.unsalted_paths], rel.max_tokens_rule,
                        shared_store=None, served=served, max_body_bytes=guard_max_body_bytes(served),
                        cache_salt_paths=rel.cache_salt_paths,
                        queue_slo_seconds=cfg.monitoring.queue_latency_slo_seconds,
                        traces=cfg.monitoring.traces.enabled, path_prefixes=cloud_run_prefixes(cfg, model.name))
    if (store := guard_store_config(cfg)) is not None:
        base["globalLimits"] = store
    return {**base, "trustedPeers": [], "cloudRun": identity_config(cfg, model, callers)}


def identity_config(cfg: StackConfig, model: CloudRunModelSpec, callers: list[TenantSpec]) -> dict[str, Any]:
    """The guard config's `cloudRun`: the auth mode and what it verifies each tenant by."""
    out: dict[str, Any] = {"auth": model.auth, "refusedHeaders": list(REFUSED_HEADERS),
                           "tenantPrefixes": {p: t for p, t in cloud_run_prefix_tenants(cfg, model.name).items()
                                              if t is not None}}
    if model.auth == "jwt":
        out["tenants"] = {t.name: {"issuer": t.jwt.issuer, "jwksUri": t.jwt.jwks_uri, "audiences": list(t.jwt.audiences),
                                   "subjects": list(t.jwt.subjects) if t.jwt.subjects is not None else None}
                          for t in callers}
    else:
        out["accounts"] = {email: t.name for t in callers for email in t.cloud_run_invokers}
    return out


def invoker_members(cfg: StackConfig, model: CloudRunModelSpec) -> list[str]:
    """The service's roles/run.invoker members: under auth iam each calling tenant's service
    accounts; under auth jwt none (the invoker check is off: the guard verifies the tenant's token)."""
    if model.auth != "iam":
        return []
    return sorted({f"serviceAccount:{email}" for t in cloud_run_callers(cfg, model.name) for email in t.cloud_run_invokers})


def id_token_audience(cfg: StackConfig, model: CloudRunModelSpec) -> Optional[str]:
    """The audience a tenant's client mints its Google ID token for under auth iam, which the service
    accepts as its custom audience (None under jwt: no invoker check reads it). Cloud Run checks a
    token's `aud` against the service's run.app URL, which the load balancer's clients never call (it
    is disabled), or a custom audience; by convention the URL called: the model's base on the Cloud Run
    models' load balancer, <scheme>://<cloudRun.hostname>/<model>, one per model so that a token for
    one model is no token for another. Without a hostname (an internal load balancer reached at its
    address) no URL is fixed when the service is planned, and an address re-created would change every
    client's tokens: the audience is then the plain name <cluster>-run/<model>."""
    if model.auth != "iam":
        return None
    if cfg.cloud_run is not None and cfg.cloud_run.hostname:
        return f"{cloud_run_base(cfg)}/{model.name}"
    return f"{front_name(cfg)}/{model.name}"
