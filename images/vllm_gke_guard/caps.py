"""The cap on what one request can make vLLM generate: per-sequence max tokens (resolved as the
pinned vLLM resolves them) x max(n, best_of) x number of prompts. A missing bound is set to what
the tenant's cap allows, a larger one refused, with the reason vLLM would give for a bad value."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from .body import ABSENT, prompt_count, prompt_lists
from .errors import GuardError
from .routes import COMPLETIONS_DEFAULT_MAX_TOKENS, OUTPUT_FIELDS, PROMPT_FIELDS


def as_int(value: Any, field: str, allow_none: bool = True) -> Optional[int]:
    """pydantic's lax int, as vLLM's request models take it: ints, integral floats, integer
    strings and booleans; anything else is refused here with the reason vLLM would give."""
    if type(value) is int:  # the common case first
        return value
    if value is None:
        if allow_none:
            return None
        raise GuardError(400, f"{field} must be an integer, not null", "invalid_type", field)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise GuardError(400, f"{field} must be an integer, not {json.dumps(value)[:40]}", "invalid_type", field)


class Budget:
    """The output bound of one request: per-sequence tokens x sequences."""

    __slots__ = ("kind", "sequences", "per_sequence", "param")

    def __init__(self, kind: str, fields: Any, rule: str):
        self.kind = kind
        n, best_of = fields.n, fields.best_of
        n = 1 if n is ABSENT else as_int(n, "n") or 1
        best_of = 1 if best_of is ABSENT else as_int(best_of, "best_of") or 1
        prompts = prompt_count(prompt_lists(fields, kind), every_item=kind == "chat_batch") \
            if kind in PROMPT_FIELDS else 1
        self.sequences = (n if n > best_of else best_of) * prompts
        if self.sequences < 1:
            raise GuardError(400, "n and best_of must be at least 1", "invalid_value", "n")
        if kind == "chat" or kind == "chat_batch":
            mct, mt = fields.max_completion_tokens, fields.max_tokens
            mct = None if mct is ABSENT else as_int(mct, "max_completion_tokens")
            mt = None if mt is ABSENT else as_int(mt, "max_tokens")
            # vLLM <= 0.1x: `max_completion_tokens or max_tokens` (0 falls through);
            # later: max_completion_tokens unless None. "both": bound under either reading.
            not_none = mct if mct is not None else mt
            if rule == "not-none":
                self.per_sequence = [not_none]
            elif rule == "or" or mct:  # a non-zero max_completion_tokens: both readings agree
                self.per_sequence = [mct or mt]
            else:
                self.per_sequence = [mct or mt, not_none]
            self.param = "max_completion_tokens" if mct is not None else "max_tokens"
        elif kind == "completions":
            mt = fields.max_tokens
            mt = COMPLETIONS_DEFAULT_MAX_TOKENS if mt is ABSENT else as_int(mt, "max_tokens")
            self.per_sequence = [mt]
            self.param = "max_tokens"
            if rule != "not-none":
                # vLLM <= 0.1x reads `max_completion_tokens or max_tokens` for completions too (an
                # extra field its request model keeps: vllm/entrypoints/utils.py get_max_tokens).
                mct = fields.max_completion_tokens
                if mct is not ABSENT and mct is not None and type(mct) is not int:
                    # An extra field: no model converts it, and vLLM's min(int, "5") would fail
                    # with a 500. Only a JSON integer (or null) is what the engine can read.
                    raise GuardError(400, f"max_completion_tokens must be an integer, not "
                                          f"{json.dumps(mct)[:40]}", "invalid_type", "max_completion_tokens")
                mct = None if mct is ABSENT else mct
                self.per_sequence = [mct or mt] if rule == "or" else [mct or mt, mt]
                if mct:
                    self.param = "max_completion_tokens"
        else:
            self.param = OUTPUT_FIELDS[kind]
            value = getattr(fields, self.param)
            self.per_sequence = [None if value is ABSENT else as_int(value, self.param)]

    def check(self, cap: int, tenant: str) -> Optional[int]:
        """None when the request is within the cap; else the per-sequence bound to add."""
        unbounded = False
        for value in self.per_sequence:
            if value is None:
                unbounded = True
                continue
            if value < 0:
                raise GuardError(400, f"{self.param} must not be negative", "invalid_value", self.param)
            if value * self.sequences > cap:
                raise GuardError(400, (
                    f"{self.param}={value} x {self.sequences} sequence(s) would generate up to "
                    f"{value * self.sequences} tokens, over tenant '{tenant}' cap of {cap}; ask for at most "
                    f"{cap // self.sequences} per sequence"), "max_tokens_exceeded", self.param)
        if not unbounded:
            return None
        per_sequence = cap // self.sequences
        if per_sequence < 1:
            raise GuardError(400, f"{self.sequences} sequences exceed tenant '{tenant}' cap of {cap} tokens",
                             "max_tokens_exceeded", "n")
        return per_sequence
