"""MeshNamespace: a namespace in the mesh that denies every request it does not explicitly allow.

Besides the deny-all, exactly two things pass without a JWT, each from known sources only:
  - load balancer health checks, `GET /health`, from Google's health-check ranges and the
    proxy-only subnet (Envoy-based regional load balancers probe from there). They enter
    through the pod's sidecar like any request, so without this every backend is unhealthy
    and the Gateway answers 503;
  - Managed Prometheus scrapes, `GET /metrics`, from the cluster's pod and node ranges (the
    collectors run outside the mesh).
The kubelet's own probes are rewritten by sidecar injection to go through the agent, not Envoy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import custom_resource, meta
from .model.k8s_objects import ACCESS_LABEL
from .options import child_opts

ISTIO_API = "security.istio.io/v1"
ISTIO_NETWORKING_API = "networking.istio.io/v1"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
# https://cloud.google.com/load-balancing/docs/firewall-rules: health-check probe ranges of
# the global and regional Application Load Balancers.
GOOGLE_HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")


@dataclass(frozen=True)
class TrustedSources:
    """Source ranges allowed the two unauthenticated paths. No defaults: Google's health-check
    ranges alone miss the proxy-only subnet the regional Gateway classes probe from, and no
    metrics range means Managed Prometheus never scrapes vLLM, so KEDA never scales.
    `for_cluster` derives both from the cluster's ranges."""

    # Load balancer health checks: Google's ranges plus the proxy-only subnet.
    health_checks: Sequence[pulumi.Input[str]]
    # Metric scrapes: the pod and node ranges.
    metrics: Sequence[str]

    @classmethod
    def for_cluster(cls, proxy_only_cidr: pulumi.Input[str], pods_cidr: str, subnet_cidr: str) -> "TrustedSources":
        return cls(health_checks=[*GOOGLE_HEALTH_CHECK_RANGES, proxy_only_cidr], metrics=[pods_cidr, subnet_cidr])

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("TrustedSources.metrics: empty, Managed Prometheus could scrape no vLLM metrics and KEDA "
                             "would never scale; give the pod and node ranges (TrustedSources.for_cluster)")
        if not set(GOOGLE_HEALTH_CHECK_RANGES) <= set(h for h in self.health_checks if isinstance(h, str)) \
                or len(self.health_checks) <= len(GOOGLE_HEALTH_CHECK_RANGES):
            raise ValueError("TrustedSources.health_checks: needs Google's health-check ranges "
                             f"({', '.join(GOOGLE_HEALTH_CHECK_RANGES)}) and the proxy-only subnet the regional "
                             "Gateway classes probe from (TrustedSources.for_cluster)")


@dataclass
class MeshNamespaceArgs:
    name: str
    provider: k8s.Provider
    sources: TrustedSources
    # Hosts of the JWKS endpoints RequestAuthentications in this namespace use: managed Cloud
    # Service Mesh fetches JWKS from the workload's own Envoy, which reaches only hosts the mesh
    # knows (ServiceEntry) and speaks TLS to them only when told (DestinationRule). No default:
    # without its issuer's host here, every token in the namespace fails verification.
    jwks_hosts: Sequence[str]
    # Kubernetes service accounts to create here (no token mounted): the vLLM servers' and the
    # standbys' own identities, so no grant names the namespace's shared `default`. No default:
    # a pod naming an account that does not exist is never created (VllmServiceArgs runs as
    # vllm-server, Standby as vllm-standby).
    service_accounts: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict[str, str])


def mesh_lock(name: str, md: Any, labels: Mapping[str, str], allow: tuple[str, str], principals: Sequence[str],
              operation: Mapping[str, Any], opts: pulumi.ResourceOptions) -> None:
    """A service with no credential of its own, locked by the mesh alone (the limit store, the
    trace collector): its namespace STRICT mTLS, deny by default, and one AuthorizationPolicy
    (`allow`: its resource name's suffix and its object name) admitting `principals` to the pods
    of `labels` for `operation`. `md(obj)` gives an object's metadata in the namespace."""
    custom_resource(f"{name}-mtls", ISTIO_API, "PeerAuthentication", md("strict"), {"mtls": {"mode": "STRICT"}}, opts)
    custom_resource(f"{name}-deny-all", ISTIO_API, "AuthorizationPolicy", md("deny-all"), {}, opts)
    custom_resource(f"{name}-{allow[0]}", ISTIO_API, "AuthorizationPolicy", md(allow[1]),
                    {"action": "ALLOW", "selector": {"matchLabels": dict(labels)},
                     "rules": [{"from": [{"source": {"principals": sorted(principals)}}],
                                "to": [{"operation": dict(operation)}]}]}, opts)


def allow_unauthenticated(path: str, sources: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    return {"action": "ALLOW", "rules": [{
        "from": [{"source": {"ipBlocks": list(sources)}}],
        "to": [{"operation": {"methods": ["GET"], "paths": [path]}}]}]}


class MeshNamespace(pulumi.ComponentResource):
    """Istio-injected, may attach HTTPRoutes to the Gateway, default deny plus probes and scrapes."""

    namespace: k8s.core.v1.Namespace
    name: pulumi.Output[str]

    def __init__(self, name: str, args: MeshNamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MeshNamespace", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            # Managed Cloud Service Mesh honours the default injection label.
            metadata=meta(args.name, labels={"istio-injection": "enabled", ACCESS_LABEL: "true",
                                             **args.labels}),
            opts=k8s_opts)
        self.name = self.namespace.metadata.name
        for account in args.service_accounts:
            k8s.core.v1.ServiceAccount(f"{name}-sa-{account}", metadata={**meta(account), "namespace": self.name},
                                       automount_service_account_token=False, opts=k8s_opts)

        def policy(resource: str, policy_name: str, spec: dict[str, Any]) -> None:
            custom_resource(resource, ISTIO_API, "AuthorizationPolicy",
                            {**meta(policy_name), "namespace": self.name}, spec, k8s_opts)

        # An ALLOW policy with no rules matches nothing: only the explicit allows get through.
        policy(f"{name}-deny-all", "deny-all", {})
        policy(f"{name}-allow-health", "allow-lb-health-checks",
               allow_unauthenticated(HEALTH_PATH, args.sources.health_checks))
        if args.sources.metrics:
            policy(f"{name}-allow-metrics", "allow-metrics-scrape",
                   allow_unauthenticated(METRICS_PATH, args.sources.metrics))
        for host in sorted(set(args.jwks_hosts)):
            slug = host.replace(".", "-")
            custom_resource(
                f"{name}-jwks-{slug}", ISTIO_NETWORKING_API, "ServiceEntry",
                {**meta(f"jwks-{slug}"), "namespace": self.name},
                {"hosts": [host], "location": "MESH_EXTERNAL", "resolution": "DNS", "exportTo": ["."],
                 "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}]}, k8s_opts)
            custom_resource(
                f"{name}-jwks-tls-{slug}", ISTIO_NETWORKING_API, "DestinationRule",
                {**meta(f"jwks-{slug}"), "namespace": self.name},
                {"host": host, "exportTo": ["."], "trafficPolicy": {"tls": {"mode": "SIMPLE", "sni": host}}},
                k8s_opts)
        self.register_outputs({"name": self.name})
