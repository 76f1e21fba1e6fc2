"""Request traces kept private and affordable: sampled by ratio, sent only to a collector in the
cluster that admits the servers by mesh identity."""

from __future__ import annotations

from typing import Iterator, Sequence
from urllib.parse import urlparse

from .base import Finding, Resource, env_of, mesh_only, vllm_servers, where

SAMPLER = "parentbased_traceidratio"


def _flag(args: Sequence[object], flag: str) -> str | None:
    items = [str(a) for a in args]
    for i, a in enumerate(items):
        if a == flag and i + 1 < len(items):
            return items[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def traces_private(resources: Sequence[Resource]) -> Iterator[Finding]:
    namespaces: set[str] = set()
    for r, _pod, c in vllm_servers(resources):
        endpoint = _flag(c.get("args") or [], "--otlp-traces-endpoint")
        if endpoint is None:
            continue
        host = urlparse(endpoint).hostname or ""
        parts = host.split(".")
        if not host.endswith(".svc.cluster.local") or len(parts) != 5:
            yield r, (f"{where(r)} sends its traces to {host or endpoint}, outside the cluster's collector: spans "
                      "name tenants and request ids (set vllm-gke:monitoring.traces)")
            continue
        namespaces.add(parts[1])
        sampler = (env_of(c).get("OTEL_TRACES_SAMPLER") or {}).get("value")
        ratio = (env_of(c).get("OTEL_TRACES_SAMPLER_ARG") or {}).get("value")
        if sampler != SAMPLER or ratio is None:
            yield r, (f"{where(r)} samples traces with {sampler or 'the SDK default (parentbased_always_on)'}: "
                      f"every request is recorded at the platform's cost; use {SAMPLER} with a ratio")
    for ns in sorted(namespaces):
        yield from mesh_only(resources, ns, f"the trace collector in '{ns}'",
                             "any pod could write into the platform's traces")
