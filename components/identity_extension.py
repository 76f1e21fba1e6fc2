"""IdentityExtension: the tenant identity extension in front of the endpoint pickers.

GKE's load balancer calls it (a GCPRoutingExtension on the Gateway, failing closed) with every
request's headers before it selects a route; it verifies the tenant's token and sets the picker's
objective, fairness id and the verified tenant, which the picker's routes require, and removes any
copy a client sent (images/vllm_gke_identity; why: components/model/serving_api.py). On the
picker's body routes it also reads the body (bounded) and sets the tenant's cache_salt in it, so
the picker's prefix keys match the replica's salted blocks. Declares its
config, Deployment (two replicas on two nodes, a budget of one disruption, non-root on a read-only
filesystem, outside the mesh), Service, the load balancer's health check of it, the NetworkPolicy
that admits only the load balancer's proxies and health checks, and the extension itself, as GKE's
body-based router is deployed (components/model/identity_extension.py says from where).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.identity_extension import (
    CONFIG_FILE,
    LABELS,
    NAME,
    budget_spec,
    deployment_spec,
    health_check_spec,
    ingress_spec,
    routing_extension_spec,
    service_spec,
)
from .model.k8s_objects import content_digest
from .options import child_opts


@dataclass
class IdentityExtensionArgs:
    # Its namespace: the Gateway's (an extension attaches to a Gateway of its own namespace).
    namespace: pulumi.Input[str]
    gateway: str
    image: str
    # IDENTITY_CONFIG (identity_extension.config_text).
    config: str
    provider: k8s.Provider
    # The load balancer's proxy-only subnet and health-check ranges (the only callers admitted).
    load_balancer_sources: Sequence[pulumi.Input[str]] = ()
    # One release: the move from bf329cd's routes (issue 39); drop next release. Declare the
    # GCPRoutingExtension later, with attach(after=the Gateway's routes): it strips the header
    # bf329cd's routes match, so it goes live only once the new routes (which accept it too) are in.
    defer_extension: bool = False


class IdentityExtension(pulumi.ComponentResource):
    deployment: k8s.apps.v1.Deployment
    service: k8s.core.v1.Service
    extension: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: IdentityExtensionArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:IdentityExtension", name, None, opts)
        if not args.load_balancer_sources:  # an ingress rule with no sources admits every source
            raise ValueError("IdentityExtension: load_balancer_sources (the proxy-only subnet and the health-check "
                             "ranges) are required")
        k8s_opts = child_opts(self, opts, provider=args.provider)
        metadata: k8s.meta.v1.ObjectMetaArgsDict = {**meta(NAME, labels=LABELS), "namespace": args.namespace}
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=metadata, data={CONFIG_FILE: args.config},
                                       opts=k8s_opts)
        k8s.networking.v1.NetworkPolicy(f"{name}-ingress", metadata=metadata,
                                        spec=api_body(ingress_spec(args.load_balancer_sources)), opts=k8s_opts)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=metadata,
            spec=api_body(deployment_spec(args.image, content_digest(args.config))),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config]))
        k8s.policy.v1.PodDisruptionBudget(f"{name}-budget", metadata=metadata, spec=api_body(budget_spec()),
                                          opts=k8s_opts)
        self.service = k8s.core.v1.Service(f"{name}-svc", metadata=metadata, spec=api_body(service_spec()),
                                           opts=k8s_opts)
        custom_resource(f"{name}-hc", "networking.gke.io/v1", "HealthCheckPolicy", metadata, health_check_spec(),
                        child_opts(self, opts, provider=args.provider, depends_on=[self.service]))
        self._name, self._args, self._opts, self._metadata = name, args, opts, metadata
        if not args.defer_extension:
            self.attach()
        self.register_outputs({"extension": NAME})

    def attach(self, after: Sequence[pulumi.Resource] = ()) -> k8s.apiextensions.CustomResource:
        """The GCPRoutingExtension, only once its pods answer (from then on every request of the Gateway
        goes through it) and once `after` is in place."""
        args = self._args
        self.extension = custom_resource(
            f"{self._name}-extension", "networking.gke.io/v1", "GCPRoutingExtension", self._metadata,
            routing_extension_spec(args.gateway, json.loads(args.config)),
            child_opts(self, self._opts, provider=args.provider, depends_on=[self.service, self.deployment, *after]))
        return self.extension
