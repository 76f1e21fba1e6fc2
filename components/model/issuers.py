"""Facts about JWT issuers: which ones anyone at all can get a token from (the model layer and the
policy pack both judge tenants by it; standard library only)."""

from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

# Issuers whose tokens anyone can get (any account, any repository, any audience they ask for:
# IAM's generateIdToken takes any audience): host -> the first path segments that make it shared
# (None: every path). A tenant on one of them is only the subjects it lists.
_SHARED_ISSUERS: dict[str, Optional[frozenset[str]]] = {
    "accounts.google.com": None,
    "appleid.apple.com": None,
    "token.actions.githubusercontent.com": None,
    "gitlab.com": None,
    "www.facebook.com": None,
    "facebook.com": None,
    # CI and infrastructure services that sign for every customer under one issuer (HCP Terraform
    # workload identity, Buildkite OIDC): the customer chooses the audience.
    "app.terraform.io": None,
    "app.eu.terraform.io": None,
    "agent.buildkite.com": None,
    # Microsoft's multi-tenant endpoints and the consumer (personal accounts) tenant.
    **dict.fromkeys(("login.microsoftonline.com", "sts.windows.net", "login.windows.net"), frozenset(
        ("common", "organizations", "consumers", "9188040d-6c67-4c5b-b112-36a304b66dad"))),
}


def shared_public_issuer(issuer: str) -> bool:
    """Whether anyone at all can obtain a token from this issuer (accounts.google.com, Microsoft's
    common endpoint, GitHub Actions...): its tokens say who, never which tenant."""
    parts = urlsplit(issuer if "://" in issuer else f"https://{issuer}")
    host = (parts.hostname or "").lower()
    if host not in _SHARED_ISSUERS:
        return False
    segments = _SHARED_ISSUERS[host]
    return segments is None or parts.path.strip("/").split("/")[0].lower() in segments
