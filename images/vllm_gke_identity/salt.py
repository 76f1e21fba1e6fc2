"""A picker route's body with the verified tenant's cache_salt set, as the replica's guard sets it
(images/vllm_gke_guard: config.py's Tenant.salt, body.py's add_members): the member
`"cache_salt":<the salt as JSON>` appended as the object's last, so it wins over any copy the
client sent wherever duplicates are read last-wins (Python's json and so vLLM, Go's encoding/json
and so the endpoint picker). The salt itself is serving_api.cache_salt's, carried in the config;
tests/test_identity_extension.py checks this output against the guard's own functions, so the
guard's rewrite at the replica changes nothing the picker hashed.

Why the picker must see it: llm-d-router v0.10.0 folds the body's cache_salt into the first
block's key (pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/
blockkeys.go:78-92, prefixhash/hashing.go:95), and vLLM's blocks are salted by the guard: without
the salt in the body the picker's keys never match a salted tenant's blocks."""

from __future__ import annotations

import json
from typing import Any, Optional

# Checks a body is one JSON object without building it: the top level's members stay raw bytes
# (their syntax is still checked), where json.loads would build every string and list of the prompt
# on the event loop. The picker and the guard parse the body again anyway.
_OBJECT: Optional[Any] = None
_ERRORS: tuple[type[BaseException], ...] = ()
try:  # the image installs it (Dockerfile); without it the check is json's alone
    import msgspec

    _OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
    _ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
except ImportError:  # pragma: no cover - the tests run with it
    pass


class BadBody(ValueError):
    """Not one JSON object in UTF-8: a 400, as the guard and the picker answer."""

    code: Optional[str] = None  # the error's code (None: the status's) and the field it names
    param: Optional[str] = None


class KvTransferParams(BadBody):
    """A client's kv_transfer_params: vLLM's KV connector reads them (remote engine, host, port, blocks);
    only llm-d-router's routing sidecar on a disaggregated model's decode pod may write them (the guard
    refuses them too, on every pod the sidecar does not front). The guard's code and param."""

    code = "kv_transfer_params_refused"
    param = "kv_transfer_params"


class EngineXargs(KvTransferParams):
    """A client's vllm_xargs naming what the engine reads as the platform's: vLLM makes extra_args of
    vllm_xargs (entrypoints/openai/chat_completion/protocol.py:785-791) and the engine takes
    kv_transfer_params, ec_transfer_params and kv_cache_report_mode from it (v1/request.py:123-131);
    the guard's kv_transfer.ENGINE_XARGS, refused alike."""

    param = "vllm_xargs"


ENGINE_XARGS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode")


def _check_xargs(body: bytes) -> None:
    """EngineXargs where the (valid) body's vllm_xargs, read as vLLM reads it, names an ENGINE_XARGS key."""
    xargs = json.loads(body).get(EngineXargs.param)
    if isinstance(xargs, dict) and (found := [k for k in ENGINE_XARGS if k in xargs]):
        raise EngineXargs(f"vllm_xargs may not carry {', '.join(found)}: the platform's routing sets them, "
                          "never a client: remove them")


def _no_constant(name: str) -> Any:
    raise BadBody(f"{name} is not JSON")  # Go's encoding/json (the picker) refuses it too


def member(salt: str) -> bytes:
    """The encoded member, byte for byte the guard's (config.py: b'"cache_salt":' + json.dumps(salt))."""
    return b'"cache_salt":' + json.dumps(str(salt)).encode()


def salted(body: bytes, salt: str) -> bytes:
    """`body` with the tenant's cache_salt appended as its last member; BadBody if it is not one JSON object."""
    keys = check_object(body)
    if KvTransferParams.param in keys:
        raise KvTransferParams("kv_transfer_params is set by the platform's routing, never by a client: remove it")
    if EngineXargs.param in keys:
        _check_xargs(body)
    # A valid object's last byte but whitespace is its closing brace (the guard's closing_brace).
    close = len(body.rstrip())
    before = body[:close - 1].rstrip()
    sep = b"" if before.endswith(b"{") else b","
    return before + sep + member(salt) + body[close - 1:]


def check_object(body: bytes) -> set[str]:
    """The top level's keys (unescaped, as vLLM's json reads them); BadBody unless `body` is one JSON
    object in UTF-8 (NaN and Infinity refused, as Go's encoding/json refuses them); msgspec's verdict
    where it accepts, json's words where it does not (it also refuses a lone surrogate escape json takes)."""
    try:
        text = body.decode("utf-8")  # msgspec skips raw members without checking their UTF-8
        if _OBJECT is not None:
            try:
                return set(_OBJECT.decode(body))
            except _ERRORS:
                pass  # json says why (or accepts what msgspec alone refuses)
        doc = json.loads(text, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadBody(f"the body is not a valid JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise BadBody("the body must be a JSON object")
    return set(doc)
