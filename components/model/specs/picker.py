"""The endpoint picker of models with routing: inference-gateway (llm-d-router v0.10.0): how it
fails, how it scores replicas, when it calls the pool saturated, and how it queues while it is.
Every default is the picker's own or a bound its memory holds (components/model/picker.py says
where each comes from upstream)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import Spec


class PickerScorers(Spec):
    """The weights of the scheduling profile's scorers: each replica's score is the weighted sum,
    the highest wins. 0 leaves a scorer out."""

    # Fewest requests waiting in the replica's vLLM queue (vllm:num_requests_waiting).
    queue: int = Field(default=2, ge=0, le=100)
    # Most free KV cache (1 - vllm:kv_cache_usage_perc).
    kv_cache_utilization: int = Field(default=2, ge=0, le=100)
    # Longest prompt prefix the replica likely holds in its prefix cache (the picker's own
    # approximate index of what it sent where; tenants' cache_salt keeps their blocks apart).
    prefix_cache: int = Field(default=3, ge=0, le=100)

    @model_validator(mode="after")
    def _some(self) -> "PickerScorers":
        if not (self.queue or self.kv_cache_utilization or self.prefix_cache):
            raise ValueError("every weight is 0: the picker would choose at random; give queue, kvCacheUtilization "
                             "or prefixCache a weight")
        return self


class PickerSaturation(Spec):
    """When the pool counts as saturated (the picker's utilization-detector): the mean over replicas
    of max(waiting / queueDepthThreshold, KV-cache use / kvCacheUtilThreshold) reaching 1. While it
    is, flow control holds requests in their bands (without flow control, negative priorities are
    shed with 429)."""

    # Requests waiting in a replica's vLLM queue that count as full.
    queue_depth_threshold: int = Field(default=5, ge=1, le=1000)
    # Share of a replica's KV cache in use that counts as full.
    kv_cache_util_threshold: float = Field(default=0.8, gt=0, le=1)
    # Age after which a replica's scraped metrics count as stale, milliseconds: a stale replica
    # counts as full (so a picker cut off from the replicas queues rather than overloads them).
    metrics_staleness_ms: int = Field(default=200, ge=50, le=60000)


class PickerFlowControl(Spec):
    """Flow control: while the pool is saturated the picker queues requests in priority bands (one
    per tenant priority), dispatching the highest band first and, within a band, the tenants in turn
    (round robin over fairness ids, first come first served within a tenant); bounded queues and a
    time-to-live shed what cannot wait."""

    # Queue by priority (the picker's flowControl feature gate). Off: nothing waits in the picker,
    # positive priorities change nothing and negative ones are shed (429) while saturated.
    enabled: bool = True
    # Longest a request waits in the picker's queue, seconds; then 429 (503 while the pool has no
    # replica). Must stay below gateway.requestTimeoutSeconds: the load balancer's backend timeout
    # counts the wait too, and past it the client gets the load balancer's error instead.
    queue_ttl_seconds: int = Field(default=60, ge=1, le=3600)
    # Requests one band (priority >= 0) may hold queued and in flight; beyond it, 429.
    band_max_requests: int = Field(default=1000, ge=1, le=100000)
    # Bytes of request bodies one band (priority >= 0) may hold, MiB.
    band_max_bytes_mib: int = Field(default=512, ge=1, le=2048)
    # The same bounds for each negative-priority band: small, so sheddable tenants are shed first.
    sheddable_max_requests: int = Field(default=50, ge=1, le=100000)
    sheddable_max_bytes_mib: int = Field(default=64, ge=1, le=2048)
    # Bounds across all bands: the queued bodies live in the picker's memory (a 4 GiB limit).
    max_requests: int = Field(default=2000, ge=1, le=100000)
    max_bytes_mib: int = Field(default=1024, ge=1, le=2048)

    @model_validator(mode="after")
    def _bands_within_the_whole(self) -> "PickerFlowControl":
        for band, whole, unit in ((self.band_max_requests, self.max_requests, "maxRequests"),
                                  (self.band_max_bytes_mib, self.max_bytes_mib, "maxBytesMib")):
            if band > whole:
                raise ValueError(f"band{unit[0].upper()}{unit[1:]} {band} is above {unit} {whole}: the global bound "
                                 f"would reject first; lower band{unit[0].upper()}{unit[1:]} or raise {unit}")
        return self


class PickerSpec(Spec):
    """The endpoint picker of every model with routing: inference-gateway."""

    # What the load balancer does while no picker answers. FailClose (the default): the request
    # fails (500) - no tenant's priority, queue or shedding is bypassed. FailOpen: the load
    # balancer sends it to a replica of its own choosing, with no priorities, no queueing, no
    # prefix or load awareness, for as long as the picker is down (a leader's crash: up to 15 s; its
    # rollout or drain: until the new leader is ready, see the routing guide).
    failure_mode: Literal["FailClose", "FailOpen"] = "FailClose"
    # How the prefix-cache scorer knows what a replica holds. approximate: the picker's own record
    # of what it sent where. precise: vLLM's KV-cache events (ZMQ, readable by the picker's pods
    # alone) and a tokenizer, <model>-render (two pods of 1 CPU, 2 GiB on the system pool, apart
    # from the picker), reading the model's shared weights; CUDA pools only
    # (components/model/picker_prefix.py).
    prefix_cache: Literal["approximate", "precise"] = "approximate"
    # The scorers' weights.
    scorers: PickerScorers = Field(default_factory=PickerScorers)
    # When the pool counts as saturated.
    saturation: PickerSaturation = Field(default_factory=PickerSaturation)
    # Priority bands, fairness and bounded queues while saturated.
    flow_control: PickerFlowControl = Field(default_factory=PickerFlowControl)
