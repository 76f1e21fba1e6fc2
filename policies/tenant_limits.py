"""What a tenant may spend, as the guard in the vLLM pod enforces it: max_tokens caps, LoRA
adapters scoped per tenant, and a shared limit store only mesh identities reach."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

from .base import Finding, Resource, env_of, mesh_only, vllm_servers, where

GUARD_MIDDLEWARE = "vllm_gke_guard.GuardMiddleware"


def max_tokens_cap(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, _pod, c in vllm_servers(resources):
        args = [str(a) for a in c.get("args") or []]
        if not any(args[i] == "--middleware" and args[i + 1] == GUARD_MIDDLEWARE for i in range(len(args) - 1)):
            yield r, f"{where(r)}: the server does not load {GUARD_MIDDLEWARE}, so no max_tokens cap applies"
            continue
        raw = env_of(c).get("GKE_LLM_GUARD_CONFIG", {}).get("value")
        try:
            issuers = json.loads(raw or "").get("issuers", {})
        except (ValueError, AttributeError):
            yield r, f"{where(r)}: GKE_LLM_GUARD_CONFIG is missing or not JSON"
            continue
        for issuer, entry in issuers.items():
            cap = entry.get("maxTokens") if isinstance(entry, dict) else None
            # The engine hands numbers over as doubles; a cap is a whole number of at least one.
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 1 or cap != int(cap):
                yield r, f"{where(r)}: tenant issuer {issuer} has no positive maxTokens cap"


def _guard_configs(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    for r, _pod, c in vllm_servers(resources):
        raw = (env_of(c).get("GKE_LLM_GUARD_CONFIG") or {}).get("value")
        try:
            yield r, json.loads(raw) if isinstance(raw, str) else {}
        except ValueError:
            yield r, {}


def _flag_values(args: Sequence[Any], flag: str) -> list[str]:
    """The values after `flag` up to the next option (nargs='+')."""
    out: list[str] = []
    items = [str(a) for a in args]
    for i, a in enumerate(items):
        if a == flag:
            for v in items[i + 1:]:
                if v.startswith("--"):
                    break
                out.append(v)
    return out


def lora_adapters_scoped(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A server with LoRA adapters serves several models in one process: the guard must hold a
    per-tenant list of the `model` values each tenant may send, and every adapter must come
    from the read-only weights mount (never fetched from a hub at run time)."""
    configs = {r.urn: cfg for r, cfg in _guard_configs(resources)}
    for r, _pod, c in vllm_servers(resources):
        modules = _flag_values(list(c.get("command") or []) + list(c.get("args") or []), "--lora-modules")
        if not modules:
            continue
        mounts = [m.get("mountPath", "") for m in c.get("volumeMounts") or [] if m.get("readOnly")]
        for module in modules:
            path = module.split("=", 1)[1] if "=" in module else module
            # Under a read-only mount, or a mount of its own (Hyperdisk ML: a disk per adapter).
            if not any(path == m.rstrip("/") or path.startswith(m.rstrip("/") + "/") for m in mounts):
                yield r, f"{where(r)}: LoRA adapter '{module}' is not on a read-only mount of the weights"
        issuers = (configs.get(r.urn) or {}).get("issuers") or {}
        unscoped = sorted(e.get("tenant", i) for i, e in issuers.items() if not isinstance(e.get("models"), list))
        if unscoped:
            yield r, (f"{where(r)} serves LoRA adapters but its guard lets {', '.join(unscoped)} send any `model`: "
                      "every tenant could use every adapter")


def limit_store_mesh_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    """The shared limit store has no password: the mesh is its only lock. Its namespace must
    refuse plaintext (STRICT mTLS) and admit peers by identity alone, on the store's port."""
    stores = {str(cfg["globalLimits"].get("host", "")) for _r, cfg in _guard_configs(resources)
              if isinstance(cfg.get("globalLimits"), dict)}
    for store in sorted(stores):
        parts = store.split(".")
        yield from mesh_only(resources, parts[1] if len(parts) > 1 else "default", f"the limit store {store}",
                             "any pod could spend or reset a tenant's limits")
