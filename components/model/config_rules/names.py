"""Names the stack gives that must not collide: items, policies, what is served, tenant issuers, the
serving namespace."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from ..specs import TenantSpec, item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

# Namespaces the platform (or Kubernetes, or the mesh) owns.
RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", "istio-system", "gke-managed-system",
                       "gmp-system", "gmp-public", "custom-metrics", "vllm-gke-system", "vllm-gke-mesh-check",
                       "vllm-gke-limits", "keda"}


def unique_names(cfg: "StackConfig", add: Add) -> None:
    for field, items in (("nodePools", cfg.node_pools), ("models", cfg.models), ("tenants", cfg.tenants)):
        for name, n in Counter(i.name for i in items).items():
            if n > 1:
                add(field, f"name '{name}' is used {n} times; names must be unique")
    # The serving namespace holds one AuthorizationPolicy allow-<tenant>-<model> per pair: tenant
    # 'a-b' calling 'c' and tenant 'a' calling 'b-c' would name the same object, and one tenant's
    # access would overwrite the other's.
    seen: dict[str, tuple[int, str]] = {}
    for i, tenant in enumerate(cfg.tenants):
        for model in tenant.models:
            name = f"allow-{tenant.name}-{model}"
            if name in seen and seen[name][1] != tenant.name:
                j, other = seen[name]
                add(f"{item_key('tenants', cfg.tenants, i)}.name", f"tenant '{tenant.name}' calling '{model}' and "
                    f"tenant '{other}' ({item_key('tenants', cfg.tenants, j)}) name the same policy '{name}'; rename "
                    "one of the tenants or models")
            seen.setdefault(name, (i, tenant.name))
    # What the program serves is named by a key - a model, its canary (<model>-canary), a tenant's
    # dedicated copy (<tenant>-<model>) and its canary - that names its routes, pools, Services and
    # Pulumi resources: two things under one key would be two owners of each.
    served: dict[str, str] = {}

    def serve(key: str, where: str, what: str, also: str) -> None:
        if key in served:
            add(where, f"{what} is named '{key}', which is also {served[key]}; rename one of them")
        served.setdefault(key, also)

    for m in cfg.models:
        served.setdefault(m.name, "a model's name")
    for i, m in enumerate(cfg.models):
        if m.canary is not None:
            serve(f"{m.name}-canary", f"{item_key('models', cfg.models, i)}.canary", f"model '{m.name}''s canary",
                  f"the name of model '{m.name}''s canary")
    canaries = {m.name for m in cfg.models if m.canary is not None}
    for i, tenant in enumerate(cfg.tenants):
        key = f"{item_key('tenants', cfg.tenants, i)}.dedicated.models"
        for model in tenant.dedicated.models if tenant.dedicated else []:
            copy = f"tenant '{tenant.name}''s dedicated copy of '{model}'"
            serve(f"{tenant.name}-{model}", key, copy, f"the name of {copy}")
            if model in canaries:
                serve(f"{tenant.name}-{model}-canary", key, f"the canary of {copy}", f"the name of the canary of {copy}")
    # A spot pool's on-demand twin is the node pool <pool>-ondemand.
    pools = {p.name for p in cfg.node_pools}
    for i, pool in enumerate(cfg.node_pools):
        if pool.has_fallback_pool and (twin := f"{pool.name}-ondemand") in pools:
            add(f"{item_key('nodePools', cfg.node_pools, i)}.onDemandFallback",
                f"the pool's on-demand twin is the node pool '{twin}', which is also declared; rename that pool or "
                "set onDemandFallback: false")


def issuers(cfg: "StackConfig", add: Add) -> None:
    tenants = cfg.tenants
    for i, a in enumerate(tenants):
        for j, b in enumerate(tenants):
            if i >= j:
                continue
            if a.jwt.issuer == b.jwt.issuer:
                add(f"{item_key('tenants', tenants, j)}.jwt.issuer", f"'{b.jwt.issuer}' is also "
                    f"{item_key('tenants', tenants, i)}'s ('{a.name}'): tenants are told apart by issuer, so each "
                    "needs its own")
    # An issuer that is a path prefix of another's is fine: Istio matches a principal's iss exactly
    # (`<iss>/*` is any subject of that one issuer; infra/contracts/istio.py), as does the guard.


def namespaces(cfg: "StackConfig", add: Add) -> None:
    check_serving_namespace(add, "servingNamespace", cfg.serving_namespace, cfg.tenants)


def check_serving_namespace(add: Add, key: str, ns: str, tenants: Sequence[TenantSpec] = ()) -> None:
    """Not a tenant's namespace, nor one the platform or GKE owns. Also run by the package's MeshNamespace."""
    tenant_namespaces = {f"tenant-{t.name}" for t in tenants}
    if ns in tenant_namespaces or ns in RESERVED_NAMESPACES:
        owner = "a tenant's namespace" if ns in tenant_namespaces else "a namespace the platform or GKE owns"
        add(key, f"'{ns}' is {owner}; choose another name (default vllm)")
