"""GuardMiddleware: the ASGI middleware vLLM loads with `--middleware vllm_gke_guard.GuardMiddleware`,
and the order its checks run in. Every request is decided here from the start: the tenant URL's
prefix stripped (prefixes.py), then route, then
caller (the sidecar's address, one verified issuer, a subject the tenant lists, the tenant's own
objective), then rate limit, then body; the common chat request takes a shorter path of its own that decides exactly
as the general one does (tests compare the two)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Optional

from . import body as _body
from . import kv_transfer
from .asgi import ASGIApp, Receive, Replay, Scope, Send, forward
from .body import (
    ABSENT,
    DECODE_ERRORS,
    MSGSPEC_MAX_BYTES,
    add_members,
    closing_brace,
    fields_or_error,
    int_member,
    metered_or_error,
    read_fields,
    receive_body,
    too_large,
    utf8_or_error,
)
from .caps import Budget
from .config import DEFAULT_MAX_BODY_BYTES, DEFAULT_TRUSTED_PEERS, Tenant, load_config, warmup_token
from .errors import Disconnected, GuardError, respond
from .fallback import Cut, Fallback, Route
from .headers import ISSUER, SUBJECT, WARMUP_HEADER, Headers, check_content_type, header_slots, is_warmup, objective_of
from .limits import connect_store, rate_limited, take_shared
from .metrics import count_untrusted, log
from .models import check_model, model_list_filter
from .overload import Overload, VllmQueue
from .prefixes import Prefixes
from .routes import OPEN_ROUTES, OUTPUT_FIELDS, route_kind, route_table
from .scan import JsonShapeError
from .swap import SwapGate, swapping
from .tracing import TRACE_HEADERS, tracing
from .usage import Meter, shared_state
from .warm import WARM_PATH, WarmCheck

# The client's headers vLLM is not handed: its trace context (tracing.py: a client cannot choose to
# be recorded or join another trace), and the tenant's token, which the mesh keeps on the requests
# of the tenants sent to a fallback model only for the guard to send on (fallback.py).
NOT_FOR_VLLM = (*TRACE_HEADERS, b"authorization", b"x-serverless-authorization")

# What _admit hands on: the scope and body for vLLM, on a server with adapters the `model` values
# the tenant may see listed, and the tenant whose request it counts (None for the open routes, the
# model list and the entrypoint's warm-up).
Admitted = tuple[Scope, Receive, Optional[frozenset[str]], Optional[Tenant]]


class Divert(Exception):
    """A shed request whose tenant has a fallback route: sent there, else the refusal (fallback.py)."""

    def __init__(self, tenant: Tenant, route: Route, refusal: GuardError, scope: Scope):
        super().__init__(tenant.name)
        self.tenant, self.route, self.refusal, self.scope = tenant, route, refusal, scope


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: Optional[dict[str, Any]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.app = app
        cfg = load_config(config)
        self.issuer_header = str(cfg.get("issuerHeader", "x-vllm-gke-issuer")).lower().encode()
        # The verified subject (Istio writes it from the token; the mesh admits only listed ones).
        self.subject_header = str(cfg.get("subjectHeader", "x-vllm-gke-subject")).lower().encode()
        issuers: dict[str, dict[str, Any]] = cfg.get("issuers") or {}
        # The model this server serves, as the tenants' counters name it.
        self.model = str(cfg.get("model") or "")
        self.tenants = {iss: Tenant(e, clock, self.model) for iss, e in issuers.items()}
        # Behind the endpoint picker: the objective (priority) the route set must be the tenant's own.
        self.objective_header = str(cfg.get("objectiveHeader") or "").lower().encode()
        # One release: the move from bf329cd's routes (issue 39); drop next release. The header those
        # routes matched: the same tenant's own objective is accepted under it, never another value.
        self.legacy_objective_header = str(cfg.get("legacyObjectiveHeader") or "").lower().encode() \
            if self.objective_header else b""
        # path -> (method, kind)
        self.routes = route_table(cfg)
        # The tenant URLs' prefixes that route to this pool, stripped before any check (prefixes.py).
        self.prefixes = Prefixes(cfg.get("pathPrefixes") or ())
        self.trusted_peers = frozenset(cfg.get("trustedPeers") or DEFAULT_TRUSTED_PEERS)
        self.max_body = int(cfg.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
        self.rule = str(cfg.get("maxTokensRule") or "both")
        # The routes whose request models take cache_salt in the pinned release.
        self.salted = frozenset(cfg.get("cacheSaltRoutes") or ())
        # Who may send vLLM kv_transfer_params on this pod (kv_transfer.py): by default nobody.
        self.kv_transfer = kv_transfer.policy_of(cfg)
        # Limits across replicas (LimitStore); the per-replica windows are then the fallback.
        shared = cfg.get("globalLimits")
        self.shared: Any = None
        self.store_unavailable: type[Exception] = Exception
        if shared:
            self.shared, self.store_unavailable = connect_store(shared)
        # models[].sleepMode: admitted requests wait for this server's turn on its shared GPU (swap.py).
        self.swap = swapping(cfg, getattr(self.shared, "client", None))
        if self.swap is not None:
            self.app = SwapGate(self.app, self.swap, self.routes)
        # `unmetered` (a P/D prefill pod, disaggregation_cluster.role_guard_config): its requests are prefill legs
        # whose usage the decode pod's guard counts; the tenant is checked and the limits taken here, before the
        # prefill's GPU work (the decode guard takes none for the sidecar's decode leg: `decode_leg`).
        self.unmetered = bool(cfg.get("unmetered"))
        self.limits: Any = self.shared
        # A P/D decode pod: the per-replica window waits for the body, which tells the sidecar's decode leg.
        self.sidecar = self.kv_transfer == "routing-sidecar"
        # Overload protection: the queue-time objective, where some tenant may be shed (overload.py).
        overload: dict[str, Any] = cfg.get("overload") or {}
        self.overload: Optional[Overload] = Overload(
            float(overload["queueSloSeconds"]), [t.priority for t in self.tenants.values()], VllmQueue(), clock) \
            if overload and any(t.priority < 0 for t in self.tenants.values()) else None
        # Where the tenants it sheds go instead of a 429, for those that may (fallback.py).
        fallback: dict[str, Any] = cfg.get("fallback") or {}
        self.fallback = Fallback(fallback, self.model) if fallback and self.overload is not None else None
        # Spans of the guard's own, continued by vLLM's (tracing.py); the client's context is dropped either way.
        self.tracing = tracing(bool(cfg.get("traces")), self.model)
        self.warmup_token = warmup_token()
        self.header_slots = header_slots(self.issuer_header, self.objective_header, self.subject_header,
                                         self.legacy_objective_header)
        self.logged_peers: set[str] = set()
        # On Cloud Run (cloudRun): no mesh sidecar, so the tenant comes from the request's own credential,
        # verified here or by Cloud Run (cloud_run.py), and the path's tenant must be it.
        self.cloud_run: Any = None
        self.strip: Callable[[Scope], Scope] = self.prefixes.strip
        if cfg.get("cloudRun"):
            from .cloud_run import CloudRunIdentity  # PyJWT: imported only where a server needs it

            self.cloud_run = CloudRunIdentity(cfg["cloudRun"], (t.name for t in self.tenants.values()), clock)
            self.by_name = {t.name: t for t in self.tenants.values()}
            self.strip = partial(self.cloud_run.strip, self.prefixes)
        # On Cloud Run, the startup probe's path: 503 until the entrypoint has warmed this server (warm.py).
        self.warm: Optional[WarmCheck] = WarmCheck() if cfg.get("cloudRun") else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind != "http":  # websockets (e.g. /v1/realtime) are not behind the tenant checks
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        if self.warm is not None and scope.get("path") == WARM_PATH:
            await self.warm.answer(scope, send)
            return
        try:
            scope, receive, listed, tenant = await self._admit(shared_state(self.strip(scope)), receive)
        except GuardError as err:
            await respond(send, err)
            return
        except Disconnected:
            return  # the client left mid-body: nothing is forwarded
        except Divert as divert:
            await self._divert(divert, receive, send)
            return
        except Exception:  # a guard bug must not become a 500 or let the request through
            log.exception("guard failed on %s %s", scope.get("method"), scope.get("path"))
            await respond(send, GuardError(400, "the request could not be checked", "unprocessable"))
            return
        if listed is not None:
            send = model_list_filter(send, listed)
        if tenant is None:
            await self.app(scope, receive, send)
            return
        scope = for_vllm(scope)
        if self.unmetered:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        meter = Meter(send, tenant.meters, scope, self.routes.get(path, ("", ""))[1])
        traced = self.tracing
        span = None
        if traced is not None:
            scope, span = traced.start(scope, tenant.name, path)
        try:
            await self.app(scope, receive, meter)
        finally:
            outcome = meter.done()
            if traced is not None:
                traced.finish(span, meter.status, outcome, meter.prompt, meter.generated)

    # Off only in tests, to check that the fast path decides exactly as the general one.
    fast_path = True

    async def _admit(self, scope: Scope, receive: Receive) -> Admitted:
        """The scope and body to forward, and on a server with adapters the `model` values the
        tenant may see listed (GET /v1/models names every adapter the server loaded)."""
        if self.fast_path and self.routes.get(path := scope.get("path", "")) == ("POST", "chat") \
                and scope.get("method") == "POST" and path not in OPEN_ROUTES:
            admitted = await self._admit_common_chat(scope, receive)
            if admitted is not None:
                return admitted
        path, method = scope.get("path") or "", scope.get("method") or ""
        if OPEN_ROUTES.get(path) == method:
            if self.cloud_run is not None:  # on Cloud Run, /metrics to the instance's own sidecar alone
                self.cloud_run.open_route(path, (scope.get("client") or ("", 0))[0])
            return scope, receive, None, None
        kind = route_kind(self.routes, path, method)
        seen = Headers(scope.get("headers") or (), self.header_slots)
        client = (scope.get("client") or ("", 0))[0]
        if self.warmup_token and client == "127.0.0.1" and is_warmup(seen, self.warmup_token):
            return scope, receive, None, None
        if self.cloud_run is not None:
            tenant = self.by_name[await self.cloud_run.tenant(scope)]
        else:
            tenant = self._mesh_tenant(seen, client)
        if tenant.priority < 0 and kind != "info":  # a listing queues nothing in the engine: never shed
            self._shed(tenant, scope)
        # The replica's own window, before any body is read, with globalLimits too: a tenant's
        # stream of bodies the guard refuses (each read and parsed on vLLM's event loop) meets a
        # 429 here; the shared store counts only the requests found valid (take_shared).
        if not self.sidecar and (wait := tenant.limiter.take()) is not None:
            raise rate_limited(tenant, wait)
        if kind == "info":
            self._take_after_body(tenant, False)
            await take_shared(self.limits, self.store_unavailable, tenant, 0)
            # Not a request the SLOs or the chargeback count: a client polling /v1/models would
            # otherwise dilute the availability its generations get.
            return scope, receive, tenant.models, None
        if seen.content_type != b"application/json" or seen.repeated:  # the common case without parsing it
            check_content_type(seen)
        length = seen.content_length
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            raise too_large(self.max_body)
        return await self._admit_body(scope, receive, await receive_body(receive, self.max_body), kind, tenant,
                                      salt=tenant.salt if path in self.salted else None)

    def _mesh_tenant(self, seen: Headers, client: str) -> Tenant:
        """The tenant Istio verified: through the pod's sidecar, one verified issuer, a subject the tenant
        lists, behind the endpoint picker the tenant's own objective."""
        if client not in self.trusted_peers:
            count_untrusted(client, self.logged_peers, self.trusted_peers)
            raise GuardError(403, "the request did not come through the mesh sidecar; refused", "no_mesh")
        issuer = seen.once(ISSUER)
        if issuer is None:
            raise GuardError(403 if seen.issuer is None else 400, "exactly one verified issuer is required",
                             "forbidden")
        tenant = self.tenants.get(issuer.decode("latin-1"))
        if tenant is None:
            raise GuardError(403, "no tenant is configured for this token's issuer", "forbidden")
        if tenant.subjects is not None and seen.once(SUBJECT) not in tenant.subjects:
            raise GuardError(403, f"this token's subject is not one tenant '{tenant.name}' lists (jwt.subjects)",
                             "forbidden")
        if self.objective_header and ((objective := objective_of(seen, bool(self.legacy_objective_header))) is None
                                      or objective.decode("latin-1") != tenant.objective):
            raise GuardError(403, f"tenant '{tenant.name}' must call this model under its own path "
                                  f"(/{tenant.name}/<model>/v1)", "forbidden")
        return tenant

    def _take_after_body(self, tenant: Tenant, decode_leg: bool) -> Any:
        """On a P/D decode pod (`sidecar`), the per-replica window taken now, unless the request is the routing
        sidecar's decode leg (kv_transfer_params from its loopback peer: the prefill pod's guard took the limits
        before the prefill ran); the shared limits to take (None: none)."""
        if not self.sidecar:
            return self.limits
        if decode_leg:
            return None
        if (wait := tenant.limiter.take()) is not None:
            raise rate_limited(tenant, wait)
        return self.limits

    def _shed(self, tenant: Tenant, scope: Scope) -> None:
        """A 429 with Retry-After for a sheddable tenant while the queue is over its objective; its
        request to the fallback model instead, where the tenant has a route there (Divert)."""
        if self.overload is not None and self.overload.shed(tenant.priority):
            refusal = self.overload.refusal(tenant.name)
            if self.fallback is not None and (route := self.fallback.route(tenant.name, scope.get("path", ""))):
                # Sent on as if served here: within the tenant's rate limit on this replica, taken
                # before its body is read (the fallback's guard takes its limits there too).
                if (wait := tenant.limiter.take()) is not None:
                    raise rate_limited(tenant, wait)
                raise Divert(tenant, route, refusal, scope)
            tenant.meters.shed.inc()
            raise refusal

    async def _divert(self, divert: Divert, receive: Receive, send: Send) -> None:
        """The shed request served by the fallback model, or the 429 it would have had (the body
        too large, the fallback unreachable or refusing: fallback.py says when)."""
        assert self.fallback is not None
        try:
            served = await self.fallback.serve(divert.route, divert.scope, receive, send, self.max_body)
        except Disconnected:
            return
        except Cut:  # its answer broke off after the response started: the server aborts the connection
            raise
        except GuardError:  # a body over the limit: its 413 comes once the tier is back
            served = False
        except Exception:  # a guard bug must not become a 500
            log.exception("the shed request of tenant %s was not sent to the fallback model", divert.tenant.name)
            served = False
        if not served:
            divert.tenant.meters.shed.inc()
            await respond(send, divert.refusal)

    async def _admit_common_chat(self, scope: Scope, receive: Receive) -> Optional[Admitted]:
        """The request nearly every call is - a tenant's chat completion within its cap, through
        the sidecar, one issuer, JSON, one sequence - checked in one function:
        in a busy server the guard's code is out of the CPU's caches on every request, so each
        function and object it touches costs (timed inside a loaded server at 1 KB: ~10 us a
        request on the general path, ~7 here). None, before anything is counted or read, for any request
        that is not plainly that one: the general path then decides it from the start. Once the
        rate limit is taken it finishes as the general path would (tests compare the two)."""
        if self.shared is not None or self.objective_header or self.sidecar or self.cloud_run is not None:
            return None
        path = scope.get("path")
        issuer_header, subject_header = self.issuer_header, self.subject_header
        issuer = subject = content_type = length = None
        for k, v in scope.get("headers") or ():
            if k == issuer_header:
                if issuer is not None:
                    return None
                issuer = v
            elif k == subject_header:
                if subject is not None:
                    return None
                subject = v
            elif k == b"content-type":
                if content_type is not None:
                    return None
                content_type = v
            elif k == b"content-length":
                if length is not None:
                    return None
                length = v
            elif k == WARMUP_HEADER:
                return None
        if issuer is None or content_type != b"application/json" or length is None or not length.isdigit() \
                or int(length) > self.max_body or (scope.get("client") or ("", 0))[0] not in self.trusted_peers:
            return None
        tenant = self.tenants.get(issuer.decode("latin-1"))
        if tenant is None or tenant.models is not None or (tenant.subjects is not None
                                                           and subject not in tenant.subjects):
            return None
        # From here on, as the general path: shed, counted, then the body.
        if tenant.priority < 0:
            self._shed(tenant, scope)
        if (wait := tenant.limiter.take()) is not None:
            raise rate_limited(tenant, wait)
        message = await receive()
        # body._BODY read here, not imported: without msgspec (or in a test that takes it away) it is None.
        if message.get("type") == "http.request" and not message.get("more_body") \
                and len(body := message.get("body", b"")) <= MSGSPEC_MAX_BYTES \
                and (decoder := _body._BODY) is not None:  # pyright: ignore[reportPrivateUsage]
            if len(body) > self.max_body:
                raise too_large(self.max_body)
            try:  # read_fields, inline
                fields = decoder.decode(body)
            except DECODE_ERRORS:
                fields = None  # the general path says why
        else:
            body = await receive_body(receive, self.max_body, message)
            try:
                fields = read_fields(body, "chat")
            except (JsonShapeError, ValueError):
                fields = None
        kv_transfer.check(body, self.kv_transfer)
        salt = tenant.salt if path in self.salted else None
        if fields is not None and fields.n is ABSENT and fields.best_of is ABSENT:
            mct, mt = fields.max_completion_tokens, fields.max_tokens
            # One sequence bounded by a positive max_completion_tokens within the cap: every reading
            # of the rule agrees; max_tokens must still be what as_int accepts.
            if type(mct) is int and 0 < mct <= tenant.cap and (mt is ABSENT or mt is None or type(mt) is int) \
                    and body.isascii():
                if salt is None:
                    return scope, Replay(body, receive), None, tenant
                return (*forward(scope, receive, add_members(body, closing_brace(fields, body), salt)), None, tenant)
        return await self._admit_body(scope, receive, body, "chat", tenant, fields, salt=salt)

    async def _admit_body(self, scope: Scope, receive: Receive, body: bytes, kind: str, tenant: Tenant,
                          fields: Any = None, salt: Optional[bytes] = None) -> Admitted:
        """The checks on the body, once the request is counted and its body read (and its fields,
        where the caller has read them already); `salt`, the tenant's cache_salt member to append."""
        utf8_or_error(body)
        kv_transfer.check(body, self.kv_transfer)
        limits = self._take_after_body(tenant, self.sidecar and kv_transfer.carries(body))
        if kind not in OUTPUT_FIELDS:  # pooling: rate limited, generates nothing
            fields = fields_or_error(body, kind)
            metered_or_error(fields)
            if tenant.models is not None:
                check_model(tenant.models, fields)
            await take_shared(limits, self.store_unavailable, tenant, 0)
            if salt is None:
                return scope, Replay(body, receive), None, tenant
            return (*forward(scope, receive, add_members(body, closing_brace(fields, body), salt)), None, tenant)
        if fields is None:
            fields = fields_or_error(body, kind)
        try:
            budget = Budget(kind, fields, self.rule)
        except (JsonShapeError, ValueError) as exc:  # includes UnicodeDecodeError, JSONDecodeError
            raise GuardError(400, f"the body is not a valid JSON object: {exc}", "invalid_json") from None
        if tenant.models is not None:
            check_model(tenant.models, fields)
        add = budget.check(tenant.cap, tenant.name)
        if limits is not None:
            per_sequence = add if add is not None else max(v for v in budget.per_sequence if v is not None)
            await take_shared(limits, self.store_unavailable, tenant, per_sequence * budget.sequences)
        if add is None and salt is None:
            return scope, Replay(body, receive), None, tenant
        members = b",".join(m for m in (None if add is None else int_member(OUTPUT_FIELDS[kind], add), salt) if m)
        return (*forward(scope, receive, add_members(body, closing_brace(fields, body), members)), None, tenant)


def for_vllm(scope: Scope) -> Scope:
    """The scope without the headers vLLM is not handed (copied only where it had one; the copy
    shares the `state` dict the handler writes the usage into)."""
    headers = scope.get("headers") or ()
    if not any(k in NOT_FOR_VLLM for k, _ in headers):
        return scope
    return dict(scope, headers=[(k, v) for k, v in headers if k not in NOT_FOR_VLLM])
