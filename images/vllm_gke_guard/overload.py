"""Overload protection: while this replica's queue time is over its SLO, the guard answers the
lowest-priority tenants 429 with Retry-After, a tier at a time, before anyone else waits longer.

The signal is vLLM's own, read in process from the metrics its stat logger keeps for /metrics
(vllm 0.34.0 v1/metrics/loggers.py: the gauge vllm:num_requests_waiting, :537, set each engine
step; the histogram vllm:request_queue_time_seconds, :970, observed as each request finishes,
:1296). The queue time now is estimated once a second as the larger of the mean queue time of
the requests that finished in that second and the waiting requests over the rate requests
leave the queue (Little's law); a queue that does not move counts as its age.

Tiers are the tenants' negative priorities (tenants[].priority); 0 is never shed. Each second the
queue is over the SLO one more tier is shed, most negative first; each second it is under half
the SLO one tier comes back. So a lower tier is always shed before a higher one, and a short
spike sheds only the lowest.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from .errors import GuardError

WAITING = "vllm:num_requests_waiting"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INTERVAL_S = 1.0


class VllmQueue:
    """(waiting requests, queue-time sum, queue-time count) from vLLM's metrics in this process,
    summed over engines; zeros until the engine's stat logger has registered them."""

    def __init__(self, registry: Any = None):
        self.registry = registry
        self.collectors: Optional[tuple[Any, Any]] = None

    def _find(self) -> Optional[tuple[Any, Any]]:
        registry = self.registry
        if registry is None:
            try:
                from prometheus_client import REGISTRY
            except ImportError:  # pragma: no cover - it ships with vLLM
                return None
            registry = REGISTRY
        names = registry._names_to_collectors  # pyright: ignore[reportPrivateUsage]  (no public lookup)
        waiting, queue = names.get(WAITING), names.get(f"{QUEUE_TIME}_sum")
        return (waiting, queue) if waiting is not None and queue is not None else None

    def read(self) -> tuple[float, float, float]:
        if self.collectors is None:
            self.collectors = self._find()
            if self.collectors is None:
                return 0.0, 0.0, 0.0
        waiting_c, queue_c = self.collectors
        waiting = sum(s.value for m in waiting_c.collect() for s in m.samples if s.name == WAITING)
        total = count = 0.0
        for metric in queue_c.collect():
            for s in metric.samples:
                if s.name == f"{QUEUE_TIME}_sum":
                    total += s.value
                elif s.name == f"{QUEUE_TIME}_count":
                    count += s.value
        return waiting, total, count


class Overload:
    """Which priorities are shed now; decided at most once a second, on a sheddable request."""

    def __init__(self, slo_seconds: float, priorities: Sequence[int], queue: Any,
                 clock: Callable[[], float], interval: float = INTERVAL_S):
        self.slo = float(slo_seconds)
        # The tiers, most negative (shed first) to least; 0 is never among them.
        self.tiers = sorted({p for p in priorities if p < 0})
        self.queue = queue
        self.clock = clock
        self.interval = interval
        self.level = 0  # how many of the lowest tiers are shed
        self.estimate = 0.0
        self.last: Optional[tuple[float, float, float]] = None  # (time, sum, count) at the last decision
        self.stalled_since: Optional[float] = None

    def _update(self, now: float) -> None:
        waiting, total, count = self.queue.read()
        last, self.last = self.last, (now, total, count)
        if last is None:
            return
        elapsed, done = now - last[0], count - last[2]
        mean = (total - last[1]) / done if done > 0 else 0.0
        if waiting <= 0:
            backlog, self.stalled_since = 0.0, None
        elif done > 0:
            backlog, self.stalled_since = waiting / (done / elapsed), None
        else:  # requests wait and none left the queue: it is at least as old as the stall
            self.stalled_since = self.stalled_since if self.stalled_since is not None else last[0]
            backlog = now - self.stalled_since
        self.estimate = max(mean, backlog)
        if self.estimate > self.slo:
            self.level = min(self.level + 1, len(self.tiers))
        elif self.estimate < self.slo / 2:
            self.level = max(self.level - 1, 0)

    def shed(self, priority: int) -> bool:
        """Whether a request of this priority is answered 429 now."""
        now = self.clock()
        if self.last is None or now - self.last[0] >= self.interval:
            self._update(now)
        return self.level > 0 and priority <= self.tiers[self.level - 1]

    def refusal(self, tenant: str) -> GuardError:
        err = GuardError(429, f"the server is overloaded (queue time about {self.estimate:.1f}s, over its "
                              f"{self.slo:g}s objective): requests of tenant '{tenant}', at its priority, are "
                              "refused until it drains; retry after the time given", "overloaded")
        err.retry_after = max(self.interval, math.ceil(min(self.estimate, 60.0)))
        return err
