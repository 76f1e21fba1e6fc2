"""Gateway: Cloud Load Balancing through the GKE Gateway API, with length-aware routing.

Each model has a short-request and a long-request pool. Its HTTPRoute sends a request to the
long pool when its body is large (Content-Length at or above the model's threshold) or the
client says so (`x-vllm-gke-length: long`), and everything else to the short pool. A 500-token
prompt therefore never queues behind, or blocks, a stream of 10-token ones - unlike round-robin.

With TLS (required for external classes) model routes attach only to the HTTPS listener; the
HTTP listener admits nothing but the gateway's own redirect to HTTPS, so a bearer token is never
accepted in clear. Certificates come from a Kubernetes Secret or Certificate Manager (GKE
Gateway security guide: `networking.gke.io/cert-manager-certs` on a regional listener, a
certificate map annotation on a global Gateway); the address is reserved (NamedAddress).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .model.k8s_objects import ACCESS_LABEL, vllm_health_check
from .model.serving_api import FAIRNESS_HEADER, OBJECTIVE_HEADER, REFUSED_AT_THE_PICKER, VERIFIED_HEADERS
from .model.specs import GatewaySpec
from .model.vllm_server import drain_seconds
from .options import child_opts
from .project_apis import ProjectApis

GATEWAY_NAME = "vllm"
LENGTH_HINT_HEADER = "x-vllm-gke-length"
HTTP_LISTENER = "http"
HTTPS_LISTENER = "https"
# GCPBackendPolicy's connectionDraining.drainingTimeoutSec upper bound (Cloud Load Balancing).
MAX_DRAINING_S = 3600
# Where a request carrying a picker control header is redirected: no route serves it (404).
PICKER_HEADER_REFUSED_PATH = "/vllm-gke/errors/gateway-control-header-not-allowed"


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


def at_most_regex(n: int) -> str:
    """An RE2 pattern matching exactly the decimal integers 0..n (no leading zeros)."""
    digits = str(n)
    width = len(digits)
    alternatives = ["0"]
    if width > 1:
        alternatives.append(f"[1-9][0-9]{{0,{width - 2}}}")  # fewer digits than n
    alternatives.append(digits)
    for i, ch in enumerate(digits):
        high = int(ch) - 1
        low = 1 if i == 0 else 0
        if high < low:
            continue
        rest = width - i - 1
        tail = f"[0-9]{{{rest}}}" if rest else ""
        alternatives.append(f"{digits[:i]}[{low}-{high}]{tail}")
    return "^(" + "|".join(alternatives) + ")$"


def backend_defaults(request_timeout_seconds: int) -> dict[str, Any]:
    """GCPBackendPolicy defaults for vLLM replicas. Long generations stream for minutes (the load
    balancer's 30 s default would cut them); a detached endpoint keeps its connections for as long
    as a stopping replica may still answer (preStop plus the longest request), so what it
    accepted finishes on a scale-down or drain."""
    return {"timeoutSec": request_timeout_seconds,
            "connectionDraining": {"drainingTimeoutSec": min(MAX_DRAINING_S, drain_seconds(request_timeout_seconds))}}


@dataclass(frozen=True)
class PickerTarget:
    """A model's InferencePool as one tenant reaches it. The tenant must send its own objective
    (no other value is routed) and may not send the picker's other control headers (refused):
    the picker reads the request before route-level header changes apply (envoy#15012), so
    neither its priority nor its replica is the client's to choose. The route also sets them
    for the replica, whose mesh policy and guard check the same objective."""

    pool_name: str
    objective: str
    tenant: str
    # (path, method) pairs the picker serves (serving_api.picker_routes()).
    routes: tuple[tuple[str, str], ...] = (("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                                           ("/v1/models", "GET"))
    # The largest Content-Length a body may declare (the picker buffers it whole).
    max_body_bytes: int = 1 << 20


@dataclass(frozen=True)
class RouteTarget:
    """The two pools of one model (or, with `picker`, its InferencePool), reachable under
    /<path_prefix>/v1/..."""

    route_name: str
    namespace: pulumi.Input[str]
    path_prefix: str
    short_service: str
    long_service: str
    long_request_bytes: int
    port: int = 8000
    # A canary revision's two pools and its share of each rule's traffic (percent).
    canary_short_service: Optional[str] = None
    canary_long_service: Optional[str] = None
    canary_weight: int = 0
    # Load balancer target requests/s per replica (a capacity, not a cap), by Service (pools that set maxRatePerEndpoint).
    max_rate_per_endpoint: Mapping[str, int] = field(default_factory=dict[str, int])
    # Routing through GKE Inference Gateway's endpoint picker instead of by length.
    picker: Optional[PickerTarget] = None

    def services(self) -> list[str]:
        """The Services the load balancer sends to (none behind a picker: the pool has its own policies)."""
        if self.picker:
            return []
        canary = [s for s in (self.canary_short_service, self.canary_long_service) if s]
        return [self.short_service, self.long_service, *canary]


@dataclass
class GatewayArgs:
    spec: GatewaySpec
    namespace: pulumi.Input[str]
    targets: Sequence[RouteTarget]
    provider: k8s.Provider
    project: str = ""
    region: str = ""
    # The subnetwork an internal gateway's reserved address comes from.
    subnetwork: Optional[pulumi.Input[str]] = None
    name_prefix: str = "vllm"
    apis: Optional[ProjectApis] = None


class Gateway(pulumi.ComponentResource):
    gateway: k8s.apiextensions.CustomResource
    address: Optional[pulumi.Output[str]] = None
    # The CNAME record to create for a Google-managed certificate's DNS authorization.
    dns_authorization: Optional[pulumi.Output[Any]] = None

    def __init__(self, name: str, args: GatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Gateway", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        spec = args.spec
        apis = args.apis
        # GCP resources the Gateway names (address, certificate): it must not come up before them.
        self._gcp_children: list[pulumi.Resource] = []

        def gcp_opts(*api_names: str, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=[*(apis.needs(*api_names) if apis else []), *depends_on])

        listener_host = {"hostname": spec.hostname} if spec.hostname else {}
        # Only namespaces this library labels may attach routes, and only to the serving listener.
        tenant_routes = {"namespaces": {"from": "Selector", "selector": {"matchLabels": {ACCESS_LABEL: "true"}}}}
        own_routes = {"namespaces": {"from": "Same"}}
        annotations: dict[str, Any] = {}
        tls_options: dict[str, Any] = {}
        if spec.managed_certificate:
            assert spec.hostname is not None
            cert_name, extra = self._managed_certificate(name, args, gcp_opts)
            if spec.regional:
                tls_options = {"options": {"networking.gke.io/cert-manager-certs": cert_name}}
            else:
                annotations["networking.gke.io/certmap"] = extra
        listeners: list[dict[str, Any]] = []
        if spec.tls:
            tls: dict[str, Any] = {"mode": "Terminate", **tls_options}
            if spec.tls_secret_name:
                tls["certificateRefs"] = [{"kind": "Secret", "name": spec.tls_secret_name}]
            listeners.append({"name": HTTPS_LISTENER, "protocol": "HTTPS", "port": 443,
                              "allowedRoutes": tenant_routes, "tls": tls, **listener_host})
            listeners.append({"name": HTTP_LISTENER, "protocol": "HTTP", "port": 80,
                              "allowedRoutes": own_routes, **listener_host})
            self.serving_listener = HTTPS_LISTENER
        else:
            listeners.append({"name": HTTP_LISTENER, "protocol": "HTTP", "port": 80,
                              "allowedRoutes": tenant_routes, **listener_host})
            self.serving_listener = HTTP_LISTENER

        gateway_spec: dict[str, Any] = {"gatewayClassName": spec.class_name, "listeners": listeners}
        if spec.static_ip:
            address_name = self._address(name, args, gcp_opts)
            gateway_spec["addresses"] = [{"type": "NamedAddress", "value": address_name}]
        self.gateway = custom_resource(
            f"{name}-gateway", "gateway.networking.k8s.io/v1", "Gateway",
            {**meta(GATEWAY_NAME, annotations=annotations or None), "namespace": args.namespace},
            gateway_spec, child_opts(self, opts, provider=args.provider, depends_on=self._gcp_children))

        if spec.tls:
            custom_resource(
                f"{name}-https-redirect", "gateway.networking.k8s.io/v1", "HTTPRoute",
                {**meta("https-redirect"), "namespace": args.namespace},
                {"parentRefs": [{"name": GATEWAY_NAME, "sectionName": HTTP_LISTENER}],
                 **({"hostnames": [spec.hostname]} if spec.hostname else {}),
                 "rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {
                     "scheme": "https", "statusCode": 301}}]}]},
                k8s_opts)

        parent_ref = {"name": GATEWAY_NAME, "namespace": args.namespace, "sectionName": self.serving_listener}
        for target in args.targets:
            self._route(name, target, parent_ref, spec, k8s_opts)

        self.register_outputs({"gatewayName": GATEWAY_NAME, "className": spec.class_name,
                               "external": spec.external, "listener": self.serving_listener,
                               "address": self.address, "dnsAuthorization": self.dns_authorization,
                               "routes": [t.route_name for t in args.targets]})

    def _address(self, name: str, args: GatewayArgs, gcp_opts: Any) -> str:
        spec = args.spec
        address_name = f"{args.name_prefix}-gateway"
        if not spec.regional:
            addr: pulumi.CustomResource = gcp.compute.GlobalAddress(
                f"{name}-ip", name=address_name, project=args.project, opts=gcp_opts("compute.googleapis.com"))
        elif spec.external:
            addr = gcp.compute.Address(
                f"{name}-ip", name=address_name, project=args.project, region=args.region,
                address_type="EXTERNAL", opts=gcp_opts("compute.googleapis.com"))
        else:
            # One internal address shared by the HTTP and HTTPS forwarding rules.
            addr = gcp.compute.Address(
                f"{name}-ip", name=address_name, project=args.project, region=args.region,
                address_type="INTERNAL", subnetwork=args.subnetwork, purpose="SHARED_LOADBALANCER_VIP",
                opts=gcp_opts("compute.googleapis.com"))
        self._gcp_children.append(addr)
        self.address = addr.address
        return address_name

    def _managed_certificate(self, name: str, args: GatewayArgs, gcp_opts: Any) -> tuple[str, str]:
        """A Google-managed certificate for the hostname, authorised by a DNS record."""
        spec = args.spec
        assert spec.hostname is not None
        location = args.region if spec.regional else "global"
        cert_name = f"{args.name_prefix}-gateway"
        auth = gcp.certificatemanager.DnsAuthorization(
            f"{name}-dns-auth", name=f"{args.name_prefix}-gateway", project=args.project, location=location,
            domain=spec.hostname, opts=gcp_opts("certificatemanager.googleapis.com"))
        cert = gcp.certificatemanager.Certificate(
            f"{name}-cert", name=cert_name, project=args.project, location=location,
            managed={"domains": [spec.hostname], "dns_authorizations": [auth.id]},
            opts=gcp_opts("certificatemanager.googleapis.com"))
        children: list[pulumi.Resource] = [auth, cert]
        map_name = ""
        if not spec.regional:
            map_name = f"{args.name_prefix}-gateway"
            cert_map = gcp.certificatemanager.CertificateMap(
                f"{name}-cert-map", name=map_name, project=args.project,
                opts=gcp_opts("certificatemanager.googleapis.com"))
            children += [cert_map, gcp.certificatemanager.CertificateMapEntry(
                f"{name}-cert-map-entry", name=f"{args.name_prefix}-gateway", project=args.project,
                map=cert_map.name, hostname=spec.hostname, certificates=[cert.id],
                opts=gcp_opts("certificatemanager.googleapis.com"))]
        self._gcp_children += children
        self.dns_authorization = auth.dns_resource_records
        return cert_name, map_name

    def _route(self, name: str, target: RouteTarget, parent_ref: dict[str, Any], spec: GatewaySpec,
               opts: pulumi.ResourceOptions) -> None:
        prefix = f"/{target.path_prefix}/v1"
        path = {"type": "PathPrefix", "value": prefix}
        # No URLRewrite: GKE does not claim HTTPRoute path rewrites (infra/contracts/gateway.py), so
        # the path reaches the pod as sent; the mesh admits it prefixed and the guard strips the prefix.
        # The tenant is the issuer and subject Istio verified: a client's own copy never gets through.
        strip_verified = [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": list(VERIFIED_HEADERS)}}]

        def backend(service: str, canary: Optional[str]) -> list[dict[str, Any]]:
            if not canary:
                return [{"name": service, "port": target.port}]
            # Weights are relative: stable and canary always both listed, so a rollback is a
            # config change of the weight and the canary can stay warm at 0.
            return [{"name": service, "port": target.port, "weight": 100 - target.canary_weight},
                    {"name": canary, "port": target.port, "weight": target.canary_weight}]

        if target.picker:
            self._picker_route(name, target, parent_ref, spec, opts)
            return
        long_backend = {"filters": strip_verified,
                        "backendRefs": backend(target.long_service, target.canary_long_service)}
        # Header matches outrank the bare path match of the last rule (Gateway API precedence).
        rules = [
            {"matches": [{"path": path, "headers": [{"type": "RegularExpression", "name": "content-length",
                                                     "value": at_least_regex(target.long_request_bytes)}]}],
             **long_backend},
            {"matches": [{"path": path, "headers": [{"type": "Exact", "name": LENGTH_HINT_HEADER,
                                                     "value": "long"}]}],
             **long_backend},
            {"matches": [{"path": path}], "filters": strip_verified,
             "backendRefs": backend(target.short_service, target.canary_short_service)},
        ]
        self._declare_route(name, target, rules, parent_ref, spec, opts)

        self._service_policies(name, target, spec, opts)

    @staticmethod
    def _declare_route(name: str, target: RouteTarget, rules: list[dict[str, Any]], parent_ref: dict[str, Any], spec: GatewaySpec,
                       opts: pulumi.ResourceOptions) -> None:
        route_spec: dict[str, Any] = {"parentRefs": [parent_ref], "rules": rules}
        if spec.hostname:
            route_spec["hostnames"] = [spec.hostname]
        custom_resource(f"{name}-route-{target.route_name}", "gateway.networking.k8s.io/v1", "HTTPRoute",
                        {**meta(target.route_name), "namespace": target.namespace}, route_spec, opts)

    def _picker_route(self, name: str, target: RouteTarget, parent_ref: dict[str, Any], spec: GatewaySpec,
                      opts: pulumi.ResourceOptions) -> None:
        """One rule per route the picker serves, each requiring the tenant's own objective and,
        for a body, a Content-Length within the limit (no chunked or oversized body reaches the
        picker, which buffers it whole); and first a rule that answers any request carrying one
        of the picker's other control headers with a redirect to a path nothing serves. Each of
        its matches is a served match plus that header, so it outranks the served rule by header
        count (Gateway API precedence), whatever the implementation does with ties."""
        picker = target.picker
        assert picker is not None
        prefix = f"/{target.path_prefix}"
        own = {"type": "Exact", "name": OBJECTIVE_HEADER, "value": picker.objective}
        length = {"type": "RegularExpression", "name": "content-length", "value": at_most_regex(picker.max_body_bytes)}

        def served(path: str, method: str) -> dict[str, Any]:
            # No method match (GKE's conformance reports list it as unsupported): the mesh and the
            # guard refuse a wrong method; a body route still needs its bounded Content-Length.
            return {"path": {"type": "Exact", "value": f"{prefix}{path}"},
                    "headers": [own, *([length] if method == "POST" else [])]}

        headers = {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": OBJECTIVE_HEADER, "value": picker.objective},
                    {"name": FAIRNESS_HEADER, "value": picker.tenant}],
            "remove": [*VERIFIED_HEADERS, *REFUSED_AT_THE_PICKER]}}  # never PICKER_SETS: see serving_api
        backend = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": picker.pool_name}
        def with_header(match: dict[str, Any], header: str) -> dict[str, Any]:
            return {**match, "headers": [*match["headers"], {"type": "RegularExpression", "name": header, "value": ".*"}]}

        refused = {"matches": [with_header(served(path, method), header)
                               for path, method in picker.routes for header in REFUSED_AT_THE_PICKER],
            "filters": [{"type": "RequestRedirect", "requestRedirect": {
                "path": {"type": "ReplaceFullPath", "replaceFullPath": PICKER_HEADER_REFUSED_PATH},
                "statusCode": 302}}]}
        # Forwarded as sent (no URLRewrite, as above): the picker reads no path, the guard strips the prefix.
        rules = [refused, *({"matches": [served(path, method)], "filters": [headers], "backendRefs": [backend]}
                            for path, method in picker.routes)]
        self._declare_route(name, target, rules, parent_ref, spec, opts)

    @staticmethod
    def _service_policies(name: str, target: RouteTarget, spec: GatewaySpec, opts: pulumi.ResourceOptions) -> None:
        for service in target.services():
            ref = {"group": "", "kind": "Service", "name": service}
            custom_resource(
                f"{name}-hc-{target.route_name}-{service}", "networking.gke.io/v1", "HealthCheckPolicy",
                {**meta(service), "namespace": target.namespace}, vllm_health_check(ref, target.port), opts)
            backend_policy: dict[str, Any] = backend_defaults(spec.request_timeout_seconds)
            if target.max_rate_per_endpoint.get(service):
                backend_policy["maxRatePerEndpoint"] = target.max_rate_per_endpoint[service]
            custom_resource(
                f"{name}-bp-{target.route_name}-{service}", "networking.gke.io/v1", "GCPBackendPolicy",
                {**meta(service), "namespace": target.namespace},
                {"default": backend_policy, "targetRef": ref}, opts)
