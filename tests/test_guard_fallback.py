"""The degradation path in the guard (images/vllm_gke_guard/fallback.py): a request the overloaded
replica sheds goes to the fallback model where its tenant may call it, every other shed tenant
still gets the 429, priority 0 is never sent, and everything is back to normal once the tier is.
The fallback's answers stand in here; tests/test_guard_fallback_in_vllm.py has two real vLLM
servers, and tests/test_fallback.py the config and the mesh."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest

from tests.test_guard import ISSUER, TENANT, Clock, Recorder, call, error, status
from tests.test_guard_overload import Queue
from vllm_gke.components.model.serving_api import guard_config, tenant_routes
from vllm_gke.components.model.specs import TenantSpec

from tests.test_guard import guard  # isort: skip

DRAFTS, BATCH = "https://auth.example/drafts", "https://auth.example/batch"
TOKEN = b"Bearer drafts-token"
CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10}
# What components/model/fallback.py writes for a pool of m whose fallback is "small" (tests/test_fallback.py
# checks that the plan's is of this shape).
FALLBACK = {"model": "small", "paths": [CHAT, "/v1/completions"], "longRequestBytes": 1024, "timeoutSeconds": 600,
            "tenants": {"drafts": {"url": "http://small-short.vllm.svc.cluster.local:8000/small",
                                   "longUrl": "http://small-long.vllm.svc.cluster.local:8000/small"}}}


def tenant(name: str, priority: int) -> TenantSpec:
    return TenantSpec.model_validate({**TENANT.model_dump(by_alias=True), "name": name, "priority": priority,
                                      "jwt": {**TENANT.jwt.model_dump(by_alias=True),
                                              "issuer": f"https://auth.example/{name}"}})


class Fallback:
    """Stands in for the fallback's Service: records each request, answers as told."""

    def __init__(self, status=200, chunks=(b'{"model": "small", "choices": []}',), fail=None):
        self.status, self.chunks, self.fail = status, chunks, fail
        self.calls: list[tuple[str, dict, bytes]] = []

    @asynccontextmanager
    async def __call__(self, url, headers, body):
        self.calls.append((url, headers, body))
        if self.fail is not None:
            raise self.fail

        async def chunks():
            for c in self.chunks:
                yield c

        yield self.status, [("Content-Type", "application/json"), ("server", "istio-envoy")], chunks()


def overloaded(fallback=None, config=FALLBACK, **extra):
    """A guard whose queue is over its objective: after this, `batch` (-5) is shed, and from the
    next second `drafts` (-1) too; `a` (0) never."""
    cfg = guard_config([TENANT, tenant("drafts", -1), tenant("batch", -5)], tenant_routes(), queue_slo_seconds=2.0,
                       fallback=config)
    clock, app, queue = Clock(), Recorder(), Queue()
    mw = guard.GuardMiddleware(app, {**cfg, "model": "m", **extra}, clock)
    mw.overload.queue = queue
    fake = fallback or Fallback()
    if mw.fallback is not None:
        mw.fallback.open = fake
    assert status(send(mw, DRAFTS)) == 200  # the first reading: nothing shed yet
    clock.now += 1
    queue.waiting, _ = 50, queue.leave(10)  # 5 s of queue, over the 2 s objective
    assert status(send(mw, BATCH)) == 429  # the lowest tier, shed
    clock.now += 1
    queue.leave(10)
    return mw, app, clock, queue, fake


def send(mw, issuer, body=BODY, path=CHAT, token=TOKEN, **kw):
    headers = [(b"authorization", token)] if token else []
    return call(mw, body, path=path, issuer=issuer, headers=headers, **kw)


def counter(tenant_name, outcome, model="m", fallback="small"):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("vllm_gke_tenant_fallback_requests_total",
                                     {"tenant": tenant_name, "model": model, "fallback": fallback,
                                      "outcome": outcome}) or 0.0


def shed_count(tenant_name):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("vllm_gke_tenant_requests_total",
                                     {"tenant": tenant_name, "model": "m", "outcome": "shed"}) or 0.0


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_shed_tenant_allowed_the_fallback_is_served_there(fast_path, monkeypatch):
    mw, app, _clock, _queue, fake = overloaded()
    monkeypatch.setattr(mw, "fast_path", fast_path)
    served, shed = counter("drafts", "served"), shed_count("drafts")
    seen = len(app.seen)
    sent = send(mw, DRAFTS)
    assert status(sent) == 200 and len(app.seen) == seen  # answered, and not by this replica's vLLM
    (url, headers, body), = fake.calls
    assert url == "http://small-short.vllm.svc.cluster.local:8000/small/v1/chat/completions"
    # The tenant's own token, for the fallback's sidecar to verify again; no claim header of this
    # replica's (the fallback's sidecar writes its own from the token).
    assert headers == {"authorization": TOKEN.decode(), "content-type": "application/json"}
    assert json.loads(body) == {**BODY, "model": "small"}  # the last `model` wins, as json.loads reads it
    start = sent[0]
    assert dict(start["headers"]) == {b"content-type": b"application/json", b"x-vllm-gke-served-model": b"small"}
    assert b"".join(m.get("body", b"") for m in sent[1:]) == fake.chunks[0]
    assert sent[-1]["more_body"] is False
    assert counter("drafts", "served") == served + 1 and shed_count("drafts") == shed


def test_a_streamed_answer_is_passed_on_as_it_comes():
    chunks = (b'data: {"choices": [1]}\n\n', b'data: {"choices": [2]}\n\n', b"data: [DONE]\n\n")
    mw, _app, *_, fake = overloaded(Fallback(chunks=chunks))
    sent = send(mw, DRAFTS, {**BODY, "stream": True})
    assert [m["body"] for m in sent[1:-1]] == list(chunks) and all(m["more_body"] for m in sent[1:-1])
    assert json.loads(fake.calls[0][2])["stream"] is True


def test_priority_0_is_never_sent_and_a_tenant_not_allowed_the_fallback_gets_the_429():
    mw, app, _clock, _queue, fake = overloaded()
    seen = len(app.seen)
    assert status(send(mw, ISSUER)) == 200 and len(app.seen) == seen + 1  # served here
    sent = send(mw, BATCH)
    assert status(sent) == 429 and error(sent)["code"] == "overloaded"
    assert b"retry-after" in dict(sent[0]["headers"])
    assert fake.calls == []


@pytest.mark.parametrize("answer", [
    Fallback(status=503), Fallback(status=429), Fallback(status=403), Fallback(status=400),
    Fallback(fail=OSError("connection refused")), Fallback(fail=TimeoutError()),
], ids=["unavailable", "shedding-too", "mesh-refused", "bad-request", "unreachable", "timed-out"])
def test_the_fallback_refusing_or_unreachable_is_the_429_the_client_would_have_had(answer):
    mw, app, _clock, _queue, fake = overloaded(answer)
    refused, shed = counter("drafts", "refused"), shed_count("drafts")
    seen = len(app.seen)
    sent = send(mw, DRAFTS)
    assert len(fake.calls) == 1 and len(app.seen) == seen
    assert status(sent) == 429 and len(sent) == 2
    err = error(sent)
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "overloaded"
    assert int(dict(sent[0]["headers"])[b"retry-after"]) >= 1
    assert counter("drafts", "refused") == refused + 1 and shed_count("drafts") == shed + 1


def test_everything_returns_to_normal_as_the_tiers_come_back():
    mw, app, clock, queue, fake = overloaded()
    assert status(send(mw, DRAFTS)) == 200 and len(fake.calls) == 1  # sent there
    clock.now += 1
    queue.waiting, _ = 0, queue.leave(10)  # drained: one tier back a second, the highest first
    seen = len(app.seen)
    assert status(send(mw, DRAFTS)) == 200 and len(app.seen) == seen + 1 and len(fake.calls) == 1
    assert status(send(mw, BATCH)) == 429  # still shed this second
    clock.now += 1
    queue.leave(1)
    assert status(send(mw, BATCH)) == 200 and len(app.seen) == seen + 2
    assert len(fake.calls) == 1


@pytest.mark.parametrize("case,body,path,token", [
    ("an adapter", {**BODY, "model": "m-adapter"}, CHAT, TOKEN),
    ("another route", {"model": "m", "input": "hi"}, "/v1/responses", TOKEN),
    ("no token", BODY, CHAT, None),
    ("not a JSON object", ["not", "an", "object"], CHAT, TOKEN),
])
def test_what_the_fallback_cannot_serve_as_asked_gets_the_429(case, body, path, token):
    """The fallback serves its own model on chat and completions: a request naming an adapter of
    this one, another route, one without the tenant's token or that is no JSON object is not sent."""
    mw, _app, *_, fake = overloaded()
    assert status(send(mw, DRAFTS, body, path=path, token=token)) == 429, case
    assert fake.calls == []


def test_no_client_header_sends_a_request_there():
    """Only this replica's shed decision sends a request: whatever a client sets, a request of a
    tier not shed is served here (and no header the guard reads names a destination)."""
    mw, app, _clock, _queue, fake = overloaded()
    seen = len(app.seen)
    spoofed = [(b"x-vllm-gke-served-model", b"small"), (b"x-vllm-gke-fallback", b"small"),
               (b"x-gateway-inference-objective", b"drafts.small")]
    assert status(call(mw, BODY, path=CHAT, issuer=ISSUER, headers=[(b"authorization", TOKEN), *spoofed])) == 200
    assert len(app.seen) == seen + 1 and fake.calls == []


def test_a_long_request_goes_to_the_fallbacks_long_pool_and_the_pickers_objective_is_set():
    long_body = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
    mw, *_, fake = overloaded()
    assert status(send(mw, DRAFTS, long_body)) == 200
    assert fake.calls[0][0] == "http://small-long.vllm.svc.cluster.local:8000/small/v1/chat/completions"
    picked = {**FALLBACK, "tenants": {"drafts": {"url": "http://small-short.vllm.svc.cluster.local:8000/drafts/small",
                                                 "headers": {"x-gateway-inference-objective": "drafts.small"}}}}
    mw, *_, fake = overloaded(config=picked)
    assert status(send(mw, DRAFTS, long_body)) == 200
    url, headers, _ = fake.calls[0]
    assert url == "http://small-short.vllm.svc.cluster.local:8000/drafts/small/v1/chat/completions"
    assert headers["x-gateway-inference-objective"] == "drafts.small"


def test_without_a_fallback_every_shed_tenant_gets_the_429():
    mw, *_ = overloaded(config=None)
    assert mw.fallback is None and "fallback" not in guard_config([tenant("drafts", -1)], tenant_routes())
    assert status(send(mw, DRAFTS)) == 429


def test_a_client_that_leaves_stops_the_fallbacks_work():
    """The client gone while the fallback answers: the relay is cancelled, nothing more is sent."""
    import asyncio

    stopped: list[bool] = []

    class Endless(Fallback):
        @asynccontextmanager
        async def __call__(self, url, headers, body):
            async def chunks():
                try:
                    while True:
                        yield b"data: {}\n\n"
                        await asyncio.sleep(0.01)
                except BaseException:
                    stopped.append(True)
                    raise

            self.calls.append((url, headers, body))
            yield 200, [], chunks()

    mw, *_ = overloaded(Endless())
    sent = send(mw, DRAFTS, disconnect_after=0)
    assert stopped == [True] and status(sent) == 200 and sent[-1].get("more_body") is not False


def test_at_most_so_many_requests_are_relayed_at_once():
    mw, _app, *_, fake = overloaded()
    mw.fallback.in_flight = guard.fallback.MAX_IN_FLIGHT
    assert status(send(mw, DRAFTS)) == 429 and fake.calls == []
