"""The swap on a shared GPU (images/vllm_gke_guard/swap.py): the GPU's lease in a real Redis with
the limit store's own config, ACL and function library; each server's side of it (wake, yield,
sleep) against an engine client that records what it is asked; the 503 when the GPU stays busy."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from typing import Any, Optional

import pytest

from vllm_gke.images.vllm_gke_guard import swap as sw
from vllm_gke.images.vllm_gke_guard.errors import GuardError, error_body
from vllm_gke.infra.plan import REPO_ROOT

IMAGES = REPO_ROOT / "images"


@pytest.fixture
def redis_port(tmp_path):
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        if os.environ.get("CI"):
            pytest.fail("CI runs the GPU lease against a real redis-server")
        pytest.skip("no redis-server here (set REDIS_SERVER)")
    from benchmarks.limit_store import start_redis

    proc, port = start_redis(binary, tmp_path)
    yield port
    proc.terminate()
    proc.wait(5)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def lease(port: int, holder: str, ttl_s: float = 5.0, poll_s: float = 0.02) -> sw.GpuLease:
    import redis.asyncio as aioredis

    return sw.GpuLease(aioredis.Redis(port=port), "node-1", holder, ttl_s, poll_s)


def free(port: int, node: str = "node-1") -> None:
    """The GPU as a holder's drop leaves it: free at once (a missing lease is fenced)."""
    import redis

    redis.Redis(port=port).hset(sw.lease_key(node), "free", "1")


def test_one_holder_and_its_waiter(redis_port):
    free(redis_port)

    async def go() -> list[Any]:
        a, b, c = (lease(redis_port, h) for h in "abc")
        out = [await a.take(), await b.take(), await a.renew(), await c.take()]
        await a.drop()
        # Free, but b waited first: c must wait its turn, b takes it.
        out += [await c.take(), await b.take(), await b.renew(), await a.renew()]
        return out

    took_a, b_waits, a_sees_b, c_behind_b, c_after_drop, b_takes, b_renews, a_lost = run(go())
    assert took_a == (True, "a", "")
    assert b_waits == (False, "a", "b")
    assert a_sees_b == (True, "a", "b")  # the holder learns of its waiter when it renews
    assert c_behind_b == (False, "a", "b")  # a fresh claim is not overwritten
    assert c_after_drop == (False, "", "b")
    assert b_takes == (True, "b", "")  # the claim cleared once served
    assert b_renews == (True, "b", "")
    assert a_lost[0] is False


def test_a_holder_that_stops_renewing_frees_the_gpu_a_fence_later_and_a_stale_claim_expires(redis_port):
    free(redis_port)

    async def go() -> tuple[Any, Any, Any, Any]:
        a, b = lease(redis_port, "a", ttl_s=0.2), lease(redis_port, "b", ttl_s=0.2)
        await a.take()
        await b.take()  # b waits, then goes away
        await asyncio.sleep(0.4)  # past the lease and the claim's freshness (4 polls)
        c = lease(redis_port, "c", ttl_s=0.2)
        fenced = await c.take()  # the lease is gone: a may still be awake, so not yet
        while not (granted := await c.take())[0]:
            await asyncio.sleep(0.02)
        return fenced, granted, await a.renew(), await b.renew()

    fenced, c_takes, a_lost, b_not_holder = run(go())
    assert fenced == (False, "", "c")
    assert c_takes == (True, "c", "")
    assert a_lost[0] is False and b_not_holder[0] is False


def test_a_store_restarted_empty_hands_the_gpu_out_only_after_the_holder_slept(redis_port):
    """/tmp/rev4/restart.py: the store keeps nothing; its lease gone while a is awake and b waits,
    b must not wake before a has seen the loss and slept."""
    free(redis_port)
    gpu: list[str] = []
    events: list[str] = []

    class Tracked(Engine):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        async def sleep(self, level: int, mode: str) -> None:
            await asyncio.sleep(0.1)  # a sleep takes a while: the copy to host
            await super().sleep(level, mode)
            gpu.remove(self.name)
            events.append(f"{self.name} asleep")

        async def wake_up(self, tags: Optional[list[str]]) -> bool:
            gpu.append(self.name)
            events.append(f"{self.name} awake beside {sorted(set(gpu) - {self.name})}")
            return await super().wake_up(tags)

    async def go() -> None:
        import redis.asyncio as aioredis

        assert (await lease(redis_port, "a", ttl_s=0.5).take())[0]
        a = sw.Swap({"level": 1, "minAwakeSeconds": 3600}, lease(redis_port, "a", ttl_s=0.5), poll_s=0.02)
        a.bind(Tracked("a"))
        gpu.append("a")
        b = sw.Swap({"level": 1, "waitSeconds": 10}, lease(redis_port, "b", ttl_s=0.5), poll_s=0.02)
        b.awake = False
        b.bind(Tracked("b"))
        request = asyncio.create_task(b.enter())
        await asyncio.sleep(0.2)
        await aioredis.Redis(port=redis_port).delete(sw.lease_key("node-1"))  # what a restart leaves
        await asyncio.wait_for(request, 10)
        for t in (a.watcher, b.watcher):
            assert t is not None
            t.cancel()

    run(go())
    assert events == ["a asleep", "b awake beside []"]


def test_the_lease_is_within_the_stores_acl(redis_port):
    import redis
    from redis.exceptions import NoPermissionError

    plain = redis.Redis(port=redis_port)
    assert sw.lease_key("n").startswith("rl:")  # the guards' keys; any other is refused by the ACL
    with pytest.raises(NoPermissionError):
        plain.hset("gpu:n", "holder", "x")


class Engine:
    """The engine client calls the swap makes (AsyncLLM's sleep, wake_up, collective_rpc), recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.asleep = False

    async def sleep(self, level: int, mode: str) -> None:
        self.calls.append(("sleep", level, mode))
        self.asleep = True

    async def wake_up(self, tags: Optional[list[str]]) -> bool:
        self.calls.append(("wake_up", tags))
        if tags is None or "kv_cache" in tags:
            self.asleep = False
        return not self.asleep

    async def collective_rpc(self, method: str) -> list[Any]:
        self.calls.append(("collective_rpc", method))
        return [None]


def server(port: int, holder: str, level: int = 1, wait_s: float = 5.0, min_awake_s: float = 0.0,
           ttl_s: float = 5.0) -> tuple[sw.Swap, Engine]:
    s = sw.Swap({"level": level, "waitSeconds": wait_s, "minAwakeSeconds": min_awake_s},
                lease(port, holder, ttl_s), poll_s=0.02)
    engine = Engine()
    s.bind(engine)
    return s, engine


async def started(port: int, holder: str, **kw: Any) -> tuple[sw.Swap, Engine]:
    """A server as the entrypoint leaves it: the lease taken before vLLM starts, awake."""
    free(port)
    granted, _, _ = await lease(port, holder).take()
    assert granted
    return server(port, holder, **kw)


async def asleep(port: int, holder: str, **kw: Any) -> tuple[sw.Swap, Engine]:
    free(port)
    s, engine = server(port, holder, **kw)
    s.awake = False
    return s, engine


def test_a_request_for_a_sleeping_model_waits_for_the_awake_one_to_sleep(redis_port):
    async def go() -> tuple[Engine, Engine, list[str]]:
        a, a_engine = await started(redis_port, "a")
        b, b_engine = await asleep(redis_port, "b")
        order: list[str] = []
        await a.enter()  # a request of a's, in flight on the GPU
        b_request = asyncio.create_task(b.enter())
        await asyncio.sleep(0.2)
        order.append("b waiting" if not b_request.done() else "b served early")
        order.append("a still awake" if not a_engine.asleep else "a slept under its request")
        a.leave()
        await asyncio.wait_for(b_request, 5)
        order.append("b served")
        b.leave()
        for t in (a.watcher, b.watcher):
            assert t is not None
            t.cancel()
        return a_engine, b_engine, order

    a_engine, b_engine, order = run(go())
    assert order == ["b waiting", "a still awake", "b served"]
    assert a_engine.calls == [("sleep", 1, "wait")]  # finishes what it runs, then sleeps
    assert b_engine.calls == [("wake_up", None)]


def test_level_2_reloads_the_weights_before_the_kv_cache(redis_port):
    async def go() -> Engine:
        b, engine = await asleep(redis_port, "b", level=2)
        await b.enter()
        b.leave()
        assert b.watcher is not None
        b.watcher.cancel()
        return engine

    assert run(go()).calls == [("wake_up", ["weights"]), ("collective_rpc", "reload_weights"),
                               ("wake_up", ["kv_cache"])]


def test_past_its_wait_a_request_gets_503_with_retry_after(redis_port):
    async def go() -> GuardError:
        b, engine = await asleep(redis_port, "b", wait_s=0.3)
        await lease(redis_port, "stuck", ttl_s=30).take()  # a holder that never yields
        with pytest.raises(GuardError) as exc:
            await b.enter()
        assert engine.calls == [] and b.inflight == 0
        assert b.watcher is not None
        b.watcher.cancel()
        return exc.value

    err = run(go())
    assert err.status == 503 and err.code == "model_swapping" and err.retry_after is not None
    assert error_body(err).startswith(b'{"error": {"message": "the GPU is serving stuck')
    assert b'"type": "service_unavailable"' in error_body(err)


def test_the_holder_keeps_the_gpu_until_its_warm_up_and_its_minimum_then_yields(redis_port):
    """Not before a request served (the entrypoint's warm-up, after its handoff: a yield before
    it would read to the entrypoint as a lost lease), nor before minAwakeSeconds."""
    async def go() -> tuple[bool, bool, bool]:
        a, a_engine = await started(redis_port, "a", min_awake_s=0)
        await lease(redis_port, "b").take()  # b waits
        await a.step()
        before_warm_up = not a_engine.asleep
        await a.enter()
        a.leave()
        a.min_awake_s = 3600
        await a.step()
        kept = not a_engine.asleep
        a.min_awake_s = 0
        await a.step()
        for t in (a.watcher,):
            assert t is not None
            t.cancel()
        return before_warm_up, kept, a_engine.asleep

    assert run(go()) == (True, True, True)


def test_a_server_that_lost_its_lease_sleeps(redis_port):
    async def go() -> bool:
        a, engine = await started(redis_port, "a")
        await lease(redis_port, "a").drop()
        await lease(redis_port, "b").take()  # someone else holds the GPU now
        await a.step()
        assert a.watcher is not None
        a.watcher.cancel()
        return engine.asleep and not a.awake

    assert run(go())


def test_a_store_out_of_reach_past_half_the_lease_sleeps_the_server():
    class Down:
        async def fcall(self, *args: Any) -> Any:
            raise ConnectionError("store down")

    async def go() -> tuple[bool, bool]:
        s = sw.Swap({"level": 1}, sw.GpuLease(Down(), "n", "a", ttl_s=0.2), poll_s=0.02)
        engine = Engine()
        s.bind(engine)
        await s.step()  # just renewed at start: keeps serving
        first = engine.asleep
        s.renewed = time.monotonic() - 1  # last renewed past half the lease
        await s.step()
        assert s.watcher is not None
        s.watcher.cancel()
        return first, engine.asleep

    assert run(go()) == (False, True)


def test_the_entrypoint_waits_for_the_lease_and_keeps_it_while_vllm_starts(redis_port, monkeypatch):
    """hold_for_startup (images/serve.py's, before vLLM starts): it waits while another server is
    awake, its claim making that one yield; then renews the lease past its time to live until the
    guard gives it up."""
    import threading

    import redis

    plain: Any = redis.Redis(port=redis_port)  # Any: redis-py annotates fcall's arguments as lists

    def call(op: str, holder: str) -> list[Any]:
        out = plain.fcall(sw.FUNCTION, 1, sw.lease_key("node-1"), op, holder, 30_000, 1000)
        return [int(out[0]), *(v.decode() for v in out[1:])]

    monkeypatch.setenv(sw.NODE_ENV, "node-1")
    monkeypatch.setenv(sw.HOLDER_ENV, "b")
    cfg = {"globalLimits": {"host": "127.0.0.1", "port": redis_port}, "swap": {"level": 1, "leaseSeconds": 0.5}}
    free(redis_port)
    assert call("take", "a")[0] == 1
    done: list[Any] = []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: done.append(sw.hold_for_startup(cfg, stop.is_set)))
    waiter.start()
    try:
        time.sleep(0.5)
        assert not done and call("renew", "a") == [1, "a", "b"]  # b waits, and a sees it
        call("drop", "a")
        waiter.join(10)
    finally:
        stop.set()
    assert len(done) == 1 and callable(done[0])
    time.sleep(1.0)  # twice the lease: renewed meanwhile by the entrypoint's thread
    assert call("take", "c")[:2] == [0, "b"]
    again = sw.hold_for_startup(cfg, lambda: False)  # already b's: taken again at once
    assert again is not None
    assert sw.hold_for_startup({"swap": {}}, lambda: True)  # no swap: nothing to wait for
    assert sw.hold_for_startup(cfg, lambda: True) is None  # told to stop before it has the lease
    for handoff in (done[0], again):
        handoff()  # the guard holds it from here: the entrypoint's threads renew no more
    time.sleep(1.0)
    assert call("renew", "b")[0] == 0  # lapsed: nobody but the guard (absent here) renews it


class Slow(Engine):
    """An engine whose level-2 reload takes `reload_s`, and which records who is on the GPU."""

    def __init__(self, name: str, gpu: list[str], reload_s: float = 0.0) -> None:
        super().__init__()
        self.name, self.gpu, self.reload_s = name, gpu, reload_s

    async def wake_up(self, tags: Optional[list[str]]) -> bool:
        if tags != ["kv_cache"]:  # the first call of a wake maps memory back
            assert self.gpu == [], f"{self.name} wakes beside {self.gpu}"
            self.gpu.append(self.name)
        return await super().wake_up(tags)

    async def collective_rpc(self, method: str) -> list[Any]:
        await asyncio.sleep(self.reload_s)
        return await super().collective_rpc(method)

    async def sleep(self, level: int, mode: str) -> None:
        await super().sleep(level, mode)
        self.gpu.remove(self.name)


def test_a_wake_longer_than_the_lease_keeps_it(redis_port):
    """/tmp/rev4/long_wake.py: a level-2 reload four times the lease; another model's request meanwhile
    waits for it (renewed while it wakes), never wakes beside it."""
    free(redis_port)
    gpu: list[str] = []

    async def go() -> list[tuple[Any, ...]]:
        def mk(holder: str, level: int, reload_s: float) -> tuple[sw.Swap, Slow]:
            s = sw.Swap({"level": level, "waitSeconds": 10}, lease(redis_port, holder, ttl_s=0.3), poll_s=0.02)
            s.awake = False
            engine = Slow(holder, gpu, reload_s)
            s.bind(engine)
            return s, engine

        m, m_engine = mk("mistral", 2, 1.2)
        q, _ = mk("qwen", 1, 0.0)
        woken = asyncio.create_task(m.enter())
        await asyncio.sleep(0.1)
        other = asyncio.create_task(q.enter())
        await asyncio.wait_for(woken, 10)
        assert not other.done() and gpu == ["mistral"]
        m.leave()  # mistral's request done: it yields to qwen's
        await asyncio.wait_for(other, 10)
        q.leave()
        for t in (m.watcher, q.watcher):
            assert t is not None
            t.cancel()
        return m_engine.calls

    calls = run(go())
    assert gpu == ["qwen"]
    assert calls[-1] == ("sleep", 2, "wait")


def test_a_lease_lost_while_waking_puts_the_engine_back_to_sleep(redis_port):
    async def go() -> tuple[list[tuple[Any, ...]], bool]:
        import redis.asyncio as aioredis

        b, engine = await asleep(redis_port, "b", level=2, wait_s=0.3)

        async def reload(method: str) -> list[Any]:  # the store restarts mid-wake
            engine.calls.append(("collective_rpc", method))
            await aioredis.Redis(port=redis_port).delete(sw.lease_key("node-1"))
            await asyncio.sleep(0.1)
            return [None]

        engine.collective_rpc = reload  # type: ignore[method-assign]
        with pytest.raises(GuardError):
            await b.enter()  # fenced after that: not granted again within its wait
        assert b.watcher is not None
        b.watcher.cancel()
        return engine.calls, b.awake

    calls, awake = run(go())
    assert calls[-1] == ("sleep", 2, "abort") and not awake


class Flaky:
    """The store's client, cut off from this guard while `down`."""

    def __init__(self, real: Any) -> None:
        self.real, self.down = real, False

    async def fcall(self, *args: Any) -> Any:
        if self.down:
            raise ConnectionError("partition")
        return await self.real.fcall(*args)


def test_a_server_cut_off_from_the_store_sleeps_and_frees_the_gpu_once_it_answers(redis_port, monkeypatch):
    """/tmp/rev4/stuck.py: a server that never yielded, cut off from the store past half its lease,
    sleeps; once the store answers, the GPU is another's (the entrypoint handed the lease to the
    guard after its warm-up, and the guard drops what it could not)."""
    import redis.asyncio as aioredis

    free(redis_port)
    monkeypatch.setenv(sw.NODE_ENV, "node-1")
    monkeypatch.setenv(sw.HOLDER_ENV, "a")
    cfg = {"globalLimits": {"host": "127.0.0.1", "port": redis_port}, "swap": {"level": 1, "leaseSeconds": 2}}

    async def go() -> bool:
        handoff = sw.hold_for_startup(cfg, lambda: False)  # the entrypoint: takes it, its thread renews
        assert handoff is not None
        client = Flaky(aioredis.Redis(port=redis_port))
        a = sw.Swap({"level": 1}, sw.GpuLease(client, "node-1", "a", 2.0, 0.02), poll_s=0.02)
        a_engine = Engine()
        a.bind(a_engine)
        handoff()  # serve.py, once its warm-up went through the guard
        client.down = True
        while not a_engine.asleep:
            await asyncio.sleep(0.05)
        client.down = False
        b, b_engine = server(redis_port, "b", wait_s=1.5, ttl_s=2.0)
        b.awake = False
        await b.enter()  # within its wait: well before a's lease (2 s) would lapse by itself
        b.leave()
        for t in (a.watcher, b.watcher):
            assert t is not None
            t.cancel()
        return not b_engine.asleep

    assert run(go())


def test_a_store_out_of_reach_while_a_request_waits_is_a_503_with_retry_after():
    class Down:
        async def fcall(self, *args: Any) -> Any:
            raise ConnectionError("store down")

    async def go() -> tuple[GuardError, int]:
        s = sw.Swap({"level": 1}, sw.GpuLease(Down(), "n", "a", ttl_s=15), poll_s=0.02)
        s.awake = False
        s.bind(Engine())
        with pytest.raises(GuardError) as exc:
            await s.enter()
        assert s.watcher is not None
        s.watcher.cancel()
        return exc.value, s.inflight

    err, inflight = run(go())
    assert err.status == 503 and err.retry_after == 15 and inflight == 0
    assert b'"code": "model_swapping"' in error_body(err) and b'"type": "service_unavailable"' in error_body(err)


def test_requests_arriving_while_a_server_that_lost_its_lease_sleeps_wait_for_its_next_turn(redis_port):
    async def go() -> tuple[int, list[tuple[Any, ...]]]:
        a, engine = await started(redis_port, "a")
        release = asyncio.Event()

        async def slow_sleep(level: int, mode: str) -> None:
            engine.calls.append(("sleep", level, mode))
            await release.wait()
            engine.asleep = True

        engine.sleep = slow_sleep  # type: ignore[method-assign]
        await lease(redis_port, "a").drop()
        await lease(redis_port, "b").take()  # the GPU is b's now
        stepping = asyncio.create_task(a.step())
        await asyncio.sleep(0.05)
        arriving = asyncio.create_task(a.enter())  # during the sleep
        await asyncio.sleep(0.05)
        queued = a.inflight  # 0: not let into the paused engine
        release.set()
        await stepping
        arriving.cancel()
        assert a.watcher is not None
        a.watcher.cancel()
        return queued, engine.calls

    queued, calls = run(go())
    assert queued == 0 and calls == [("sleep", 1, "abort")]


def test_a_yielding_server_that_loses_its_lease_sleeps_before_the_waiter_wakes(redis_port):
    """/tmp/rev4b/yield_restart.py: a waits for its request in flight to yield; the store restarts
    empty meanwhile; b's take is fenced and granted a lease later: a must have slept by then."""
    free(redis_port)
    gpu: list[str] = []

    async def go() -> tuple[list[tuple[Any, ...]], bool]:
        import redis.asyncio as aioredis

        assert (await lease(redis_port, "a", ttl_s=0.5).take())[0]
        a = sw.Swap({"level": 1}, lease(redis_port, "a", ttl_s=0.5), poll_s=0.02)
        a_engine = Slow("a", gpu)
        a.bind(a_engine)
        gpu.append("a")
        await a.enter()  # the entrypoint's warm-up
        a.leave()
        await a.enter()  # a long generation in flight on a
        b = sw.Swap({"level": 1, "waitSeconds": 10}, lease(redis_port, "b", ttl_s=0.5), poll_s=0.02)
        b.awake = False
        b.bind(Slow("b", gpu))
        request = asyncio.create_task(b.enter())
        for _ in range(250):
            if a.yielding:
                break
            await asyncio.sleep(0.02)
        assert a.yielding
        await aioredis.Redis(port=redis_port).delete(sw.lease_key("node-1"))  # the store restarted empty
        await asyncio.wait_for(request, 10)  # Slow asserts b never wakes beside a
        a.leave()
        await asyncio.sleep(0.1)
        for t in (a.watcher, b.watcher):
            assert t is not None
            t.cancel()
        return a_engine.calls, a.awake

    calls, awake = run(go())
    assert gpu == ["b"] and not awake
    assert calls == [("sleep", 1, "abort")]  # cut at once, no drop: the lease is b's


def test_a_yielding_server_cut_off_from_the_store_past_half_the_lease_sleeps_and_owes_the_drop(redis_port):
    async def go() -> tuple[list[tuple[Any, ...]], bool]:
        import redis.asyncio as aioredis

        free(redis_port)
        client = Flaky(aioredis.Redis(port=redis_port))
        assert (await sw.GpuLease(client, "node-1", "a", 0.5, 0.02).take())[0]
        a = sw.Swap({"level": 1}, sw.GpuLease(client, "node-1", "a", 0.5, 0.02), poll_s=0.02)
        engine = Engine()
        a.bind(engine)
        await a.enter()  # in flight: the yield waits for it
        client.down = True
        a.renewed = time.monotonic() - 1  # last renewed past half the lease
        await asyncio.wait_for(a._yield(), 5)  # pyright: ignore[reportPrivateUsage]
        assert a.watcher is not None
        a.watcher.cancel()
        return engine.calls, a.owes_drop

    calls, owes = run(go())
    assert calls == [("sleep", 1, "abort")] and owes


def lua(port: int, op: str, holder: str, ttl_ms: int = 30_000) -> list[Any]:
    import redis

    plain: Any = redis.Redis(port=port)  # Any: redis-py annotates fcall's arguments as lists
    out = plain.fcall(sw.FUNCTION, 1, sw.lease_key("node-1"), op, holder, ttl_ms, 1000)
    return [int(out[0]), *(v.decode() for v in out[1:])]


def test_a_lease_lost_while_vllm_loads_tells_the_entrypoint_before_the_waiter_is_granted(redis_port, monkeypatch):
    """/tmp/rev4b/startup_restart.py: the entrypoint holds the lease while vLLM loads; the store
    restarts empty; the waiter is granted a fence later, and the entrypoint must know before."""
    import redis

    monkeypatch.setenv(sw.NODE_ENV, "node-1")
    monkeypatch.setenv(sw.HOLDER_ENV, "a")
    cfg = {"globalLimits": {"host": "127.0.0.1", "port": redis_port}, "swap": {"level": 1, "leaseSeconds": 1}}
    free(redis_port)
    told: list[float] = []
    handoff = sw.hold_for_startup(cfg, lambda: False, on_lost=lambda: told.append(time.monotonic()))
    assert handoff is not None
    time.sleep(0.5)
    redis.Redis(port=redis_port).delete(sw.lease_key("node-1"))  # the store restarted empty
    while lua(redis_port, "take", "b", 1000)[0] != 1:
        time.sleep(0.05)
    granted = time.monotonic()
    handoff()
    assert told and told[0] < granted


def server_script(tmp_path: Any, body: str) -> str:
    script = tmp_path / "vllm.py"
    script.write_text(body)
    return f"{sys.executable} {script}"


def entrypoint(monkeypatch: Any, port: int, command: str, tmp_path: Any) -> Any:
    """images/serve.py's main, its server `command`, its GPU lease in the store on `port`."""
    import json

    monkeypatch.syspath_prepend(str(IMAGES))
    import serve  # pyright: ignore[reportMissingImports]

    monkeypatch.setattr(serve.signal, "signal", lambda *a: None)  # pyright: ignore[reportUnknownMemberType]
    monkeypatch.setenv(sw.NODE_ENV, "node-1")
    monkeypatch.setenv(sw.HOLDER_ENV, "a")
    monkeypatch.setenv("GKE_LLM_WARM_MARKER", str(tmp_path / "warm"))
    monkeypatch.setenv("GKE_LLM_SERVER_COMMAND", command)
    monkeypatch.setenv("GKE_LLM_GUARD_CONFIG", json.dumps(
        {"globalLimits": {"host": "127.0.0.1", "port": port}, "swap": {"level": 1, "leaseSeconds": 1}}))
    free(port)
    return serve


def test_the_entrypoint_stops_a_loading_vllm_whose_lease_was_lost_and_exits_non_zero(redis_port, monkeypatch, tmp_path):
    import threading

    import redis

    loading = server_script(tmp_path, "import sys, time\nopen(sys.argv[0] + '.pid', 'w').write('x')\ntime.sleep(120)\n")
    serve = entrypoint(monkeypatch, redis_port, loading, tmp_path)

    def restart_store() -> None:
        while not (tmp_path / "vllm.py.pid").exists():
            time.sleep(0.05)
        redis.Redis(port=redis_port).delete(sw.lease_key("node-1"))

    threading.Thread(target=restart_store, daemon=True).start()
    begun = time.monotonic()
    code = serve.main(["/models/m", "--port", "1"])
    assert code != 0 and time.monotonic() - begun < 60  # stopped, not left loading for its 120 s
    assert not (tmp_path / "warm").exists()


def test_the_entrypoint_drops_the_lease_once_vllm_exits(redis_port, monkeypatch, tmp_path):
    serve = entrypoint(monkeypatch, redis_port, server_script(tmp_path, "pass\n"), tmp_path)
    assert serve.main(["/models/m", "--port", "1"]) == 0
    assert lua(redis_port, "take", "b")[:2] == [1, "b"]  # free at once, not a lease and a fence later


def test_the_package_services_of_one_pool_share_a_lease_no_model_wakes_beside_another_reloading(redis_port):
    """/tmp/rev4b/mixed_leases.py: two package VllmServices on one shared pool (qwen level 1, mistral
    level 2); the store restarts while mistral reloads; qwen's take is fenced by its own lease, so it
    must be no shorter than mistral's reload. Their leases are the services' own, scaled by 1/100."""
    from vllm_gke.components.provider.vllm_service import _swap  # pyright: ignore[reportPrivateUsage]
    from vllm_gke.infra.config import parse
    from vllm_gke.infra.plan import read_stack_config

    cfg = parse(read_stack_config("tuned"))
    models = {m.name: m for m in cfg.models}
    pool = cfg.pool("l4-shared")
    leases = {name: _swap(models[name], pool)["swap"]["leaseSeconds"] / 100 for name in ("qwen-1-5b", "mistral-7b")}
    reload_s = leases["mistral-7b"] / 1.5 * 0.9  # within its lease, as the lease's margin allows
    gpu: list[str] = []
    free(redis_port)

    async def go() -> None:
        import redis.asyncio as aioredis

        def mk(holder: str, level: int, reload: float) -> sw.Swap:
            s = sw.Swap({"level": level, "waitSeconds": 10}, lease(redis_port, holder, ttl_s=leases[holder]),
                        poll_s=0.02)
            s.awake = False
            s.bind(Slow(holder, gpu, reload))
            return s

        m, q = mk("mistral-7b", 2, reload_s), mk("qwen-1-5b", 1, 0.0)
        woken = asyncio.create_task(m.enter())
        await asyncio.sleep(0.1)
        other = asyncio.create_task(q.enter())
        await asyncio.sleep(0.1)
        await aioredis.Redis(port=redis_port).delete(sw.lease_key("node-1"))  # the store restarted empty
        done = await asyncio.gather(woken, other, return_exceptions=True)
        for t in (m.watcher, q.watcher):
            assert t is not None
            t.cancel()
        assert not [d for d in done if isinstance(d, AssertionError)], done  # Slow: nobody woke beside another

    run(go())


def test_a_request_cut_by_a_lost_lease_before_its_response_gets_503_not_vllms_200(redis_port):
    """vLLM 0.34 finishes an aborted request with finish_reason "abort" in a 200: the gate answers a
    cut request whose response had not begun 503 + Retry-After in OpenAI's format; a begun one (a
    stream) goes on as vLLM ends it."""
    async def go() -> tuple[list[Any], list[Any]]:
        a, _ = await started(redis_port, "a")
        go_on = asyncio.Event()

        async def vllm(scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == "/v1/stream":
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await go_on.wait()  # generating while the lease is lost
            if scope["path"] != "/v1/stream":
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b'{"finish_reason": "abort"}'})

        gate = sw.SwapGate(vllm, a, {p: ("POST", "completions") for p in ("/v1/completions", "/v1/stream")})
        sent: dict[str, list[Any]] = {"/v1/completions": [], "/v1/stream": []}

        async def call(path: str) -> None:
            async def send(message: Any) -> None:
                sent[path].append(message)

            await gate({"type": "http", "path": path}, None, send)

        calls = [asyncio.create_task(call(p)) for p in sent]
        await asyncio.sleep(0.05)
        await lease(redis_port, "a").drop()
        await lease(redis_port, "b").take()  # the GPU is b's now
        await a.step()  # a sees it: sleeps, aborting both
        go_on.set()
        await asyncio.gather(*calls)
        assert a.watcher is not None
        a.watcher.cancel()
        return sent["/v1/completions"], sent["/v1/stream"]

    cut, stream = run(go())
    assert cut[0]["status"] == 503 and dict(cut[0]["headers"])[b"retry-after"] == b"2"
    assert b'"code": "model_swapping"' in cut[1]["body"] and b'"type": "service_unavailable"' in cut[1]["body"]
    assert len(cut) == 2  # vLLM's own 200 and body swallowed
    assert stream[0]["status"] == 200 and stream[1]["body"] == b'{"finish_reason": "abort"}'


def test_a_wake_that_raises_sleeps_again_frees_the_gpu_and_answers_503(redis_port):
    async def go() -> tuple[GuardError, list[tuple[Any, ...]], list[Any]]:
        b, engine = await asleep(redis_port, "b", level=2)

        async def oom(method: str) -> list[Any]:
            engine.calls.append(("collective_rpc", method))
            raise RuntimeError("CUDA out of memory")

        engine.collective_rpc = oom  # type: ignore[method-assign]
        with pytest.raises(GuardError) as exc:
            await b.enter()
        assert b.watcher is not None
        b.watcher.cancel()
        return exc.value, engine.calls, lua(redis_port, "take", "c")

    err, calls, taken = run(go())
    assert err.status == 503 and err.code == "model_swapping" and err.retry_after is not None
    assert calls[-1] == ("sleep", 2, "abort")  # the weights it mapped back go to sleep again
    assert taken[:2] == [1, "c"]  # the GPU free at once


def test_a_drop_owed_through_a_store_outage_is_logged_once_not_each_poll(redis_port, caplog):
    import logging

    import redis.asyncio as aioredis

    async def go() -> bool:
        client = Flaky(aioredis.Redis(port=redis_port))
        a = sw.Swap({"level": 1}, sw.GpuLease(client, "node-1", "a", 0.5, 0.02), poll_s=0.02)
        a.awake, a.owes_drop, client.down = False, True, True
        for _ in range(5):
            await a.step()
        client.down = False
        await a.step()
        return a.owes_drop

    with caplog.at_level(logging.WARNING):
        owes = run(go())
    assert not owes  # dropped once the store answers
    assert len([r for r in caplog.records if "cannot be dropped" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback each poll
