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
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .mesh_namespace import ISTIO_API, MeshNamespace, MeshNamespaceArgs, TrustedSources
from .model.config_rules.components import check_tenant_auth
from .model.disaggregation_cluster import role_selector
from .model.k8s_objects import MODEL_LABEL, TENANT_LABEL
from .model.mesh_identity import jwks_host, server_accounts, tenant_namespace
from .model.serving_api import Route, objective_name, tenant_routes
from .model.specs import TenantSpec
from .model.tenant_policies import allow_tenant, jwt_rules
from .options import child_opts


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
    # The tenant's token stays on its requests to the shared servers (RequestAuthentication
    # forwardOriginalToken), so a replica shedding it can send the request on to a fallback model,
    # whose sidecar verifies the token again (model/fallback.py forwards_token).
    forward_token: bool = False
    # Disaggregated models among picker_models: the decode pod's P/D front takes the prefix off before the
    # routing sidecar, whose prefill leg reaches the prefill pods at the bare path (/v1/...).
    disaggregated_models: Sequence[str] = ()


class TenantAuth(pulumi.ComponentResource):
    namespace: MeshNamespace

    def __init__(self, name: str, args: TenantAuthArgs, opts: Optional[pulumi.ResourceOptions] = None):
        check_tenant_auth(args.shared_models, args.picker_models)
        super().__init__("vllm-gke:index:TenantAuth", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        tenant = args.tenant
        self.namespace = MeshNamespace(
            f"{name}-ns", MeshNamespaceArgs(tenant_namespace(tenant), args.provider, args.sources,
                                            labels={TENANT_LABEL: tenant.name}, jwks_hosts=[jwks_host(tenant)],
                                            service_accounts=server_accounts(tenant) if args.service_accounts is None
                                            else args.service_accounts),
            opts=child_opts(self, opts))
        # The tenant's own namespace: its dedicated replicas at /<tenant>/<model>/v1, or nothing but
        # the deny-all (without dedicated models its own prefix stands in: no pod there serves it).
        self._policy(f"{name}-jwt", "RequestAuthentication", f"jwt-{tenant.name}", self.namespace.name,
                     jwt_rules(tenant), tenant, k8s_opts)
        dedicated = list(tenant.dedicated.models) if tenant.dedicated else []
        self._policy(f"{name}-allow", "AuthorizationPolicy", f"allow-{tenant.name}", self.namespace.name,
                     allow_tenant(tenant, args.routes, [f"/{tenant.name}/{m}" for m in dedicated] or [f"/{tenant.name}"],
                                  {TENANT_LABEL: tenant.name}), tenant, k8s_opts)
        self._shared(name, args, k8s_opts)
        self.register_outputs({"namespace": self.namespace.name, "issuer": tenant.jwt.issuer,
                               "sharedModels": list(args.shared_models)})

    def _shared(self, name: str, args: TenantAuthArgs, opts: pulumi.ResourceOptions) -> None:
        """The shared serving namespace: the tenant's issuer trusted, one allow per model it may call."""
        tenant = args.tenant
        if args.shared_models:
            self._policy(f"{name}-jwt-shared", "RequestAuthentication", f"jwt-{tenant.name}", args.serving_namespace,
                         jwt_rules(tenant, args.forward_token), tenant, opts)
        for model in args.shared_models:
            picked = model in args.picker_models
            # The prefixes serving_api.path_prefix gives: /<model>, behind the picker /<tenant>/<model>.
            spec = allow_tenant(tenant, args.routes, [f"/{tenant.name}/{model}" if picked else f"/{model}"],
                                {MODEL_LABEL: model}, objective_name(tenant.name, model) if picked else None)
            self._policy(f"{name}-allow-{model}", "AuthorizationPolicy", f"allow-{tenant.name}-{model}",
                         args.serving_namespace, spec, tenant, opts)
            if model in args.disaggregated_models:  # the prefill leg, on the prefill pods alone
                leg = allow_tenant(tenant, args.routes, [""], role_selector(model, "prefill"),
                                   objective_name(tenant.name, model))
                self._policy(f"{name}-allow-{model}-prefill", "AuthorizationPolicy",
                             f"allow-{tenant.name}-{model}-prefill", args.serving_namespace, leg, tenant, opts)

    @staticmethod
    def _policy(resource: str, kind: str, policy_name: str, namespace: pulumi.Input[str], spec: Mapping[str, Any],
                tenant: TenantSpec, opts: pulumi.ResourceOptions) -> None:
        custom_resource(resource, ISTIO_API, kind,
                        {**meta(policy_name, labels={TENANT_LABEL: tenant.name}), "namespace": namespace},
                        spec, opts)
