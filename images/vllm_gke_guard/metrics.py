"""What the guard tells operators: its counters on vLLM's /metrics (a dashboard tile and an alert
read each: components/observability.py) and its log, through vLLM's own logger."""

from __future__ import annotations

import logging
from typing import Any, Sequence

# A child of vLLM's own logger, whose handler vLLM's logging config sets up: in vLLM's API
# server the root logger has no handler and is at ERROR, so a plain module logger shows nothing.
log = logging.getLogger("vllm.gke_guard")


class _NoCounter:
    def inc(self, amount: float = 1) -> None:
        pass

    def labels(self, *values: str) -> "_NoCounter":
        return self


def _counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Any:
    """A Prometheus counter on vLLM's /metrics (prometheus_client's default registry, which vLLM's
    single API server serves); a no-op where prometheus_client is missing (tests)."""
    try:
        from prometheus_client import Counter
    except ImportError:  # pragma: no cover - it ships with vLLM
        return _NoCounter()
    try:
        return Counter(name, documentation, labels)
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
# Every error the guard answers itself (errors.respond), by status code: its 429s (rate limits, shedding,
# a fallback refusing) are counted nowhere else before a tenant's request reaches vLLM, and the Cloud Run
# alert on Cloud Run's own 429s subtracts them (components/model/cloud_run_monitoring.py run_refusals).
# Bounded: a status code the guard answers (errors.ERROR_TYPES and the few others).
GUARD_REFUSALS = _counter("vllm_gke_guard_refusals", "Requests the guard answered with an error itself, by "
                          "status code (429: rate limited or shed)", ("code",))


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


# Per tenant and model, what the chargeback and the SLOs read (components/observability.py,
# components/service_levels.py): requests by outcome, and the prompt and generated tokens vLLM
# itself counted for each (its request metadata's final usage, as it reports to middleware). The
# labels are bounded: a tenant of the config, the model this server serves, four outcomes.
TENANT_REQUESTS = _counter("vllm_gke_tenant_requests", "Tenant requests by outcome: ok (answered), refused (a 4xx: "
                           "the request's own fault), error (a 5xx or no answer), shed (refused for overload)",
                           ("tenant", "model", "outcome"))
PROMPT_TOKENS = _counter("vllm_gke_tenant_prompt_tokens", "Prompt tokens of tenant requests, as vLLM counted them",
                         ("tenant", "model"))
GENERATION_TOKENS = _counter("vllm_gke_tenant_generation_tokens", "Tokens generated for tenant requests, as vLLM "
                             "counted them", ("tenant", "model"))
OUTCOMES = ("ok", "refused", "error", "shed")
# Shed requests sent to the stack's fallback model instead of a 429 (fallback.py), per tenant, model
# and fallback: served (the fallback answered), cut (its answer broke off once the client's had
# started: fallback.py) or refused (it did not answer: the client got the 429, also counted `shed`
# above). Bounded as those: a tenant of the config, this server's model, its fallback.
FALLBACK_REQUESTS = _counter("vllm_gke_tenant_fallback_requests", "Shed tenant requests sent to the fallback model "
                             "instead of a 429: served there, cut (its answer broke off midway), or refused "
                             "(the client got the 429)",
                             ("tenant", "model", "fallback", "outcome"))


class TenantMeters:
    """One tenant's counters on this server, their label values resolved once (a labelled
    counter's lookup costs a dict and a lock on every request otherwise); created at start, so
    every series exists at zero and a rate over it is defined before the first request."""

    __slots__ = ("ok", "refused", "error", "shed", "prompt", "generation")

    def __init__(self, tenant: str, model: str):
        self.ok, self.refused, self.error, self.shed = (TENANT_REQUESTS.labels(tenant, model, o) for o in OUTCOMES)
        self.prompt = PROMPT_TOKENS.labels(tenant, model)
        self.generation = GENERATION_TOKENS.labels(tenant, model)
