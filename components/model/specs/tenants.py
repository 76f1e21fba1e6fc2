"""Tenants: their issuer, caps, rate limits (per replica or in the shared store), dedicated
replicas and priority."""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import urlsplit

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
)

from ..issuers import shared_public_issuer
from .base import (
    HOSTNAME,
    ImageRef,
    Name,
    Spec,
)

# A Google service account's email: a user-managed one (6-30 characters, then the project id), the
# Compute Engine default or the App Engine default. Cloud Run's invoker binding and the verified
# token's email claim spell it in lower case.
SERVICE_ACCOUNT = re.compile(r"^(?:[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com"
                             r"|[0-9]{1,20}-compute@developer\.gserviceaccount\.com"
                             r"|[a-z][a-z0-9-]{4,28}[a-z0-9]@appspot\.gserviceaccount\.com)$")


def _subject(value: str) -> str:
    # Istio splits a request principal at its last '/' and reads a leading or trailing '*' as a
    # wildcard (pilot/pkg/security/authz/model/generator.go): neither could be matched exactly.
    if not value or len(value) > 255 or "/" in value or value.startswith("*") or value.endswith("*") \
            or not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError(f"'{value}' cannot be matched exactly as a request principal: a subject (the token's "
                         "sub) is 1-255 printable characters without spaces, '/' or a leading or trailing '*'")
    return value


class JwtSpec(Spec):
    # The JWT issuer (iss) of the tenant's tokens, an https URL, exactly as the tokens carry it
    # (a trailing '/', as Auth0's, included).
    issuer: str
    # Where the issuer's signing keys are (https).
    jwks_uri: str
    # Required: without audiences the mesh accepts a token the issuer minted for any other service.
    audiences: list[str] = Field(min_length=1)
    # The token subjects (sub) that are this tenant; none: every subject of the issuer. Required
    # on an issuer anyone can get tokens from (accounts.google.com: a service account's uniqueId).
    subjects: Optional[list[str]] = Field(default=None, min_length=1, validate_default=True)

    @field_validator("issuer", "jwks_uri")
    @classmethod
    def _https(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme != "https" or not parts.hostname or not HOSTNAME.match(parts.hostname) \
                or any(c.isspace() for c in v) or parts.query or parts.fragment:
            raise ValueError(f"'{v}' must be an https:// URL with a DNS host and no query or fragment")
        # Verbatim: the mesh compares the token's iss with it byte for byte (a '/' more or less fails).
        return v

    @field_validator("subjects")
    @classmethod
    def _listed(cls, v: Optional[list[str]], info: ValidationInfo) -> Optional[list[str]]:
        issuer = info.data.get("issuer")
        if v is None:
            if issuer and shared_public_issuer(issuer):
                raise ValueError(f"'{issuer}' issues tokens to anyone who asks (any account, any audience), so "
                                 "its tokens alone would make anyone this tenant; list the tenant's token subjects "
                                 "(sub; for a Google service account its uniqueId) under jwt.subjects, or use an "
                                 "issuer of the tenant's own")
            return v
        for s in v:
            _subject(s)
        if dupes := sorted({s for s in v if v.count(s) > 1}):
            raise ValueError(f"subjects {dupes} are listed more than once")
        return v


class RateLimitSpec(Spec):
    # Requests admitted per tenant in any 60 seconds: per replica, or across all replicas with
    # vllm-gke:globalLimits enabled (each replica's own count is then the fallback).
    requests_per_minute: int = Field(ge=1)
    # Generated tokens per tenant in any 60 seconds, across all replicas (needs globalLimits, and
    # at least the tenant's maxTokens): each request counts what it may make vLLM generate (its
    # bound under maxTokens).
    tokens_per_minute: Optional[int] = Field(default=None, ge=1)


class GlobalLimitsSpec(Spec):
    """One shared store of the tenants' sliding windows, so limits hold across replicas."""

    # Count requests and tokens per tenant across all replicas (an in-cluster Redis, reached
    # over the mesh's mTLS: only the vLLM pods' identities may connect; no password exists).
    enabled: bool = False
    # The store's image.
    image: ImageRef = Field(default_factory=lambda: ImageRef(repository="mirror.gcr.io/library/redis", tag="7.4.2-alpine"))


class DedicatedSpec(Spec):
    """Models a tenant gets its own replicas of, on its own (often MIG) node pool."""

    # Models the tenant gets its own replicas of.
    models: list[Name] = Field(min_length=1)
    # Node pool of those replicas.
    node_pool: Name


class TenantSpec(Spec):
    # Tenant name; its namespace is tenant-<name>.
    name: Name
    # How the tenant's tokens are verified.
    jwt: JwtSpec
    # Models the tenant may call.
    models: list[Name] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, v: list[str]) -> list[str]:
        dupes = sorted({m for m in v if v.count(m) > 1})
        if dupes:
            raise ValueError(f"models {dupes} are listed more than once")
        return v

    # The tenant's request rate limit.
    rate_limit: RateLimitSpec
    # Most tokens one request may make vLLM generate (all sequences together).
    max_tokens: int = Field(ge=1, le=131072)
    # Replicas of the tenant's own.
    dedicated: Optional[DedicatedSpec] = None
    # Priority of the tenant's requests (-100 to 100, default 0). In the in-server guard, a
    # negative one is shed (429 with Retry-After) while a replica's queue time is over
    # monitoring.queueLatencySloSeconds, the most negative tier first; 0 and above never are.
    # On models with routing: inference-gateway it is also the tenant's InferenceObjective's
    # (llm-d-router v0.10.0, picker.flowControl on): each distinct priority is a band of the
    # picker's queue; while the pool is saturated the highest band is dispatched first
    # (processor.go:402-414), the tenants of one band in turn (round robin over their fairness
    # ids), first come first served within a tenant. A full band or a wait past
    # picker.flowControl.queueTtlSeconds answers 429, 503 while the pool has no replica
    # (requestcontrol/admission.go:240-285); negative bands have picker.flowControl's small
    # sheddable bounds, so they are shed first. With flow control off, only negative ones are
    # shed (429 while saturated) and positive ones change nothing.
    priority: int = Field(default=0, ge=-100, le=100)
    # Google service accounts (emails) that are this tenant on the Cloud Run models whose auth is iam
    # (cloudRun.models[].auth): each gets roles/run.invoker on the services of those models it lists,
    # Cloud Run verifies the account's Google ID token (asked for with its email claim), and the guard
    # maps the verified account to this tenant. An account is one tenant's.
    cloud_run_invokers: list[str] = Field(default_factory=list)

    @field_validator("cloud_run_invokers")
    @classmethod
    def _service_accounts(cls, v: list[str]) -> list[str]:
        for email in v:
            if not SERVICE_ACCOUNT.match(email):
                raise ValueError(f"'{email}' is not a service account's email (<name>@<project>.iam.gserviceaccount.com, "
                                 "<number>-compute@developer.gserviceaccount.com or <project>@appspot.gserviceaccount.com, "
                                 "lower case)")
        if dupes := sorted({e for e in v if v.count(e) > 1}):
            raise ValueError(f"accounts {dupes} are listed more than once")
        return v
