"""MeshNamespace: a namespace in the mesh that denies every request it does not explicitly allow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.k8s_meta import ACCESS_LABEL, custom_resource, meta

ISTIO_API = "security.istio.io/v1"


@dataclass
class MeshNamespaceArgs:
    name: str
    provider: k8s.Provider
    labels: Mapping[str, str] = field(default_factory=dict)


class MeshNamespace(pulumi.ComponentResource):
    """Istio-injected, may attach HTTPRoutes to the Gateway, default deny plus metrics scraping."""

    namespace: k8s.core.v1.Namespace
    name: pulumi.Output[str]

    def __init__(self, name: str, args: MeshNamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:MeshNamespace", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata=meta(args.name, labels={"istio-injection": "enabled", ACCESS_LABEL: "true",
                                             **args.labels}),
            opts=k8s_opts)
        self.name = self.namespace.metadata.name
        # An ALLOW policy with no rules matches nothing: only the explicit allows below get through.
        custom_resource(f"{name}-deny-all", ISTIO_API, "AuthorizationPolicy",
                        {**meta("deny-all"), "namespace": self.name}, {}, k8s_opts)
        # Managed Prometheus collectors sit outside the mesh; let them read /metrics only.
        custom_resource(
            f"{name}-allow-metrics", ISTIO_API, "AuthorizationPolicy",
            {**meta("allow-metrics-scrape"), "namespace": self.name},
            {"action": "ALLOW", "rules": [{"to": [{"operation": {"methods": ["GET"], "paths": ["/metrics"]}}]}]},
            k8s_opts)
        self.register_outputs({"name": self.name})
