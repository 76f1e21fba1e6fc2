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


# Cloud Storage bucket names: 3-63 characters of lowercase letters, digits, '-', '_' (no dots
# here: dotted names are domain-verified), a letter or digit at both ends, not "goog" first.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")


def is_bucket_name(value: str) -> bool:
    return bool(_BUCKET.match(value)) and not value.startswith("goog") and "google" not in value


def bucket_name(project: str, base: str) -> str:
    """`<project>-<base>` (bucket names are global: the project makes it unique) when valid; else
    shortened with a hash of the whole."""
    candidate = f"{project}-{base}".lower()
    if is_bucket_name(candidate):
        return candidate
    digest = hashlib.sha256(candidate.encode()).hexdigest()[:8]
    shortened = f"{candidate[:63 - len(digest) - 1].rstrip('-_')}-{digest}"
    if not is_bucket_name(shortened):
        raise ValueError(f"cannot derive a bucket name from '{project}' and '{base}'")
    return shortened
