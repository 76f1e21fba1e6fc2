"""What a tenant may spend, as the guard in the vLLM pod enforces it: max_tokens caps, LoRA
adapters scoped per tenant, and a shared limit store only mesh identities reach."""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Iterator, Mapping, Sequence

from .base import Finding, Resource, env_of, kube, mesh_only, namespace_of, vllm_servers, where

GUARD_MIDDLEWARE = "vllm_gke_guard.GuardMiddleware"


def loads_guard(args: Sequence[Any]) -> bool:
    """Whether a server's args load the guard (`--middleware vllm_gke_guard.GuardMiddleware`)."""
    items = [str(a) for a in args]
    return any(items[i] == "--middleware" and items[i + 1] == GUARD_MIDDLEWARE for i in range(len(items) - 1))


def uncapped(issuers: Mapping[str, Any]) -> list[str]:
    """The tenant issuers of a guard config's `issuers` without a positive maxTokens cap."""
    caps = {issuer: entry.get("maxTokens") if isinstance(entry, dict) else None for issuer, entry in issuers.items()}
    # The engine hands numbers over as doubles; a cap is a whole number of at least one.
    return [issuer for issuer, cap in caps.items()
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 1 or cap != int(cap)]


def max_tokens_cap(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, _pod, c in vllm_servers(resources):
        if not loads_guard(c.get("args") or []):
            yield r, f"{where(r)}: the server does not load {GUARD_MIDDLEWARE}, so no max_tokens cap applies"
            continue
        raw = env_of(c).get("GKE_LLM_GUARD_CONFIG", {}).get("value")
        try:
            issuers = json.loads(raw or "").get("issuers", {})
        except (ValueError, AttributeError):
            yield r, f"{where(r)}: GKE_LLM_GUARD_CONFIG is missing or not JSON"
            continue
        for issuer in uncapped(issuers):
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
    refuse plaintext (STRICT mTLS) and admit peers by identity alone, on the store's port; the one
    exception, the Cloud Run guards: address ranges to a TLS port where Redis requires the client
    certificate, mTLS off on that port alone."""
    stores = {str(cfg["globalLimits"].get("host", "")) for _r, cfg in _guard_configs(resources)
              if isinstance(cfg.get("globalLimits"), dict)}
    for store in sorted(s for s in stores if not _is_address(s)):  # an address: a Cloud Run guard's way in
        parts = store.split(".")
        ns = parts[1] if len(parts) > 1 else "default"
        tls = _client_cert_ports(resources, ns)
        for finding in mesh_only(resources, ns, f"the limit store {store}", "any pod could spend or reset a tenant's limits"):
            if finding[0] is None or not _cloud_run_tls_allow(finding[0], tls):
                yield finding
        for pa in kube(resources, "PeerAuthentication"):
            loose = {str(k) for k, v in ((pa.props.get("spec") or {}).get("portLevelMtls") or {}).items()
                     if (v or {}).get("mode") != "STRICT"}
            if namespace_of(pa) == ns and loose - tls:
                yield pa, (f"{where(pa)} lets plaintext reach port(s) {', '.join(sorted(loose - tls))} of the limit store "
                           f"{store}, where Redis requires no client certificate")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _client_cert_ports(resources: Sequence[Resource], ns: str) -> set[str]:
    """The store's TLS port where its redis.conf requires a client certificate (the Cloud Run
    guards' way in, components/model/cloud_run_store.py)."""
    ports: set[str] = set()
    for cm in kube(resources, "ConfigMap"):
        lines = ((cm.props.get("data") or {}).get("redis.conf") or "").splitlines() if namespace_of(cm) == ns else []
        words = [line.split() for line in lines if line.strip()]
        if ["tls-auth-clients", "yes"] in words and any(w[0] == "tls-ca-cert-file" for w in words):
            ports |= {w[1] for w in words if w[0] == "tls-port" and len(w) == 2}
    return ports


def _cloud_run_tls_allow(policy: Resource, tls_ports: set[str]) -> bool:
    """An ALLOW of address ranges (never everything) to client-certificate ports only."""
    rules = (policy.props.get("spec") or {}).get("rules") or []
    for rule in rules:
        sources = [f.get("source") or {} for f in rule.get("from") or []]
        blocks = [b for src in sources for b in src.get("ipBlocks") or []]
        ops = [t.get("operation") or {} for t in rule.get("to") or []]
        if (not sources or any(set(src) != {"ipBlocks"} for src in sources) or not blocks
                or any(b.endswith("/0") for b in blocks) or not ops
                or any(set(op) != {"ports"} or not op["ports"] or not set(map(str, op["ports"])) <= tls_ports for op in ops)):
            return False
    return bool(rules) and bool(tls_ports)
