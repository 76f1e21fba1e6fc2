"""The endpoint picker against the load balancer in front of it: a request queued in the picker
must be shed by the picker (429/503 with its reason) before the load balancer's backend timeout
cuts it with an error of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
