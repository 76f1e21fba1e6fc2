"""The top-level JSON scanner: where a body's wanted fields are, without decoding the rest.

For large bodies, while that is cheaper than msgspec: strings are skipped with memchr (bytes.find),
runs without quotes or brackets hopped over with one bounded regex call, so a long prompt costs
little. Each step is paid out of a work allowance; a body with so many strings, escapes or brackets
that msgspec's linear C parser would be faster raises ScanTooLong, and the caller decodes it that
way instead: no body costs more than linear C time. Fields are found as Python's json.loads (what
vLLM's FastAPI uses) finds them, last key winning.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Optional


class JsonShapeError(ValueError):
    pass


_WS = frozenset(b" \t\n\r")
_WS_RUN = re.compile(rb"[ \t\n\r]*")
# Runs the scanner can hop over in one C call: anything but quotes and brackets, and short
# strings without escapes (sre walks strings at ~4 ns a byte, memchr far faster: long or
# escaped strings are left to _skip_string).
# Bounded, so that no single call can run long (sre takes ~100 ns an iteration of a group, and
# a body can be one long run of digits or short strings): the caller loops, spending its work.
_BULK = re.compile(rb'(?:[^"\[\]{}]{1,4096}|"[^"\\]{0,64}"){0,16}')
# A key without escapes, the colon and the whitespace around them.
_KEY = re.compile(rb'[ \t\n\r]*"([^"\\]*)"[ \t\n\r]*:[ \t\n\r]*')
_SCALAR = re.compile(rb"[^,\]}\s]+")
# A whole member with a scalar or short string value and what follows it, in one C call.
_MEMBER = re.compile(rb'[ \t\n\r]*"([^"\\]*)"[ \t\n\r]*:[ \t\n\r]*'
                     rb'(-?[0-9][0-9.eE+-]*|true|false|null|"[^"\\]{0,64}")[ \t\n\r]*([,}])')
_AFTER = re.compile(rb"[ \t\n\r]*([,}])")


def skip_ws(buf: bytes, i: int) -> int:
    if i < len(buf) and buf[i] in _WS:  # a regex call only where there is whitespace
        return _WS_RUN.match(buf, i).end()  # pyright: ignore[reportOptionalMemberAccess]  (a * pattern matches)
    return i


class ScanTooLong(Exception):
    """The scanner's work allowance ran out: the body has so many strings, escapes or brackets
    that msgspec's linear C parser is faster; the caller decodes it that way instead. Without
    an allowance a body of escaped quotes costs the scanner ~100 ms a MB of event-loop time."""


def _spend(work: list[int], steps: int = 1) -> None:
    work[0] -= steps
    if work[0] < 0:
        raise ScanTooLong()


def _skip_string(buf: bytes, i: int, work: list[int]) -> int:
    """Index after the closing quote of the string opening at buf[i]."""
    j = i + 1
    while True:
        q = buf.find(b'"', j)
        if q < 0:
            raise JsonShapeError("unterminated string")
        if buf[q - 1] != 0x5C:  # not escaped: the common case
            return q + 1
        k, lowest = q - 1, q - 1 - work[0]
        while buf[k] == 0x5C:  # backslash
            k -= 1
            if k < lowest:
                raise ScanTooLong()
        _spend(work, q - k)
        if (q - 1 - k) % 2 == 0:
            return q + 1
        j = q + 1


def _skip_container(buf: bytes, i: int, work: list[int]) -> int:
    depth = 0
    pos = i
    n = len(buf)
    while True:
        end = _BULK.match(buf, pos).end()  # pyright: ignore[reportOptionalMemberAccess]  (a {0,16} pattern matches)
        work[0] -= 1 + ((end - pos) >> 7)  # _spend, inline
        if work[0] < 0:
            raise ScanTooLong()
        pos = end
        if pos >= n:
            raise JsonShapeError("unterminated array or object")
        c = buf[pos]
        if c == 0x22:
            pos = _skip_string(buf, pos, work)
            continue
        if c == 0x5B or c == 0x7B:
            depth += 1
        elif c == 0x5D or c == 0x7D:
            depth -= 1
        else:
            continue  # _BULK stopped at its bound
        pos += 1
        if depth == 0:
            return pos
        if depth < 0:
            raise JsonShapeError("unbalanced brackets")


def _skip_value(buf: bytes, i: int, work: list[int]) -> int:
    if i >= len(buf):
        raise JsonShapeError("missing value")
    c = buf[i]
    if c == 0x22:
        return _skip_string(buf, i, work)
    if c in (0x5B, 0x7B):
        return _skip_container(buf, i, work)
    m = _SCALAR.match(buf, i)
    if m is None:
        raise JsonShapeError("missing value")
    return m.end()


def _slow_key(buf: bytes, i: int, work: list[int]) -> tuple[str, int]:
    """A key with escapes (decoded exactly as json.loads does) and where its value starts."""
    i = skip_ws(buf, i)
    if buf[i:i + 1] != b'"':
        raise JsonShapeError("expected a key")
    end = _skip_string(buf, i, work)
    key = json.loads(buf[i:end])
    i = skip_ws(buf, end)
    if buf[i:i + 1] != b":":
        raise JsonShapeError("expected ':'")
    return key, skip_ws(buf, i + 1)


def scan_object(buf: bytes, wanted: frozenset[str], work: Optional[list[int]] = None) \
        -> tuple[dict[str, tuple[int, int]], int]:
    """Spans of the wanted top-level fields (the last occurrence, as json.loads keeps) and the
    index of the object's closing brace. Anything that is not one JSON object is refused.
    `work`: [steps allowed] (ScanTooLong past it); no limit by default."""
    if work is None:
        work = [sys.maxsize]
    i = skip_ws(buf, 0)
    if buf[i:i + 1] != b"{":
        # Also refuses what json.loads would decode as UTF-16/32 or with a BOM.
        raise JsonShapeError("the body must be a JSON object")
    spans: dict[str, tuple[int, int]] = {}
    i = skip_ws(buf, i + 1)
    if buf[i:i + 1] == b"}":
        close = i
    else:
        while True:
            work[0] -= 1  # _spend, inline
            if work[0] < 0:
                raise ScanTooLong()
            m = _MEMBER.match(buf, i)
            if m is not None:  # the common small member
                key = m.group(1).decode("utf-8")
                if key in wanted:
                    spans[key] = m.span(2)
                if m.group(3) == b"}":
                    close = m.end() - 1
                    break
                i = m.end()
                continue
            m = _KEY.match(buf, i)
            if m is not None:
                key, start = m.group(1).decode("utf-8"), m.end()
            else:
                key, start = _slow_key(buf, i, work)
            end = _skip_value(buf, start, work)
            if key in wanted:
                spans[key] = (start, end)
            after = _AFTER.match(buf, end)
            if after is None:
                raise JsonShapeError("expected ',' or '}'")
            if after.group(1) == b"}":
                close = after.end() - 1
                break
            i = after.end()
    if close + 1 != len(buf) and buf[close + 1:].strip(b" \t\n\r"):
        raise JsonShapeError("data after the JSON object")
    return spans, close


def scan_allowance(size: int) -> int:
    """Scanner steps (~0.25 us each) worth spending on a body before msgspec would have been faster."""
    return 64 + size // 1024
