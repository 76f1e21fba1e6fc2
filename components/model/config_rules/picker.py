"""The endpoint picker against the load balancer in front of it: a request queued in the picker
must be shed by the picker (429/503 with its reason) before the load balancer's backend timeout
cuts it with an error of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..picker_prefix import precise_prefix_problems, reads_kv_events
from ..specs import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def picker_queue_within_backend_timeout(cfg: "StackConfig", add: Add) -> None:
    flow = cfg.picker.flow_control
    if not flow.enabled or not any(m.routing == "inference-gateway" for m in cfg.models):
        return
    timeout = cfg.gateway.request_timeout_seconds
    if flow.queue_ttl_seconds >= timeout:
        # GCPBackendPolicy timeoutSec (gateway.requestTimeoutSeconds) counts the time queued in the picker.
        add("picker.flowControl.queueTtlSeconds",
            f"is {flow.queue_ttl_seconds}, not below gateway.requestTimeoutSeconds {timeout}: the load balancer's "
            "backend timeout would cut a queued request before the picker sheds it; lower queueTtlSeconds (leave "
            "the generation its time too) or raise gateway.requestTimeoutSeconds")


def precise_prefix_cache(cfg: "StackConfig", add: Add) -> None:
    """picker.prefixCache precise: what keeps vLLM's events from matching the picker's blocks, and
    what keeps the events (every tenant's prompt tokens) from every other pod."""
    if cfg.picker.prefix_cache != "precise" or not any(reads_kv_events(cfg.picker, m) for m in cfg.models):
        return
    seen: set[tuple[str, str]] = set()
    for i, model in enumerate(cfg.models):
        if not reads_kv_events(cfg.picker, model):
            continue
        # Checked by every release its replicas run on (a dedicated tenant's pool may be a TPU).
        pools = {model.node_pool, *(t.dedicated.node_pool for t in cfg.tenants
                                    if t.dedicated and model.name in t.dedicated.models)}
        for pool in sorted(p for p in pools if any(n.name == p for n in cfg.node_pools)):
            for key, problem in precise_prefix_problems(model, cfg.release_for(pool)):
                # The release is the node pool's; the fix is the picker's setting (the problem says it).
                where = "picker.prefixCache" if key == "vllmVersion" else f"{item_key('models', cfg.models, i)}.{key}"
                text = f"{model.name} on {pool}: {problem}" if key == "vllmVersion" else problem
                if (where, text) not in seen:
                    seen.add((where, text))
                    add(where, text)
    if not cfg.cluster.dataplane_v2:
        add("cluster.dataplaneV2", "is false, so GKE enforces no NetworkPolicy and every pod could read the KV-cache "
            "events (every tenant's prompt tokens) that picker.prefixCache precise publishes; set dataplaneV2 true "
            "(a new cluster) or picker.prefixCache: approximate")
    if cfg.picker.scorers.prefix_cache == 0:
        add("picker.scorers.prefixCache", "is 0, so picker.prefixCache precise would publish and index KV-cache events "
            "that score nothing; give it a weight or set picker.prefixCache: approximate")
