"""TenantAuth: a tenant's namespace, its JWT issuer, and who may call which model.

Shared models serve every tenant from the serving namespace; a tenant's JWT issuer is
trusted there and an AuthorizationPolicy per allowed model admits only that issuer's
principals. Dedicated models run in the tenant's own namespace, which gets the same
RequestAuthentication and a default deny. The verified issuer is copied into a header the
in-server guard keys the tenant's max_tokens cap and rate limit on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.k8s_meta import MODEL_LABEL, TENANT_LABEL, custom_resource, meta
from components.mesh_namespace import ISTIO_API, MeshNamespace, MeshNamespaceArgs, TrustedSources
from components.options import child_opts
from components.specs import TenantSpec

ISSUER_HEADER = "x-vllm-gke-issuer"


def tenant_namespace(tenant: TenantSpec) -> str:
    return f"tenant-{tenant.name}"


def jwks_host(tenant: TenantSpec) -> str:
    from urllib.parse import urlsplit

    return urlsplit(tenant.jwt.jwks_uri).hostname or ""


def guard_entry(tenant: TenantSpec) -> dict[str, Any]:
    """What the in-server guard enforces for requests carrying this tenant's verified issuer."""
    return {tenant.jwt.issuer: {"tenant": tenant.name, "maxTokens": tenant.max_tokens,
                                "requestsPerMinute": tenant.rate_limit.requests_per_minute}}


@dataclass
class TenantAuthArgs:
    tenant: TenantSpec
    provider: k8s.Provider
    serving_namespace: pulumi.Input[str]
    # Models the tenant reaches in the shared serving namespace (dedicated ones excluded).
    shared_models: Sequence[str]
    sources: TrustedSources = TrustedSources()


class TenantAuth(pulumi.ComponentResource):
    namespace: MeshNamespace

    def __init__(self, name: str, args: TenantAuthArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:TenantAuth", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        tenant = args.tenant
        labels = {TENANT_LABEL: tenant.name}
        self.namespace = MeshNamespace(
            f"{name}-ns", MeshNamespaceArgs(tenant_namespace(tenant), args.provider, labels, args.sources,
                                            jwks_hosts=[jwks_host(tenant)]),
            opts=child_opts(self, opts))
        principals = [f"{tenant.jwt.issuer}/*"]

        def request_authentication(resource: str, namespace: pulumi.Input[str]) -> None:
            rule: dict[str, Any] = {
                "issuer": tenant.jwt.issuer,
                "jwksUri": tenant.jwt.jwks_uri,
                "forwardOriginalToken": False,
                # Istio overwrites any client-sent copy of this header with the verified claim.
                "outputClaimToHeaders": [{"header": ISSUER_HEADER, "claim": "iss"}],
            }
            if tenant.jwt.audiences:
                rule["audiences"] = list(tenant.jwt.audiences)
            custom_resource(resource, ISTIO_API, "RequestAuthentication",
                            {**meta(f"jwt-{tenant.name}", labels=labels), "namespace": namespace},
                            {"jwtRules": [rule]}, k8s_opts)

        def allow(resource: str, policy_name: str, namespace: pulumi.Input[str],
                  selector: Optional[dict[str, str]]) -> None:
            spec: dict[str, Any] = {
                "action": "ALLOW",
                "rules": [{"from": [{"source": {"requestPrincipals": principals}}],
                           "to": [{"operation": {"paths": ["/v1/*"], "methods": ["GET", "POST"]}}]}],
            }
            if selector:
                spec["selector"] = {"matchLabels": selector}
            custom_resource(resource, ISTIO_API, "AuthorizationPolicy",
                            {**meta(policy_name, labels=labels), "namespace": namespace}, spec, k8s_opts)

        # The tenant's own namespace: its dedicated replicas, or nothing but the deny-all.
        request_authentication(f"{name}-jwt", self.namespace.name)
        allow(f"{name}-allow", f"allow-{tenant.name}", self.namespace.name,
              {TENANT_LABEL: tenant.name})
        # The shared serving namespace: one allow per model the tenant may call.
        if args.shared_models:
            request_authentication(f"{name}-jwt-shared", args.serving_namespace)
        for model in args.shared_models:
            allow(f"{name}-allow-{model}", f"allow-{tenant.name}-{model}", args.serving_namespace,
                  {MODEL_LABEL: model})

        self.register_outputs({"namespace": self.namespace.name, "issuer": tenant.jwt.issuer,
                               "sharedModels": list(args.shared_models)})
