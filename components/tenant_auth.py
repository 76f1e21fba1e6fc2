"""TenantAuth: a tenant's namespace, its JWT issuer, and who may call which model.

Shared models serve every tenant from the serving namespace; a tenant's JWT issuer is
trusted there and an AuthorizationPolicy per allowed model admits only that issuer's
principals (only its listed subjects', where jwt.subjects lists them). Dedicated models run in
the tenant's own namespace, which gets the same RequestAuthentication and a default deny. The
verified issuer and subject are copied into headers the in-server guard maps to the tenant (its
max_tokens cap and rate limit) and checks against its subjects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .mesh_namespace import ISTIO_API, MeshNamespace, MeshNamespaceArgs, TrustedSources
from .model.k8s_objects import MODEL_LABEL, TENANT_LABEL
from .model.serving_api import (
    ISSUER_HEADER,
    OBJECTIVE_HEADER,
    SUBJECT_HEADER,
    Route,
    mesh_operations,
    objective_name,
    picker_routes,
    tenant_routes,
)
from .model.specs import TenantSpec
from .options import child_opts


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
    from .model.weights_layout import SERVER_SA
    from .standby import STANDBY_SA

    return (SERVER_SA, STANDBY_SA) if tenant.dedicated else ()


@dataclass
class TenantAuthArgs:
    tenant: TenantSpec
    provider: k8s.Provider
    serving_namespace: pulumi.Input[str]
    # Models the tenant reaches in the shared serving namespace (dedicated ones excluded).
    shared_models: Sequence[str]
    sources: TrustedSources
    # The routes a tenant may call (the guard enforces the same list).
    routes: Sequence[Route] = tuple(tenant_routes())
    # Shared models behind the endpoint picker: the tenant is admitted only with its own objective
    # (priority), which its route /<tenant>/<model>/v1 sets; another tenant's route is refused.
    picker_models: Sequence[str] = ()
    # Service accounts of the tenant's own namespace (its dedicated servers' and standbys'); by
    # default those two where the tenant has dedicated replicas, none otherwise.
    service_accounts: Optional[Sequence[str]] = None


class TenantAuth(pulumi.ComponentResource):
    namespace: MeshNamespace

    def __init__(self, name: str, args: TenantAuthArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:TenantAuth", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        tenant = args.tenant
        labels = {TENANT_LABEL: tenant.name}
        self.namespace = MeshNamespace(
            f"{name}-ns", MeshNamespaceArgs(tenant_namespace(tenant), args.provider, args.sources, labels=labels,
                                            jwks_hosts=[jwks_host(tenant)],
                                            service_accounts=server_accounts(tenant) if args.service_accounts is None
                                            else args.service_accounts),
            opts=child_opts(self, opts))
        principals = request_principals(tenant)

        def request_authentication(resource: str, namespace: pulumi.Input[str]) -> None:
            rule: dict[str, Any] = {
                "issuer": tenant.jwt.issuer,
                "jwksUri": tenant.jwt.jwks_uri,
                "forwardOriginalToken": False,
                # Istio overwrites any client-sent copy of these headers with the verified claims.
                "outputClaimToHeaders": [{"header": ISSUER_HEADER, "claim": "iss"},
                                         {"header": SUBJECT_HEADER, "claim": "sub"}],
            }
            if tenant.jwt.audiences:
                rule["audiences"] = list(tenant.jwt.audiences)
            custom_resource(resource, ISTIO_API, "RequestAuthentication",
                            {**meta(f"jwt-{tenant.name}", labels=labels), "namespace": namespace},
                            {"jwtRules": [rule]}, k8s_opts)

        def allow(resource: str, policy_name: str, namespace: pulumi.Input[str],
                  selector: Optional[dict[str, str]], prefixes: Sequence[str], objective: Optional[str] = None) -> None:
            # Behind the picker, only what it serves (the guard and the route admit the same); each
            # route under the tenant's own prefixes, as the Gateway forwards it (no path rewrite).
            rule: dict[str, Any] = {"from": [{"source": {"requestPrincipals": principals}}],
                                    "to": mesh_operations(picker_routes() if objective else args.routes, prefixes)}
            # The guard reads the tenant from this header: it must name the token's own issuer
            # when Envoy's RBAC runs (after jwt_authn wrote it), so a data plane that left a
            # client's copy in place (outputClaimToHeaders unsupported) still cannot pass one
            # tenant's token off as another's; without the header the request is refused.
            rule["when"] = [{"key": f"request.headers[{ISSUER_HEADER}]", "values": [tenant.jwt.issuer]}]
            if tenant.jwt.subjects is not None:  # the subject the guard checks, likewise
                rule["when"].append({"key": f"request.headers[{SUBJECT_HEADER}]", "values": list(tenant.jwt.subjects)})
            if objective:
                rule["when"].append({"key": f"request.headers[{OBJECTIVE_HEADER}]", "values": [objective]})
            spec: dict[str, Any] = {"action": "ALLOW", "rules": [rule]}
            if selector:
                spec["selector"] = {"matchLabels": selector}
            custom_resource(resource, ISTIO_API, "AuthorizationPolicy",
                            {**meta(policy_name, labels=labels), "namespace": namespace}, spec, k8s_opts)

        # The tenant's own namespace: its dedicated replicas at /<tenant>/<model>/v1, or nothing but
        # the deny-all (without dedicated models its own prefix stands in: no pod there serves it).
        request_authentication(f"{name}-jwt", self.namespace.name)
        dedicated = list(tenant.dedicated.models) if tenant.dedicated else []
        allow(f"{name}-allow", f"allow-{tenant.name}", self.namespace.name,
              {TENANT_LABEL: tenant.name}, [f"/{tenant.name}/{m}" for m in dedicated] or [f"/{tenant.name}"])
        # The shared serving namespace: one allow per model the tenant may call.
        if args.shared_models:
            request_authentication(f"{name}-jwt-shared", args.serving_namespace)
        for model in args.shared_models:
            picked = model in args.picker_models
            # The prefixes serving_api.path_prefix gives: /<model>, behind the picker /<tenant>/<model>.
            allow(f"{name}-allow-{model}", f"allow-{tenant.name}-{model}", args.serving_namespace,
                  {MODEL_LABEL: model}, [f"/{tenant.name}/{model}" if picked else f"/{model}"],
                  objective_name(tenant.name, model) if picked else None)

        self.register_outputs({"namespace": self.namespace.name, "issuer": tenant.jwt.issuer,
                               "sharedModels": list(args.shared_models)})
