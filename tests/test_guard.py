"""The tenant guard, tried as a hostile tenant would: every bypass closed, never a 500."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO_ROOT
from vllm_gke.components.model.serving_api import (
    LEGACY_OBJECTIVE_HEADER,
    OBJECTIVE_HEADER,
    OPEN_ROUTES,
    TENANT_ROUTES,
    guard_config,
    tenant_routes,
)
from vllm_gke.components.model.specs import TenantSpec
from vllm_gke.components.model.vllm_argv import load_snapshot, snapshot_versions

sys.path.insert(0, str(REPO_ROOT / "images"))
import vllm_gke_guard as guard  # noqa: E402

ISSUER = "https://auth.example/a"
CAP = 100
TENANT = TenantSpec.model_validate({
    "name": "a", "jwt": {"issuer": ISSUER, "jwksUri": "https://auth.example/a/jwks", "audiences": ["x"]},
    "models": ["m"], "rateLimit": {"requestsPerMinute": 1000}, "maxTokens": CAP})


def config(rule="both", rpm=1000, **extra):
    cfg = guard_config([TENANT.model_copy(update={"rate_limit": TENANT.rate_limit.model_copy(
        update={"requests_per_minute": rpm})})], tenant_routes(), rule)
    return {**cfg, **extra}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Recorder:
    """Stands in for vLLM: records what reaches it."""

    def __init__(self):
        self.seen: list[tuple[dict, bytes]] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((dict(scope["headers"]), body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def scope_for(path, method, headers, client="127.0.0.6", kind="http"):
    return {"type": kind, "method": method, "path": path, "headers": headers, "client": (client, 40000)}


async def _call(mw, raw, path, method, headers, client, disconnect_after=None, split=7):
    # Two messages by default (the guard must join them); split=None: the whole body in one.
    chunks = [raw[:split], raw[split:]] if raw and split is not None else [raw]
    sent: list[dict] = []

    async def receive():
        if disconnect_after is not None and len(chunks) <= disconnect_after:
            return {"type": "http.disconnect"}
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await mw(scope_for(path, method, headers, client), receive, send)
    return sent


def call(mw, body=None, path="/v1/completions", method="POST", issuer=ISSUER, headers=None, client="127.0.0.6",
         raw=None, disconnect_after=None):
    raw = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if issuer:
        hdrs.append((b"x-vllm-gke-issuer", issuer.encode()))
    hdrs += list(headers or [])
    return asyncio.run(_call(mw, raw, path, method, hdrs, client, disconnect_after))


def status(sent):
    return sent[0]["status"] if sent else None


def error(sent):
    return json.loads(sent[1]["body"])["error"]


def forwarded(app):
    return json.loads(app.seen[-1][1])


def guarded(rule="both", **kw):
    app = Recorder()
    return guard.GuardMiddleware(app, config(rule, **kw), Clock()), app


# --- the token cap -----------------------------------------------------------------------------

def test_missing_bound_is_set_to_the_cap_and_the_length_fixed():
    mw, app = guarded()
    assert status(call(mw, {"messages": [{"role": "user", "content": "hi"}]}, path="/v1/chat/completions")) == 200
    headers, body = app.seen[0]
    assert json.loads(body)["max_completion_tokens"] == CAP
    assert headers[b"content-length"] == str(len(body)).encode()


def test_completions_default_of_16_needs_no_rewrite():
    mw, app = guarded()
    raw = b'{"model": "m", "prompt": "hi"}'
    assert status(call(mw, raw=raw)) == 200 and app.seen[0][1] == raw  # the bytes are untouched


def test_explicit_null_is_unbounded_and_gets_the_cap_as_the_last_key():
    mw, app = guarded()
    assert status(call(mw, {"prompt": "hi", "max_tokens": None})) == 200
    assert forwarded(app)["max_tokens"] == CAP  # json.loads keeps the last of duplicate keys


def test_above_the_cap_is_refused_with_an_openai_error():
    mw, app = guarded()
    sent = call(mw, {"prompt": "hi", "max_tokens": CAP + 1})
    assert status(sent) == 400 and not app.seen
    err = error(sent)
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "max_tokens_exceeded" and err["param"] == "max_tokens" and str(CAP) in err["message"]


@pytest.mark.parametrize("body,path", [
    ({"messages": [], "n": 4, "max_completion_tokens": 30}, "/v1/chat/completions"),   # 4 x 30
    ({"prompt": "x", "best_of": 5, "max_tokens": 30}, "/v1/completions"),               # 5 x 30
    ({"prompt": ["a", "b", "c"], "max_tokens": 40}, "/v1/completions"),                # 3 prompts x 40
    ({"prompt": [[1, 2], [3]], "max_tokens": 60}, "/v1/completions"),                  # 2 token prompts
    ({"messages": [[{"role": "user", "content": "a"}]] * 3, "max_completion_tokens": 40},
     "/v1/chat/completions/batch"),
])
def test_sequences_multiply(body, path):
    mw, app = guarded()
    assert status(call(mw, body, path=path)) == 400 and not app.seen


def test_token_ids_are_one_prompt_and_unbounded_n_splits_the_cap():
    mw, app = guarded()
    assert status(call(mw, {"prompt": [1, 2, 3], "max_tokens": 90})) == 200
    assert status(call(mw, {"messages": [], "n": 4}, path="/v1/chat/completions")) == 200
    assert forwarded(app)["max_completion_tokens"] == 25
    sent = call(mw, {"messages": [], "n": CAP + 1}, path="/v1/chat/completions")
    assert status(sent) == 400 and error(sent)["param"] == "n"


@pytest.mark.parametrize("rule,expected", [("or", 400), ("not-none", 200), ("both", 400)])
def test_max_completion_tokens_zero_resolves_as_the_pinned_vllm_does(rule, expected):
    """vLLM 0.11 reads `max_completion_tokens or max_tokens`: 0 falls through to max_tokens."""
    mw, _ = guarded(rule)
    body = {"messages": [], "max_completion_tokens": 0, "max_tokens": 5000}
    assert status(call(mw, body, path="/v1/chat/completions")) == expected


def test_zero_with_no_fallback_is_unbounded_under_or():
    mw, app = guarded("or")
    assert status(call(mw, {"messages": [], "max_completion_tokens": 0}, path="/v1/chat/completions")) == 200
    assert forwarded(app)["max_completion_tokens"] == CAP


@pytest.mark.parametrize("value,ok", [
    ("50", True), (50.0, True), (True, True), (" 7 ", True),   # what pydantic's lax int accepts
    (50.5, False), ("abc", False), ([50], False), ({"v": 1}, False), ("5e1", False), (-1, False),
])
def test_numeric_forms(value, ok):
    mw, _ = guarded()
    sent = call(mw, {"prompt": "x", "max_tokens": value})
    assert status(sent) == (200 if ok else 400), value
    if not ok:
        assert error(sent)["code"] in ("invalid_type", "invalid_value")


@pytest.mark.parametrize("raw,code", [
    (b'{"max_tokens": 1, "max_tokens": 500}', 400),      # the last duplicate wins, as in json.loads
    (b'{"max_tokens": 500, "max_tokens": 1}', 200),
    (b'{"max_\\u0074okens": 500}', 400),                  # escapes in keys decode as in json.loads
    (b'  {"max_tokens": 500}', 400),                     # leading whitespace is still JSON
])
def test_the_guard_reads_what_json_loads_reads(raw, code):
    mw, _ = guarded()
    assert status(call(mw, raw=raw)) == code


@pytest.mark.parametrize("raw", [
    b"[1]", b'"x"', b"1", b"", b"{", b'{"a": 1} trailing', b'{"a": 1,}', b"\xef\xbb\xbf{}",
    '{"max_tokens": 500}'.encode("utf-16"), '{"max_tokens": 500}'.encode("utf-32-le"),
    b'{"\xff": 1}', b'{"a": NaN, "max_tokens": 500}', b'{"n": [[[[[[[[[[1]]]]]]]]]]}',
])
def test_bodies_that_are_not_one_json_object_are_refused(raw):
    """Refused by the guard, or else refused by vLLM's own json.loads: never read differently."""
    mw, app = guarded()
    sent = call(mw, raw=raw)
    if app.seen:
        with pytest.raises(ValueError):
            json.loads(app.seen[0][1])
    else:
        assert status(sent) == 400 and error(sent)["type"] == "invalid_request_error", raw


def test_unsupported_media_type():
    mw, app = guarded()
    sent = call(mw, {"prompt": "x"}, headers=[(b"content-type", b"text/plain")])
    assert status(sent) == 415 and not app.seen


@pytest.mark.parametrize("types,expected", [
    ([b"application/json"], 200), ([b"application/json; charset=utf-8"], 200), ([b"Application/JSON"], 200),
    ([b"application/vnd.api+json"], 200), ([], 200),  # FastAPI reads an untyped body as JSON
    ([b"text/plain"], 415), ([b"application/json", b"application/json"], 415),
    ([b"text/plain", b"application/json"], 415)])
def test_the_content_type_is_json_and_given_at_most_once(types, expected):
    mw, app = guarded()
    raw = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    hdrs = [(b"content-type", t) for t in types] + [(b"x-vllm-gke-issuer", ISSUER.encode())]
    sent = asyncio.run(_call(mw, raw, "/v1/completions", "POST", hdrs, "127.0.0.6"))
    assert status(sent) == expected and bool(app.seen) == (expected == 200)


def test_body_over_the_limit_is_413_whether_declared_or_streamed():
    mw, app = guarded(maxBodyBytes=64)
    assert status(call(mw, {"prompt": "x" * 100})) == 413
    mw, app = guarded(maxBodyBytes=64)
    raw = json.dumps({"prompt": "x" * 100}).encode()
    sent = asyncio.run(_call(mw, raw, "/v1/completions", "POST",
                             [(b"x-vllm-gke-issuer", ISSUER.encode())], "127.0.0.6"))  # no content-length
    assert status(sent) == 413 and not app.seen


def test_a_client_that_disconnects_mid_body_forwards_nothing():
    mw, app = guarded()
    sent = call(mw, {"prompt": "hello world", "max_tokens": 1}, disconnect_after=1)
    assert sent == [] and app.seen == []


def test_a_client_that_disconnects_before_the_body_forwards_nothing():
    mw, app = guarded()
    sent = call(mw, {"prompt": "hello world", "max_tokens": 1}, disconnect_after=2)  # both chunks left: at once
    assert sent == [] and app.seen == []


@pytest.mark.parametrize("split", [None, 1, 7])
def test_a_body_in_one_message_or_several_is_checked_alike(split):
    """The guard reads a one-message body (what uvicorn hands over for a small request) on a
    shorter path than a chunked one: both must cap, refuse and limit the same."""
    hdrs = [(b"content-type", b"application/json"), (b"x-vllm-gke-issuer", ISSUER.encode())]

    def send(body, mw):
        raw = json.dumps(body).encode()
        return asyncio.run(_call(mw, raw, "/v1/chat/completions", "POST", hdrs, "127.0.0.6", split=split))

    mw, app = guarded()
    assert status(send({"messages": []}, mw)) == 200
    assert json.loads(app.seen[-1][1])["max_completion_tokens"] == CAP
    assert status(send({"messages": [], "max_tokens": CAP + 1}, mw)) == 400
    mw, app = guarded(maxBodyBytes=64)  # no content-length: the size is only known from the body
    assert status(send({"messages": [{"role": "user", "content": "x" * 100}]}, mw)) == 413 and not app.seen


# --- who may call what -----------------------------------------------------------------------

def test_deny_by_default():
    mw, app = guarded()
    assert status(call(mw, {}, path="/collective_rpc")) == 404
    assert status(call(mw, {}, path="/v1/load_lora_adapter")) == 404
    assert status(call(mw, {}, path="/v1/completions/")) == 404
    assert status(call(mw, {}, path="/v1/completions", method="GET")) == 405
    assert status(call(mw, None, path="/health", method="GET", issuer=None, client="10.0.0.9")) == 200
    assert status(call(mw, None, path="/metrics", method="GET", issuer=None, client="10.0.0.9")) == 200
    assert status(call(mw, None, path="/v1/models", method="GET")) == 200
    assert status(call(mw, None, path="/v1/models", method="GET", issuer=None)) == 403


def test_every_route_the_real_servers_register_is_listed_or_refused():
    """Deny by default, checked against the routes vLLM 0.11 and 0.34 really register."""
    listed = {r.path for r in TENANT_ROUTES} | {r.path for r in OPEN_ROUTES}
    for version in snapshot_versions():
        served = {r["path"] for r in load_snapshot(version)["routes"]}
        assert {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"} <= served
        mw, app = guarded()
        for path in sorted(served - listed):
            for method in ("GET", "POST"):
                assert status(call(mw, {}, path=path, method=method)) == 404, (version, path)
        assert not app.seen
    every_snapshot_route = set().union(*({r["path"] for r in load_snapshot(v)["routes"]} for v in snapshot_versions()))
    assert {r.path for r in TENANT_ROUTES} <= every_snapshot_route  # nothing listed that no vLLM serves


def test_websockets_are_closed():
    mw, app = guarded()
    sent: list[dict] = []

    async def run():
        async def receive():
            return {"type": "websocket.connect"}

        async def send(m):
            sent.append(m)
        await mw(scope_for("/v1/realtime", "GET", [], kind="websocket"), receive, send)
    asyncio.run(run())
    assert sent == [{"type": "websocket.close", "code": 1008}] and not app.seen


@pytest.mark.parametrize("depth", [1000, 5000, 100_000])
def test_deep_nesting_is_malformed_json_not_a_guard_failure(depth, caplog):
    """A tenant nesting arrays thousands deep gets a 400, and the log gets no traceback per request."""
    mw, app = guarded()
    body = b'{"prompt": "x", "max_tokens": 5, "extra": ' + b"[" * depth + b"]" * depth + b"}"
    with caplog.at_level(logging.ERROR, logger="vllm.gke_guard"):
        sent = call(mw, raw=body)
    # Within the interpreter's recursion limit it is JSON like any other; past it, malformed.
    assert status(sent) == 200 if app.seen else 400 <= status(sent) < 500
    if depth >= 5000:
        assert not app.seen
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("value", ["5", 5.0, True, [5]])
def test_0_11_completions_take_max_completion_tokens_only_as_a_json_integer(value):
    """0.11 keeps it as an extra field, unconverted: a string would reach min(int, str) in vLLM."""
    mw, app = guarded("or")
    sent = call(mw, {"prompt": "x", "max_tokens": 5, "max_completion_tokens": value})
    assert status(sent) == 400 and error(sent)["param"] == "max_completion_tokens" and not app.seen
    assert status(call(mw, {"prompt": "x", "max_tokens": 5, "max_completion_tokens": 5})) == 200


def test_fail_closed_without_the_sidecar():
    mw, app = guarded()
    sent = call(mw, {"prompt": "x"}, client="10.20.3.4")  # straight to the pod, not via Envoy
    assert status(sent) == 403 and error(sent)["code"] == "no_mesh" and not app.seen


def test_a_refused_peer_is_counted_and_named_once(caplog):
    """A data plane delivering from another address than istiod's 127.0.0.6 would refuse every tenant:
    it shows on the replica's /metrics (an alert reads it) and in vLLM's log, each address once."""
    from prometheus_client import REGISTRY

    metric = "vllm_gke_guard_untrusted_peer_requests_total"
    before = REGISTRY.get_sample_value(metric) or 0
    mw, _ = guarded()
    with caplog.at_level(logging.ERROR, logger="vllm.gke_guard"):
        for client in ["10.20.3.4", "10.20.3.4", "127.0.0.1"]:
            assert error(call(mw, {"prompt": "x"}, client=client))["code"] == "no_mesh"
        for n in range(2 * guard.LOGGED_PEERS_MAX):  # a flood from many addresses logs a bounded number
            call(mw, {"prompt": "x"}, client=f"10.9.0.{n}")
    assert REGISTRY.get_sample_value(metric) == before + 3 + 2 * guard.LOGGED_PEERS_MAX
    named = [r.getMessage() for r in caplog.records if "refused a tenant request from" in r.getMessage()]
    assert len(named) == guard.LOGGED_PEERS_MAX and sum("10.20.3.4" in m for m in named) == 1
    assert all("127.0.0.6" in m and "controlPlaneManagement.implementation" in m for m in named)
    assert status(call(mw, {"prompt": "x"})) == 200 and REGISTRY.get_sample_value(metric) == before + 3 + 32


def test_issuer_header_exactly_once_and_known():
    mw, app = guarded()
    assert status(call(mw, {"prompt": "x"}, issuer=None)) == 403
    assert status(call(mw, {"prompt": "x"}, issuer="https://evil.example")) == 403
    dup = [(b"x-vllm-gke-issuer", b"https://evil.example")]
    assert status(call(mw, {"prompt": "x"}, headers=dup)) == 400
    assert not app.seen


def test_warm_up_token_only_from_the_entrypoint(monkeypatch):
    monkeypatch.setenv(guard.WARMUP_TOKEN_ENV, "s3cret")
    mw, app = guarded()
    token = [(guard.WARMUP_HEADER, b"s3cret")]
    assert status(call(mw, {"prompt": "x", "max_tokens": 8}, issuer=None, headers=token, client="127.0.0.1")) == 200
    assert status(call(mw, {"prompt": "x"}, issuer=None, headers=[(guard.WARMUP_HEADER, b"guess")],
                       client="127.0.0.1")) == 403
    # The token from any other peer (even through the sidecar) is just a header.
    assert status(call(mw, {"prompt": "x"}, issuer=None, headers=token, client="127.0.0.6")) == 403
    assert status(call(mw, {"prompt": "x"}, issuer=None, headers=token * 2, client="127.0.0.1")) == 403  # sent twice


# --- rate limit ---------------------------------------------------------------------------------

def test_at_most_n_in_any_minute_from_a_cold_start():
    clock = Clock()
    app = Recorder()
    mw = guard.GuardMiddleware(app, config(rpm=2), clock)
    assert [status(call(mw, {"prompt": "x"})) for _ in range(3)] == [200, 200, 429]
    sent = call(mw, {"prompt": "x"})
    assert dict(sent[0]["headers"])[b"retry-after"] == b"60" and error(sent)["code"] == "rate_limit_exceeded"
    clock.now = 59.9
    assert status(call(mw, {"prompt": "x"})) == 429  # a bucket would have refilled by now
    clock.now = 60.0
    assert status(call(mw, {"prompt": "x"})) == 200


def test_the_window_stays_exact_across_compactions_of_its_log():
    """The log drops expired entries from its front in batches: decisions and waits over many
    windows and compactions match a plain queue of the admissions in the window."""
    import collections
    import random

    rng = random.Random(7)
    clock = Clock()
    limit = 3000
    limiter = guard.SlidingWindowLimiter(limit, clock)
    window: collections.deque[float] = collections.deque()
    compactions = 0
    for _ in range(40_000):
        clock.now += rng.choice((0.0, 0.001, 0.004, 0.02, 0.5))
        while window and window[0] <= clock.now - 60:
            window.popleft()
        expected = None if len(window) < limit else window[0] + 60 - clock.now
        head = limiter.head
        assert limiter.take() == expected
        compactions += limiter.head < head
        if expected is None:
            window.append(clock.now)
        assert len(limiter) == len(window)
    assert compactions >= 3 and len(limiter.times) < 2 * (limit + limiter.COMPACT_AFTER)


@given(times=st.lists(st.floats(0, 300, allow_nan=False), min_size=1, max_size=80), limit=st.integers(1, 8))
def test_no_window_of_sixty_seconds_admits_more_than_the_limit(times, limit):
    clock = Clock()
    limiter = guard.SlidingWindowLimiter(limit, clock)
    admitted = []
    for t in sorted(times):
        clock.now = t
        if limiter.take() is None:
            admitted.append(t)
    for t in admitted:
        assert sum(1 for a in admitted if t <= a < t + 60) <= limit


def test_exact_under_concurrency():
    clock = Clock()
    app = Recorder()
    mw = guard.GuardMiddleware(app, config(rpm=5), clock)
    raw = b'{"prompt": "x"}'
    hdrs = [(b"content-type", b"application/json"), (b"x-vllm-gke-issuer", ISSUER.encode())]

    async def burst():
        return await asyncio.gather(*(_call(mw, raw, "/v1/completions", "POST", hdrs, "127.0.0.6")
                                      for _ in range(50)))
    results = asyncio.run(burst())
    assert sorted(status(r) for r in results).count(200) == 5 and len(app.seen) == 5


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def _tenant_requests(model: str) -> float:
    return sum(_sample("vllm_gke_tenant_requests_total", tenant="a", model=model, outcome=o)
               for o in ("ok", "refused", "error"))


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": "x"}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                 "max_completion_tokens": 4})])
def test_an_unmetered_guard_checks_the_tenant_and_takes_the_limit_but_counts_no_usage(path, body):
    """A P/D prefill pod's guard (`unmetered`): the tenant's limits are taken here, before the prefill's GPU work
    (the decode pod's guard takes none for the sidecar's decode leg), its usage counted on the decode pod."""
    store_falls = _sample("vllm_gke_guard_limit_store_fallbacks_total")
    dead_store = {"host": "127.0.0.1", "port": 1}  # the shared limit: a take falls back, counted
    mw, app = guarded(rpm=1, unmetered=True, model=f"unmetered{path}", globalLimits=dead_store)
    assert [status(call(mw, body, path=path)) for _ in range(2)] == [200, 429] and len(app.seen) == 1
    assert _tenant_requests(f"unmetered{path}") == 0
    assert _sample("vllm_gke_guard_limit_store_fallbacks_total") == store_falls + 1
    assert status(call(mw, body, path=path, issuer="https://auth.example/other")) == 403  # the tenant still checked
    assert status(call(mw, body, path=path, client="10.0.0.9")) == 403
    # The same guard metered: one a minute, counted.
    mw, app = guarded(rpm=1, model=f"metered{path}")
    assert [status(call(mw, body, path=path)) for _ in range(2)] == [200, 429]
    assert _tenant_requests(f"metered{path}") == 1


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": "x"}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                 "max_completion_tokens": 4})])
def test_a_decode_pods_guard_takes_no_limit_for_the_sidecars_decode_leg_and_counts_it(path, body):
    """A P/D decode pod's guard (routing-sidecar): the sidecar's decode leg (kv_transfer_params from its
    loopback peer) was limited by the prefill pod's guard: no window taken, usage counted; a request the
    picker kept local (no kv_transfer_params) takes the tenant's window here."""
    store_falls = _sample("vllm_gke_guard_limit_store_fallbacks_total")
    mw, app = guarded(rpm=1, kvTransfer="routing-sidecar", trustedPeers=["127.0.0.1"], model=f"decode{path}",
                      globalLimits={"host": "127.0.0.1", "port": 1})
    leg = {**body, "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1],
                                          "remote_host": "10.0.0.9", "remote_port": 5600}}
    assert [status(call(mw, leg, path=path, client="127.0.0.1")) for _ in range(3)] == [200, 200, 200]
    assert _sample("vllm_gke_guard_limit_store_fallbacks_total") == store_falls
    assert _tenant_requests(f"decode{path}") == 3
    assert [status(call(mw, body, path=path, client="127.0.0.1")) for _ in range(2)] == [200, 429]
    assert _sample("vllm_gke_guard_limit_store_fallbacks_total") == store_falls + 1


# --- never a 500 ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
fields = st.sampled_from(["max_tokens", "max_completion_tokens", "n", "best_of", "prompt", "messages",
                          "model", "max_output_tokens", "x"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(fields, json_values, max_size=6),
       path=st.sampled_from([r.path for r in TENANT_ROUTES if r.method == "POST"]),
       indent=st.sampled_from([None, 0, 2]), rule=st.sampled_from(["or", "not-none", "both"]))
def test_any_json_object_gets_a_4xx_or_a_bounded_request(body, path, indent, rule):
    mw, app = guarded(rule)
    raw = json.dumps(body, indent=indent).encode()
    sent = call(mw, raw=raw, path=path)
    if app.seen:
        assert status(sent) == 200
        seen = json.loads(app.seen[-1][1])
        kind = next(r.kind for r in TENANT_ROUTES if r.path == path)
        assert {k: v for k, v in seen.items() if k not in guard.OUTPUT_FIELDS.values()} == \
            {k: v for k, v in body.items() if k not in guard.OUTPUT_FIELDS.values()}
        if kind in guard.OUTPUT_FIELDS:
            assert generated_bound(seen, kind, rule) <= CAP
    else:
        assert 400 <= status(sent) < 500


def generated_bound(body, kind, rule):
    """What vLLM would generate at most, computed from json.loads' reading of the body."""
    lax = lambda v: None if v is None else int(float(v)) if not isinstance(v, bool) else int(v)  # noqa: E731
    n = max(lax(body.get("n", 1)) or 1, lax(body.get("best_of")) or 1)
    if kind == "completions":
        prompt = body.get("prompt", "x")
        count = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
        per = lax(body.get("max_tokens", 16))
        return per * n * count
    if kind in ("chat", "chat_batch"):
        mct, mt = lax(body.get("max_completion_tokens")), lax(body.get("max_tokens"))
        count = len(body["messages"]) if kind == "chat_batch" and isinstance(body.get("messages"), list) else 1
        per = [mct or mt, mct if mct is not None else mt]
        per = {"or": per[:1], "not-none": per[1:]}.get(rule, per)
        assert None not in per
        return max(per) * n * count
    return lax(body.get(guard.OUTPUT_FIELDS[kind])) * n


@settings(max_examples=300)
@given(raw=st.binary(max_size=200), path=st.sampled_from(["/v1/completions", "/v1/chat/completions",
                                                          "/v1/embeddings", "/nope"]),
       headers=st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=30)), max_size=4))
def test_arbitrary_bytes_and_headers_never_raise_or_500(raw, path, headers):
    mw, _ = guarded()
    sent = call(mw, raw=raw, path=path, headers=[(k.lower(), v) for k, v in headers])
    assert sent and (status(sent) == 200 or 400 <= status(sent) < 500)


@settings(max_examples=300)
@given(body=st.dictionaries(st.text(max_size=12), json_values, max_size=8),
       indent=st.sampled_from([None, 1, 3]), separators=st.sampled_from([None, (",", ":"), (" , ", " : ")]),
       ensure_ascii=st.booleans())
def test_both_readers_agree_with_json_loads(body, indent, separators, ensure_ascii):
    raw = json.dumps(body, indent=indent, separators=separators, ensure_ascii=ensure_ascii).encode()
    expected = json.loads(raw)
    for reader in (guard.read_fields_by_scanning, guard.read_fields):  # read_fields: msgspec, for small bodies
        fields = reader(raw, "completions")
        assert fields.values == {k: expected[k] for k in guard.COUNTED if k in expected}
        assert {k: json.loads(v) for k, v in guard.prompt_lists(fields, "completions").items()} == \
            {k: expected[k] for k in ("prompt", "prompt_embeds") if k in expected}
        close = guard.closing_brace(fields, raw)
        assert raw[close:close + 1] == b"}"


@settings(max_examples=500)
@given(raw=st.one_of(st.binary(max_size=12).map(lambda b: b'"' + b + b'"'), st.binary(max_size=12)))
@example(raw=b'"\xed\xa0\x80"')  # a lone surrogate: json.loads decodes bytes with surrogatepass
@example(raw=b'"tab\there"')  # a raw control character: json.loads refuses it
@example(raw=b'"caf\xc3\xa9"')
def test_a_scanned_value_decodes_as_json_loads_decodes_it(raw):
    """The scanner's shortcuts for digits, null and plain strings give what json.loads gives,
    or fail where it fails (any ValueError is a 400)."""
    try:
        expected = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            guard._decode_small(raw)
        return
    assert guard._decode_small(raw) == expected and type(guard._decode_small(raw)) is type(expected)


@settings(max_examples=300)
@given(body=st.dictionaries(st.text(max_size=12), json_values, max_size=8),
       indent=st.sampled_from([None, 1, 3]), separators=st.sampled_from([None, (",", ":"), (" , ", " : ")]),
       ensure_ascii=st.booleans())
def test_the_scanner_agrees_with_json_loads(body, indent, separators, ensure_ascii):
    raw = json.dumps(body, indent=indent, separators=separators, ensure_ascii=ensure_ascii).encode()
    spans, close = guard.scan_object(raw, frozenset(body))
    assert raw[close:close + 1] == b"}"
    assert {k: json.loads(raw[a:b]) for k, (a, b) in spans.items()} == json.loads(raw)


_LONG = {
    "short strings": {"prompt": ["ab"] * 20_000, "max_tokens": 5, "n": 2},
    "token ids": {"prompt": list(range(200_000)), "max_tokens": 5},
    "quotes": {"messages": [{"role": "user", "content": '"' * 40_000}], "max_completion_tokens": 7},
    "backslashes": {"messages": [{"role": "user", "content": "\\" * 40_000 + '"'}], "max_tokens": 9, "model": "m"},
    "many messages": {"messages": [{"role": "user", "content": "hi"}] * 5_000, "best_of": 3},
    "long runs": {"model": "m", "messages": [{"role": "user", "content": "x" * 70_000}], "max_completion_tokens": 1},
}


@pytest.mark.parametrize("with_msgspec", [True, False])
@pytest.mark.parametrize("name", list(_LONG))
def test_large_bodies_read_as_json_loads_reads_them_whatever_their_shape(name, with_msgspec, monkeypatch):
    """Past 16 KB the scanner reads a body while that is cheaper than msgspec, and gives up
    (ScanTooLong) on bodies of many strings, escapes or brackets, which msgspec (json.loads in an
    image without it) then reads: either way the same fields as json.loads, and no body costs the
    scanner more than its allowance."""
    if not with_msgspec:
        for name_ in ("_BODY", "_ARRAY", "_OBJECT"):
            monkeypatch.setattr(guard.body, name_, None)
    raw = json.dumps(_LONG[name]).encode()
    expected = json.loads(raw)
    kind = "completions" if "prompt" in expected else "chat_batch"
    fields = guard.read_fields(raw, kind)
    assert fields.values == {k: expected[k] for k in guard.COUNTED if k in expected}
    assert {k: json.loads(v) for k, v in guard.prompt_lists(fields, kind).items()} == \
        {k: expected[k] for k in guard.PROMPT_FIELDS[kind] if k in expected}
    gives_up = name not in ("long runs",)
    if gives_up:
        with pytest.raises(guard.ScanTooLong):
            guard.read_fields_by_scanning(raw, kind, [guard.scan_allowance(len(raw))])
    assert guard.read_fields_by_scanning(raw, kind).values == fields.values  # without an allowance: slow, same
    prompts = len(expected.get("prompt", expected.get("messages"))) if name in ("short strings", "many messages") else 1
    assert guard.Budget(kind, fields, "both").sequences == prompts * max(expected.get("n", 1), expected.get("best_of", 1))


def test_the_scanner_hops_long_containers_in_bounded_steps():
    """Containers longer than one bounded hop (16 runs or short strings, 4 KB a run) end where
    json.loads says they do."""
    body = {"a": ["s"] * 100, "b": [[1] * 3000, {"k": "v" * 60}] * 3, "c": "1" * 9000, "d": [1.5e3] * 2000, "max_tokens": 3}
    raw = json.dumps(body).encode()
    spans, close = guard.scan_object(raw, frozenset(body))
    assert {k: json.loads(raw[a:b]) for k, (a, b) in spans.items()} == body and close == len(raw) - 1


# --- behind the endpoint picker: the objective is the tenant's own ----------------------------

def test_behind_the_picker_a_tenant_must_carry_its_own_objective():
    """The objective the identity extension set from the token (serving_api.OBJECTIVE_HEADER, the
    x-llm-d-* spelling the picker reads first) must be the tenant's whom Istio verified here too:
    the guard and the picker agree on who is who. Missing, another tenant's or repeated: 403 (the old
    x-gateway-* spelling: test_the_old_objective_header_passes_with_the_tenants_own_value_only)."""
    app = Recorder()
    cfg = guard_config([TENANT], tenant_routes(), "both", objectives_for="m")
    assert cfg["objectiveHeader"] == OBJECTIVE_HEADER == "x-llm-d-inference-objective"
    mw = guard.GuardMiddleware(app, cfg, Clock())
    body = {"model": "m", "prompt": "hi", "max_tokens": 5}
    own = OBJECTIVE_HEADER.encode()
    assert status(call(mw, body, headers=[(own, b"a.m")])) == 200
    for headers in ([], [(own, b"b.m")], [(own, b"a.m"), (own, b"a.m")], [(own, b"a.other")]):
        sent = call(mw, body, headers=headers)
        assert status(sent) == 403 and error(sent)["code"] == "forbidden", headers
        assert error(sent)["type"] == "permission_error" and "/a/<model>/v1" in error(sent)["message"]
    assert len(app.seen) == 1


# One release: the move from bf329cd's routes (issue 39); drop next release.
def test_the_old_objective_header_passes_with_the_tenants_own_value_only():
    """While a stack moves from bf329cd's routes (clients sent x-gateway-inference-objective, which the
    identity extension strips once it runs), the tenant's own objective under that name passes; another
    value, a repeated one, or both names with different values: 403 in OpenAI's format."""
    app = Recorder()
    cfg = guard_config([TENANT], tenant_routes(), "both", objectives_for="m")
    assert cfg["legacyObjectiveHeader"] == LEGACY_OBJECTIVE_HEADER == "x-gateway-inference-objective"
    mw = guard.GuardMiddleware(app, cfg, Clock())
    body = {"model": "m", "prompt": "hi", "max_tokens": 5}
    own, old = OBJECTIVE_HEADER.encode(), LEGACY_OBJECTIVE_HEADER.encode()
    for headers in ([(old, b"a.m")], [(own, b"a.m"), (old, b"a.m")]):
        assert status(call(mw, body, headers=headers)) == 200, headers
    for headers in ([(old, b"b.m")], [(old, b"a.m"), (old, b"a.m")], [(own, b"a.m"), (old, b"b.m")],
                    [(own, b"b.m"), (old, b"a.m")], [(old, b"a.m"), (own, b"a.m"), (own, b"a.m")]):
        sent = call(mw, body, headers=headers)
        assert status(sent) == 403 and error(sent)["code"] == "forbidden", headers
        assert error(sent)["type"] == "permission_error" and "/a/<model>/v1" in error(sent)["message"]
    assert len(app.seen) == 2
    # Without the compat key (as next release): the old name alone is refused.
    del cfg["legacyObjectiveHeader"]
    assert status(call(guard.GuardMiddleware(Recorder(), cfg, Clock()), body, headers=[(old, b"a.m")])) == 403


@given(st.binary(max_size=64))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_forged_objective_is_a_403_never_a_500(value):
    """Whatever bytes a request's objective carries (a forged or mangled one), it is refused in
    OpenAI's format unless it is exactly the tenant's own; nothing reaches vLLM."""
    app = Recorder()
    mw = guard.GuardMiddleware(app, guard_config([TENANT], tenant_routes(), "both", objectives_for="m"), Clock())
    sent = call(mw, {"model": "m", "prompt": "hi", "max_tokens": 5}, headers=[(OBJECTIVE_HEADER.encode(), value)])
    if value == b"a.m":
        assert status(sent) == 200
        return
    assert status(sent) == 403 and error(sent)["type"] == "permission_error" and not app.seen


def test_without_the_picker_the_objective_header_is_not_required():
    mw, app = guarded()
    assert status(call(mw, {"model": "m", "prompt": "hi", "max_tokens": 5})) == 200


def test_every_conversation_of_a_chat_batch_counts_whatever_its_first_item_is():
    """Regression (found by Hypothesis): a batch whose first conversation was not a list counted
    as one conversation, so the cap added for an unbounded batch of two allowed twice the cap."""
    mw, app = guarded(rule="or")
    body = {"messages": [None, [{"role": "user", "content": "hi"}]], "max_tokens": None}
    assert status(call(mw, body, path="/v1/chat/completions/batch")) == 200
    assert forwarded(app)["max_completion_tokens"] == CAP // 2


# --- the common-chat path decides exactly as the general one ----------------------------------

_bounds = st.one_of(st.integers(-3, 2 * CAP), st.none(), st.booleans(), st.floats(-1, 2 * CAP, allow_nan=False),
                    st.sampled_from(["7", "x", [], {}]))
_chat_bodies = st.one_of(
    st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}]), "max_completion_tokens": _bounds},
                          optional={"max_tokens": _bounds, "n": _bounds, "best_of": _bounds,
                                    "model": st.sampled_from(["m", "other", 3]),
                                    "pad": st.sampled_from(["", "x" * 70, "x" * 17_000])}).map(
        lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"messages": st.just([])}, optional={"max_tokens": _bounds}).map(
        lambda d: json.dumps(d).encode()),
    st.sampled_from([b"", b"[]", b"{", b'{"max_completion_tokens": 5} x', b'\xff{}', b'{"n": 1, "n": 2}']))
# The common request, and each way of being a little different from it.
_COMMON = {"issuers": [ISSUER], "types": [b"application/json"], "length": "right", "extra": [],
           "client": "127.0.0.6", "split": None, "method": "POST"}
_VARIANTS = {"issuers": [[], [ISSUER, ISSUER], ["https://other.example"]],
             "types": [[], [b"application/json"] * 2, [b"text/plain"], [b"application/json; charset=utf-8"]],
             "length": ["none", "short", "long", "junk", "twice"],
             "extra": [[(guard.WARMUP_HEADER, b"t")], [(b"x-other", b"1")]],
             "client": ["127.0.0.1", "10.1.2.3"], "split": [7], "method": ["GET"]}
_chat_requests = st.builds(
    lambda raw, changes: {**_COMMON, **dict(changes), "raw": raw}, _chat_bodies,
    st.lists(st.sampled_from(list(_VARIANTS)).flatmap(lambda k: st.tuples(st.just(k), st.sampled_from(_VARIANTS[k]))),
             max_size=2))


def _both_paths_decide_alike(requests, rule="both", max_body=None, warm_up="", peers=None):
    extra = {"maxBodyBytes": max_body} if max_body else {}
    if peers:
        extra["trustedPeers"] = peers
    pairs = []
    before = os.environ.get(guard.WARMUP_TOKEN_ENV)
    os.environ[guard.WARMUP_TOKEN_ENV] = warm_up
    try:
        for fast in (True, False):
            app = Recorder()
            mw = guard.GuardMiddleware(app, config(rule, rpm=2, **extra), Clock())
            mw.fast_path = fast
            pairs.append((mw, app))
    finally:
        os.environ.pop(guard.WARMUP_TOKEN_ENV) if before is None else os.environ.update({guard.WARMUP_TOKEN_ENV: before})
    for req in requests:
        req = {**_COMMON, **req}
        raw = req["raw"]
        lengths = {"right": [str(len(raw))], "none": [], "short": [str(max(len(raw) - 1, 0))],
                   "long": [str(len(raw) + 5)], "junk": ["12a"], "twice": [str(len(raw))] * 2}[req["length"]]
        hdrs = [(b"x-vllm-gke-issuer", i.encode()) for i in req["issuers"]] + \
            [(b"content-type", t) for t in req["types"]] + [(b"content-length", n.encode()) for n in lengths] + \
            req["extra"]
        outcomes = []
        for mw, app in pairs:
            sent = asyncio.run(_call(mw, raw, "/v1/chat/completions", req["method"], hdrs, req["client"],
                                     split=req["split"]))
            outcomes.append((sent, app.seen[-1:] if app.seen else [], len(mw.tenants[ISSUER].limiter)))
            app.seen.clear()
        assert outcomes[0] == outcomes[1], req


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_chat_requests, min_size=1, max_size=4), rule=st.sampled_from(["both", "or", "not-none"]),
       max_body=st.sampled_from([None, 64, 20_000]), warm_up=st.sampled_from(["", "t"]),
       peers=st.sampled_from([None, ["127.0.0.6", "127.0.0.1"]]))
def test_the_common_chat_path_decides_as_the_general_one(requests, rule, max_body, warm_up, peers):
    """Same responses, same bytes forwarded, same requests counted, for chat requests of every
    shape near the common one (2 a minute, so the limit is reached too)."""
    _both_paths_decide_alike(requests, rule, max_body, warm_up, peers)


def _chat(**body):
    return json.dumps({"messages": [], **body}).encode()


@pytest.mark.parametrize("requests,kw", [
    ([{"raw": _chat(max_completion_tokens=0)}], {}),  # 0: readings differ, the cap is added
    ([{"raw": _chat(max_completion_tokens=5, max_tokens="x")}], {}),  # max_tokens still validated
    ([{"raw": _chat(max_completion_tokens=5, max_tokens=1.5)}], {}),
    ([{"raw": _chat(max_completion_tokens=CAP + 1)}], {}),
    ([{"raw": _chat(max_completion_tokens=True)}], {}),
    ([{"raw": _chat(max_completion_tokens=5, n=2)}], {}),
    ([{"raw": _chat(max_completion_tokens=5), "client": "127.0.0.1", "extra": [(guard.WARMUP_HEADER, b"t")]}],
     {"warm_up": "t", "peers": ["127.0.0.6", "127.0.0.1"]}),  # the warm-up skips the tenant checks
    ([{"raw": _chat(max_completion_tokens=5, pad="x" * 100)}], {"max_body": 64}),
    ([{"raw": _chat(max_completion_tokens=5), "length": "long"}],  # the stated length alone is over the limit
     {"max_body": len(_chat(max_completion_tokens=5)) + 2}),
    ([{"raw": _chat(max_completion_tokens=5), "length": "short"}],  # the body alone is over it
     {"max_body": len(_chat(max_completion_tokens=5)) - 1}),
    ([{"raw": _chat(max_completion_tokens=5)}] * 3, {}),  # the third is over the rate
])
def test_the_common_chat_path_decides_as_the_general_one_on_its_edges(requests, kw):
    _both_paths_decide_alike(requests, **kw)


def test_without_msgspec_the_guard_decides_the_same(monkeypatch):
    """msgspec ships in the vLLM image; without it (the guard is standard library otherwise)
    the scanner and json.loads give the same answers."""
    for name in ("_BODY", "_ARRAY", "_OBJECT"):
        monkeypatch.setattr(guard.body, name, None)
    mw, app = guarded()
    chat = "/v1/chat/completions"
    assert status(call(mw, {"messages": [], "max_completion_tokens": 5}, path=chat)) == 200
    assert status(call(mw, {"messages": [], "max_completion_tokens": CAP + 1}, path=chat)) == 400
    assert status(call(mw, {"messages": []}, path=chat)) == 200 and forwarded(app)["max_completion_tokens"] == CAP
    assert status(call(mw, {"prompt": ["a"] * 30_000, "max_tokens": 1}, path="/v1/completions")) == 400  # 30k prompts
    assert status(call(mw, raw=b"[1, 2]", path="/v1/embeddings")) == 400
    assert status(call(mw, {"input": ["x"] * 20_000}, path="/v1/embeddings")) == 200


@pytest.mark.parametrize("msgspec", [True, False])
@pytest.mark.parametrize("encoding", ["bytes", "bytes_only"])
def test_embeddings_the_guard_cannot_meter_are_refused(encoding, msgspec, monkeypatch):
    """vLLM 0.34 answers encoding_format "bytes" with the usage in a `metadata` header and
    "bytes_only" with none, while the guard meters a pooling answer's body: a tenant asking for
    them would embed for free. Refused with a 400 naming the field, whatever reads the body
    (msgspec, the scanner on a large body, json.loads), the last copy of the key winning as in vLLM."""
    if not msgspec:
        for name in ("_BODY", "_ARRAY", "_OBJECT"):
            monkeypatch.setattr(guard.body, name, None)
    mw, app = guarded()
    path = "/v1/embeddings"
    for body in ({"input": "hi", "encoding_format": encoding},
                 {"input": ["x"] * 20_000, "encoding_format": encoding},
                 {"input": "hi", "encoding_format": encoding, "model": "m"}):
        sent = call(mw, body, path=path)
        assert status(sent) == 400
        err = json.loads(sent[1]["body"])["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["param"] == "encoding_format" and encoding in err["message"]
    escaped = encoding.replace("b", "\\u0062")
    raw = b'{"input": "hi", "encoding_format": "float", "encoding_format": "' + escaped.encode() + b'"}'
    assert status(call(mw, raw=raw, path=path)) == 400
    assert status(call(mw, raw=raw.replace(b'"float"', b'"x"').replace(escaped.encode(), b"float"), path=path)) == 200
    assert len(app.seen) == 1
    for metered in ("float", "base64"):
        assert status(call(mw, {"input": "hi", "encoding_format": metered}, path=path)) == 200
    assert status(call(mw, {"input": "hi"}, path=path)) == 200


# --- tenants share no prefix cache (cache_salt), and what else vLLM would trip on ------------------

SALTED = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


def salted(**kw):
    app = Recorder()
    return guard.GuardMiddleware(app, config(cacheSaltRoutes=SALTED, **kw), Clock()), app


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "cache_salt": "tenant-b"}),
    ("/v1/completions", {"prompt": "hi", "cache_salt": "x", "max_tokens": 5}),
    ("/v1/embeddings", {"input": "hi", "cache_salt": "tenant-b"}),
])
def test_every_salted_request_carries_the_tenants_own_salt(monkeypatch, fast_path, path, body):
    """Two tenants' identical prompts must not share vLLM's prefix cache (a timing side channel):
    the guard appends the tenant's salt as the last key, which wins over a client's (json.loads
    keeps the last duplicate), on the common path and the general one alike."""
    monkeypatch.setattr(guard.GuardMiddleware, "fast_path", fast_path)
    mw, app = salted()
    assert status(call(mw, body, path=path)) == 200
    headers, raw = app.seen[-1]
    assert json.loads(raw)["cache_salt"] == "tenant-a"
    assert raw.rstrip().endswith(b'"cache_salt":"tenant-a"}')
    assert headers[b"content-length"] == str(len(raw)).encode()


def test_unsalted_routes_and_releases_are_left_alone():
    mw, app = salted()
    assert status(call(mw, {"input": "hi"}, path="/v1/score")) == 200  # not among this config's salted routes
    assert b"cache_salt" not in app.seen[-1][1]
    mw, app = guarded()  # a config without cacheSaltRoutes (a release without the field)
    assert status(call(mw, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5},
                       path="/v1/chat/completions")) == 200
    assert b"cache_salt" not in app.seen[-1][1]


def test_the_plan_salts_what_each_release_takes(plans):
    from tests.conftest import vllm_deployments
    from vllm_gke.components.model.vllm_versions import RELEASES

    for dep in vllm_deployments(plans["prod"]):
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        cfg = json.loads(env["GKE_LLM_GUARD_CONFIG"])
        assert set(cfg["cacheSaltRoutes"]) == set(RELEASES["0.34.0"].cache_salt_paths) & set(cfg["routes"])
        salts = [e["cacheSalt"] for e in cfg["issuers"].values()]
        assert len(set(salts)) == len(salts) and all(s == f"tenant-{e['tenant']}" for s, e in
                                                    zip(salts, cfg["issuers"].values()))
    assert set(RELEASES["0.11.0"].cache_salt_paths) == {"/v1/completions", "/v1/chat/completions", "/v1/responses"}


def test_0_11_routes_with_a_shared_unsalted_prefix_cache_are_refused(plan_variant):
    """On 0.11 the pooling routes share the prefix cache with no salt the guard can set: the guard
    serves none of them, so no tenant's embedding prompt warms another's."""
    plan = plan_variant("dev", lambda v: v.update({"vllm-gke:vllmVersion": "0.11.0",
                                                   "vllm-gke:serverImage": {**v["vllm-gke:serverImage"],
                                                                            "tag": "v0.11.0-gke.1"}}))
    from tests.conftest import vllm_deployments

    for dep in vllm_deployments(plan):
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        cfg = json.loads(env["GKE_LLM_GUARD_CONFIG"])
        assert "/v1/chat/completions" in cfg["routes"] and set(cfg["cacheSaltRoutes"]) <= set(cfg["routes"])
        assert not set(cfg["routes"]) & {"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/rerank"}
        mw = guard.GuardMiddleware(Recorder(), cfg, Clock())
        assert status(call(mw, {"input": "hi", "model": "m"}, path="/v1/embeddings")) == 404


@pytest.mark.parametrize("rule,status_", [("or", 400), ("both", 400), ("not-none", 200)])
def test_completions_bound_is_read_as_the_release_reads_it(rule, status_):
    """vLLM 0.11 reads `max_completion_tokens or max_tokens` for completions too (an extra field its
    request model keeps); 0.34 reads max_tokens only."""
    mw, _ = guarded(rule)
    sent = call(mw, {"prompt": "hi", "max_completion_tokens": 100000, "max_tokens": 5})
    assert status(sent) == status_
    if status_ == 400:
        assert error(sent)["code"] == "max_tokens_exceeded" and error(sent)["param"] == "max_completion_tokens"


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("path,raw", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "max_completion_tokens": 5}'),
    ("/v1/chat/completions", b'{"messages": [], "user": "\xc3"}'),
    ("/v1/completions", b'{"prompt": "hi", "suffix": "\xed\xa0\x80"}'),  # an encoded surrogate
    ("/v1/embeddings", b'{"input": "hi", "extra": "\x80"}'),
])
def test_invalid_utf8_anywhere_is_a_400(monkeypatch, fast_path, path, raw):
    monkeypatch.setattr(guard.GuardMiddleware, "fast_path", fast_path)
    mw, app = guarded()
    sent = call(mw, raw=raw, path=path)
    assert status(sent) == 400 and error(sent)["code"] == "invalid_encoding"
    assert app.seen == []


def test_the_body_cap_is_sized_from_each_models_context(plans):
    """The defect: a fixed 32 MiB for every model, read whole before a refusal (~19 ms of the
    event loop each). Each length-routed pool's guard now reads at most what its model's longest
    context needs (GUARD_BYTES_PER_TOKEN a token, at least GUARD_MIN_BODY_BYTES), and refuses more
    with a 413 before reading it."""
    from tests.conftest import vllm_deployments
    from vllm_gke.components.model.serving_api import (
        GUARD_BYTES_PER_TOKEN,
        GUARD_MIN_BODY_BYTES,
        PICKER_REENCODING_GROWTH,
        picker_max_body_bytes,
    )

    for stack in ("dev", "prod"):
        for dep in vllm_deployments(plans[stack]):
            (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
            cfg = json.loads({e["name"]: e.get("value") for e in vllm["env"]}["GKE_LLM_GUARD_CONFIG"])
            model = plans[stack].config.model(dep["metadata"]["labels"]["vllm-gke.io/model"])
            expected = PICKER_REENCODING_GROWTH * picker_max_body_bytes(model) \
                if model.routing == "inference-gateway" \
                else max(GUARD_MIN_BODY_BYTES, model.served_max_model_len * GUARD_BYTES_PER_TOKEN)
            assert cfg["maxBodyBytes"] == expected < guard.DEFAULT_MAX_BODY_BYTES, dep["metadata"]["name"]
    # The guard takes its cap from that key, and refuses a longer body before reading it.
    mw, app = guarded(maxBodyBytes=GUARD_MIN_BODY_BYTES)
    sent = asyncio.run(_call(mw, b"{}", "/v1/completions", "POST", [
        (b"content-type", b"application/json"), (b"content-length", str(GUARD_MIN_BODY_BYTES + 1).encode()),
        (b"x-vllm-gke-issuer", ISSUER.encode())], "127.0.0.6"))
    assert status(sent) == 413 and not app.seen



# --- the tenant URL's prefix -------------------------------------------------------------------
# The Gateway forwards /<prefix>/v1/... as sent (GKE does not claim HTTPRoute path rewrites): the
# guard strips the pool's prefixes first, from path and raw_path, and nothing else.

PREFIXES = ["/qwen-7b", "/a/llama-8b"]


class ScopeRecorder(Recorder):
    """Also records the scope's path, raw path and query string as vLLM's router would read them."""

    def __init__(self):
        super().__init__()
        self.paths: list[tuple[str, object, bytes]] = []

    async def __call__(self, scope, receive, send):
        self.paths.append((scope["path"], scope.get("raw_path"), scope.get("query_string", b"")))
        await super().__call__(scope, receive, send)


def prefixed(body=None, path="/v1/chat/completions", method="POST", raw_path=None, query=b"", client="127.0.0.6",
             issuer=ISSUER):
    """One request through a guard serving PREFIXES: (what it sent back, what reached vLLM)."""
    app = ScopeRecorder()
    mw = guard.GuardMiddleware(app, config(pathPrefixes=PREFIXES), Clock())
    raw = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if issuer:
        headers.append((b"x-vllm-gke-issuer", issuer.encode()))
    scope = {**scope_for(path, method, headers, client), "query_string": query,
             **({"raw_path": raw_path if raw_path is not None else path.encode()} if raw_path is not False else {})}
    sent: list[dict] = []
    chunks = [raw]

    async def receive():
        return {"type": "http.request", "body": chunks.pop(0) if chunks else b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent, app.paths


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("route,body,method", [("/v1/chat/completions", CHAT, "POST"),
                                               ("/v1/completions", {"prompt": "x", "max_tokens": 5}, "POST"),
                                               ("/v1/models", None, "GET")])
def test_the_pools_prefixes_are_stripped_before_the_checks_and_vllms_router(prefix, route, body, method):
    sent, seen = prefixed(body, prefix + route, method, query=b"api-version=1&x=%2F")
    assert status(sent) == 200, sent
    assert seen == [(route, route.encode(), b"api-version=1&x=%2F")]  # the query string kept as sent


def test_a_prefix_is_stripped_from_the_raw_path_with_its_encoding_kept():
    sent, seen = prefixed(CHAT, "/qwen-7b/v1/chat/completions", raw_path=b"/qwen-7b/v1/chat/complet%69ons")
    assert status(sent) == 200 and seen == [("/v1/chat/completions", b"/v1/chat/complet%69ons", b"")]
    # No raw path (a server that gives none): the decoded path decides.
    sent, seen = prefixed(CHAT, "/qwen-7b/v1/chat/completions", raw_path=False)
    assert status(sent) == 200 and seen == [("/v1/chat/completions", None, b"")]


@pytest.mark.parametrize("path,raw_path", [
    ("/qwen-7b-evil/v1/chat/completions", None),     # a longer name is not the prefix
    ("/qwen-7b/v1x/chat/completions", None),         # nor is a longer segment after it
    ("/qwen-7/v1/chat/completions", None),
    ("/a/v1/chat/completions", None),                # a tenant's segment alone
    ("/llama-8b/v1/chat/completions", None),         # another pool's prefix
    ("/b/llama-8b/v1/chat/completions", None),       # another tenant's
    ("/a/llama-8b/v1/chat/completions", b"/a%2Fllama-8b/v1/chat/completions"),  # %2F is no segment boundary
    ("/qwen-7b/v1/chat/completions", b"/qwen%2D7b/v1/chat/completions"),  # the sidecar matched another path
    ("/qwen-7b/qwen-7b/v1/chat/completions", None),  # stripped once, at most
    ("/qwen-7b/health", None), ("/qwen-7b/metrics", None),  # the open routes are not served under a prefix
    ("/qwen-7b/v1/../../health", None),
])
def test_an_unknown_prefix_is_a_404_in_openais_format(path, raw_path):
    method = "GET" if path.endswith(("health", "metrics")) else "POST"
    sent, seen = prefixed(CHAT, path, method, raw_path=raw_path)
    assert status(sent) == 404 and not seen, path
    assert error(sent) == {"message": error(sent)["message"], "type": "invalid_request_error", "param": None,
                           "code": "not_found"}
    assert dict(sent[0]["headers"])[b"content-type"] == b"application/json"


def test_what_stays_unprefixed_keeps_working():
    """Health checks (/health), scrapes (/metrics), the entrypoint's warm-up and other direct calls
    the mesh allows reach the server unprefixed, unchanged."""
    for path in ("/health", "/metrics"):
        sent, seen = prefixed(None, path, "GET", issuer=None, client="10.0.0.9")
        assert status(sent) == 200 and seen == [(path, path.encode(), b"")]
    sent, seen = prefixed(CHAT, "/v1/chat/completions")
    assert status(sent) == 200 and seen[0][0] == "/v1/chat/completions"
    # ...and stripping never lets a request past the checks after it.
    assert status(prefixed(CHAT, "/qwen-7b/v1/chat/completions", client="10.0.0.9")[0]) == 403
    assert status(prefixed(CHAT, "/qwen-7b/v1/chat/completions", issuer=None)[0]) == 403
    assert status(prefixed(CHAT, "/qwen-7b/v1/chat/completions", "GET")[0]) == 405


@given(rest=st.text(st.sampled_from("/v1abc%2F.-?"), max_size=12))
@example(rest="/v1")
@example(rest="/v1/")
@example(rest="/v12")
def test_a_prefix_is_stripped_exactly_when_v1_follows_it_as_a_segment(rest):
    prefixes = guard.Prefixes(PREFIXES)
    scope = {"type": "http", "path": "/qwen-7b" + rest, "raw_path": ("/qwen-7b" + rest).encode()}
    out = prefixes.strip(scope)
    if rest == "/v1" or rest.startswith("/v1/"):
        assert (out["path"], out["raw_path"]) == (rest, rest.encode())
    else:
        assert out is scope


def test_every_pools_guard_strips_exactly_the_prefixes_routed_to_it(plans):
    """The config's pathPrefixes are the pool's: /<model> shared, /<tenant>/<model> behind the
    picker and for a dedicated copy; tests/test_gateway.py checks them against the HTTPRoutes."""
    from tests.conftest import vllm_deployments

    prefixes = {}
    for stack in ("prod", "staging"):
        for dep in vllm_deployments(plans[stack]):
            (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
            cfg = json.loads({e["name"]: e.get("value") for e in vllm["env"]}["GKE_LLM_GUARD_CONFIG"])
            prefixes[(stack, dep["metadata"]["namespace"], dep["metadata"]["name"])] = cfg.get("pathPrefixes")
    assert prefixes[("prod", "vllm", "qwen-7b-short")] == prefixes[("prod", "vllm", "qwen-7b-long")] == ["/qwen-7b"]
    assert prefixes[("prod", "tenant-analytics", "qwen-7b-short")] == ["/analytics/qwen-7b"]
    picked = prefixes[("staging", "vllm", "llama-8b-short")]  # behind the picker: one per tenant
    assert len(picked) > 1 and all(p.startswith("/") and p.endswith("/llama-8b") for p in picked), picked


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "frontier"])
def test_the_paths_health_checks_and_scrapers_use_stay_open_and_unstripped(plans, stack):
    """The load balancer's health checks (HealthCheckPolicy, also the InferencePool's), the
    collectors' scrapes (PodMonitoring) and the kubelet's probes call the replica unprefixed: every
    guard leaves those paths as they are, and serves them as open routes."""
    from tests.conftest import manifests_of, vllm_deployments

    plan = plans[stack]
    checks = [h["spec"]["default"]["config"] for h in manifests_of(plan, "HealthCheckPolicy")]
    # The gRPC ones check the endpoint picker's and the identity extension's Services, not a replica.
    assert all(c["type"] == "GRPC" for c in checks if "httpHealthCheck" not in c)
    paths = {c["httpHealthCheck"]["requestPath"] for c in checks if "httpHealthCheck" in c}
    paths |= {e["path"] for m in manifests_of(plan, "PodMonitoring") for e in m["spec"]["endpoints"]}
    configs = []
    for dep in vllm_deployments(plan):
        (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        paths |= {vllm[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")
                  if "httpGet" in (vllm.get(p) or {})}
        configs.append(json.loads({e["name"]: e.get("value") for e in vllm["env"]}["GKE_LLM_GUARD_CONFIG"]))
    assert paths and paths <= set(guard.OPEN_ROUTES), paths
    for cfg in configs:
        assert cfg["pathPrefixes"]
        for path in paths:
            scope = {"type": "http", "path": path, "raw_path": path.encode()}
            assert guard.Prefixes(cfg["pathPrefixes"]).strip(scope) is scope
