"""ASGI middleware loaded into vLLM's OpenAI server with `--middleware vllm_gke_guard.GuardMiddleware`.

It is all that stands between a tenant and the GPUs, so it denies by default:
  - first it strips the tenant URL's prefix (/<model>/v1/..., /<tenant>/<model>/v1/...: the
    Gateway forwards the path as sent) where it is one its config's pathPrefixes names;
  - only the routes in its config pass (the tenant routes, each with its method and kind, plus
    GET /health and GET /metrics); any other path, method or a websocket gets 404/405;
  - a tenant route needs the request to have come through the pod's Envoy sidecar (the peer
    address Envoy's inbound passthrough uses, 127.0.0.6) carrying exactly one verified-issuer
    header that Istio set from the JWT; no sidecar, no service. The issuer names the tenant;
    where the tenant lists subjects (jwt.subjects), the verified-subject header Istio set must
    be one of them (403 otherwise);
  - per tenant: a request rate limit (a sliding window: at most N admitted in any 60 seconds,
    exact under concurrency, from a cold start) and a cap on the tokens one request can make
    vLLM generate: per-sequence max tokens (resolved as the pinned vLLM resolves them)
    x max(n, best_of) x number of prompts. A missing bound is set to what the cap allows, a
    larger one refused;
  - per tenant, its own prefix-cache salt on every route the release salts (`cache_salt`,
    overwriting a client's): tenants on one replica share no cached prefix, so none can time
    another's prompts (vLLM documents cache_salt for exactly this);
  - per tenant and model, each admitted request's outcome and the prompt and generated tokens
    vLLM counted for it, on vLLM's /metrics (usage.py), for chargeback and the SLOs.
Errors are OpenAI-style JSON 4xx; nothing raised inside the guard escapes as a 500. A client that
disconnects mid-body gets nothing forwarded.

For speed (it runs in vLLM's single API-server event loop) the body is never decoded whole:
msgspec (in the vLLM image) reads small bodies into a struct of the few fields the guard needs,
and a scanner that skips strings with memchr reads large ones while that is cheaper, msgspec
(or json.loads) the rest, so no body costs more than linear C time. The fields read are the ones
Python's json.loads (what vLLM's FastAPI uses) would give, last key winning; the bytes are left
untouched unless a bound must be added. The common request takes a shorter path of its own.

Config: JSON in GKE_LLM_GUARD_CONFIG (see components/model/serving_api.py for the shape).
Standard library and msgspec, both in the vLLM image (without msgspec: json.loads, slower); with
globalLimits, redis-py too (the image installs it).

One module per concern (each imports the ones it needs, relatively: the package also loads as
vllm_gke.images.vllm_gke_guard):
  prefixes.py    the tenant URL's prefix, stripped before anything reads the path
  routes.py      the allow-list and what each kind of route is metered by
  headers.py     the few request headers read: issuer, subject, objective, content type and length, warm-up
  body.py        receiving a body, reading its fields (msgspec, or the scanner), rewriting it
  scan.py        the top-level JSON scanner for large bodies
  caps.py        the max_tokens cap: what one request can make vLLM generate
  models.py      LoRA adapters: the models a tenant may name and see listed
  limits.py      rate limits: each replica's windows, the glue to the shared store
  store.py       the shared limit store's client (globalLimits)
  config.py      GKE_LLM_GUARD_CONFIG, and each issuer's tenant
  errors.py      the OpenAI-style errors
  usage.py       each tenant request's outcome and tokens (vLLM's own count), for chargeback and SLOs
  overload.py    which tenants are shed while the replica's queue is over its objective
  fallback.py    a shed request sent to the stack's fallback model instead of the 429
  kv_transfer.py who may send vLLM kv_transfer_params (P/D: the routing sidecar's legs alone)
  warm.py        on Cloud Run, the startup probe's path: 503 until the entrypoint has warmed the server
  swap.py        models[].sleepMode: this server's turn on a time-shared GPU (a lease in the store)
  metrics.py     the counters on vLLM's /metrics, the log
  asgi.py        the ASGI types, the body handed on to vLLM
  middleware.py  GuardMiddleware: the order the checks run in, and the common request's short path
This module re-exports what the tests, benchmarks and vLLM's `--middleware` use.
"""

from __future__ import annotations

from .body import (
    ABSENT,
    COUNTED,
    LISTED,
    MSGSPEC_MAX_BYTES,
    Fields,
    add_members,
    closing_brace,
    int_member,
    is_object,
    present_values,
    prompt_count,
    prompt_lists,
    read_fields,
    read_fields_by_scanning,
    read_fields_with_json,
    utf8_or_error,
)
from .body import _decode_small as _decode_small  # pyright: ignore[reportPrivateUsage]  (for the tests)
from .caps import Budget, as_int
from .config import (
    CONFIG_ENV,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_TRUSTED_PEERS,
    WARMUP_TOKEN_ENV,
    Tenant,
)
from .errors import ERROR_TYPES, Disconnected, GuardError, error_body
from .headers import WARMUP_HEADER, header_slots
from .limits import WINDOW_SECONDS, SlidingTokenWindow, SlidingWindowLimiter
from .metrics import LOGGED_PEERS_MAX, STORE_FALLBACKS, UNTRUSTED_PEERS, log
from .middleware import GuardMiddleware
from .models import EMPTY_MODEL_LIST, MODEL_LIST_MAX_BYTES
from .prefixes import Prefixes
from .routes import COMPLETIONS_DEFAULT_MAX_TOKENS, OPEN_ROUTES, OUTPUT_FIELDS, PROMPT_FIELDS
from .scan import JsonShapeError, ScanTooLong, scan_allowance, scan_object

__all__ = [
    "ABSENT", "COMPLETIONS_DEFAULT_MAX_TOKENS", "CONFIG_ENV", "COUNTED", "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_TRUSTED_PEERS", "EMPTY_MODEL_LIST", "ERROR_TYPES", "LISTED", "LOGGED_PEERS_MAX", "MODEL_LIST_MAX_BYTES",
    "MSGSPEC_MAX_BYTES", "OPEN_ROUTES", "OUTPUT_FIELDS", "PROMPT_FIELDS", "STORE_FALLBACKS", "UNTRUSTED_PEERS",
    "WARMUP_HEADER", "WARMUP_TOKEN_ENV", "WINDOW_SECONDS", "Budget", "Disconnected", "Fields", "GuardError",
    "GuardMiddleware", "JsonShapeError", "Prefixes", "ScanTooLong", "SlidingTokenWindow", "SlidingWindowLimiter", "Tenant",
    "add_members", "as_int", "closing_brace", "error_body", "header_slots", "int_member", "is_object", "log",
    "present_values", "prompt_count", "prompt_lists", "read_fields", "read_fields_by_scanning",
    "read_fields_with_json", "scan_allowance", "scan_object", "utf8_or_error",
]
