"""The few request headers the guard reads: the verified issuer and subject (Istio sets them from the JWT), the
objective the route set behind the endpoint picker, the body's type and length, and the
entrypoint's warm-up token. Each must come once: a repeated one is not trusted."""

from __future__ import annotations

import hmac
from typing import Iterable, Optional

from .errors import GuardError

WARMUP_HEADER = b"x-gke-llm-warmup"

# Which of Headers' values a header sets (the issuer and objective names come from config).
ISSUER, OBJECTIVE, CONTENT_TYPE, CONTENT_LENGTH, WARMUP, SUBJECT, LEGACY_OBJECTIVE = range(7)


def header_slots(issuer_header: bytes, objective_header: bytes = b"", subject_header: bytes = b"",
                 legacy_objective_header: bytes = b"") -> dict[bytes, int]:
    slots = {b"content-type": CONTENT_TYPE, b"content-length": CONTENT_LENGTH, WARMUP_HEADER: WARMUP}
    if legacy_objective_header:  # One release: the move from bf329cd's routes (issue 39); drop next release.
        slots[legacy_objective_header] = LEGACY_OBJECTIVE
    if objective_header:
        slots[objective_header] = OBJECTIVE
    if subject_header:
        slots[subject_header] = SUBJECT
    slots[issuer_header] = ISSUER  # set last: it wins should config name a standard header
    return slots


class Headers:
    """The few request headers the guard reads, in one pass with one dict lookup a header (this
    runs on every request): the first value of each, and which of them came more than once."""

    __slots__ = ("issuer", "objective", "content_type", "content_length", "warmup", "subject", "legacy_objective",
                 "repeated")

    def __init__(self, headers: Iterable[tuple[bytes, bytes]], slots: dict[bytes, int]):
        found: list[Optional[bytes]] = [None, None, None, None, None, None, None]
        repeated = 0
        get = slots.get
        for k, v in headers:
            i = get(k)
            if i is not None:
                if found[i] is None:
                    found[i] = v
                else:
                    repeated |= 1 << i
        (self.issuer, self.objective, self.content_type, self.content_length, self.warmup, self.subject,
         self.legacy_objective) = found
        self.repeated = repeated

    def once(self, slot: int) -> Optional[bytes]:
        """The header's value if it came exactly once, else None."""
        return None if self.repeated & (1 << slot) else (self.issuer, self.objective, self.content_type,
                                                          self.content_length, self.warmup, self.subject,
                                                          self.legacy_objective)[slot]


def objective_of(seen: Headers, legacy: bool) -> Optional[bytes]:
    """The objective the request names: from the objective header, else (`legacy`: one release, the
    move from bf329cd's routes, issue 39; drop next release) from the header those routes matched;
    None where either came more than once or both came with different values."""
    if seen.repeated & ((1 << OBJECTIVE) | (1 << LEGACY_OBJECTIVE)):
        return None
    if not legacy or seen.legacy_objective is None:
        return seen.objective
    if seen.objective is not None and seen.objective != seen.legacy_objective:
        return None
    return seen.legacy_objective


def is_warmup(seen: Headers, warmup_token: bytes) -> bool:
    token = seen.once(WARMUP)
    return bool(warmup_token) and token is not None and hmac.compare_digest(token, warmup_token)


def check_content_type(seen: Headers) -> None:
    if seen.content_type is None:
        return  # FastAPI parses an untyped body as JSON
    media = seen.content_type.split(b";")[0].strip().lower()
    if seen.repeated & (1 << CONTENT_TYPE) or not (media == b"application/json" or media.endswith(b"+json")):
        raise GuardError(415, "the body must be application/json", "unsupported_media_type")
