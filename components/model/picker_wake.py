"""Scale from zero behind the endpoint picker (llm-d-router v0.10.0), and where a standby still serves.

With flow control on, a request for a pool with no endpoint waits in the picker's queue: an empty
pool reads as saturation 1.0, which holds dispatch (pkg/epp/saturationdetector/.../detector.go:129-135,
pkg/epp/flowcontrol/controller/internal/processor.go:389-414), until a replica is ready or the
request's time-to-live runs out (flowControl.defaultRequestTTL, 60 s by default:
pkg/epp/flowcontrol/controller/config.go:33). KEDA wakes the pool on that queue, so such a pool
has no standby: one in the InferencePool would be an endpoint, and the picker would send it the
requests (its 503) instead of queueing them.

Where a standby stays:
  - length-routed pools: no queue stands in front of them (the load balancer sends to the pool's
    Service, whose only answer at zero is the standby's);
  - picker pools with flow control off: the picker admits a request at zero and answers 503 at
    once (pkg/epp/requestcontrol/director.go:305-311), with nothing KEDA could wake on; the standby,
    selected by the InferencePool, answers and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from .capacity import placements
from .config_rules.scaling import wake_seconds
from .k8s_objects import MODEL_LABEL, POOL_LABEL
from .serving_pool import SERVER_LABELS
from .specs import ModelSpec, ServingPoolSpec

if TYPE_CHECKING:
    from .stack_config import StackConfig

# llm-d-router v0.10.0's flowControl.defaultRequestTTL when its config sets none.
DEFAULT_QUEUE_TTL_S = 60.0


@dataclass(frozen=True)
class PickerQueue:
    """The picker's flow control, as scale from zero sees it."""

    flow_control: bool = True
    # How long a request waits in the queue; 0: no time-to-live (it waits for the client or the
    # load balancer to give up: endpointpickerconfig_types.go:379-387).
    ttl_seconds: float = DEFAULT_QUEUE_TTL_S


def picker_queue(cfg: "StackConfig") -> PickerQueue:
    """The stack's picker queue (vllm-gke:picker flowControl)."""
    flow = cfg.picker.flow_control
    return PickerQueue(flow_control=flow.enabled, ttl_seconds=float(flow.queue_ttl_seconds))


def wakes_on_picker_queue(model: ModelSpec, pool: ServingPoolSpec, queue: PickerQueue) -> bool:
    """A pool that may go to zero behind a picker that queues: KEDA wakes it on the queue, no standby."""
    return model.routing == "inference-gateway" and pool.min_replicas == 0 and queue.flow_control


def keeps_standby(model: ModelSpec, pool: ServingPoolSpec, queue: PickerQueue) -> bool:
    """A pool that may go to zero and has no queue in front of it to wait in."""
    return pool.min_replicas == 0 and not wakes_on_picker_queue(model, pool, queue)


def inference_pool_selector(model: ModelSpec, queue: PickerQueue) -> dict[str, str]:
    """The InferencePool's pods: the model's one pool, and only its vLLM pods unless its standby is
    to answer there (flow control off): a standby in the pool makes it look served at zero."""
    # Disaggregated: its prefill pods too (their role label tells the picker's filters which is which).
    base = {MODEL_LABEL: model.name} if model.disaggregation is not None else {MODEL_LABEL: model.name, POOL_LABEL: "short"}
    return base if keeps_standby(model, model.short, queue) else {**base, **SERVER_LABELS}


@dataclass(frozen=True)
class PickerWake:
    """What a first request after idle meets at a picker pool at zero."""

    label: str  # model, and the tenant of a dedicated copy
    # From KEDA's scale-up to a replica serving: a node, then the cold start (config_rules.scaling).
    wake_seconds: int
    ttl_seconds: float  # 0: none
    request_timeout_seconds: int  # the load balancer's backend timeout (GCPBackendPolicy timeoutSec)

    @property
    def first_requests(self) -> Literal["served", "expire", "cut"]:
        """served: they wait out the wake in the queue; expire: the queue's time-to-live ends first
        (503); cut: the load balancer's timeout ends first."""
        limit = self.ttl_seconds or float("inf")
        if self.wake_seconds <= min(limit, self.request_timeout_seconds):
            return "served"
        return "expire" if limit <= self.request_timeout_seconds else "cut"

    def line(self) -> str:
        ttl = f"{self.ttl_seconds:.0f} s" if self.ttl_seconds else "none"
        verdict = {"served": "first requests after idle wait in the queue and are served",
                   "expire": "first requests after idle expire",
                   "cut": "first requests after idle are cut by the load balancer"}[self.first_requests]
        return (f"{self.label} behind the picker, at zero: wakes in ~{self.wake_seconds / 60:.0f} min (a node and the "
                f"cold start), queue time-to-live {ttl}, load balancer timeout {self.request_timeout_seconds} s: {verdict}")

    def warning(self) -> Optional[str]:
        if self.first_requests == "served":
            return None
        if self.first_requests == "expire":
            how = (f"each gets the picker's 503 after {self.ttl_seconds:.0f} s in its queue (body 'inference error: "
                   "ServiceUnavailable - ...', header x-llm-d-request-dropped-reason: rejected-no-endpoints; not "
                   "OpenAI's error format)")
        else:
            how = f"each is cut by the load balancer after {self.request_timeout_seconds} s"
        return (f"{self.line()}: {how}; the pool still wakes, so clients must retry until it serves, or set "
                "minReplicas 1 to keep one warm")


def picker_wakes(cfg: "StackConfig") -> list[PickerWake]:
    """Every copy of a model behind a picker that queues, at zero (shared and dedicated)."""
    queue = picker_queue(cfg)
    return [PickerWake(model.name + (f" ({tenant})" if tenant else ""), wake_seconds(cfg, model, node_pool),
                       queue.ttl_seconds, cfg.gateway.request_timeout_seconds)
            for model, node_pool, tenant in placements(cfg)
            if wakes_on_picker_queue(model, model.short, queue)]
