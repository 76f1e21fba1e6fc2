"""PrefillPaths: what opens a disaggregated model's prefill pods (models[].disaggregation) to its decode
pods and closes them to everything else. The prefill pool's workload, scaling, budget and scrape are a
serving pool's (VllmService, pool "prefill": serving_plan.pool_services adds it); the routing sidecar
and the pods' role, components/model/disaggregation_cluster.py's.

  - a headless Service over the prefill pods (their port as HTTP to the mesh; the prefill leg, sent to a
    pod IP, still goes in plain text: disaggregation_cluster.prefill_service_spec);
  - a NetworkPolicy: the model's decode pods alone to vLLM's port, NIXL's side channel and UCX's ports
    (the last two past the mesh), the model's picker and Managed Prometheus to vLLM's port;
  - a NetworkPolicy on the decode pods: the pool's port for the load balancer and the picker alone, vLLM's
    /metrics for Managed Prometheus, NIXL's ports for the prefill pods (disaggregation_cluster.decode_ingress);
  - an AuthorizationPolicy refusing every request from neither a server pod's identity nor a pod address
    but the scrape of /metrics and /health: the load balancer reaches no prefill pod even where a picker
    names one.
The tenants' own allow policies (TenantAuth, on the model's pods) still apply to the prefill leg, which
carries the tenant's token, and the guard there checks the tenant as on any replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .mesh_namespace import ISTIO_API
from .model.disaggregation_cluster import (
    decode_ingress,
    prefill_ingress,
    prefill_mesh_policy,
    prefill_service_spec,
    role_selector,
)
from .model.mesh_identity import client_principal
from .options import child_opts


@dataclass
class PrefillPathsArgs:
    model_name: str
    # The serving namespace's name (the mesh principal names it: a plain string).
    namespace: str
    provider: k8s.Provider
    # The cluster's pod range (cluster.podsCidr): the decode pods' addresses.
    pods_cidr: str
    # The load balancer's proxies and health checks (the decode pods' port is theirs alone), and the
    # host-network scrapers' range, as the picker's NetworkPolicy takes them.
    load_balancer_sources: Sequence[pulumi.Input[str]] = ()
    metrics_sources: Sequence[str] = ()


class PrefillPaths(pulumi.ComponentResource):
    def __init__(self, name: str, args: PrefillPathsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:PrefillPaths", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        model, labels = args.model_name, role_selector(args.model_name, "prefill")

        def metadata(suffix: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(f"{model}-prefill{suffix}", labels=labels), "namespace": args.namespace}

        k8s.core.v1.Service(f"{name}-pods", metadata=metadata("-pods"), spec=api_body(prefill_service_spec(model)),
                            opts=k8s_opts)
        k8s.networking.v1.NetworkPolicy(f"{name}-ingress", metadata=metadata("-ingress"),
                                        spec=api_body(prefill_ingress(model)), opts=k8s_opts)
        if not args.load_balancer_sources:  # an empty `from` would admit no one: the model unreachable
            raise ValueError(f"PrefillPaths {model}: load_balancer_sources (the proxy-only subnet and the health "
                             "checks' ranges) is required")
        k8s.networking.v1.NetworkPolicy(
            f"{name}-decode-ingress", metadata={**meta(f"{model}-decode-ingress", labels=role_selector(model, "decode")),
                                                "namespace": args.namespace},
            spec=api_body(decode_ingress(model, args.load_balancer_sources, args.metrics_sources)), opts=k8s_opts)
        custom_resource(f"{name}-mesh", ISTIO_API, "AuthorizationPolicy", metadata("-decode-only"),
                        prefill_mesh_policy(model, client_principal(args.namespace), args.pods_cidr), k8s_opts)
        self.register_outputs({"model": model})
