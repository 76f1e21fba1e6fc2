"""Per-tenant limits across all replicas: the shared store's script (run by Redis' Lua engine in
fakeredis), the guard using it, the fallback to per-replica windows, and what the stack declares."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import fakeredis
import pytest

from tests.conftest import REPO_ROOT, manifests_of
from vllm_gke.components.limit_store import LIBRARY, LIBRARY_NAME, NAMESPACE, PORT, REDIS_CONF, host
from vllm_gke.components.model.serving_api import guard_config, tenant_routes
from vllm_gke.components.model.specs import TenantSpec

sys.path.insert(0, str(REPO_ROOT / "images"))
import vllm_gke_guard as guard  # noqa: E402
from vllm_gke_guard import store as limits  # noqa: E402

ISSUER = "https://auth.example/a"


def tenant(rpm=3, tpm=None, cap=100):
    return TenantSpec.model_validate({
        "name": "a", "jwt": {"issuer": ISSUER, "jwksUri": "https://auth.example/a/jwks", "audiences": ["x"]},
        "models": ["m"], "rateLimit": {"requestsPerMinute": rpm, **({"tokensPerMinute": tpm} if tpm else {})},
        "maxTokens": cap})


def run(coro):
    return asyncio.run(coro)


def store():
    """A store as LimitStore starts it: the guards' function library loaded."""
    server = fakeredis.FakeServer()
    fakeredis.FakeRedis(server=server).function_load(LIBRARY)
    return server


def limiter(server, **kw):
    return limits.SharedLimiter(fakeredis.FakeAsyncRedis(server=server), **kw)


# --- the script --------------------------------------------------------------------------------

def test_at_most_n_requests_in_the_window_across_replicas():
    server = store()
    replicas = [limiter(server) for _ in range(3)]

    async def go():
        return [await replicas[i % 3].take("a", 5, None, 0) for i in range(9)]

    verdicts = run(go())
    assert [v.wait is None for v in verdicts] == [True] * 5 + [False] * 4
    assert all(v.limit == "requests" and 0 < v.wait <= 61 for v in verdicts[5:])  # 61 one-second buckets


def test_tenants_have_separate_windows():
    server = store()
    one = limiter(server)

    async def go():
        return [await one.take(t, 1, None, 0) for t in ("a", "b", "a")]

    assert [v.wait is None for v in run(go())] == [True, True, False]


def test_tokens_reserved_per_minute_across_replicas():
    server = store()
    r1, r2 = limiter(server), limiter(server)

    async def go():
        return [await r1.take("a", 100, 1000, 600), await r2.take("a", 100, 1000, 400),
                await r2.take("a", 100, 1000, 1), await r1.take("a", 100, 1000, 0)]

    first, second, third, fourth = run(go())
    assert first.wait is None and second.wait is None
    assert third.limit == "tokens" and 0 < third.wait <= 61
    assert fourth.wait is None  # a request that generates nothing only counts as a request


def test_refused_requests_reserve_nothing():
    server = store()
    r = limiter(server)

    async def go():
        out = [await r.take("a", 2, 100, 80), await r.take("a", 2, 100, 80)]  # the second is over on tokens
        out.append(await r.take("a", 2, 100, 20))  # so a request slot and 20 tokens are still there
        return out

    assert [v.wait is None for v in run(go())] == [True, False, True]


def test_the_window_slides():
    server = store()
    r = limiter(server, bucket_ms=100, buckets=10)

    async def go():
        before = [await r.take("a", 1, None, 0), await r.take("a", 1, None, 0)]
        await asyncio.sleep(1.1)
        return before + [await r.take("a", 1, None, 0)]

    assert [v.wait is None for v in run(go())] == [True, False, True]


def test_unreachable_store_raises_and_is_not_asked_again_at_once():
    server = store()
    server.connected = False
    now = [0.0]
    r = limiter(server, clock=lambda: now[0], retry_after_failure=5.0)
    with pytest.raises(limits.StoreUnavailable):
        run(r.take("a", 1, None, 0))
    server.connected = True
    with pytest.raises(limits.StoreUnavailable, match="recently"):
        run(r.take("a", 1, None, 0))
    now[0] = 6.0
    assert run(r.take("a", 1, None, 0)).wait is None


class CountingClient:
    """A client that counts the function calls it makes on the store."""

    def __init__(self, inner, latency: float = 0.0):
        self.inner, self.calls, self.latency = inner, 0, latency

    async def fcall(self, *args):
        self.calls += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        return await self.inner.fcall(*args)


def test_a_refused_flood_never_reaches_the_store():
    """One tenant's flood of refused requests must not load the single-threaded store every
    tenant shares: after a refusal the replica refuses locally until its Retry-After passes."""
    server = store()
    client = CountingClient(fakeredis.FakeAsyncRedis(server=server))
    now = [0.0]
    r = limits.SharedLimiter(client, clock=lambda: now[0])

    async def go(n):
        return [await r.take("a", 2, None, 0) for _ in range(n)]

    verdicts = run(go(1000))
    assert [v.wait is None for v in verdicts[:3]] == [True, True, False]
    assert all(v.limit == "requests" and v.wait > 0 for v in verdicts[2:])
    assert client.calls == 3  # two admitted, one refused; the other 997 never left the replica
    now[0] = 62.0  # past the Retry-After: the store is asked again
    run(go(1))
    assert client.calls == 4


def test_a_concurrent_flood_is_one_call_at_a_time_and_never_anothers_fallback():
    """Requests arrive at once, not one after another: a tenant's burst on a replica is one store
    call at a time, the calls after its first refusal stay local, and the next tenant is still
    counted in the store (not pushed to per-replica limits)."""
    server = store()
    client = CountingClient(fakeredis.FakeAsyncRedis(server=server), latency=0.001)  # a network round trip
    r = limits.SharedLimiter(client)

    async def go():
        burst = await asyncio.gather(*(r.take("a", 600, None, 0) for _ in range(1500)))
        return burst, await r.take("b", 600, None, 0)

    burst, other = run(go())
    assert sum(v.wait is None for v in burst) == 600
    assert client.calls == 600 + 1 + 1  # 600 admitted, one refusal, and tenant b's own call
    assert other.wait is None


def test_an_outage_is_said_once_not_per_request(caplog):
    class Down:
        async def fcall(self, *args):
            await asyncio.sleep(0.01)
            raise ConnectionError("refused")

    r = limits.SharedLimiter(Down())

    async def go():
        return await asyncio.gather(*(r.take(t, 5, None, 0) for t in ("a", "b", "c") for _ in range(200)),
                                    return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="vllm.gke_guard"):
        outcomes = run(go())
    assert all(isinstance(o, limits.StoreUnavailable) for o in outcomes)
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_a_burst_holds_few_connections_to_a_real_store(real_redis):
    """The pool is bounded: 3,000 requests at once from one replica hold at most its connections."""
    r = limits.SharedLimiter.connect("127.0.0.1", real_redis, connections=4)
    peak = []

    def established() -> int:  # the store's side of each TCP connection (Linux /proc/net/tcp)
        rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
        return sum(1 for row in rows if int(row[1].split(":")[1], 16) == real_redis and row[3] == "01")

    async def go():
        async def watch():
            for _ in range(40):
                peak.append(established())
                await asyncio.sleep(0.002)
        return await asyncio.gather(watch(), *(r.take(t, 100000, None, 0) for t in ("a", "b", "c", "d", "e", "f")
                                               for _ in range(500)))
    verdicts = run(go())[1:]
    assert all(v.wait is None for v in verdicts)  # all 3,000 counted in the store
    assert 0 < max(peak) <= 4


def test_a_token_refusal_still_lets_a_smaller_request_ask():
    server = store()
    client = CountingClient(fakeredis.FakeAsyncRedis(server=server))
    r = limits.SharedLimiter(client)

    async def go():
        return [await r.take("a", 100, 100, 80), await r.take("a", 100, 100, 80), await r.take("a", 100, 100, 90),
                await r.take("a", 100, 100, 20)]

    verdicts = run(go())
    assert [v.wait is None for v in verdicts] == [True, False, False, True]
    assert client.calls == 3  # the 90-token one was refused locally after the 80-token refusal


def test_the_window_state_is_bounded_whatever_it_holds():
    """A call's work is bounded by the bucket count, not the admissions in the window: the
    tenant's window is one hash of at most 2 x 61 buckets and 3 totals, after 3,000 admissions."""
    server = store()
    r = limiter(server)

    async def go():
        for _ in range(3000):
            assert (await r.take("a", 10**6, 10**9, 7)).wait is None

    run(go())
    plain = fakeredis.FakeRedis(server=server)
    assert plain.hlen("rl:{a}:w") <= 2 * limits.BUCKETS + 3
    totals = plain.hmget("rl:{a}:w", "req", "tok")
    assert [int(v) for v in totals] == [3000, 21000]


# --- the guard using it -----------------------------------------------------------------------

class Ok:
    async def __call__(self, scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def guards(monkeypatch, server, n=2, **tenant_kw):
    monkeypatch.setattr(limits.SharedLimiter, "connect",
                        classmethod(lambda cls, host, port: cls(fakeredis.FakeAsyncRedis(server=server))))
    cfg = guard_config([tenant(**tenant_kw)], tenant_routes(), "both", shared_store=("limits.example", 6379))
    return [guard.GuardMiddleware(Ok(), cfg) for _ in range(n)]


def call(mw, body, path="/v1/completions"):
    raw = json.dumps(body).encode()
    chunks = [raw]
    sent = []

    async def receive():
        return {"type": "http.request", "body": chunks.pop(0) if chunks else b"", "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
               (b"x-vllm-gke-issuer", ISSUER.encode())]
    asyncio.run(mw({"type": "http", "method": "POST", "path": path, "headers": headers,
                    "client": ("127.0.0.6", 1)}, receive, send))
    return sent


def test_guards_share_the_tenants_request_limit(monkeypatch):
    a, b = guards(monkeypatch, store(), rpm=3)
    codes = [call(mw, {"prompt": "x", "max_tokens": 5})[0]["status"] for mw in (a, b, a, b, a)]
    assert codes == [200, 200, 200, 429, 429]
    refused = call(b, {"prompt": "x", "max_tokens": 5})
    assert dict(refused[0]["headers"]).get(b"retry-after")
    assert "across all replicas" in json.loads(refused[1]["body"])["error"]["message"]


def test_guards_share_the_tenants_token_limit_counting_each_requests_bound(monkeypatch):
    a, b = guards(monkeypatch, store(), rpm=100, tpm=250, cap=100)
    # n=2 x 50 = 100 tokens; the missing bound is the cap (100); then 100 more would exceed 250.
    assert call(a, {"prompt": "x", "max_tokens": 50, "n": 2})[0]["status"] == 200
    assert call(b, {"prompt": "x", "max_tokens": None})[0]["status"] == 200
    refused = call(a, {"prompt": "x", "max_tokens": 100})
    assert refused[0]["status"] == 429
    assert "250 tokens/minute (this request may generate 100)" in json.loads(refused[1]["body"])["error"]["message"]
    assert call(b, {"prompt": "x", "max_tokens": 50})[0]["status"] == 200  # 50 still fits
    # Pooling generates nothing: it counts as a request only.
    assert call(a, {"input": "x"}, path="/v1/embeddings")[0]["status"] == 200


def test_a_refused_request_takes_no_slot_in_the_store(monkeypatch):
    a, b = guards(monkeypatch, store(), rpm=1)
    assert call(a, {"prompt": "x", "max_tokens": 10_000})[0]["status"] == 400  # over the cap: a's window only
    assert call(b, {"prompt": "x", "max_tokens": 5})[0]["status"] == 200


def test_a_stream_of_refused_bodies_meets_a_429_before_its_bodies_are_read(monkeypatch):
    """The defect: under globalLimits the replica's window was skipped and the store counts only
    valid requests, so a tenant's stream of bodies the guard refuses (each read and parsed on the
    event loop) never met a limit. Every request counts in the replica's window before its body."""
    server = store()
    a, = guards(monkeypatch, server, n=1, rpm=3)
    received = []

    def send(raw):
        async def receive():
            received.append(1)
            return {"type": "http.request", "body": raw, "more_body": False}

        sent = []

        async def out(message):
            sent.append(message)

        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                   (b"x-vllm-gke-issuer", ISSUER.encode())]
        asyncio.run(a({"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers,
                       "client": ("127.0.0.6", 1)}, receive, out))
        return sent[0]["status"]

    assert [send(b"[" * 1000) for _ in range(3)] == [400] * 3 and len(received) == 3
    assert [send(b"[" * 1000) for _ in range(3)] == [429] * 3 and len(received) == 3  # never read
    assert not fakeredis.FakeRedis(server=server).keys("rl:*")  # none of them reached the store


def test_store_down_falls_back_to_each_replicas_window(monkeypatch):
    server = store()
    server.connected = False
    a, b = guards(monkeypatch, server, rpm=2)
    codes = [call(mw, {"prompt": "x", "max_tokens": 5})[0]["status"] for mw in (a, a, a, b, b, b)]
    assert codes == [200, 200, 429, 200, 200, 429]  # per replica: 2 each


def test_store_down_still_enforces_tokens_per_minute_per_replica(monkeypatch):
    server = store()
    server.connected = False
    a, = guards(monkeypatch, server, n=1, rpm=100, tpm=250, cap=100)
    codes = [call(a, {"prompt": "x", "max_tokens": 100})[0]["status"] for _ in range(3)]
    assert codes == [200, 200, 429]
    refused = call(a, {"prompt": "x", "max_tokens": 100})
    assert "250 tokens/minute" in json.loads(refused[1]["body"])["error"]["message"]
    assert call(a, {"prompt": "x", "max_tokens": 50})[0]["status"] == 200  # 50 more still fit


def test_a_store_outage_is_logged_where_vllm_shows_logs_and_counted(monkeypatch):
    """In vLLM's API server the root logger has no handler: the guard logs through vLLM's own
    logger ("vllm", which vLLM's logging config gives a handler), and counts each fallback on
    vLLM's /metrics for the dashboard and the alert."""
    import logging

    from prometheus_client import REGISTRY, generate_latest

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    vllm_logger = logging.getLogger("vllm")
    handler = Keep()
    vllm_logger.addHandler(handler)
    vllm_logger.setLevel(logging.INFO)
    try:
        before = REGISTRY.get_sample_value("vllm_gke_guard_limit_store_fallbacks_total") or 0
        server = store()
        server.connected = False
        a, = guards(monkeypatch, server, n=1, rpm=100)
        for _ in range(3):
            assert call(a, {"prompt": "x", "max_tokens": 5})[0]["status"] == 200
    finally:
        vllm_logger.removeHandler(handler)
    assert any("shared limit store unavailable" in m for m in seen)
    assert limits.log.name.startswith("vllm.") and guard.log.name.startswith("vllm.")
    assert REGISTRY.get_sample_value("vllm_gke_guard_limit_store_fallbacks_total") == before + 3
    assert b"vllm_gke_guard_limit_store_fallbacks_total" in generate_latest()


# --- what the stack declares -------------------------------------------------------------------

def test_store_admits_only_the_vllm_pods_over_mtls(plans):
    plan = plans["prod"]
    (pa,) = [p for p in manifests_of(plan, "PeerAuthentication") if p["metadata"]["namespace"] == NAMESPACE]
    assert pa["spec"] == {"mtls": {"mode": "STRICT"}}
    policies = {p["metadata"]["name"]: p["spec"] for p in manifests_of(plan, "AuthorizationPolicy")
                if p["metadata"]["namespace"] == NAMESPACE}
    assert policies["deny-all"] == {}
    (rule,) = policies["allow-vllm-guards"]["rules"]
    assert rule["from"][0]["source"]["principals"] == ["*/ns/tenant-analytics/sa/vllm-server",
                                                       "*/ns/vllm/sa/vllm-server"]
    assert rule["to"] == [{"operation": {"ports": [str(PORT)]}}]
    # The vLLM pods run as those accounts, and nothing else does: not the standbys, not `default`.
    accounts = {}
    for d in manifests_of(plan, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        accounts.setdefault(spec.get("serviceAccountName", "default"), set()).add(d["metadata"]["name"])
    assert all(n.startswith(("llama", "qwen")) and "standby" not in n and "epp" not in n
               for n in accounts["vllm-server"])
    assert {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in manifests_of(plan, "ServiceAccount")} >= {
        ("vllm", "vllm-server"), ("vllm", "vllm-standby"), ("tenant-analytics", "vllm-server")}


def test_store_keeps_nothing_and_runs_only_the_script():
    conf = dict(line.split(" ", 1) for line in REDIS_CONF.splitlines())
    assert conf["save"] == '""' and conf["appendonly"] == "no"
    acl = conf["user"].split()
    assert "~rl:*" in acl and "-@all" in acl and "resetkeys" in acl
    allowed = {a[1:] for a in acl if a.startswith("+")}
    # Every command the script calls, and the client's handshake, are allowed; nothing more.
    import re
    called = {c.lower() for c in re.findall(r"redis\.call\('([A-Z]+)'", LIBRARY)}
    assert called <= allowed
    # FCALL of the loaded library alone: no EVAL, no SCRIPT, no FUNCTION (no client runs its own code).
    assert allowed - called == {"ping", "hello", "fcall"}
    assert LIBRARY.startswith(f"#!lua name={LIBRARY_NAME}\n")
    assert f"redis.register_function('{limits.FUNCTION}', take)" in LIBRARY  # the guard calls what the store loads


def test_guards_in_prod_count_across_replicas(plans):
    for d in manifests_of(plans["prod"], "Deployment"):
        containers = d["spec"]["template"]["spec"]["containers"]
        if containers[0]["name"] != "vllm":
            continue
        cfg = json.loads({e["name"]: e.get("value") for e in containers[0]["env"]}["GKE_LLM_GUARD_CONFIG"])
        assert cfg["globalLimits"] == {"host": host(), "port": PORT}
    dev = manifests_of(plans["dev"], "Deployment")
    assert not [d for d in dev if d["metadata"]["namespace"] == NAMESPACE]
    for d in dev:
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "vllm":
                assert "globalLimits" not in {e["name"]: e.get("value") for e in c["env"]}["GKE_LLM_GUARD_CONFIG"]


def test_store_pods_wait_for_the_mesh(plans):
    plan = plans["prod"]
    store = plan.kube("Deployment", "limits")
    assert plan.waits_for(store, plan.kube("Job", "mesh-ready"))  # a meshed pod: the sidecar must inject


# --- against a real Redis, where one is installed (REDIS_SERVER or redis-server on PATH) -------

def _redis_server():
    import os
    import shutil

    return os.environ.get("REDIS_SERVER") or shutil.which("redis-server")


@pytest.fixture
def real_redis(tmp_path):
    import os

    binary = _redis_server()
    if not binary:
        if os.environ.get("CI"):
            pytest.fail("CI runs the limit store against a real redis-server: .ci/run installs Debian's package")
        pytest.skip("no redis-server here (set REDIS_SERVER): the script ran in fakeredis' Lua above")
    from benchmarks.limit_store import start_redis

    proc, port = start_redis(binary, tmp_path)  # the store's own config and ACL
    yield port
    proc.terminate()
    proc.wait(5)


def test_the_script_and_the_acl_on_a_real_redis(real_redis):
    import redis
    import redis.asyncio as aioredis

    async def go():
        a = limits.SharedLimiter(aioredis.Redis(port=real_redis))
        b = limits.SharedLimiter(aioredis.Redis(port=real_redis))
        verdicts = [await (a if i % 2 else b).take("t", 3, 1000, 400) for i in range(4)]
        return verdicts

    verdicts = run(go())
    # 3 requests fit, but the third's 400 tokens would make 1,200 of 1,000: refused on tokens.
    assert [v.wait is None for v in verdicts] == [True, True, False, False]
    assert verdicts[2].limit == "tokens" and verdicts[3].limit == "tokens"
    plain = redis.Redis(port=real_redis)
    assert plain.ping()
    for forbidden in (lambda: plain.flushall(), lambda: plain.get("rl:{t}:req"), lambda: plain.config_get("*"),
                      lambda: plain.keys("*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    # Keys outside rl: are out of reach even for the allowed commands.
    with pytest.raises(redis.exceptions.NoPermissionError):
        plain.zadd("elsewhere", {"x": 1})
    # No code of a client's own: no EVAL, no SCRIPT, no FUNCTION; the library is the one loaded at start.
    code = "#!lua name=mine\nredis.register_function('mine', function() return redis.call('TIME') end)"
    for forbidden in (lambda: plain.eval("return 1", 0), lambda: plain.evalsha("0" * 40, 0),
                      lambda: plain.script_load("return 1"), lambda: plain.function_load(code, replace=True),
                      lambda: plain.function_delete(LIBRARY_NAME), lambda: plain.function_flush(),
                      lambda: plain.function_list()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    # The user that loaded it is gone.
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=real_redis, username="loader", password="x").ping()


def test_a_changed_store_config_rolls_the_store(plans, plan_variant, monkeypatch):
    """The ConfigMap has a fixed name and Redis reads it (and loads the function library) once: the
    pod template carries their digest, so a change is a new pod, not a running store with the old."""
    import hashlib

    from vllm_gke.components import limit_store

    store = plans["prod"].kube("Deployment", "limits").props
    digest = store["spec"]["template"]["metadata"]["annotations"]["vllm-gke.io/config-sha256"]
    assert digest == hashlib.sha256((REDIS_CONF + LIBRARY + limit_store.startup()).encode()).hexdigest()[:16]
    monkeypatch.setattr(limit_store, "REDIS_CONF", REDIS_CONF.replace("maxmemory 256mb", "maxmemory 128mb"))
    changed = plan_variant("prod").kube("Deployment", "limits").props
    assert changed["spec"]["template"]["metadata"]["annotations"]["vllm-gke.io/config-sha256"] != digest
    monkeypatch.setattr(limit_store, "REDIS_CONF", REDIS_CONF)
    monkeypatch.setattr(limit_store, "LIBRARY", LIBRARY.replace("local width", "local  width"))
    changed = plan_variant("prod").kube("Deployment", "limits").props
    assert changed["spec"]["template"]["metadata"]["annotations"]["vllm-gke.io/config-sha256"] != digest
    # The library travels beside the config; the pod is ready only once it is loaded.
    (cm,) = [m for m in manifests_of(plans["prod"], "ConfigMap") if m["metadata"]["namespace"] == NAMESPACE]
    assert cm["data"] == {"redis.conf": REDIS_CONF, "limits.lua": LIBRARY}
    (redis_c,) = store["spec"]["template"]["spec"]["containers"][:1]
    assert redis_c["command"] == ["sh", "-c", limit_store.startup()]
    assert limit_store.LOADED in " ".join(redis_c["readinessProbe"]["exec"]["command"])


def test_store_outages_are_charted_and_alerted_where_limits_are_shared(plans):
    from vllm_gke.components.model.monitoring import FALLBACKS_METRIC

    obs = plans["prod"].platform.observability
    assert FALLBACKS_METRIC in json.dumps(obs.dashboard_definition)
    (alert,) = [a for a in obs.alert_definitions if FALLBACKS_METRIC in json.dumps(a)]
    assert alert["severity"] == "ERROR"
    assert FALLBACKS_METRIC == "vllm_gke_guard_limit_store_fallbacks_total"  # the guard's counter, as exposed
    dev = plans["dev"].platform.observability  # no shared store, no chart of it
    assert FALLBACKS_METRIC not in json.dumps([dev.dashboard_definition, dev.alert_definitions])


@pytest.mark.parametrize("grant", ["+eval", "+evalsha", "+script|load", "+function|load", "+@scripting", "+@all"])
def test_the_contract_refuses_an_acl_that_lets_a_client_run_code(plans, grant):
    import copy
    import dataclasses

    from vllm_gke.infra.contracts import redis_writes_nothing_and_scripts_obey_the_acl as check

    plan = dataclasses.replace(plans["prod"], resources=copy.deepcopy(plans["prod"].resources))
    assert check(plan) == []
    (cm,) = [r for r in plan.resources if r.props.get("kind") == "ConfigMap"
             and (r.props.get("data") or {}).get("redis.conf")]
    cm.props["data"]["redis.conf"] = cm.props["data"]["redis.conf"].replace("+fcall", f"+fcall {grant}")
    assert any("run code of its own" in p for p in check(plan))
