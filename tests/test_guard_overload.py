"""Overload protection in the guard (images/vllm_gke_guard/overload.py): while the queue time is
over its objective, the lowest-priority tenants get 429 with Retry-After first, a tier a second;
priority 0 never. The metric names it reads are checked on the real vLLM's /metrics in
tests/test_guard_in_vllm.py."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram

from tests.test_guard import ISSUER, TENANT, Clock, Recorder, call, status
from vllm_gke.components.model.serving_api import guard_config, tenant_routes
from vllm_gke.components.model.specs import TenantSpec

from tests.test_guard import guard  # isort: skip

overload = guard.overload


class Queue:
    """Stands in for vLLM's metrics: waiting requests, and how many got their first token (left the queue)."""

    def __init__(self):
        self.waiting, self.left = 0.0, 0.0

    def read(self):
        return self.waiting, self.left

    def leave(self, n):
        self.left += n


def controller(slo=2.0, priorities=(0, -1, -5)):
    clock, queue = Clock(), Queue()
    return overload.Overload(slo, priorities, queue, clock), clock, queue


def step(ctl, clock, seconds=1.0):
    clock.now += seconds
    return {p: ctl.shed(p) for p in (0, -1, -5)}


def test_the_lowest_tier_goes_first_then_the_next_and_priority_0_never():
    ctl, clock, queue = controller()
    assert step(ctl, clock) == {0: False, -1: False, -5: False}  # the first reading has no rate yet
    queue.waiting = 40
    queue.leave(10)  # 10 requests left the queue this second, 40 wait: 4 s ahead, over 2 s
    assert step(ctl, clock) == {0: False, -1: False, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True}  # no tier left; 0 is never shed
    # between half the objective and the objective: hold
    queue.waiting, _ = 15, queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True}
    # under half: a tier back each second, the highest first
    queue.waiting, _ = 2, queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: False, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: False, -5: False}


def test_decided_at_most_once_an_interval():
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 50, queue.leave(10)
    assert step(ctl, clock)[-5] is True
    queue.leave(10)
    assert step(ctl, clock, 0.3)[-1] is False  # too soon for the next tier
    assert step(ctl, clock, 0.7)[-1] is True


def test_waiting_over_the_rate_they_leave():
    """30 wait and 5 a second leave: 6 s ahead, whatever the requests before them waited."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 30, queue.leave(5)
    assert step(ctl, clock)[-5] is True and ctl.estimate == pytest.approx(6.0)


def test_a_queue_that_does_not_move_counts_its_age():
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting = 3  # nothing leaves the queue; at the last reading none waited
    assert step(ctl, clock)[-5] is False and ctl.estimate == 0  # it began now
    assert step(ctl, clock)[-5] is False  # 1 s old
    assert step(ctl, clock)[-5] is False  # 2 s: at the objective, not over it
    assert step(ctl, clock)[-5] is True and ctl.estimate == pytest.approx(3.0)


def test_a_queue_after_a_quiet_spell_is_not_taken_for_a_stall():
    """Ten idle minutes, then a burst of priority-0 requests fills the batch: the first sheddable
    request must not read the whole quiet spell as the queue's age, nor average a rate over it."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting = 3
    assert step(ctl, clock, 600)[-5] is False and ctl.estimate == 0
    assert step(ctl, clock)[-5] is False and ctl.estimate == pytest.approx(1.0)  # its age: since the last reading


def test_the_shed_tiers_hold_through_the_retry_after_pause():
    """The shed tenants pause for Retry-After (4 s here) and no sheddable request asks meanwhile:
    the queue is as long when they come back, so they are still shed (forgetting the overload
    over the pause admitted them into the same queue: shed, served, shed, a saw-tooth)."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 40, queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: False, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True}
    pause = ctl.refusal("batch").retry_after
    assert pause > 2 * ctl.interval
    queue.leave(10 * pause)  # priority 0 keeps it full meanwhile
    assert step(ctl, clock, pause) == {0: False, -1: True, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True}  # still 4 s ahead
    # a pause after which nothing waits: one tier back a reading, not all at once (the returning
    # cohort would fill it again and be shed again: the saw-tooth)
    queue.waiting = 0
    assert step(ctl, clock, pause) == {0: False, -1: False, -5: True}
    assert step(ctl, clock) == {0: False, -1: False, -5: False}
    # a spell longer than any Retry-After: nothing to hold
    queue.waiting, _ = 40, queue.leave(10)
    step(ctl, clock)
    queue.waiting = 0
    assert step(ctl, clock, 600) == {0: False, -1: False, -5: False}


def test_tenants_that_honour_retry_after_come_back_once_the_server_is_healthy():
    """The queue drains to 5 waiting with 50 a second leaving (0.1 s ahead) while the shed tenants
    pause for their Retry-After, all the same length, and no sheddable request asks meanwhile: the
    reading when they come back takes the rate over the pause and brings the tiers back, one a
    reading (holding the old level over a pause shed them at every return, for good, with the
    stale 4 s estimate)."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 40, queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: False, -5: True}
    queue.leave(10)
    assert step(ctl, clock) == {0: False, -1: True, -5: True} and ctl.estimate == pytest.approx(4.0)
    queue.waiting = 5
    returns = []
    for _ in range(10):
        pause = ctl.refusal("batch").retry_after
        queue.leave(50 * pause)  # priority 0's requests keep flowing meanwhile
        returns.append(step(ctl, clock, pause))
    assert ctl.estimate == pytest.approx(0.1)
    assert returns[0] == {0: False, -1: False, -5: True}  # one tier back at the first return
    assert returns[1:] == [{0: False, -1: False, -5: False}] * 9


def test_a_queue_stalled_over_the_pause_stays_shed():
    """Requests waited before the pause and none got a first token during it: the queue is as old
    as the pause, over the objective."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 40, queue.leave(10)
    assert step(ctl, clock)[-5] is True
    assert step(ctl, clock, ctl.refusal("batch").retry_after)[-5] is True and ctl.estimate > ctl.slo


def test_a_spell_longer_than_any_retry_after_forgets_the_overload():
    """Ten quiet minutes are no shed tenant's pause (Retry-After is at most a minute): requests
    waiting then are a new burst, measured afresh, not shed for the old one."""
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 40, queue.leave(10)
    assert step(ctl, clock)[-5] is True
    queue.waiting = 3
    assert step(ctl, clock, 600) == {0: False, -1: False, -5: False}


def test_a_drained_queue_brings_the_tiers_back_whatever_the_requests_before_waited():
    ctl, clock, queue = controller()
    step(ctl, clock)
    queue.waiting, _ = 40, queue.leave(5)
    assert step(ctl, clock)[-5] is True
    queue.waiting, _ = 0, queue.leave(40)  # drained; those 40 may still be generating
    assert step(ctl, clock)[-5] is False and ctl.estimate == 0


def test_vllms_own_metrics_are_read_as_it_registers_them():
    """Named and labelled as vLLM 0.34's stat logger makes them (one child per engine)."""
    registry = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "", ["model_name", "engine"], registry=registry)
    first = Histogram("vllm:time_to_first_token_seconds", "", ["model_name", "engine"], registry=registry,
                      buckets=(0.3, 1.0, 5.0))
    reader = overload.VllmQueue(registry)
    waiting.labels("m", "0").set(4)
    waiting.labels("m", "1").set(3)
    first.labels("m", "0").observe(2.0)
    first.labels("m", "1").observe(0.5)
    first.labels("m", "1").observe(0.7)
    assert reader.read() == (7.0, 3.0)
    assert overload.VllmQueue(CollectorRegistry()).read() == (0.0, 0.0)  # not registered yet: nothing


def tenants():
    def tenant(name, priority):
        return TenantSpec.model_validate({**TENANT.model_dump(by_alias=True), "name": name, "priority": priority,
                                          "jwt": {**TENANT.jwt.model_dump(by_alias=True),
                                                  "issuer": f"https://auth.example/{name}"}})
    return [TENANT, tenant("batch", -5), tenant("drafts", -1)]


def overloaded_guard():
    cfg = guard_config(tenants(), tenant_routes(), queue_slo_seconds=2.0, served=None)
    assert cfg["overload"] == {"queueSloSeconds": 2.0}
    assert cfg["issuers"]["https://auth.example/batch"]["priority"] == -5
    clock, app = Clock(), Recorder()
    mw = guard.GuardMiddleware(app, {**cfg, "model": "m-overload"}, clock)
    queue = Queue()
    mw.overload.queue = queue
    return mw, app, clock, queue


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_guard_answers_a_shed_tenant_429_with_retry_after_in_openais_format(fast_path, monkeypatch):
    from prometheus_client import REGISTRY

    mw, app, clock, queue = overloaded_guard()
    monkeypatch.setattr(mw, "fast_path", fast_path)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10}
    path = "/v1/chat/completions"
    assert status(call(mw, body, path=path, issuer="https://auth.example/batch")) == 200
    clock.now += 1
    queue.waiting, _ = 50, queue.leave(10)
    shed = {"tenant": "batch", "model": "m-overload", "outcome": "shed"}
    before = REGISTRY.get_sample_value("vllm_gke_tenant_requests_total", shed) or 0.0
    sent = call(mw, body, path=path, issuer="https://auth.example/batch")
    assert status(sent) == 429
    headers = dict(sent[0]["headers"])
    assert int(headers[b"retry-after"]) >= 4
    err = json.loads(sent[1]["body"])["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "overloaded" and err["type"] == "rate_limit_error" and "batch" in err["message"]
    assert REGISTRY.get_sample_value("vllm_gke_tenant_requests_total", shed) == before + 1
    # the next tier is still served this second, and priority 0 always
    assert status(call(mw, body, path=path, issuer="https://auth.example/drafts")) == 200
    assert status(call(mw, body, path=path, issuer=ISSUER)) == 200
    # the shed request never reached vLLM
    assert len(app.seen) == 3


def test_no_sheddable_tenant_no_overload_control():
    cfg = guard_config([TENANT], tenant_routes(), queue_slo_seconds=2.0)
    assert "overload" not in cfg
    assert guard.GuardMiddleware(Recorder(), cfg, Clock()).overload is None


def test_the_model_list_is_never_shed_nor_counted():
    """GET /v1/models queues nothing in the engine: a shed tenant still lists its models, and no
    `shed` outcome is counted against its availability."""
    from prometheus_client import REGISTRY

    mw, app, clock, queue = overloaded_guard()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10}
    assert status(call(mw, body, path="/v1/chat/completions", issuer="https://auth.example/batch")) == 200
    clock.now += 1
    queue.waiting, _ = 50, queue.leave(10)
    assert status(call(mw, body, path="/v1/chat/completions", issuer="https://auth.example/batch")) == 429
    shed = {"tenant": "batch", "model": "m-overload", "outcome": "shed"}
    before = REGISTRY.get_sample_value("vllm_gke_tenant_requests_total", shed)
    assert status(call(mw, None, path="/v1/models", method="GET", issuer="https://auth.example/batch")) == 200
    assert REGISTRY.get_sample_value("vllm_gke_tenant_requests_total", shed) == before
