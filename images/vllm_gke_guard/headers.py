"""The few request headers the guard reads: the verified issuer and subject (Istio sets them from the JWT), the
objective the route set behind the endpoint picker, the body's type and length, and the
entrypoint's warm-up token. Each must come once: a repeated one is not trusted."""

from __future__ import annotations

import hmac
from typing import Iterable, Optional

from .errors import GuardError

WARMUP_HEADER = b"x-gke-llm-warmup"

# Which of Headers' values a header sets (the issuer and objective names come from config).
ISSUER, OBJECTIVE, CONTENT_TYPE, CONTENT_LENGTH, WARMUP, SUBJECT = range(6)


def header_slots(issuer_header: bytes, objective_header: bytes = b"", subject_header: bytes = b"") -> dict[bytes, int]:
    slots = {b"content-type": CONTENT_TYPE, b"content-length": CONTENT_LENGTH, WARMUP_HEADER: WARMUP}
    if objective_header:
        slots[objective_header] = OBJECTIVE
    if subject_header:
        slots[subject_header] = SUBJECT
    slots[issuer_header] = ISSUER  # set last: it wins should config name a standard header
    return slots


class Headers:
    """The few request headers the guard reads, in one pass with one dict lookup a header (this
    runs on every request): the first value of each, and which of them came more than once."""

    __slots__ = ("issuer", "objective", "content_type", "content_length", "warmup", "subject", "repeated")

    def __init__(self, headers: Iterable[tuple[bytes, bytes]], slots: dict[bytes, int]):
        found: list[Optional[bytes]] = [None, None, None, None, None, None]
        repeated = 0
        get = slots.get
        for k, v in headers:
            i = get(k)
            if i is not None:
                if found[i] is None:
                    found[i] = v
                else:
                    repeated |= 1 << i
        self.issuer, self.objective, self.content_type, self.content_length, self.warmup, self.subject = found
        self.repeated = repeated

    def once(self, slot: int) -> Optional[bytes]:
        """The header's value if it came exactly once, else None."""
        return None if self.repeated & (1 << slot) else (self.issuer, self.objective, self.content_type,
                                                          self.content_length, self.warmup, self.subject)[slot]


def is_warmup(seen: Headers, warmup_token: bytes) -> bool:
    token = seen.once(WARMUP)
    return bool(warmup_token) and token is not None and hmac.compare_digest(token, warmup_token)


def check_content_type(seen: Headers) -> None:
    if seen.content_type is None:
        return  # FastAPI parses an untyped body as JSON
    media = seen.content_type.split(b";")[0].strip().lower()
    if seen.repeated & (1 << CONTENT_TYPE) or not (media == b"application/json" or media.endswith(b"+json")):
        raise GuardError(415, "the body must be application/json", "unsupported_media_type")
