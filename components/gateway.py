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

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .model.config_rules.components import check_gateway
from .model.gateway_routes import (
    GATEWAY_NAME,
    RouteTarget,
    gateway_spec,
    https_redirect,
    route_spec,
    service_backend_policy,
    service_ref,
    serving_listener,
)
from .model.k8s_objects import vllm_health_check
from .model.specs import GatewaySpec
from .options import child_opts
from .project_apis import ProjectApis

# A child's options waiting for these APIs (and these resources).
GcpOpts = Callable[..., pulumi.ResourceOptions]


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
        check_gateway(args.spec.class_name, args.targets)
        super().__init__("vllm-gke:index:Gateway", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        spec = args.spec
        self.serving_listener = serving_listener(spec)
        self.gateway = self._gateway(name, args, opts)
        if spec.tls:
            custom_resource(f"{name}-https-redirect", "gateway.networking.k8s.io/v1", "HTTPRoute",
                            {**meta("https-redirect"), "namespace": args.namespace}, https_redirect(spec), k8s_opts)
        parent_ref = {"name": GATEWAY_NAME, "namespace": args.namespace, "sectionName": self.serving_listener}
        for target in args.targets:
            # A model whose pools Flagger all rolls out has its routes from Flagger (one a pool).
            if rules := target.rules():
                custom_resource(f"{name}-route-{target.route_name}", "gateway.networking.k8s.io/v1", "HTTPRoute",
                                {**meta(target.route_name), "namespace": target.namespace},
                                route_spec(parent_ref, rules, spec.hostname), k8s_opts)
            self._service_policies(name, target, spec, k8s_opts)
        self.register_outputs({"gatewayName": GATEWAY_NAME, "className": spec.class_name,
                               "external": spec.external, "listener": self.serving_listener,
                               "address": self.address, "dnsAuthorization": self.dns_authorization,
                               "routes": [t.route_name for t in args.targets]})

    def _gateway(self, name: str, args: GatewayArgs,
                 opts: Optional[pulumi.ResourceOptions]) -> k8s.apiextensions.CustomResource:
        """The Gateway, after the GCP resources it names (its certificate, its address)."""
        spec = args.spec
        apis = args.apis
        # GCP resources the Gateway names (address, certificate): it must not come up before them.
        self._gcp_children: list[pulumi.Resource] = []

        def gcp_opts(*api_names: str, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=[*(apis.needs(*api_names) if apis else []), *depends_on])

        annotations: dict[str, Any] = {}
        certificate = ""
        if spec.managed_certificate:
            assert spec.hostname is not None
            cert_name, cert_map = self._managed_certificate(name, args, gcp_opts)
            if spec.regional:
                certificate = cert_name
            else:
                annotations["networking.gke.io/certmap"] = cert_map
        address = self._address(name, args, gcp_opts) if spec.static_ip else ""
        return custom_resource(
            f"{name}-gateway", "gateway.networking.k8s.io/v1", "Gateway",
            {**meta(GATEWAY_NAME, annotations=annotations or None), "namespace": args.namespace},
            gateway_spec(spec, certificate, address),
            child_opts(self, opts, provider=args.provider, depends_on=self._gcp_children))

    def _address(self, name: str, args: GatewayArgs, gcp_opts: GcpOpts) -> str:
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

    def _managed_certificate(self, name: str, args: GatewayArgs, gcp_opts: GcpOpts) -> tuple[str, str]:
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

    @staticmethod
    def _service_policies(name: str, target: RouteTarget, spec: GatewaySpec, opts: pulumi.ResourceOptions) -> None:
        for service in target.services():
            custom_resource(
                f"{name}-hc-{target.route_name}-{service}", "networking.gke.io/v1", "HealthCheckPolicy",
                {**meta(service), "namespace": target.namespace},
                vllm_health_check(service_ref(service), target.port), opts)
            custom_resource(
                f"{name}-bp-{target.route_name}-{service}", "networking.gke.io/v1", "GCPBackendPolicy",
                {**meta(service), "namespace": target.namespace},
                service_backend_policy(service, spec.request_timeout_seconds,
                                       target.rate_for(service)), opts)
