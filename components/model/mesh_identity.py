"""Who is who to the mesh: a tenant's namespace and JWT issuer, the service accounts a consumer
namespace holds, and the principals the mesh's AuthorizationPolicies name."""

from __future__ import annotations

from urllib.parse import urlsplit

from .specs import TenantSpec
from .weights_layout import SERVER_SA

# The standbys' own service account (MeshNamespace makes it): no grant names it.
STANDBY_SA = "vllm-standby"


def tenant_namespace(tenant: TenantSpec) -> str:
    return f"tenant-{tenant.name}"


def jwks_host(tenant: TenantSpec) -> str:
    return urlsplit(tenant.jwt.jwks_uri).hostname or ""


def request_principals(tenant: TenantSpec) -> list[str]:
    """Who the tenant is to the mesh: `<iss>/<sub>` of each listed subject, else any subject of its
    issuer. Istio splits each at its last '/' and matches iss and sub exactly (the issuer verbatim,
    a trailing '/' included), a '*' at either end of the value as a wildcard."""
    subjects = tenant.jwt.subjects
    return [f"{tenant.jwt.issuer}/{s}" for s in subjects] if subjects is not None else [f"{tenant.jwt.issuer}/*"]


def server_accounts(tenant: TenantSpec) -> tuple[str, ...]:
    """The service accounts a tenant's namespace holds: its dedicated servers' and standbys'."""
    return (SERVER_SA, STANDBY_SA) if tenant.dedicated else ()


def client_principal(namespace: str, service_account: str = SERVER_SA) -> str:
    """The mesh identity of pods in `namespace` running as `service_account`, in any trust domain
    (Cloud Service Mesh's is <project>.svc.id.goog)."""
    return f"*/ns/{namespace}/sa/{service_account}"
