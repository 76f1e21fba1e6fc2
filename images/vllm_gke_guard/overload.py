"""Overload protection: while this replica's queue time is over its SLO, the guard answers the
lowest-priority tenants 429 with Retry-After, a tier at a time, before anyone else waits longer.

The signal is vLLM's own, read in process from the metrics its stat logger keeps for /metrics
(vllm 0.34.0 v1/metrics/loggers.py): the gauge vllm:num_requests_waiting (:537, set each engine
step) and how many requests got their first token, the count of vllm:time_to_first_token_seconds
(:930, observed as each request's first token comes, :1284) - a request has left the queue by
then. (vllm:request_queue_time_seconds would say how long, but it is observed only when a request
finishes, a whole generation later: after a spike it keeps reporting the spike.) Once a second
the queue time is estimated by Little's law, the waiting requests over the rate requests left
the queue in that second; a queue that holds requests and does not move counts as its age; an
empty queue, as nothing.

Tiers are the tenants' negative priorities (tenants[].priority); 0 is never shed. Each second the
queue is over the SLO one more tier is shed, most negative first; each second it is under half
the SLO one tier comes back. So a lower tier is always shed before a higher one, and a short
spike sheds only the lowest. The state moves only when a sheddable request asks. A quiet spell (no
reading for over two intervals) up to the longest Retry-After given (60 s) is most often the shed
tenants' own pause: the reading that ends it takes the rate over the whole spell (the first
tokens counted meanwhile are what the server did) and decides as any other, so the shed tiers
stay shed while the queue is still over, and come back one a reading once it is under half; a
queue found empty after it, or a spell longer than any Retry-After, brings every tier back at once.
(Starting again from nothing shed would admit the returning tenants into the same queue and shed
them again a few seconds later: a saw-tooth. Holding the level over a spell without a rate would
shed tenants that honour Retry-After, all back after the same pause, for good: no reading would
ever come a second after another.)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from .errors import GuardError

WAITING = "vllm:num_requests_waiting"
FIRST_TOKENS = "vllm:time_to_first_token_seconds"
INTERVAL_S = 1.0
# The longest Retry-After a refusal gives: a quiet spell longer than that is no shed tenant's pause.
MAX_RETRY_AFTER_S = 60.0


class VllmQueue:
    """(waiting requests, requests that got their first token) from vLLM's metrics in this
    process, summed over engines; zeros until the engine's stat logger has registered them."""

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
        waiting, first = names.get(WAITING), names.get(f"{FIRST_TOKENS}_count")
        return (waiting, first) if waiting is not None and first is not None else None

    def read(self) -> tuple[float, float]:
        if self.collectors is None:
            self.collectors = self._find()
            if self.collectors is None:
                return 0.0, 0.0
        waiting_c, first_c = self.collectors
        waiting = sum(s.value for m in waiting_c.collect() for s in m.samples if s.name == WAITING)
        left = sum(s.value for m in first_c.collect() for s in m.samples if s.name == f"{FIRST_TOKENS}_count")
        return waiting, left


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
        self.last: Optional[tuple[float, float, float]] = None  # (time, left, waiting) at the last reading
        self.stalled_since: Optional[float] = None

    def _update(self, now: float) -> None:
        waiting, left = self.queue.read()
        last, self.last = self.last, (now, left, waiting)
        if last is None or now - last[0] > MAX_RETRY_AFTER_S + 2 * self.interval:
            # The first reading, or one after a spell no Retry-After asked for: nothing to hold.
            self.level, self.estimate, self.stalled_since = 0, 0.0, None
            return
        # An empty queue after a pause (the shed tenants' Retry-After, about the time it took to
        # drain) lets one tier back, as any quiet reading does: all at once, they would fill it again.
        # After a pause too: the rate over it (the shed tenants' Retry-After) is the server's.
        elapsed, moved = now - last[0], left - last[1]
        if waiting <= 0:
            self.estimate, self.stalled_since = 0.0, None
        elif moved > 0:
            self.estimate, self.stalled_since = waiting / (moved / elapsed), None
        else:  # requests wait and none left the queue: it is as old as the stall, which began by
            # the last reading if requests waited then, else now
            if self.stalled_since is None:
                self.stalled_since = last[0] if last[2] > 0 else now
            self.estimate = now - self.stalled_since
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
        err.retry_after = max(self.interval, math.ceil(min(self.estimate, MAX_RETRY_AFTER_S)))
        return err
