"""A tenant's Istio policies as data: the RequestAuthentication that verifies its JWTs and the
AuthorizationPolicies that admit its principals (components/tenant_auth.py declares them)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .mesh_identity import request_principals
from .serving_api import (
    ISSUER_HEADER,
    LEGACY_OBJECTIVE_HEADER,
    OBJECTIVE_HEADER,
    SUBJECT_HEADER,
    Route,
    mesh_operations,
    picker_routes,
)
from .specs import TenantSpec


def jwt_rules(tenant: TenantSpec, forward_token: bool = False) -> dict[str, Any]:
    """The RequestAuthentication spec trusting the tenant's issuer. The token stops at the sidecar,
    but with `forward_token` (the shared servers of a tenant some replica may send to a fallback
    model, fallback.forwards_token): the replica sends it on, and the fallback's sidecar checks it."""
    rule: dict[str, Any] = {
        "issuer": tenant.jwt.issuer,
        "jwksUri": tenant.jwt.jwks_uri,
        # The one place the token is read from (Istio's default also reads an access_token query
        # parameter): the token a replica sends on from this header is the one Istio verified.
        "fromHeaders": [{"name": "Authorization", "prefix": "Bearer "}],
        "forwardOriginalToken": forward_token,
        # Istio overwrites any client-sent copy of these headers with the verified claims.
        "outputClaimToHeaders": [{"header": ISSUER_HEADER, "claim": "iss"},
                                 {"header": SUBJECT_HEADER, "claim": "sub"}],
    }
    if tenant.jwt.audiences:
        rule["audiences"] = list(tenant.jwt.audiences)
    return {"jwtRules": [rule]}


def allow_tenant(tenant: TenantSpec, routes: Sequence[Route], prefixes: Sequence[str],
                 selector: Optional[Mapping[str, str]] = None, objective: Optional[str] = None) -> dict[str, Any]:
    """The AuthorizationPolicy spec admitting the tenant's principals to `routes` under `prefixes`
    (as the Gateway forwards them: no path rewrite), on the pods of `selector`; behind the picker
    (`objective`), only what the picker serves and only with the tenant's own objective."""
    # Behind the picker, only what it serves (the guard and the route admit the same).
    rule: dict[str, Any] = {"from": [{"source": {"requestPrincipals": request_principals(tenant)}}],
                            "to": mesh_operations(picker_routes() if objective else routes, prefixes)}
    # The guard reads the tenant from this header: it must name the token's own issuer
    # when Envoy's RBAC runs (after jwt_authn wrote it), so a data plane that left a
    # client's copy in place (outputClaimToHeaders unsupported) still cannot pass one
    # tenant's token off as another's; without the header the request is refused.
    rule["when"] = [{"key": f"request.headers[{ISSUER_HEADER}]", "values": [tenant.jwt.issuer]}]
    if tenant.jwt.subjects is not None:  # the subject the guard checks, likewise
        rule["when"].append({"key": f"request.headers[{SUBJECT_HEADER}]", "values": list(tenant.jwt.subjects)})
    rules = [rule]
    if objective:
        rules = [{**rule, "when": [*rule["when"], {"key": f"request.headers[{header}]", "values": [objective]}]}
                 for header in (OBJECTIVE_HEADER, *([LEGACY_OBJECTIVE_HEADER] if LEGACY_OBJECTIVE_HEADER else []))]
        # One release: the move from bf329cd's routes (issue 39); drop next release. The second rule
        # admits the same principals with the same objective under the header those routes matched
        # (the identity extension strips it once it runs); the guard then requires that value too.
    spec: dict[str, Any] = {"action": "ALLOW", "rules": rules}
    if selector:
        spec["selector"] = {"matchLabels": dict(selector)}
    return spec
