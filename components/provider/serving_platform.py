"""Platform, as the component package exposes it to every Pulumi language (not platform.py: the plugin
runs with this folder on sys.path, where that name would shadow the standard library's): one resource
declares the whole serving platform from the same settings a stack's config holds, checked the same way."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi

from ..model.stack_config import StackConfig as StackConfigModel
from ..platform import Platform as _Platform
from ..platform import PlatformArgs
from .convert import named_inputs, to_spec
from .facade import Facade
from .types import StackConfig


class PlatformInputs(TypedDict):
    """Inputs of Platform."""

    config: StackConfig
    """The platform's settings: project, region, cluster, node pools, models, tenants, image, gateway,
    weights, monitoring (the keys of a stack's config, camelCase)."""


class Platform(_Platform, Facade):
    """GKE with GPU/MIG pools, one shared copy of the weights, vLLM pools behind Cloud Load Balancing
    with length- or inference-aware routing, per-tenant JWT auth and limits, KEDA autoscaling and
    Cloud Monitoring: everything one vllm-gke stack declares."""

    cluster_name: pulumi.Output[str]
    """The GKE cluster's name."""
    kubeconfig: pulumi.Output[str]
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (secret)."""
    routes: dict[str, str]
    """Each route's path prefix (<model> or <tenant>/<model>, then /v1), by route name."""
    dashboard_id: pulumi.Output[str]
    """The Cloud Monitoring dashboard's id."""
    gateway_address: pulumi.Output[Optional[str]]
    """The load balancer's reserved address (gateway.staticIp), to point the hostname at."""
    dns_authorization: pulumi.Output[Optional[list[dict[str, str]]]]
    """With gateway.managedCertificate: the DNS records (name, type, data: a CNAME) Certificate
    Manager needs before it issues the certificate."""

    def __init__(self, name: str, args: PlatformInputs, opts: Optional[pulumi.ResourceOptions] = None):
        config = to_spec(StackConfigModel, args.get("config"), "Platform", "config")
        # The stack config's keys (`vllm-gke:models[qwen-7b]`, `gcp:project`) as this input spells them.
        with named_inputs("Platform", "config"):
            super().__init__(name, PlatformArgs(config), opts)
        self.cluster_name, self.kubeconfig = self.cluster.cluster.name, self.cluster.kubeconfig
        self.dashboard_id = self.observability.dashboard.id
        self.gateway_address = pulumi.Output.from_input(self.gateway.address)
        self.dns_authorization = pulumi.Output.from_input(self.gateway.dns_authorization)
