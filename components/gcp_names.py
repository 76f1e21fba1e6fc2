"""Names GCP will accept, derived from config names (which are at most 32 characters)."""

from __future__ import annotations

import hashlib
import re

_SERVICE_ACCOUNT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")


def service_account_id(base: str, role: str) -> str:
    """`<base>-<role>` when that is a valid service account id (6-30 characters, a letter first,
    a letter or digit last); else the base shortened and made unique with a hash of the whole."""
    candidate = f"{base}-{role}"
    if _SERVICE_ACCOUNT_ID.match(candidate):
        return candidate
    digest = hashlib.sha256(candidate.encode()).hexdigest()[:6]
    room = 30 - len(role) - len(digest) - 2
    shortened = f"{base[:room].rstrip('-')}-{digest}-{role}"
    if not _SERVICE_ACCOUNT_ID.match(shortened):
        raise ValueError(f"cannot derive a service account id from '{base}' and '{role}'")
    return shortened


def is_service_account_id(value: str) -> bool:
    return bool(_SERVICE_ACCOUNT_ID.match(value))
