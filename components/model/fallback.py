"""The degradation path to a fallback model (models[].fallback), as data: which tenants a
model's replicas send to it while they shed them, and where each goes.

The trigger is the guard's overload protection (images/vllm_gke_guard/overload.py), unchanged:
a replica sheds its lowest tiers, one a second, while its estimated queue time is over
monitoring.queueLatencySloSeconds, and brings them back one a second once it is under half.
A shed tenant allowed the fallback model gets that model's answer instead of the 429; every
other shed tenant still gets the 429.

The signal is the queue time, one part of the time to first token, not the TTFT bound itself.
TTFT is the queue time plus the prefill, and in vLLM 0.34 both grow with load: each scheduler
step gives its token budget to the running requests first, the waiting ones what is left
(vllm/v1/core/sched/scheduler.py, "First, schedule the RUNNING requests"), so a new prompt is
prefilled in smaller chunks over longer steps as the running batch grows, and a request
preempted for KV cache goes back to the queue and prefills again. The queue estimate (waiting
requests over the rate they leave) misses the prefill slowing: under a large running batch, or
with long prompts, TTFT can pass its bound while the queue stays under its objective, and then
nothing is shed or sent. The TTFT alert says so (monitoring's, a warning); the remedy there is
the batch (maxNumSeqs, the batched tokens) or more replicas, not shedding. What the queue time
gives in return: it moves within a second of the load and falls as soon as the shed requests
leave, where vLLM's TTFT histogram observes a request only at its first token, after it waited,
and a per-replica P99 needs a window of samples. The config check (config_rules/fallback.py)
keeps queueLatencySloSeconds below ttftSloSeconds, so the queue alone over its objective comes
before the bound.

How a request gets there: the shedding replica's guard takes the tenant's rate limit there, as for
a request it serves, and posts it, with the tenant's own bearer token (its RequestAuthentication
keeps the token on the request: tenant_policies.jwt_rules; vLLM is not handed it), to
the fallback's Service under the tenant's own URL prefix, as the Gateway would: the fallback's
sidecar verifies the token and its AuthorizationPolicy admits the tenant exactly as it admits
the tenant's direct calls (no new grant), and its guard applies the tenant's own caps, limits
and priority there. The `model` is set to the fallback's; nothing a client sends chooses any of it.
A request naming the original model's token IDs (a prompt of IDs, logit_bias, allowed_token_ids,
stop_token_ids, ...) is not sent: the fallback's tokenizer would read other tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from .k8s_objects import service_name_of
from .mesh_identity import tenant_namespace
from .serving_api import OBJECTIVE_HEADER, objective_name, path_prefix
from .specs import ModelSpec, TenantSpec
from .vllm_server import PORT

if TYPE_CHECKING:
    from .stack_config import StackConfig

# The routes a request is sent to the fallback on: the ones every pool serves, behind the
# endpoint picker too. A shed request on another route (responses, which may name a stored
# response of this replica; messages; a batch; pooling) gets the 429.
FORWARDED_PATHS = ("/v1/chat/completions", "/v1/completions")


def sent_tenants(model: ModelSpec, callers: Sequence[TenantSpec]) -> list[TenantSpec]:
    """The callers a replica of `model` sends to its fallback while it sheds them: those of
    negative priority (the only ones shed) whose models list the fallback."""
    if model.fallback is None:
        return []
    return [t for t in callers if t.priority < 0 and model.fallback.model in t.models]


def _dedicated(tenant: TenantSpec, model: str) -> bool:
    return tenant.dedicated is not None and model in tenant.dedicated.models


def shared_callers(cfg: "StackConfig", model: ModelSpec) -> list[TenantSpec]:
    """The tenants served by the model's shared replicas (a tenant's dedicated copy is its own)."""
    return [t for t in cfg.tenants if model.name in t.models and not _dedicated(t, model.name)]


def cluster_url(service: str, namespace: str) -> str:
    return f"http://{service}.{namespace}.svc.cluster.local:{PORT}"


def tenant_target(cfg: "StackConfig", fallback: ModelSpec, tenant: TenantSpec) -> dict[str, Any]:
    """Where the tenant's request goes: the fallback's Service (the tenant's dedicated copy of it,
    where it has one) under the prefix the Gateway routes the tenant there by; behind the
    endpoint picker with the tenant's own objective, which the fallback's mesh and guard require."""
    dedicated = _dedicated(tenant, fallback.name)
    namespace = tenant_namespace(tenant) if dedicated else cfg.serving_namespace
    prefix = "/" + path_prefix(fallback, tenant, dedicated)
    target: dict[str, Any] = {"url": cluster_url(service_name_of(fallback.name, "short"), namespace) + prefix}
    if fallback.routing == "inference-gateway":
        target["headers"] = {OBJECTIVE_HEADER: objective_name(tenant.name, fallback.name)}
    else:
        target["longUrl"] = cluster_url(service_name_of(fallback.name, "long"), namespace) + prefix
    return target


def fallback_guard_config(cfg: "StackConfig", model: ModelSpec, callers: Sequence[TenantSpec],
                          dedicated: bool = False) -> Optional[dict[str, Any]]:
    """The guard's `fallback` (its fallback.py) for a pool of `model` serving `callers`; None where
    it sends no one there (no fallback, no shed tenant allowed it, or a tenant's dedicated copy:
    its own capacity, which it does not leave)."""
    sent = [] if dedicated else sent_tenants(model, callers)
    if not sent or model.fallback is None:
        return None
    fallback = cfg.model(model.fallback.model)
    return {"model": fallback.name, "paths": list(FORWARDED_PATHS),
            # The fallback's length routing, as its route applies it (gateway_routes.length_rules).
            "longRequestBytes": fallback.long_request_bytes,
            # A request lives no longer at the load balancer.
            "timeoutSeconds": cfg.gateway.request_timeout_seconds,
            "tenants": {t.name: tenant_target(cfg, fallback, t) for t in sent}}


def forwards_token(cfg: "StackConfig", tenant: TenantSpec) -> bool:
    """Whether the tenant's bearer token must stay on its requests to the shared servers: some
    shared model it calls may send it to a fallback, which verifies the token again."""
    return any(sent_tenants(m, [tenant]) for m in cfg.models if tenant in shared_callers(cfg, m))
