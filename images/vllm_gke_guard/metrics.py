"""What the guard tells operators: its counters on vLLM's /metrics (a dashboard tile and an alert
read each: components/observability.py) and its log, through vLLM's own logger."""

from __future__ import annotations

import logging
from typing import Any

# A child of vLLM's own logger, whose handler vLLM's logging config sets up: in vLLM's API
# server the root logger has no handler and is at ERROR, so a plain module logger shows nothing.
log = logging.getLogger("vllm.gke_guard")


class _NoCounter:
    def inc(self) -> None:
        pass


def _counter(name: str, documentation: str) -> Any:
    """A Prometheus counter on vLLM's /metrics (prometheus_client's default registry, which vLLM's
    single API server serves); a no-op where prometheus_client is missing (tests)."""
    try:
        from prometheus_client import Counter
    except ImportError:  # pragma: no cover - it ships with vLLM
        return _NoCounter()
    try:
        return Counter(name, documentation)
    except ValueError:  # registered already (the module loaded twice)
        from prometheus_client import REGISTRY

        return REGISTRY._names_to_collectors[name]  # pyright: ignore[reportPrivateUsage]  (no public lookup)


# Requests counted on the replica's own windows because the shared limit store did not answer:
# the dashboard and an alert read it (vllm_gke_guard_limit_store_fallbacks_total).
STORE_FALLBACKS = _counter("vllm_gke_guard_limit_store_fallbacks", "Requests limited per replica because the "
                           "shared limit store was unreachable")
# Tenant requests refused because they did not arrive from the sidecar's inbound passthrough
# address: a process in the pod calling vLLM directly, or a mesh whose data plane delivers from
# another address (the platform is built on istiod's 127.0.0.6; managed Cloud Service Mesh's
# TRAFFIC_DIRECTOR implementation does not document it). An alert reads it
# (vllm_gke_guard_untrusted_peer_requests_total); the log names the address, once each.
UNTRUSTED_PEERS = _counter("vllm_gke_guard_untrusted_peer_requests", "Tenant requests refused because they did "
                           "not come from the mesh sidecar's inbound passthrough address")
LOGGED_PEERS_MAX = 16


def count_untrusted(client: str, logged_peers: set[str], trusted_peers: frozenset[str]) -> None:
    """Count the refusal; name each new address once (bounded: a flood logs nothing more)."""
    UNTRUSTED_PEERS.inc()
    if client not in logged_peers and len(logged_peers) < LOGGED_PEERS_MAX:
        logged_peers.add(client)
        log.error("refused a tenant request from %s: only the mesh sidecar's inbound passthrough address (%s) "
                  "is trusted. If every request comes from it, the mesh's data plane does not deliver from "
                  "127.0.0.6: check the control plane implementation (gcloud container fleet mesh describe: "
                  "controlPlaneManagement.implementation) against the docs' 'Managed Cloud Service Mesh' (docs/guides/mesh.md)",
                  client or "an unknown peer", ", ".join(sorted(trusted_peers)))
