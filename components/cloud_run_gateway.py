"""CloudRunGateway: the Application Load Balancer in front of the Cloud Run models, of the stack
gateway's class, beside GKE's Gateway (which takes no serverless backend).

A serverless NEG per model in the model's region, a backend service each (no health check and no
timeout: Google refuses both on a serverless NEG's backend service, and Cloud Run's own request
timeout bounds a request), one URL map routing /<model>/v1/* and /<tenant>/<model>/v1/* as the
GKE routes do (the path unrewritten: the guard strips the prefix) and answering 404 for anything
else, a reserved address, HTTPS with a Google-managed Certificate Manager certificate for
cloudRun.hostname where the gateway serves HTTPS (plain HTTP then only redirects), the target
proxies and forwarding rules. The regional classes use the cluster's VPC and its proxy-only subnet.
An auth jwt model's backend service carries its Cloud Armor policy (regional in the load balancer's
region for a regional class, global for the global class), evaluated before Cloud Run is reached.
The facts: components/model/cloud_run_gateway.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_gcp as gcp

from .gpu_cluster import GpuCluster
from .model.cloud_run_gateway import ArmorPolicy, CloudRunBackend, CloudRunFront, cloud_run_front, front_url
from .model.serving_api import VERIFIED_HEADERS
from .model.stack_config import StackConfig
from .options import child_opts
from .project_apis import ProjectApis

COMPUTE = "compute.googleapis.com"
CERTS = "certificatemanager.googleapis.com"


@dataclass
class CloudRunGatewayArgs:
    front: CloudRunFront
    # Model name -> its Cloud Run service's name (the serverless NEG points at it).
    services: Mapping[str, pulumi.Input[str]]
    project: str
    # The cluster's VPC and node subnet (an internal address comes from it), and its proxy-only
    # subnet, which a regional load balancer's forwarding rule needs to exist first.
    network: Optional[pulumi.Input[str]] = None
    subnetwork: Optional[pulumi.Input[str]] = None
    proxy_subnet: Optional[pulumi.Resource] = None
    apis: Optional[ProjectApis] = None
    # What the NEGs wait for (the Cloud Run services).
    depends_on: Sequence[pulumi.Resource] = field(default_factory=list[pulumi.Resource])


class CloudRunGateway(pulumi.ComponentResource):
    address: pulumi.Output[str]
    # The CNAME record to create for the certificate's DNS authorization (TLS only).
    dns_authorization: Optional[pulumi.Output[Any]] = None
    # Model -> the URL tenants call it at (the shared /<model>/v1).
    urls: dict[str, str]

    def __init__(self, name: str, args: CloudRunGatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:CloudRunGateway", name, None, opts)
        self._name, self._args, self._opts = name, args, opts
        front = args.front
        backends = {b.model: self._backend(b) for b in front.backends}
        url_map = self._url_map(f"{name}-url-map", front.name, self._routes(backends))
        self.address = self._address()
        if front.tls:
            https = self._https_proxy(url_map)
            self._forwarding_rule("https", "443", https)
            redirect = self._url_map(f"{name}-redirect", f"{front.name}-redirect", {"default_url_redirect": {
                "https_redirect": True, "strip_query": False, "redirect_response_code": "MOVED_PERMANENTLY_DEFAULT"}})
            self._forwarding_rule("http", "80", self._http_proxy(redirect))
        else:
            self._forwarding_rule("http", "80", self._http_proxy(url_map))
        self.urls = {b.model: front_url(front, b.model) for b in front.backends}
        self.register_outputs({"className": front.class_name, "address": self.address, "urls": self.urls,
                               "dnsAuthorization": self.dns_authorization,
                               "backends": {m: s.id for m, s in backends.items()}})

    def _child(self, *api_names: str, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
        apis = self._args.apis
        return child_opts(self, self._opts, depends_on=[*(apis.needs(*api_names) if apis else []), *depends_on])

    def _backend(self, backend: CloudRunBackend) -> pulumi.CustomResource:
        """The model's serverless NEG (in its region) and backend service."""
        args, front = self._args, self._args.front
        neg = gcp.compute.RegionNetworkEndpointGroup(
            f"{self._name}-neg-{backend.model}", name=backend.name, project=args.project, region=backend.region,
            network_endpoint_type="SERVERLESS", cloud_run={"service": args.services[backend.model]},
            opts=self._child(COMPUTE, depends_on=args.depends_on))
        # UTILIZATION at full capacity: a serverless NEG has no instances to measure; capacityScaler
        # is required outside INTERNAL region backend services. No health check, no timeoutSec.
        common: dict[str, Any] = dict(
            name=backend.name, project=args.project, load_balancing_scheme=front.kind.scheme, protocol="HTTP",
            backends=[{"group": neg.id, "balancing_mode": "UTILIZATION", "capacity_scaler": 1.0}],
            opts=self._child(COMPUTE))
        if backend.armor is not None:
            common["security_policy"] = self._armor(backend.model, backend.armor).id
        if front.kind.regional:
            return gcp.compute.RegionBackendService(f"{self._name}-backend-{backend.model}", region=front.region,
                                                   **common)
        return gcp.compute.BackendService(f"{self._name}-backend-{backend.model}", **common)

    def _armor(self, model: str, policy: ArmorPolicy) -> pulumi.CustomResource:
        """The model's Cloud Armor policy, of the load balancer's scope (a backend service takes a
        policy of its own scope only)."""
        args, front = self._args, self._args.front
        common: dict[str, Any] = dict(name=policy.name, project=args.project, type="CLOUD_ARMOR",
                                      description=f"Cloud Run model {model}: well-formed bearer JWTs only, per-IP throttle",
                                      rules=policy.rules(), opts=self._child(COMPUTE))
        if front.kind.regional:
            return gcp.compute.RegionSecurityPolicy(f"{self._name}-armor-{model}", region=front.region, **common)
        return gcp.compute.SecurityPolicy(f"{self._name}-armor-{model}", **common)

    def _routes(self, backends: Mapping[str, pulumi.CustomResource]) -> dict[str, Any]:
        """The URL map's routing: the host, each model's paths, 404 for the rest."""
        front = self._args.front
        first = backends[front.backends[0].model]
        # The load balancer answers 404 itself (an abort before any backend; the route names one
        # because a route action must): no unknown path or host reaches a Cloud Run service.
        not_found = {"weighted_backend_services": [{"backend_service": first.id, "weight": 100}],
                     "fault_injection_policy": {"abort": {"http_status": 404, "percentage": 100.0}}}
        matcher = {"name": "models", "default_route_action": not_found,
                   "path_rules": [{"paths": b.paths, "service": backends[b.model].id} for b in front.backends]}
        return {"host_rules": [{"hosts": [front.hostname or "*"], "path_matcher": "models"}],
                "path_matchers": [matcher], "default_route_action": not_found,
                # As on GKE's routes: no client copy of the mesh-verified identity headers passes.
                "header_action": {"request_headers_to_removes": list(VERIFIED_HEADERS)}}

    def _url_map(self, logical: str, name: str, spec: dict[str, Any]) -> pulumi.CustomResource:
        args, front = self._args, self._args.front
        if front.kind.regional:
            return gcp.compute.RegionUrlMap(logical, name=name, project=args.project, region=front.region,
                                            opts=self._child(COMPUTE), **spec)
        return gcp.compute.URLMap(logical, name=name, project=args.project, opts=self._child(COMPUTE), **spec)

    def _address(self) -> pulumi.Output[str]:
        """One reserved address for the HTTPS and HTTP forwarding rules."""
        args, front = self._args, self._args.front
        opts = self._child(COMPUTE)
        if not front.kind.regional:
            addr: Any = gcp.compute.GlobalAddress(f"{self._name}-ip", name=front.name, project=args.project, opts=opts)
        elif front.kind.external:
            addr = gcp.compute.Address(f"{self._name}-ip", name=front.name, project=args.project, region=front.region,
                                       address_type="EXTERNAL", opts=opts)
        else:
            addr = gcp.compute.Address(f"{self._name}-ip", name=front.name, project=args.project, region=front.region,
                                       address_type="INTERNAL", subnetwork=args.subnetwork,
                                       purpose="SHARED_LOADBALANCER_VIP", opts=opts)
        self._address_resource = addr
        return addr.address

    def _https_proxy(self, url_map: pulumi.CustomResource) -> pulumi.CustomResource:
        args, front = self._args, self._args.front
        cert, cert_map = self._certificate()
        if cert_map is None:
            return gcp.compute.RegionTargetHttpsProxy(
                f"{self._name}-https", name=f"{front.name}-https", project=args.project, region=front.region,
                url_map=url_map.id, certificate_manager_certificates=[cert.id], opts=self._child(COMPUTE))
        # The proxy serves the map once its entry exists (an empty map has no certificate to serve).
        return gcp.compute.TargetHttpsProxy(
            f"{self._name}-https", name=f"{front.name}-https", project=args.project, url_map=url_map.id,
            certificate_map=cert_map[0].id.apply(lambda i: f"//certificatemanager.googleapis.com/{i}"),
            opts=self._child(COMPUTE, depends_on=[cert_map[1]]))

    def _http_proxy(self, url_map: pulumi.CustomResource) -> pulumi.CustomResource:
        args, front = self._args, self._args.front
        if front.kind.regional:
            return gcp.compute.RegionTargetHttpProxy(f"{self._name}-http", name=f"{front.name}-http",
                                                     project=args.project, region=front.region, url_map=url_map.id,
                                                     opts=self._child(COMPUTE))
        return gcp.compute.TargetHttpProxy(f"{self._name}-http", name=f"{front.name}-http", project=args.project,
                                           url_map=url_map.id, opts=self._child(COMPUTE))

    def _certificate(self) -> tuple[pulumi.CustomResource, Optional[tuple[pulumi.CustomResource, pulumi.Resource]]]:
        """A Google-managed certificate for cloudRun.hostname, authorised by a DNS record (as the
        Gateway's, components/gateway.py); a global load balancer takes it through a certificate map."""
        args, front = self._args, self._args.front
        assert front.hostname is not None
        location = front.region if front.kind.regional else "global"
        auth = gcp.certificatemanager.DnsAuthorization(
            f"{self._name}-dns-auth", name=front.name, project=args.project, location=location,
            domain=front.hostname, opts=self._child(CERTS))
        cert = gcp.certificatemanager.Certificate(
            f"{self._name}-cert", name=front.name, project=args.project, location=location,
            managed={"domains": [front.hostname], "dns_authorizations": [auth.id]}, opts=self._child(CERTS))
        self.dns_authorization = auth.dns_resource_records
        if front.kind.regional:
            return cert, None
        cert_map = gcp.certificatemanager.CertificateMap(f"{self._name}-cert-map", name=front.name,
                                                         project=args.project, opts=self._child(CERTS))
        entry = gcp.certificatemanager.CertificateMapEntry(
            f"{self._name}-cert-map-entry", name=front.name, project=args.project, map=cert_map.name,
            hostname=front.hostname, certificates=[cert.id], opts=self._child(CERTS))
        return cert, (cert_map, entry)

    def _forwarding_rule(self, scheme: str, port: str, proxy: pulumi.CustomResource) -> pulumi.CustomResource:
        args, front = self._args, self._args.front
        common: dict[str, Any] = dict(name=f"{front.name}-{scheme}", project=args.project, ip_protocol="TCP",
                                      port_range=port, target=proxy.id, ip_address=self._address_resource.id,
                                      load_balancing_scheme=front.kind.scheme)
        if not front.kind.regional:
            return gcp.compute.GlobalForwardingRule(f"{self._name}-{scheme}-rule", opts=self._child(COMPUTE), **common)
        # A regional Application Load Balancer's forwarding rule names the VPC whose proxy-only
        # subnet runs its proxies (and an internal one the subnet its address is in).
        internal = {} if front.kind.external else {"subnetwork": args.subnetwork}
        waits = [args.proxy_subnet] if args.proxy_subnet is not None else []
        return gcp.compute.ForwardingRule(f"{self._name}-{scheme}-rule", region=front.region, network=args.network,
                                          opts=self._child(COMPUTE, depends_on=waits), **internal, **common)



def build_cloud_run_gateway(name: str, cfg: StackConfig, cluster: GpuCluster, services: Mapping[str, gcp.cloudrunv2.Service],
                      apis: Optional[ProjectApis], opts: pulumi.ResourceOptions) -> Optional[CloudRunGateway]:
    """The stack's Cloud Run models' load balancer (None without any), in the cluster's VPC, after
    their services (Platform._cloud_run)."""
    front = cloud_run_front(cfg)
    if front is None:
        return None
    return CloudRunGateway(name, CloudRunGatewayArgs(
        front, {m: s.name for m, s in services.items()}, cfg.project, network=cluster.network.id,
        subnetwork=cluster.subnetwork.id, proxy_subnet=cluster.proxy_subnetwork, apis=apis,
        depends_on=list(services.values())), opts=opts)
