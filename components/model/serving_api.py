"""The vLLM HTTP API as the platform exposes it: which routes a tenant may call and how each is
metered, and the tenant guard's config.

One table feeds the guard's allow-list, the mesh's AuthorizationPolicies and the tests, which
check it against the routes the real servers register (images/vllm-versions/*.json). A route
not listed here is refused by the mesh and by the guard: new vLLM endpoints stay closed until
someone decides how to meter them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Optional, Sequence

from .specs import ModelSpec, TenantSpec

if TYPE_CHECKING:
    from .vllm_versions import VllmRelease

# Istio writes the verified JWT's issuer into this header (and overwrites a client's copy);
# the route also strips client copies before the request reaches the mesh.
ISSUER_HEADER = "x-vllm-gke-issuer"
# ...and the verified subject (sub), which the guard checks against a tenant's jwt.subjects.
SUBJECT_HEADER = "x-vllm-gke-subject"
# What Istio writes from the verified token: no client copy may reach the mesh.
VERIFIED_HEADERS = (ISSUER_HEADER, SUBJECT_HEADER)
# The endpoint picker's request headers (llm-d-router v0.10.0 pkg/epp/metadata/consts.go:37-77;
# for each pair the x-llm-d-* name wins, consts.go:89-101): the objective names the tenant's
# InferenceObjective (its priority band), the fairness id its flow within the band, the others a
# model rewrite and latency targets. The picker reads the request before route-level header
# changes apply (envoy#15012), so no route can set them for it: the tenant identity extension
# (images/vllm_gke_identity, a GCPRoutingExtension that runs before route selection) removes
# every client copy of all of them and sets the objective, the fairness id and TENANT_HEADER
# from the tenant whose token it verified; the picker's routes match on those.
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
# One release: the move from bf329cd's routes (issue 39); drop next release.
# The objective header bf329cd's routes and mesh matched (clients sent it themselves). Until the
# identity extension is programmed (it strips this header: IDENTITY_STRIPS), requests still come
# with it; the mesh, the guard and a second match of each picker route accept the tenant's own
# objective under it too, nothing else. Set to "" to drop the compat everywhere.
LEGACY_OBJECTIVE_HEADER = "x-gateway-inference-objective"
MODEL_REWRITE_HEADER = "x-llm-d-model-name-rewrite"
# The verified tenant (the extension sets it; the picker's routes match on it with the objective).
TENANT_HEADER = "x-vllm-gke-tenant"
# Every header the picker reads to choose a priority, a flow, a model or a deadline, in both
# spellings: no client copy passes the extension.
PICKER_CONTROL_HEADERS = (
    OBJECTIVE_HEADER, "x-gateway-inference-objective",  # not LEGACY_OBJECTIVE_HEADER: stays when that goes
    FAIRNESS_HEADER, "x-gateway-inference-fairness-id",
    MODEL_REWRITE_HEADER, "x-gateway-model-name-rewrite",
    "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms",
    "x-llm-d-slo-tpot-ms", "x-slo-tpot-ms",
    # The rest of llm-d's input control headers (pkg/epp/util/request/headers.go:30-40): a video's
    # frame rate, length and resolution, which its scorers may weigh.
    "x-llm-d-video-fps", "x-llm-d-video-duration-seconds", "x-llm-d-video-resolution",
)
# The headers llm-d-router's routing sidecar on a disaggregated model's decode pods sends a request's
# prefill (or a KV pull) to (v0.10.0 pkg/common/routing/common.go:14-25); only the picker sets them.
SIDECAR_ROUTING_HEADERS = ("x-prefiller-host-port", "x-encoder-hosts-ports", "x-data-parallel-host-port",
                           "x-kv-cache-source-host-port")
# What the extension removes from every request, and what it sets from a verified token.
IDENTITY_STRIPS = (*PICKER_CONTROL_HEADERS, TENANT_HEADER, *SIDECAR_ROUTING_HEADERS)
IDENTITY_SETS = (OBJECTIVE_HEADER, FAIRNESS_HEADER, TENANT_HEADER)
# What the picker sets on the request it answers for (pkg/epp/handlers/request.go, with
# ClearRouteCache): a route must neither match on it (a route re-matched after the picker would
# send every request elsewhere) nor strip it (filters applied after ext_proc would drop the
# picker's choice). A client's copy is overwritten by the picker.
PICKER_SETS = ("x-gateway-destination-endpoint",)
# Headers a client may not choose that no route can refuse either (the picker reads them before
# route filters apply): the extension strips them; kept under this name for the policy pack and
# the contracts, which check that nothing routes a client's copy to a pool.
REFUSED_AT_THE_PICKER = tuple(h for h in PICKER_CONTROL_HEADERS if h not in (OBJECTIVE_HEADER, FAIRNESS_HEADER))
# Envoy's inbound passthrough connects to the application from this address.
SIDECAR_PEER = "127.0.0.6"

Kind = Literal["completions", "chat", "chat_batch", "responses", "messages", "pooling", "info"]


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    # How the guard meters it: generation kinds are capped in tokens; pooling (no generated
    # tokens) and info are rate limited only.
    kind: Kind


# Only vLLM's /v1 API: the Gateway routes /<prefix>/v1/... (components/gateway.py; the guard strips
# the prefix), so its
# unversioned routes (/pooling, /classify, /score, /rerank, /v2/rerank, /tokenize, /detokenize)
# would be admitted here and reachable from nowhere. /v1/score and /v1/rerank serve the same models.
TENANT_ROUTES: tuple[Route, ...] = (
    Route("/v1/completions", "POST", "completions"),
    Route("/v1/chat/completions", "POST", "chat"),
    Route("/v1/chat/completions/batch", "POST", "chat_batch"),
    Route("/v1/responses", "POST", "responses"),
    Route("/v1/messages", "POST", "messages"),
    Route("/v1/embeddings", "POST", "pooling"),
    Route("/v1/score", "POST", "pooling"),
    Route("/v1/rerank", "POST", "pooling"),
    Route("/v1/models", "GET", "info"),
)
# Served without a JWT, to probes and scrapes only (see MeshNamespace for the sources).
OPEN_ROUTES: tuple[Route, ...] = (Route("/health", "GET", "info"), Route("/metrics", "GET", "info"))


# What the picker parses (llm-d-router v0.10.0: its default openai-parser and anthropic-parser pick a
# parser by path suffix, pkg/epp/handlers/parsers.go:89-102, openai/openai.go:90-104,
# anthropic/anthropic.go:68-73): chat and completions, the Responses API (`input` required; no
# precise prefix score: the vllm tokenizer backend renders no Responses, tokenizer/backend.go:107-136)
# and Anthropic Messages (>= 1 message). It answers 400 to a body on any path no parser claims
# (parsers.go:97-101), so the chat batch, /v1/score and /v1/rerank stay off its routes, and
# embeddings too (a pooling model is not what a generation pool serves). A body-less GET goes to
# a random replica (pkg/epp/handlers/request.go:42-47). The Responses store stays off
# (VLLM_ENABLE_RESPONSES_API_STORE unset): the guard admits only POST /v1/responses, so
# GET /v1/responses/{id} and its cancel are 404 (a stored response has no owner check in vLLM).
PICKER_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models")
# The picker holds a whole body in memory before any JWT is checked: its routes admit only bodies
# with a Content-Length up to this many bytes per token of the pool's context (at least 1 MiB).
PICKER_BYTES_PER_TOKEN = 16
PICKER_MIN_BODY_BYTES = 1 << 20


def picker_routes() -> list[Route]:
    """The tenant routes a model behind the endpoint picker serves (PICKER_PATHS)."""
    return [r for r in TENANT_ROUTES if r.path in PICKER_PATHS]


def picker_salted_paths(release: "VllmRelease") -> tuple[str, ...]:
    """The picker's body routes whose request models take cache_salt on `release`: the tenant
    identity extension reads and salts their bodies (components/model/identity_extension.py)."""
    return tuple(sorted(r.path for r in picker_routes() if r.method == "POST" and r.path in release.cache_salt_paths))


def picker_max_body_bytes(model: ModelSpec) -> int:
    """The largest body a picker route admits for `model`: room for its longest context."""
    return max(PICKER_MIN_BODY_BYTES, model.served_max_model_len * PICKER_BYTES_PER_TOKEN)


# The guard's body cap on a pool the length routes reach: the longest body a request within the
# model's context needs, not a fixed 32 MiB (a refused body is read whole on vLLM's event loop
# first: ~19 ms at 32 MiB). A prompt of maxModelLen tokens as token ids takes under 8 bytes a
# token, as text (~4 characters a token, each at most 6 bytes as a JSON \u escape) under 32;
# the floor leaves room for what takes no context: a logit_bias over a whole vocabulary (~256k
# entries, ~3.5 MB), response_format schemas. The catalog's models are text-only (no images).
GUARD_BYTES_PER_TOKEN = 32
GUARD_MIN_BODY_BYTES = 4 << 20


def guard_max_body_bytes(model: ModelSpec) -> int:
    """The largest body the guard reads for `model`: room for its longest context."""
    return max(GUARD_MIN_BODY_BYTES, model.served_max_model_len * GUARD_BYTES_PER_TOKEN)


# The picker forwards the body re-encoded by Go's encoding/json (pkg/epp/handlers/server.go:230),
# which writes <, > and & as 6-byte escapes: the replica's guard takes up to this many times the
# route's limit, so it never refuses what the route admitted.
PICKER_REENCODING_GROWTH = 6


def tenant_routes(served: Optional[Iterable[str]] = None) -> list[Route]:
    """The tenant routes a server actually registers (all of them when `served` is None)."""
    paths = None if served is None else set(served)
    return [r for r in TENANT_ROUTES if paths is None or r.path in paths]


def path_prefix(model: ModelSpec, tenant: TenantSpec, dedicated: bool) -> str:
    """The route's path prefix (without '/' and '/v1') for `tenant` calling `model`: the shared
    /<model>/v1 of length routing, else /<tenant>/<model>/v1 (behind the endpoint picker the tenant
    is in the path, so its priority is bound to its token; a dedicated copy is the tenant's own)."""
    if dedicated or model.routing == "inference-gateway":
        return f"{tenant.name}/{model.name}"
    return model.name


def pool_prefixes(model: ModelSpec, callers: Sequence[TenantSpec], dedicated: bool = False) -> list[str]:
    """The path prefixes ('/<prefix>', no '/v1') the Gateway routes to a pool of `model` serving
    `callers`. The Gateway forwards the path as sent (GKE does not claim HTTPRoute path rewrites:
    infra/contracts/gateway.py), so the mesh admits these prefixed paths and the guard strips them."""
    return sorted({"/" + path_prefix(model, t, dedicated) for t in callers})


def objective_name(tenant: str, model: str) -> str:
    """A tenant's InferenceObjective for a model; '.' cannot occur in either name, so no two
    (tenant, model) pairs share one."""
    return f"{tenant}.{model}"


def cache_salt(tenant: TenantSpec) -> str:
    """The tenant's prefix-cache salt: the guard sets it on every salted request (overwriting a
    client's), so no two tenants' requests share a cached prefix on one replica. A tenant name
    (a DNS label) is within vLLM's rules for it: 1-128 characters, none of @ / \\ or NUL."""
    return f"tenant-{tenant.name}"


def guard_entry(tenant: TenantSpec, model: Optional[str] = None,
                served: Optional[ModelSpec] = None) -> dict[str, Any]:
    """What the in-server guard enforces for requests carrying this tenant's verified issuer;
    with `model` (a pool behind the endpoint picker) the objective the request must carry; with
    `served` (a model with LoRA adapters) the `model` values the tenant may send."""
    entry: dict[str, Any] = {"tenant": tenant.name, "maxTokens": tenant.max_tokens,
                             "requestsPerMinute": tenant.rate_limit.requests_per_minute,
                             "cacheSalt": cache_salt(tenant)}
    if model is not None:
        entry["objective"] = objective_name(tenant.name, model)
    if served is not None and served.adapters:
        entry["models"] = [served.name, *(a.name for a in served.adapters if tenant.name in a.tenants)]
    if tenant.rate_limit.tokens_per_minute is not None:
        entry["tokensPerMinute"] = tenant.rate_limit.tokens_per_minute
    if tenant.priority < 0:  # shed first while the server's queue is over its objective
        entry["priority"] = tenant.priority
    if tenant.jwt.subjects is not None:  # only these subjects of the issuer are the tenant
        entry["subjects"] = list(tenant.jwt.subjects)
    return {tenant.jwt.issuer: entry}


def guard_config(tenants: Sequence[TenantSpec], routes: Sequence[Route],
                 max_tokens_rule: str = "both", objectives_for: Optional[str] = None,
                 shared_store: Optional[tuple[str, int]] = None, served: Optional[ModelSpec] = None,
                 max_body_bytes: Optional[int] = None, cache_salt_paths: Sequence[str] = (),
                 queue_slo_seconds: Optional[float] = None, traces: bool = False,
                 path_prefixes: Sequence[str] = (), fallback: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The guard's config; `objectives_for` names the model when its pool sits behind the endpoint
    picker, so each tenant's requests must carry that tenant's own objective; `shared_store`
    (host, port) counts the tenants' limits across replicas (LimitStore); `max_body_bytes`
    sets the guard's body limit (the model's context's, or a picker route's); `queue_slo_seconds`,
    the queue time over which tenants of negative priority are shed (the guard's overload.py);
    `traces`, the guard's spans on (its tracing.py); `path_prefixes`, what the guard strips from
    /<prefix>/v1/... before its checks and vLLM's router (pool_prefixes; its prefixes.py);
    `fallback`, where the tenants it sheds go instead of a 429 (fallback.fallback_guard_config)."""
    issuers: dict[str, Any] = {}
    for tenant in tenants:
        issuers.update(guard_entry(tenant, objectives_for, served))
    extra: dict[str, Any] = {"objectiveHeader": OBJECTIVE_HEADER} if objectives_for is not None else {}
    if objectives_for is not None and LEGACY_OBJECTIVE_HEADER:
        # One release: the move from bf329cd's routes (issue 39); drop next release.
        extra["legacyObjectiveHeader"] = LEGACY_OBJECTIVE_HEADER
    if shared_store is not None:
        extra["globalLimits"] = {"host": shared_store[0], "port": shared_store[1]}
    if max_body_bytes is not None:
        extra["maxBodyBytes"] = max_body_bytes
    if queue_slo_seconds is not None and any(t.priority < 0 for t in tenants):
        extra["overload"] = {"queueSloSeconds": queue_slo_seconds}
        if fallback:
            extra["fallback"] = dict(fallback)
    if traces:
        extra["traces"] = True
    if path_prefixes:
        extra["pathPrefixes"] = sorted(path_prefixes)
    if served is not None:  # names the tenants' request and token counters (the guard's usage.py)
        extra["model"] = served.name
    salted = sorted(p for p in cache_salt_paths if any(r.path == p for r in routes))
    if salted:
        extra["cacheSaltRoutes"] = salted
    return {**extra,
        "issuerHeader": ISSUER_HEADER,
        "subjectHeader": SUBJECT_HEADER,
        "issuers": issuers,
        "routes": {r.path: {"method": r.method, "kind": r.kind} for r in routes},
        "trustedPeers": [SIDECAR_PEER],
        "maxTokensRule": max_tokens_rule,
    }


def mesh_operations(routes: Sequence[Route], prefixes: Sequence[str]) -> list[dict[str, Any]]:
    """AuthorizationPolicy `to` entries admitting exactly these routes under each of `prefixes`
    ('/<prefix>': the sidecar sees the path as the client sent it), method by method."""
    if not prefixes or not routes:  # an empty `to` would admit every path
        raise ValueError("mesh_operations: no prefix or no route to admit")
    by_method: dict[str, list[str]] = {}
    for r in routes:
        by_method.setdefault(r.method, []).extend(p + r.path for p in prefixes)
    return [{"operation": {"methods": [m], "paths": sorted(p)}} for m, p in sorted(by_method.items())]


def pool_guard_config(callers: Sequence[TenantSpec], model: ModelSpec, release: "VllmRelease",
                      shared_store: Optional[tuple[str, int]] = None,
                      queue_slo_seconds: Optional[float] = None, traces: bool = False,
                      dedicated: bool = False, fallback: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The guard's config for one pool of `model`, as Platform and the package's VllmService both
    build it: the routes the release serves salted (or the picker's, behind the endpoint picker,
    each tenant bound to its own objective), the tenants' adapters, the shared limit store, and
    the path prefixes that route to the pool (`dedicated`: a tenant's own copy), and where the
    tenants it sheds go instead of a 429 (`fallback`: fallback.fallback_guard_config)."""
    picked = model.name if model.routing == "inference-gateway" else None
    routes = picker_routes() if picked else [r for r in tenant_routes() if r.path not in release.unsalted_paths]
    return guard_config(callers, routes, release.max_tokens_rule, objectives_for=picked, shared_store=shared_store,
                        served=model,
                        max_body_bytes=PICKER_REENCODING_GROWTH * picker_max_body_bytes(model) if picked
                        else guard_max_body_bytes(model),
                        cache_salt_paths=release.cache_salt_paths, queue_slo_seconds=queue_slo_seconds,
                        traces=traces, path_prefixes=pool_prefixes(model, callers, dedicated), fallback=fallback)
