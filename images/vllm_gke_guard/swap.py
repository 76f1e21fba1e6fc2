"""Model swapping on a time-shared GPU (models[].sleepMode): one server awake per GPU, the others
asleep with vLLM's sleep mode, each woken for its next request.

Who is awake is a lease per GPU (per node: a shared pool has one GPU per node) in the limit store,
the Redis function vllm_gke_lease_v1 (components/scripts/limit_store.lua). The guard drives its own
engine through vLLM's engine client (app.state.engine_client: sleep, wake_up, collective_rpc), so
vLLM's /sleep and /wake_up routes (only with VLLM_SERVER_DEV_MODE) stay off, and no request can
wake or sleep a model without passing the tenant checks first.

  - A request the guard admitted for a sleeping server takes the lease: free, the server wakes
    (level 1: weights back from host RAM; level 2: memory back, then the weights reloaded from the
    model's directory on the share) and serves. Held by another, it records itself as the waiter
    and polls until the lease is free, up to waitSeconds; then a 503 with Retry-After.
  - The server renews the lease every poll while it wakes (a level-2 wake outlasts the lease) and
    while awake. When another waits and it has been awake minAwakeSeconds, it stops taking
    requests (they wait for its next turn), lets those in flight finish, sleeps and drops the
    lease: the waiter takes it.
  - Only a drop frees the GPU at once. A lease gone from the store (its holder stopped renewing,
    or the store restarted empty) is fenced: the next take is granted a lease's time later. A
    server that finds its lease gone, or cannot renew it past half the lease, stops taking
    requests and sleeps at once (aborting what runs: the GPU may be another's within the fence);
    one cut off from the store drops the lease once it answers again.
  - The entrypoint (images/serve.py) takes the lease before vLLM starts (hold_for_startup) and
    renews it while vLLM loads; lost meanwhile, it stops vLLM and exits non-zero (the container
    restarts and waits for the lease). Once vLLM is healthy it hands the lease to the guard, whose
    watcher runs from vLLM's lifespan start and yields only after a request served (the
    entrypoint's warm-up, sent after the handoff); when vLLM exits it drops the lease. vLLM 0.34
    does not refuse to start beside an awake server (its extensible KV cache, on by default on CUDA,
    skips the free-memory check: vllm-project/vllm@v0.34.0:vllm/v1/worker/utils.py:759-762,783-786)
    but loads into what is left, failing or keeping a tiny KV cache until restarted: so no server
    starts while another is awake.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Awaitable, Callable, Optional

from .errors import GuardError, respond
from .metrics import log

FUNCTION = "vllm_gke_lease_v1"
NODE_ENV, HOLDER_ENV = "GKE_LLM_SWAP_NODE", "GKE_LLM_SWAP_HOLDER"
# How often a waiter asks for the lease and the holder renews it (and looks for a waiter).
POLL_SECONDS = 0.25


def lease_key(node: str) -> str:
    # Under rl:, the only keys the store's ACL lets the guards touch; one hash slot per GPU.
    return f"rl:{{gpu:{node}}}:lease"


class GpuLease:
    """The GPU's lease for one server (`holder`), over the limit store's client."""

    def __init__(self, client: Any, node: str, holder: str, ttl_s: float, poll_s: float = POLL_SECONDS):
        self.client, self.key, self.holder = client, lease_key(node), holder
        self.ttl_ms, self.fresh_ms = int(ttl_s * 1000), int(poll_s * 4000)
        self.lease_s = ttl_s

    async def _call(self, op: str, ttl_ms: Optional[int] = None) -> tuple[bool, str, str]:
        out = await self.client.fcall(FUNCTION, 1, self.key, op, self.holder, ttl_ms or self.ttl_ms, self.fresh_ms)
        text = [v.decode() if isinstance(v, bytes) else str(v) for v in out[1:]]
        return int(out[0]) == 1, text[0], text[1]

    async def take(self, ttl_ms: Optional[int] = None) -> tuple[bool, str, str]:
        """(granted, holder, waiter): the lease if free (or ours); else this server recorded as its waiter."""
        return await self._call("take", ttl_ms)

    async def renew(self) -> tuple[bool, str, str]:
        """(still ours, holder, waiter)."""
        return await self._call("renew")

    async def drop(self) -> None:
        await self._call("drop")


def swapping(cfg: dict[str, Any], client: Any) -> Optional["Swap"]:
    """The guard's Swap where its config has `swap` and the pod says which node and pod it is."""
    swap: dict[str, Any] = cfg.get("swap") or {}
    node, holder = os.environ.get(NODE_ENV, ""), os.environ.get(HOLDER_ENV, "")
    if not swap:
        return None
    if client is None or not node or not holder:
        raise ValueError(f"swap needs globalLimits (the lease's store) and {NODE_ENV}, {HOLDER_ENV} in the env")
    return Swap(swap, GpuLease(client, node, holder, float(swap.get("leaseSeconds") or 15)))


class Swap:
    """This server's side of the swap: whether its engine is awake, its requests in flight, and
    the watcher that renews the lease and yields it."""

    def __init__(self, cfg: dict[str, Any], lease: GpuLease, clock: Callable[[], float] = time.monotonic,
                 nap: Callable[[float], Awaitable[None]] = asyncio.sleep, poll_s: float = POLL_SECONDS):
        self.lease, self.clock, self.nap, self.poll = lease, clock, nap, poll_s
        self.level = int(cfg.get("level") or 1)
        self.wait_s = float(cfg.get("waitSeconds") or 60)
        self.min_awake_s = float(cfg.get("minAwakeSeconds") or 0)
        self.lease_s = lease.ttl_ms / 1000
        # The entrypoint took the lease before vLLM started: the server starts awake, holding it.
        self.awake, self.yielding = True, False
        self.awake_since = self.renewed = clock()
        self.inflight = 0
        # A request served (the entrypoint's warm-up comes after its handoff): the watcher yields only
        # then, so a yield is never taken by the entrypoint for a lost lease (it stops vLLM on that).
        self.served = False
        # Asleep because the store was out of reach: the lease is dropped once it answers.
        self.owes_drop = self.drop_failing = False
        # Sleeps that aborted what ran (a lost lease): SwapGate answers a cut request 503, not vLLM's 200.
        self.aborts = 0
        self.turn = asyncio.Lock()  # one wake or sleep at a time
        self.engine: Any = None
        self.watcher: Optional[asyncio.Task[None]] = None
        self.swaps = 0

    def bind(self, engine: Any) -> None:
        """The engine client, from the app's state (on the lifespan's start): the watcher starts then."""
        if engine is None or self.watcher is not None:
            return
        self.engine = engine
        self.watcher = asyncio.get_running_loop().create_task(self.watch())

    async def enter(self) -> None:
        """Before a request reaches the engine: the engine awake and the lease ours, or a 503. Counted
        in flight only once it may run (a yield waits for those, never for the waiting ones)."""
        if self.awake and not self.yielding:
            self.inflight += 1
            return
        await self._acquire(self.clock() + self.wait_s)

    def leave(self) -> None:
        self.inflight -= 1
        self.served = True

    async def _acquire(self, deadline: float) -> None:
        try:
            await asyncio.wait_for(self.turn.acquire(), max(0.0, deadline - self.clock()))
        except asyncio.TimeoutError:
            raise busy("another model", self.wait_s) from None
        try:
            while not self.awake:
                granted, holder, _ = await self._take()
                if granted and await self._wake_holding():
                    break
                if self.clock() >= deadline:
                    raise busy(holder or "another model", self.wait_s)
                await self.nap(self.poll)
            self.inflight += 1
        finally:
            self.turn.release()

    async def _take(self) -> tuple[bool, str, str]:
        try:
            return await self.lease.take()
        except Exception as exc:  # the store out of reach: no lease, so no wake; the caller retries later
            log.warning("swap: the GPU's lease is not reachable (%s)", type(exc).__name__)
            raise store_down(self.lease.lease_s) from None

    async def _wake_holding(self) -> bool:
        """Wake, renewing the lease each poll meanwhile; False (asleep again) if it was lost meanwhile."""
        self.renewed, self.owes_drop = self.clock(), False
        lost: list[bool] = []

        async def keep() -> None:
            while not lost:
                await self.nap(self.poll)
                try:
                    mine, _, _ = await self.lease.renew()
                except Exception:  # out of reach: judged once awake, as step() does
                    continue
                if mine:
                    self.renewed = self.clock()
                else:
                    lost.append(True)

        keeper = asyncio.get_running_loop().create_task(keep())
        try:
            await self._wake()
        except Exception as exc:
            await self._wake_failed(exc)
        finally:
            keeper.cancel()
        if lost or self.clock() - self.renewed > self.lease_s / 2:
            log.warning("swap: the lease was lost (or not renewed) while waking; sleeping again")
            await self._sleep("abort")
            self.owes_drop = not lost
            return False
        return True

    async def _wake_failed(self, exc: Exception) -> None:
        """A wake that raised (out of memory, a reload that failed): whatever woke sleeps again, the
        GPU freed at once, and the request a 503 (not vLLM's 500 with the lease held unrenewed)."""
        log.error("swap: the wake failed (%s: %s); sleeping and freeing the GPU", type(exc).__name__, exc)
        self.awake = True  # the engine may be half awake: put all of it back to sleep
        try:
            await self._sleep("abort")
        except Exception:
            log.exception("swap: could not sleep after a failed wake")
        self.awake, self.yielding, self.owes_drop = False, False, True
        try:
            await self.lease.drop()
            self.owes_drop = False
        except Exception:  # step() drops it once the store answers
            pass
        raise wake_failed(exc, self.wait_s) from None

    async def _wake(self) -> None:
        started = self.clock()
        if self.level == 2:
            # Level 2 dropped the weights: their memory back, the weights read again from the
            # model's directory (vLLM 0.34 reload_weights without a path), then the KV cache.
            await self.engine.wake_up(["weights"])
            await self.engine.collective_rpc("reload_weights")
            await self.engine.wake_up(["kv_cache"])
        else:
            await self.engine.wake_up(None)
        self.awake, self.yielding = True, False
        self.awake_since = self.clock()
        self.swaps += 1
        log.info("swap: awake in %.1f s (level %d)", self.clock() - started, self.level)

    async def _sleep(self, mode: str = "wait") -> None:
        """Sleep the engine. A yield lets running requests finish (mode wait); a server that lost its
        lease aborts them (vLLM's default), since the GPU is another's a fence later."""
        if self.awake:
            self.yielding = True  # requests arriving meanwhile wait for the next turn
            self.aborts += mode == "abort"
            await self.engine.sleep(self.level, mode)
            self.awake = False
        self.yielding = False

    async def watch(self) -> None:
        while True:
            await self.nap(self.poll)
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a watcher that dies would hold the GPU for ever
                log.exception("swap: the lease watcher failed; trying again")

    async def step(self) -> None:
        """One poll while awake: renew; sleep if the lease was lost; yield it once a waiter waits.
        Asleep, a lease it could not drop (cut off from the store) is dropped once the store answers."""
        if not self.awake:
            if self.owes_drop and not self.turn.locked():
                async with self.turn:  # never while a request of its own takes the lease and wakes
                    if not self.awake and self.owes_drop:
                        await self._drop_owed()
            return
        try:
            mine, _, waiter = await self.lease.renew()
        except Exception:  # the store unreachable: sleep before the lease could lapse under us
            if self.clock() - self.renewed > self.lease_s / 2:
                log.warning("swap: lease not renewed for %.0f s; sleeping", self.clock() - self.renewed)
                await self._lost()
                self.owes_drop = True
            return
        self.renewed = self.clock()
        if not mine:
            await self._lost()
        elif waiter and waiter != self.lease.holder and self._may_yield():
            await self._yield()

    async def _drop_owed(self) -> None:
        """The drop a server cut off from the store owes, tried each poll; the outage logged once."""
        try:
            await self.lease.drop()
        except Exception as exc:
            if not self.drop_failing:
                log.warning("swap: the GPU's lease cannot be dropped yet (%s); trying each poll", type(exc).__name__)
            self.drop_failing = True
            return
        self.owes_drop = self.drop_failing = False

    def _may_yield(self) -> bool:
        return self.served and self.clock() - self.awake_since >= self.min_awake_s

    async def _lost(self) -> None:
        self.yielding = True  # new requests wait at once, not in the paused engine
        async with self.turn:
            await self._sleep("abort")

    async def _yield(self) -> None:
        """New requests wait for the next turn; those in flight finish; then sleep and drop the lease."""
        self.yielding = True
        async with self.turn:
            while self.inflight > 0:  # requests this server admitted finish on the GPU first
                await self.nap(self.poll)
                if not await self._still_held():
                    return  # slept with abort: the GPU may be the waiter's within the fence
            await self._sleep()
            self.owes_drop = True  # a drop that fails is made by step() once the store answers
            await self.lease.drop()
            self.owes_drop = False

    async def _still_held(self) -> bool:
        """Renew while yielding (a yield waits for long requests); lost, or not renewed past half the
        lease, sleep at once as step() does: a store restarted empty grants the waiter a lease later."""
        try:
            mine, _, _ = await self.lease.renew()
        except Exception:
            if self.clock() - self.renewed <= self.lease_s / 2:
                return True
            log.warning("swap: lease not renewed for %.0f s while yielding; sleeping", self.clock() - self.renewed)
            await self._sleep("abort")
            self.owes_drop = True
            return False
        if mine:
            self.renewed = self.clock()
            return True
        log.warning("swap: the lease was lost while yielding; sleeping")
        await self._sleep("abort")
        return False


class SwapGate:
    """The app the guard hands admitted requests to, in front of vLLM's: a request that runs on the
    engine (a tenant route other than a listing, or the entrypoint's warm-up) waits for this server to
    be awake; the open routes and listings pass as they are. On the lifespan's start it finds the
    engine client and starts the watcher."""

    def __init__(self, app: Any, swap: Swap, routes: dict[str, tuple[str, str]]):
        self.app, self.swap, self.routes = app, swap, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.swap.bind(getattr(getattr(scope.get("app"), "state", None), "engine_client", None))
        if scope.get("type") != "http" or self.routes.get(scope.get("path", ""), ("", ""))[1] in ("", "info"):
            await self.app(scope, receive, send)
            return
        try:
            await self.swap.enter()
        except GuardError as err:
            await respond(send, err)
            return
        try:
            await self.app(scope, receive, self._cut_aware(send))
        finally:
            self.swap.leave()

    def _cut_aware(self, send: Any) -> Any:
        """`send` for a request in flight: cut by a lost lease's abort before its response began, it is
        answered 503 (vLLM 0.34 would answer 200 with finish_reason "abort": v1/engine/core.py:2439-2443,
        entrypoints/generate/base/serving.py:177-183). A begun response (a stream) ends as vLLM ends it."""
        aborts, replaced = self.swap.aborts, [False]

        async def wrapped(message: Any) -> None:
            if message.get("type") == "http.response.start" and self.swap.aborts != aborts:
                replaced[0] = True
                await respond(send, cut(self.swap.wait_s))
            elif not replaced[0]:
                await send(message)

        return wrapped


def store_down(lease_s: float) -> GuardError:
    err = GuardError(503, "the GPU's lease (in the limit store) is out of reach, so this model cannot wake now; "
                          "retry later", "model_swapping")
    err.retry_after = max(1.0, lease_s)
    return err


def cut(wait_s: float) -> GuardError:
    err = GuardError(503, "this model's GPU was taken back while the request ran (its lease was lost), so it was cut "
                          "before its response began; retry", "model_swapping")
    err.retry_after = max(1.0, wait_s / 4)
    return err


def wake_failed(exc: Exception, wait_s: float) -> GuardError:
    err = GuardError(503, f"this model failed to wake ({type(exc).__name__}); retry later", "model_swapping")
    err.retry_after = max(1.0, wait_s / 4)
    return err


def busy(holder: str, wait_s: float) -> GuardError:
    err = GuardError(503, f"the GPU is serving {holder}; this model did not wake within {wait_s:g} s (it shares "
                          "the GPU with other models, one at a time)", "model_swapping")
    err.retry_after = max(1.0, wait_s / 4)
    return err


def hold_for_startup(cfg: dict[str, Any], stopped: Callable[[], bool],
                     on_lost: Callable[[], None] = lambda: None) -> Optional[Callable[[], None]]:
    """The entrypoint's wait, before vLLM starts, for the GPU's lease; None if the pod was told to
    stop first. Blocking: nothing else runs in the entrypoint then. Once it has the lease, a thread
    renews it while vLLM loads (a pod that dies meanwhile frees the GPU within leaseSeconds) until
    the returned handoff is called (vLLM is up: the guard's watcher, started with its lifespan,
    renews it from then on). Lost meanwhile (a store restarted empty, or no renew past half the
    lease), the thread calls on_lost: the entrypoint stops the loading server, which would be
    beside the waiter granted the GPU a fence later."""
    shared: dict[str, Any] = cfg.get("globalLimits") or {}
    swap: dict[str, Any] = cfg.get("swap") or {}
    if not swap:
        return lambda: None
    import redis  # in the image with globalLimits

    # Any: redis-py annotates fcall's arguments as lists.
    client: Any = redis.Redis(host=str(shared["host"]), port=int(shared["port"]), socket_timeout=2)
    key, holder = lease_key(os.environ[NODE_ENV]), os.environ[HOLDER_ENV]
    ttl_ms, fresh_ms = int(float(swap.get("leaseSeconds") or 15) * 1000), int(POLL_SECONDS * 4000)
    handed = threading.Event()

    def call(op: str) -> bool:
        return int(client.fcall(FUNCTION, 1, key, op, holder, ttl_ms, fresh_ms)[0]) == 1

    def keep() -> None:
        renewed = time.monotonic()
        while not handed.wait(POLL_SECONDS):
            try:
                if call("renew"):
                    renewed = time.monotonic()
                    continue
            except redis.RedisError:
                if time.monotonic() - renewed <= ttl_ms / 2000:
                    continue
            if not handed.is_set():
                on_lost()
            return

    while not stopped():
        try:
            if call("take"):
                threading.Thread(target=keep, name="gpu-lease", daemon=True).start()
                return handed.set
        except redis.RedisError as exc:
            print(f"vllm-gke: GPU lease not reachable yet ({type(exc).__name__})", flush=True)
        time.sleep(POLL_SECONDS)
    return None


def drop_after_exit(cfg: dict[str, Any]) -> None:
    """The entrypoint, once vLLM has exited: the GPU free at once for a waiter, not a lease and a
    fence later. A no-op unless the lease is still this pod's."""
    shared: dict[str, Any] = cfg.get("globalLimits") or {}
    if not cfg.get("swap") or not shared:
        return
    import redis

    client: Any = redis.Redis(host=str(shared["host"]), port=int(shared["port"]), socket_timeout=2)
    try:
        client.fcall(FUNCTION, 1, lease_key(os.environ[NODE_ENV]), "drop", os.environ[HOLDER_ENV], 1000, 1000)
    except redis.RedisError as exc:  # it lapses by itself: a lease and a fence later
        print(f"vllm-gke: could not drop the GPU's lease on exit ({type(exc).__name__})", flush=True)
