"""The degradation path in the guard (images/vllm_gke_guard/fallback.py): a request the overloaded
replica sheds goes to the fallback model where its tenant may call it, every other shed tenant
still gets the 429, priority 0 is never sent, and everything is back to normal once the tier is.
The fallback's answers stand in here; tests/test_guard_fallback_in_vllm.py has two real vLLM
servers, and tests/test_fallback.py the config and the mesh."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from contextlib import asynccontextmanager

import pytest

from tests.conftest import REPO_ROOT
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


def tenant(name: str, priority: int, rpm: int = 1000) -> TenantSpec:
    return TenantSpec.model_validate({**TENANT.model_dump(by_alias=True), "name": name, "priority": priority,
                                      "rateLimit": {"requestsPerMinute": rpm},
                                      "jwt": {**TENANT.jwt.model_dump(by_alias=True),
                                              "issuer": f"https://auth.example/{name}"}})


class Fallback:
    """Stands in for the fallback's Service: records each request, answers as told."""

    def __init__(self, status=200, chunks=(b'{"model": "small", "choices": []}',), fail=None, cut=None,
                 kind="application/json"):
        self.status, self.chunks, self.fail, self.cut, self.kind = status, chunks, fail, cut, kind
        self.calls: list[tuple[str, dict, bytes]] = []

    @asynccontextmanager
    async def __call__(self, url, headers, body):
        self.calls.append((url, headers, body))
        if self.fail is not None:
            raise self.fail

        async def chunks():
            for c in self.chunks:
                yield c
            if self.cut is not None:  # the connection lost after these: what aiohttp raises then
                raise self.cut

        yield self.status, [("Content-Type", self.kind), ("server", "istio-envoy")], chunks()


def overloaded(fallback=None, config=FALLBACK, drafts_rpm=1000, **extra):
    """A guard whose queue is over its objective: after this, `batch` (-5) is shed, and from the
    next second `drafts` (-1) too; `a` (0) never. One of drafts' requests is taken here."""
    cfg = guard_config([TENANT, tenant("drafts", -1, drafts_rpm), tenant("batch", -5)], tenant_routes(),
                       queue_slo_seconds=2.0, fallback=config)
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
               (b"x-llm-d-inference-objective", b"drafts.small")]
    assert status(call(mw, BODY, path=CHAT, issuer=ISSUER, headers=[(b"authorization", TOKEN), *spoofed])) == 200
    assert len(app.seen) == seen + 1 and fake.calls == []


def test_a_long_request_goes_to_the_fallbacks_long_pool_and_the_pickers_objective_is_set():
    long_body = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
    mw, *_, fake = overloaded()
    assert status(send(mw, DRAFTS, long_body)) == 200
    assert fake.calls[0][0] == "http://small-long.vllm.svc.cluster.local:8000/small/v1/chat/completions"
    picked = {**FALLBACK, "tenants": {"drafts": {"url": "http://small-short.vllm.svc.cluster.local:8000/drafts/small",
                                                 "headers": {"x-llm-d-inference-objective": "drafts.small"}}}}
    mw, *_, fake = overloaded(config=picked)
    assert status(send(mw, DRAFTS, long_body)) == 200
    url, headers, _ = fake.calls[0]
    assert url == "http://small-short.vllm.svc.cluster.local:8000/drafts/small/v1/chat/completions"
    assert headers["x-llm-d-inference-objective"] == "drafts.small"


def test_without_a_fallback_every_shed_tenant_gets_the_429():
    mw, *_ = overloaded(config=None)
    assert mw.fallback is None and "fallback" not in guard_config([tenant("drafts", -1)], tenant_routes())
    assert status(send(mw, DRAFTS)) == 429


def test_a_client_that_leaves_stops_the_fallbacks_work():
    """The client gone while the fallback answers: the relay is cancelled, nothing more is sent."""

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


# --- what the overloaded replica spends on a request it sends on ---------------------------------

@pytest.mark.parametrize("fast_path", [True, False])
def test_a_shed_tenant_over_its_rate_limit_is_refused_here_and_never_sent_on(fast_path, monkeypatch):
    """Sent on only within the tenant's limit on this replica, as a request served here: the
    same 429 (rate_limit_exceeded, Retry-After), before its body is read."""
    mw, _app, *_, fake = overloaded(drafts_rpm=3)  # one of the three taken by overloaded()
    monkeypatch.setattr(mw, "fast_path", fast_path)
    assert [status(send(mw, DRAFTS)) for _ in range(2)] == [200, 200] and len(fake.calls) == 2
    sent = send(mw, DRAFTS)
    assert status(sent) == 429 and error(sent)["code"] == "rate_limit_exceeded"
    assert b"retry-after" in dict(sent[0]["headers"]) and len(fake.calls) == 2


def test_requests_are_counted_in_flight_before_their_bodies_are_read():
    """Slow bodies hold their places while they arrive: with the limit's worth of them still
    arriving, one more is the 429 at once, its body never read; they are sent on once they come."""

    mw, _app, *_, fake = overloaded()
    limit, raw = guard.fallback.MAX_IN_FLIGHT, json.dumps(BODY).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
               (b"x-vllm-gke-issuer", DRAFTS.encode()), (b"authorization", TOKEN)]

    async def one(release, arriving):
        sent, bodies = [], [raw]

        async def receive():
            if release is not None and bodies:
                arriving.append(1)
                await release.wait()
            if bodies:
                return {"type": "http.request", "body": bodies.pop(), "more_body": False}
            await asyncio.Event().wait()  # the client stays: never a disconnect

        async def record(message):
            sent.append(message)

        await mw({"type": "http", "method": "POST", "path": CHAT, "headers": headers,
                  "client": ("127.0.0.6", 40000)}, receive, record)
        return sent

    async def run():
        release, arriving = asyncio.Event(), []
        slow = [asyncio.ensure_future(one(release, arriving)) for _ in range(limit)]
        while len(arriving) < limit:
            await asyncio.sleep(0)
        extra = await one(None, arriving)
        release.set()
        return extra, await asyncio.gather(*slow)

    extra, slow = asyncio.run(run())
    assert status(extra) == 429 and error(extra)["code"] == "overloaded"
    assert [status(s) for s in slow] == [200] * limit and len(fake.calls) == limit
    assert mw.fallback.in_flight == 0


# --- an answer cut mid-way -------------------------------------------------------------------------

def test_an_answer_cut_midway_aborts_the_connection_not_a_complete_200():
    """The response started, then the fallback's connection broke: the guard raises (the server
    then aborts the connection) rather than end the body as if whole; counted `cut`."""
    mw, *_ = overloaded(Fallback(chunks=(b'{"model": "small", "choi',), cut=ConnectionResetError()))
    served, cut = counter("drafts", "served"), counter("drafts", "cut")
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": json.dumps(BODY).encode(), "more_body": False} if not sent \
            else await asyncio.Event().wait()

    async def record(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"x-vllm-gke-issuer", DRAFTS.encode()),
               (b"authorization", TOKEN)]
    with pytest.raises(Exception) as raised:
        asyncio.run(mw({"type": "http", "method": "POST", "path": CHAT, "headers": headers,
                                      "client": ("127.0.0.6", 40000)}, receive, record))
    assert raised.type is guard.fallback.Cut
    assert status(sent) == 200 and sent[-1] == {"type": "http.response.body", "body": b'{"model": "small", "choi',
                                                "more_body": True}
    assert counter("drafts", "cut") == cut + 1 and counter("drafts", "served") == served


def test_a_stream_cut_midway_ends_with_vllms_error_event_and_no_half_event():
    events = (b'data: {"choices": [1]}\n\ndata: {"cho', b'ices": [2]}\n\ndata: {"choi')
    mw, *_ = overloaded(Fallback(chunks=events, cut=TimeoutError(), kind="text/event-stream"))
    cut = counter("drafts", "cut")
    sent = send(mw, DRAFTS, {**BODY, "stream": True})
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert status(sent) == 200 and sent[-1]["more_body"] is False
    lines = [x.removeprefix(b"data: ") for x in body.split(b"\n\n") if x]
    # The whole events as they came, vLLM's error response (ErrorInfo: message, type, param, code), [DONE].
    assert [json.loads(x) for x in lines[:2]] == [{"choices": [1]}, {"choices": [2]}] and lines[3:] == [b"[DONE]"]
    error = json.loads(lines[2])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 503
    assert counter("drafts", "cut") == cut + 1


def test_a_real_fallback_dropping_its_connection_midway_reaches_the_client_as_a_failure():
    """vLLM's own aiohttp and uvicorn (VLLM_PYTHON): the guard's client reading from a server
    that drops the connection mid-answer, the guard's client reading from the guard. Plain: the
    body ends in a payload error (the connection aborted), not as a complete 200. Streamed: the
    whole events, then vLLM's error event and [DONE]."""
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI runs the guard with vLLM's own aiohttp and uvicorn: .ci/run sets VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    cfg = {**guard_config([TENANT, tenant("drafts", -1)], tenant_routes(), queue_slo_seconds=2.0, fallback=FALLBACK),
           "model": "m"}
    done = subprocess.run([python, "tests/guard_fallback_cut.py", json.dumps(cfg)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["plain"] == {"status": 200, "served": "small", "error": "ClientPayloadError"}, got
    assert got["stream"]["status"] == 200 and got["stream"]["served"] == "small", got
    events = [e for e in got["stream"]["body"].split("\n\n") if e]
    assert events[0] == 'data: {"choices": [1]}' and events[-1] == "data: [DONE]" and len(events) == 3, events
    assert json.loads(events[1].removeprefix("data: "))["error"]["type"] == "ServiceUnavailableError"


# --- what another tokenizer would misread -----------------------------------------------------------

COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize("path,body", [
    (COMPLETIONS, {"model": "m", "prompt": [791, 3938, 374], "max_tokens": 5}),
    (COMPLETIONS, {"model": "m", "prompt": [[791, 3938]], "max_tokens": 5}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "prompt_embeds": "AAAA", "max_tokens": 5}),
    (CHAT, {**BODY, "logit_bias": {"50256": -100}}),
    (CHAT, {**BODY, "allowed_token_ids": [1, 2]}),
    (CHAT, {**BODY, "stop_token_ids": [128009]}),
    (CHAT, {**BODY, "logprobs": True, "logprob_token_ids": [7]}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "max_tokens": 5, "logit_bias": {"1": 5}}),
], ids=["prompt-ids", "prompt-id-lists", "prompt-embeds", "logit-bias", "allowed-ids", "stop-ids", "logprob-ids",
        "completions-logit-bias"])
def test_a_request_in_the_models_token_ids_is_not_sent(path, body):
    """Token IDs (and prompt vectors) are the original model's: the fallback's tokenizer would read
    other tokens. Such a request gets the 429."""
    mw, _app, *_, fake = overloaded()
    sent = send(mw, DRAFTS, body, path=path)
    assert status(sent) == 429 and error(sent)["code"] == "overloaded" and fake.calls == []


@pytest.mark.parametrize("body", [
    {"model": "m", "prompt": "hi", "max_tokens": 5},
    {"model": "m", "prompt": ["hi", "there"], "max_tokens": 5, "stop_token_ids": [], "logit_bias": None},
])
def test_a_text_prompt_with_no_token_ids_is_sent(body):
    mw, _app, *_, fake = overloaded()
    assert status(send(mw, DRAFTS, body, path=COMPLETIONS)) == 200 and len(fake.calls) == 1


# --- the kept token ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fast_path", [True, False])
def test_vllm_is_never_handed_the_tenants_token(fast_path, monkeypatch):
    """The mesh keeps the token on the sent tenants' requests for the guard to send on; vLLM here
    gets neither it nor a client's trace context, shed or not."""
    mw, app, clock, queue, fake = overloaded()
    monkeypatch.setattr(mw, "fast_path", fast_path)
    extra = [(b"authorization", TOKEN), (b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    assert status(call(mw, BODY, path=CHAT, issuer=ISSUER, headers=extra)) == 200  # priority 0: served here
    clock.now += 1
    queue.waiting, _ = 0, queue.leave(10)  # drained: drafts served here again
    assert status(send(mw, DRAFTS)) == 200 and fake.calls == []
    assert len(app.seen) >= 2 and all(b"authorization" not in h and b"traceparent" not in h for h, _ in app.seen)
