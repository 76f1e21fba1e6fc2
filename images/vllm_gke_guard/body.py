"""Request bodies: received whole (within maxBodyBytes), read for the few fields the budget needs,
and rewritten only where a bound or the tenant's cache salt must be added.

For speed (it runs in vLLM's single API-server event loop) the body is never decoded whole:
msgspec (in the vLLM image) reads small bodies into a struct of the few fields the guard needs,
and the scanner (scan.py) reads large ones while that is cheaper, msgspec (or json.loads) the
rest, so no body costs more than linear C time. The fields read are the ones Python's json.loads
(what vLLM's FastAPI uses) would give, last key winning; the bytes are left untouched unless a
bound must be added. Without msgspec: json.loads where the scanner gives up, as exact, slower.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, TypeGuard

from .asgi import Message, Receive
from .errors import Disconnected, GuardError
from .routes import OUTPUT_FIELDS, PROMPT_FIELDS
from .scan import JsonShapeError, ScanTooLong, scan_allowance, scan_object, skip_ws

COUNTED = ("n", "best_of", "max_tokens", "max_completion_tokens", "max_output_tokens", "model", "encoding_format")
# Pooling encodings whose answer has no usage in its body (vLLM 0.34 pooling/base/protocol.py,
# utils.py: "bytes" sends it in a `metadata` header, "bytes_only" nowhere): the guard, which
# reads the body's usage (usage.py), could not meter them, so tenants may not ask for them.
UNMETERED_ENCODINGS = ("bytes", "bytes_only")


class _Absent:
    """A field the body does not have (null is None: vLLM reads the two differently)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
LISTED = ("prompt", "prompt_embeds", "messages")  # the prompt lists, kept as raw JSON to count


def json_object(value: Any) -> TypeGuard[dict[str, Any]]:
    """A decoded JSON value that is an object (whose keys are strings)."""
    return isinstance(value, dict)


class Fields:
    """What the budget reads of a request body, as the scanner found it: the counted fields
    decoded (as json.loads would; ABSENT when missing), the prompt lists raw, and where the
    object closes. The msgspec reader gives its own struct with the same attributes (and no
    `close`): the common path builds one object, no dicts."""

    __slots__ = COUNTED + LISTED + ("close",)

    def __init__(self, values: list[Any], close: int):
        (self.n, self.best_of, self.max_tokens, self.max_completion_tokens, self.max_output_tokens, self.model,
         self.encoding_format, self.prompt, self.prompt_embeds, self.messages) = values
        self.close = close

    @property
    def values(self) -> dict[str, Any]:
        return present_values(self)


def present_values(fields: Any) -> dict[str, Any]:
    """The counted fields a body has, as json.loads gives them."""
    return {k: v for k in COUNTED if (v := getattr(fields, k)) is not ABSENT}


def prompt_lists(fields: Any, kind: str) -> dict[str, bytes]:
    """The raw JSON of the prompt fields a request of this kind has."""
    return {k: bytes(raw) for k in PROMPT_FIELDS.get(kind, ()) if (raw := getattr(fields, k)) is not ABSENT}


def closing_brace(fields: Any, buf: bytes) -> int:
    """Where the body's object closes: the scanner knows; for a body msgspec read (valid JSON)
    it is the last byte but trailing whitespace."""
    close = getattr(fields, "close", -1)
    return close if close >= 0 else buf.rstrip().rfind(b"}")


# A string json.loads would return as is: no escapes, no control characters.
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')


def _decode_small(raw: bytes) -> Any:
    """A scanned value as json.loads gives it, the common forms without its per-call cost."""
    if raw.isdigit():
        return int(raw)
    if raw == b"null":
        return None
    if _PLAIN_STRING.fullmatch(raw):  # json.loads decodes bytes as UTF-8 with surrogatepass
        return raw[1:-1].decode("utf-8", "surrogatepass")
    return json.loads(raw)


_WANTED = {kind: frozenset(COUNTED + PROMPT_FIELDS.get(kind, ())) for kind in OUTPUT_FIELDS}


def read_fields_by_scanning(buf: bytes, kind: str, work: Optional[list[int]] = None) -> Fields:
    lists = PROMPT_FIELDS.get(kind, ())
    spans, close = scan_object(buf, _WANTED.get(kind) or frozenset(COUNTED + lists), work)
    values = [_decode_small(buf[span[0]:span[1]]) if (span := spans.get(k)) else ABSENT for k in COUNTED]
    values += [buf[span[0]:span[1]] if k in lists and (span := spans.get(k)) else ABSENT for k in LISTED]
    return Fields(values, close)


try:  # msgspec ships in the vLLM image: C speed on small bodies, same reading as json.loads
    import msgspec

    class _Body(msgspec.Struct):
        n: Any = ABSENT
        best_of: Any = ABSENT
        max_tokens: Any = ABSENT
        max_completion_tokens: Any = ABSENT
        max_output_tokens: Any = ABSENT
        model: Any = ABSENT
        encoding_format: Any = ABSENT
        prompt: msgspec.Raw = ABSENT
        prompt_embeds: msgspec.Raw = ABSENT
        messages: msgspec.Raw = ABSENT

        @property
        def values(self) -> dict[str, Any]:
            return present_values(self)

    # The decoders are None without msgspec (below), and where a test takes them away.
    _BODY: Optional[msgspec.json.Decoder[_Body]] = msgspec.json.Decoder(_Body)
    # A list's elements, undecoded: to count them.
    _ARRAY: Optional[msgspec.json.Decoder[list[msgspec.Raw]]] = msgspec.json.Decoder(list[msgspec.Raw])

    class _AnyObject(msgspec.Struct):
        pass

    # Any JSON object: every member skipped in C.
    _OBJECT: Optional[msgspec.json.Decoder[_AnyObject]] = msgspec.json.Decoder(_AnyObject)
    # What decoding a malformed body with them raises (deep nesting is malformed too).
    DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError, RecursionError)

except ImportError:  # pragma: no cover - then json.loads where the scanner would be slow: as exact, slower
    # The one branch of two that sets them.
    _BODY = _ARRAY = _OBJECT = None  # pyright: ignore[reportConstantRedefinition]
    DECODE_ERRORS = (RecursionError,)  # pyright: ignore[reportConstantRedefinition]

# Below this size msgspec's C parser wins; above it the scanner's memchr over long strings does.
MSGSPEC_MAX_BYTES = 16 * 1024


def read_fields(buf: bytes, kind: str) -> Any:
    """Fields, or msgspec's struct with the same attributes."""
    if _BODY is None:
        try:
            return read_fields_by_scanning(buf, kind, [scan_allowance(len(buf))])
        except ScanTooLong:
            return read_fields_with_json(buf, kind)
    if len(buf) > MSGSPEC_MAX_BYTES:
        try:  # while its work stays under msgspec's (~0.3 ns a byte), the scanner is the faster
            return read_fields_by_scanning(buf, kind, [scan_allowance(len(buf))])
        except ScanTooLong:
            pass
    try:
        return _BODY.decode(buf)
    except DECODE_ERRORS as exc:  # deep nesting is malformed too
        raise JsonShapeError(str(exc)) from None


def read_fields_with_json(buf: bytes, kind: str) -> Fields:
    """Without msgspec, for what the scanner gives up on: json.loads is linear, in C."""
    try:
        doc = json.loads(buf)
    except (ValueError, RecursionError) as exc:
        raise JsonShapeError(str(exc)) from None
    if not json_object(doc):
        raise JsonShapeError("the body must be a JSON object")
    lists = PROMPT_FIELDS.get(kind, ())
    values = [doc.get(k, ABSENT) for k in COUNTED]
    values += [json.dumps(doc[k]).encode() if k in lists and k in doc else ABSENT for k in LISTED]
    return Fields(values, -1)


def is_object(buf: bytes) -> None:
    """Refuses (JsonShapeError) what is not one JSON object, in linear time."""
    if _OBJECT is None:
        try:
            scan_object(buf, frozenset(), [scan_allowance(len(buf))])
        except ScanTooLong:
            read_fields_with_json(buf, "")
        return
    try:
        _OBJECT.decode(buf)
    except DECODE_ERRORS as exc:  # deep nesting is malformed too
        raise JsonShapeError(str(exc)) from None


def prompt_count(lists: dict[str, bytes], every_item: bool = False) -> int:
    """How many prompts a request carries: a string or a token list is one, a list of them many.
    With several prompt fields (prompt and prompt_embeds) vLLM may take both: count both.
    `every_item`: each element is a prompt whatever it looks like (a chat batch's conversations).
    Counted in C where msgspec is there: a list can hold millions of elements."""
    total = 0
    for raw in lists.values():
        if raw[:1] != b"[":
            total += 1
            continue
        i = skip_ws(raw, 1)
        first = raw[i:i + 1]
        if not every_item and first not in (b'"', b"["):  # a list of token ids (or empty): one prompt
            total += 1
            continue
        if _ARRAY is None:
            try:
                count = len(json.loads(raw))
            except ValueError as exc:
                raise JsonShapeError(str(exc)) from None
        else:
            try:
                count = len(_ARRAY.decode(raw))
            except DECODE_ERRORS as exc:  # deep nesting is malformed too
                raise JsonShapeError(str(exc)) from None
        total += max(count, 1)
    return max(total, 1)


def int_member(name: str, value: int) -> bytes:
    """`"name":value`, a member add_members appends."""
    return b'"' + name.encode() + b'":' + str(value).encode()


def add_members(buf: bytes, close: int, members: bytes) -> bytes:
    """Append already-encoded members (`"a":1,"b":"x"`) as the object's last: they win over any
    earlier copy of the same keys, as json.loads (and so vLLM) reads duplicates."""
    before = buf[:close].rstrip()
    sep = b"" if before.endswith(b"{") else b","
    return before + sep + members + buf[close:]


def utf8_or_error(body: bytes) -> None:
    """Refuse a body that is not UTF-8 anywhere, also inside fields the guard does not read
    (msgspec and the scanner skip those): vLLM would fail on it later, past the guard."""
    if not body.isascii():  # the common case without a decode
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GuardError(400, f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}",
                             "invalid_encoding") from None


def fields_or_error(body: bytes, kind: str) -> Any:
    try:
        return read_fields(body, kind)
    except (JsonShapeError, ValueError) as exc:  # includes UnicodeDecodeError, JSONDecodeError
        raise GuardError(400, f"the body is not a valid JSON object: {exc}", "invalid_json") from None


def metered_or_error(fields: Any) -> None:
    """Refuse a pooling request whose answer would carry no usage for the guard to count."""
    encoding = fields.encoding_format
    if isinstance(encoding, str) and encoding in UNMETERED_ENCODINGS:
        raise GuardError(400, f"encoding_format \"{encoding}\" is not served: its answer carries no usage to "
                              "meter; use \"float\" or \"base64\"", "invalid_value", "encoding_format")


def object_or_error(body: bytes) -> None:
    try:
        is_object(body)
    except (JsonShapeError, UnicodeDecodeError, ValueError) as exc:
        raise GuardError(400, f"the body is not a JSON object: {exc}", "invalid_json") from None


# --- receiving it ----------------------------------------------------------------------------

def too_large(max_body: int) -> GuardError:
    return GuardError(413, f"request body over {max_body} bytes", "payload_too_large")


async def receive_body(receive: Receive, max_body: int, message: Optional[Message] = None) -> bytes:
    if message is None:
        message = await receive()
    if message.get("type") == "http.request" and not message.get("more_body"):  # one message: the common case
        body = message.get("body", b"")
        if len(body) > max_body:
            raise too_large(max_body)
        return body
    return await read_body(receive, message, max_body)


async def read_body(receive: Receive, message: Message, max_body: int) -> bytes:
    """The whole body, from its first message on."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message.get("type") == "http.disconnect":
            raise Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise too_large(max_body)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)
        message = await receive()
