"""kv_transfer_params: what vLLM's KV connector does with a request (vllm 0.34.0 entrypoints/openai/
chat_completion/protocol.py:523, completion/protocol.py:248, responses/protocol.py:460, anthropic/
protocol.py:337 take it from the body). Under NIXL it names a remote engine, its host and port and the
blocks to read: a client's own could make a decode pod read another tenant's prompt blocks off a prefill
pod, or connect anywhere. Only llm-d-router's routing sidecar writes them, so the guard admits them by
its config's `kvTransfer` (components/model/disaggregation_cluster.py sets it per pod role):
  - "refuse" (the default, every pod not disaggregated): any top-level kv_transfer_params is a 400;
  - "prefill-leg" (a prefill pod): only the sidecar's prefill leg, every remote field null (pkg/sidecar/
    proxy/connector_nixlv2.go:161-170 at v0.10.0), which asks the engine to keep the blocks for a reader;
  - "routing-sidecar" (a decode pod, whose guard trusts the sidecar's loopback peer alone): whatever the
    sidecar forwards; a client's copy never got that far (the identity extension refuses it).
The same keys inside `vllm_xargs` reach the engine too: vLLM builds extra_args from vllm_xargs and writes the
top-level fields over it only where they are set (chat_completion/protocol.py:785-791, completion/protocol.py:
400-406, responses/protocol.py:624-628; anthropic/protocol.py:347 takes vllm_xargs too), and the engine reads
them there (v1/request.py:123-131, v1/engine/output_processor.py:292-294). A malformed one kills the engine
core (nixl/base_scheduler.py:204-205 on a non-dict): any vllm_xargs naming them is a 400 under every policy
(the sidecar never writes vllm_xargs).
Read as vLLM reads the body (json, last key winning), with escapes in the key: a body that has neither
the key's bytes nor any escape cannot carry it, so the common body costs two memchr-speed scans."""

from __future__ import annotations

import json
from typing import Any, cast

from .errors import GuardError

KEY = "kv_transfer_params"
_KEY = b'"kv_transfer_params"'
XARGS = "vllm_xargs"
_XARGS = b'"vllm_xargs"'
# The extra_args keys vLLM's engine reads (v1/request.py:123-131): the platform's, never a client's.
ENGINE_XARGS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode")
POLICIES = ("refuse", "prefill-leg", "routing-sidecar")
# The routing sidecar's prefill leg, exactly (READ mode: no MoRI-IO fields).
PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}

try:  # in the vLLM image: the top level's keys in C, the values left raw
    import msgspec

    _TOP: Any = msgspec.json.Decoder(dict[str, msgspec.Raw])
    _ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError, RecursionError)
except ImportError:  # pragma: no cover - the image and the tests have it
    # The one branch of two that sets them.
    _TOP, _ERRORS = None, ()  # pyright: ignore[reportConstantRedefinition]


def policy_of(config: dict[str, Any]) -> str:
    value = str(config.get("kvTransfer") or "refuse")
    if value not in POLICIES:
        raise ValueError(f"kvTransfer: {value!r} is not one of {POLICIES}")
    return value


def _value(body: bytes, key: str = KEY) -> Any:
    """The body's top-level `key` as json.loads gives it; ... where it has none (or is not a JSON
    object: the body checks that follow refuse it)."""
    if _TOP is not None:
        try:
            top = _TOP.decode(body)
            return json.loads(bytes(top[key])) if key in top else ...
        except _ERRORS:
            pass  # json's reading decides (it takes a lone surrogate msgspec refuses)
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return ...
    if not isinstance(doc, dict) or key not in doc:
        return ...
    return cast(dict[str, Any], doc)[key]


def engine_xargs(body: bytes) -> list[str]:
    """The ENGINE_XARGS keys the body's vllm_xargs carries (the engine reads them as it reads the fields)."""
    if _XARGS not in body and b"\\u" not in body:
        return []
    xargs = _value(body, XARGS)
    return [k for k in ENGINE_XARGS if k in xargs] if isinstance(xargs, dict) else []


def carries(body: bytes) -> bool:
    """Whether the body has a top-level kv_transfer_params (on a decode pod: the routing sidecar's decode leg)."""
    return (_KEY in body or b"\\u" in body) and _value(body) is not ...


def check(body: bytes, policy: str) -> None:
    """GuardError 400 where the body carries kv_transfer_params the pod's policy does not admit, or any
    vllm_xargs the engine would read as the platform's (under every policy)."""
    if found := engine_xargs(body):
        raise GuardError(400, f"vllm_xargs may not carry {', '.join(found)}: the platform's routing sets them, "
                              "never a client: remove them", "kv_transfer_params_refused", XARGS)
    if policy == "routing-sidecar" or (_KEY not in body and b"\\u" not in body):
        return
    value = _value(body)
    if value is ... or (policy == "prefill-leg" and value == PREFILL_LEG):
        return
    raise GuardError(400, "kv_transfer_params is set by the platform's routing, never by a client: remove it",
                     "kv_transfer_params_refused", KEY)
