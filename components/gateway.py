"""Gateway: Cloud Load Balancing through the GKE Gateway API, with length-aware routing.

Each model has a short-request and a long-request pool. Its HTTPRoute sends a request to the
long pool when its body is large (Content-Length at or above the model's threshold) or the
client says so (`x-vllm-gke-length: long`), and everything else to the short pool. A 500-token
prompt therefore never queues behind, or blocks, a stream of 10-token ones - unlike round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.k8s_meta import ACCESS_LABEL, custom_resource, meta
from components.specs import GatewaySpec

GATEWAY_NAME = "vllm"
LENGTH_HINT_HEADER = "x-vllm-gke-length"


def at_least_regex(n: int) -> str:
    """An RE2 pattern matching exactly the decimal integers >= n (no leading zeros)."""
    digits = str(n)
    width = len(digits)
    alternatives = [f"[1-9][0-9]{{{width},}}"]  # more digits than n
    alternatives.append(digits)
    for i in range(width - 1, -1, -1):
        d = int(digits[i])
        low = d + 1
        if low > 9 or (i == 0 and low < 1):
            continue
        rest = width - i - 1
        tail = f"[0-9]{{{rest}}}" if rest else ""
        alternatives.append(f"{digits[:i]}[{low}-9]{tail}")
    return "^(" + "|".join(alternatives) + ")$"


@dataclass(frozen=True)
class RouteTarget:
    """The two pools of one model, reachable under /<path_prefix>/v1/..."""

    route_name: str
    namespace: pulumi.Input[str]
    path_prefix: str
    short_service: str
    long_service: str
    long_request_bytes: int
    port: int = 8000


@dataclass
class GatewayArgs:
    spec: GatewaySpec
    namespace: pulumi.Input[str]
    targets: Sequence[RouteTarget]
    provider: k8s.Provider


class Gateway(pulumi.ComponentResource):
    gateway: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: GatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Gateway", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        spec = args.spec
        # Only namespaces this library labels may attach routes.
        allowed = {"namespaces": {"from": "Selector",
                                  "selector": {"matchLabels": {ACCESS_LABEL: "true"}}}}
        listener_host = {"hostname": spec.hostname} if spec.hostname else {}
        listeners = [{"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": allowed,
                      **listener_host}]
        if spec.tls_secret_name:
            listeners.append({"name": "https", "protocol": "HTTPS", "port": 443, "allowedRoutes": allowed,
                              "tls": {"mode": "Terminate",
                                      "certificateRefs": [{"kind": "Secret", "name": spec.tls_secret_name}]},
                              **listener_host})
        self.gateway = custom_resource(
            f"{name}-gateway", "gateway.networking.k8s.io/v1", "Gateway",
            {**meta(GATEWAY_NAME), "namespace": args.namespace},
            {"gatewayClassName": spec.class_name, "listeners": listeners}, k8s_opts)

        parent_ref = {"name": GATEWAY_NAME, "namespace": args.namespace}
        for target in args.targets:
            self._route(name, target, parent_ref, spec, k8s_opts)

        self.register_outputs({"gatewayName": GATEWAY_NAME, "className": spec.class_name,
                               "external": spec.external, "routes": [t.route_name for t in args.targets]})

    def _route(self, name: str, target: RouteTarget, parent_ref: dict, spec: GatewaySpec,
               opts: pulumi.ResourceOptions) -> None:
        prefix = f"/{target.path_prefix}/v1"
        path = {"type": "PathPrefix", "value": prefix}
        rewrite = [{"type": "URLRewrite",
                    "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}}]

        def backend(service: str) -> list[dict]:
            return [{"name": service, "port": target.port}]

        long_backend = {"filters": rewrite, "backendRefs": backend(target.long_service)}
        # One match per rule: a URLRewrite with ReplacePrefixMatch needs exactly one PathPrefix
        # match in its rule (a CEL rule of the HTTPRoute CRD, Gateway API v1.2 onwards). Header
        # matches outrank the bare path match of the last rule (Gateway API precedence).
        rules = [
            {"matches": [{"path": path, "headers": [{"type": "RegularExpression", "name": "content-length",
                                                     "value": at_least_regex(target.long_request_bytes)}]}],
             **long_backend},
            {"matches": [{"path": path, "headers": [{"type": "Exact", "name": LENGTH_HINT_HEADER,
                                                     "value": "long"}]}],
             **long_backend},
            {"matches": [{"path": path}], "filters": rewrite, "backendRefs": backend(target.short_service)},
        ]
        route_spec: dict = {"parentRefs": [parent_ref], "rules": rules}
        if spec.hostname:
            route_spec["hostnames"] = [spec.hostname]
        custom_resource(f"{name}-route-{target.route_name}", "gateway.networking.k8s.io/v1", "HTTPRoute",
                        {**meta(target.route_name), "namespace": target.namespace}, route_spec, opts)

        for service in (target.short_service, target.long_service):
            ref = {"group": "", "kind": "Service", "name": service}
            # The LB's default health check asks for '/', which vLLM answers 404.
            custom_resource(
                f"{name}-hc-{target.route_name}-{service}", "networking.gke.io/v1", "HealthCheckPolicy",
                {**meta(service), "namespace": target.namespace},
                # USE_FIXED_PORT: gke-gateway-api main rejects `port` without it; GKE 1.33 accepts both.
                {"default": {"config": {"type": "HTTP", "httpHealthCheck": {
                    "portSpecification": "USE_FIXED_PORT", "port": target.port, "requestPath": "/health"}}},
                 "targetRef": ref}, opts)
            # Long generations stream for minutes; the LB's 30 s default would cut them.
            custom_resource(
                f"{name}-bp-{target.route_name}-{service}", "networking.gke.io/v1", "GCPBackendPolicy",
                {**meta(service), "namespace": target.namespace},
                {"default": {"timeoutSec": spec.request_timeout_seconds}, "targetRef": ref}, opts)
