"""The extension's config (components/model/identity_extension.py writes it): JSON from the file
IDENTITY_CONFIG names (the ConfigMap's key) or the variable's value itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class TenantJwt:
    name: str
    issuer: str
    jwks_uri: str
    audiences: tuple[str, ...]
    # None: every subject of the issuer is the tenant.
    subjects: Optional[frozenset[str]]


@dataclass(frozen=True)
class PickerPrefix:
    """/<tenant>/<model>: a tenant's URL of a model behind an endpoint picker."""

    tenant: str
    objective: str
    # The tenant's prefix-cache salt (serving_api.cache_salt), set in the body on `salted_paths`
    # ('/v1/...' under the prefix); None: no body is read here.
    salt: Optional[str] = None
    salted_paths: frozenset[str] = frozenset()
    # The largest Content-Length the picker's route admits (gateway_routes.picker_rules): larger
    # bodies, or none declared, are refused before any byte of them is read.
    max_body_bytes: int = 0
    # A disaggregated model's URL: a body arriving where it is not read (the header chain, while GKE has
    # not yet programmed the body chain's match for it) could carry kv_transfer_params unread: refused.
    disaggregated: bool = False


@dataclass(frozen=True)
class Config:
    tenants: Mapping[str, TenantJwt]
    prefixes: Mapping[str, PickerPrefix]
    objective_header: str
    fairness_header: str
    tenant_header: str
    strip: tuple[str, ...]


def parse(raw: Mapping[str, Any]) -> Config:
    """The config from its JSON; a missing key is a KeyError naming it (the server exits on it)."""
    tenants = {name: TenantJwt(name, str(t["issuer"]), str(t["jwksUri"]), tuple(t["audiences"]),
                               frozenset(t["subjects"]) if t.get("subjects") is not None else None)
               for name, t in raw["tenants"].items()}
    prefixes = {p: _prefix(v) for p, v in raw["prefixes"].items()}
    if unknown := sorted({v.tenant for v in prefixes.values()} - set(tenants)):
        raise KeyError(f"prefixes name tenants with no jwt: {unknown}")
    headers = raw["headers"]
    return Config(tenants, prefixes, str(headers["objective"]).lower(), str(headers["fairness"]).lower(),
                  str(headers["tenant"]).lower(), tuple(str(h).lower() for h in headers["strip"]))


def _prefix(v: Mapping[str, Any]) -> PickerPrefix:
    salt = v.get("cacheSalt")
    if salt is not None and int(v["maxBodyBytes"]) <= 0:
        raise KeyError("maxBodyBytes: a salted prefix needs a positive body limit")
    return PickerPrefix(str(v["tenant"]), str(v["objective"]), str(salt) if salt is not None else None,
                        frozenset(str(p) for p in v.get("saltedPaths") or ()) if salt is not None else frozenset(),
                        int(v.get("maxBodyBytes") or 0), bool(v.get("disaggregated")))


def load(env: Optional[Mapping[str, str]] = None) -> Config:
    value = (env if env is not None else os.environ)["IDENTITY_CONFIG"]
    if not value.lstrip().startswith("{"):
        with open(value, encoding="utf-8") as f:
            value = f.read()
    return parse(json.loads(value))
