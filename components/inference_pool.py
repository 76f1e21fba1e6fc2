"""InferencePool: one model's replicas behind the GKE Inference Gateway's endpoint picker.

Declares what the upstream `inferencepool` chart (gateway-api-inference-extension v1.2.0,
config/charts/inferencepool) installs for the GKE provider, as typed Pulumi resources:
  - the InferencePool (inference.networking.k8s.io/v1) selecting the model's vLLM pods;
  - its endpoint picker (EPP): ServiceAccount, a Role that reads pools, objectives and pods
    (and, for leader election, leases and events), the plugin config (queue depth, KV-cache
    utilisation and prefix-cache affinity scorers), Deployment and Service, scraped by Managed
    Prometheus;
  - one InferenceObjective per tenant, carrying the tenant's priority;
  - the load balancer's HealthCheckPolicy and GCPBackendPolicy, which target the pool
    (GKE's "Deploy GKE Inference Gateway" guide: the default health check asks for '/').

The EPP runs outside the mesh: the load balancer calls it directly (Service Extensions, from
the proxy-only subnet) and it serves its own TLS (--secure-serving, the EPP default); a
sidecar would demand a mesh identity the load balancer does not have. It never serves a
tenant: it only answers "which replica", and the request itself still enters the chosen
replica through that replica's sidecar, JWT and AuthorizationPolicy.

Run as upstream runs it highly available (`--ha-enable-leader-election`, the chart's
replicas > 1 path): every replica serves ext_proc, only the leader runs the controllers and
reports ready (cmd/epp/runner/health.go:46-95), and a standby takes the lease once the leader
releases it, at the end of a graceful stop (ReleaseOnCancel), or 15 s after a crashed leader's last
renewal. One Ready pod by design shapes the rest: a rollout must be free to replace the old leader
while it is the only available pod; the two replicas run on different nodes, so no single drain or
node failure takes both; and no PodDisruptionBudget: it counts Ready pods, only the leader, so any
budget (minAvailable 1 or maxUnavailable 1 alike) allows no eviction of the leader and would hold
its node's drain for GKE's hour, only to be forced then with the same handover. Its metric
names come from the vLLM release (the v1.2.0 default KV-cache gauge is gone from 0.34), pprof is
off (it would be served without auth beside /metrics), and a NetworkPolicy admits only the load
balancer's proxies and health checks to ext_proc and the metrics scrapers to 9090.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.gateway_routes import backend_defaults
from .model.k8s_objects import content_digest, vllm_health_check
from .model.picker import (
    CONFIG_FILE,
    EPP_IMAGE,
    OBJECTIVE_API,
    POOL_API,
    ROLE_RULES,
    objective_spec,
    picker_config,
    picker_container,
    picker_deployment_spec,
    picker_ingress,
    picker_labels,
    picker_monitoring_spec,
    picker_name,
    picker_service_spec,
    pool_ref,
    pool_spec,
)
from .model.specs import ImageRef
from .model.vllm_versions import DEFAULT_VLLM_VERSION, release
from .options import child_opts


@dataclass
class InferencePoolArgs:
    # The pool's name (the HTTPRoute's backendRef); the picker is <name>-epp.
    pool_name: str
    namespace: pulumi.Input[str]
    # Labels of the vLLM pods the pool load-balances.
    selector: Mapping[str, str]
    provider: k8s.Provider
    # InferenceObjective name (the value routes set in x-gateway-inference-objective) -> priority.
    objectives: Mapping[str, int] = field(default_factory=dict[str, int])
    port: int = 8000
    request_timeout_seconds: int = 600
    image: ImageRef = EPP_IMAGE
    # The picker's metric-name flags for the pool's vLLM release (VllmRelease.picker_metrics);
    # the v1.2.0 defaults name a KV-cache gauge vLLM 0.34 no longer exports.
    model_metrics: Mapping[str, str] = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION).picker_metrics)
    # Who may call ext_proc (the load balancer's proxy-only subnet and health-check ranges) and
    # scrape 9090 besides Managed Prometheus' collectors (the nodes' range, for host-network ones).
    load_balancer_sources: Sequence[pulumi.Input[str]] = ()
    metrics_sources: Sequence[str] = ()


def picker_metadata(args: InferencePoolArgs, annotations: Optional[Mapping[str, str]] = None
                    ) -> k8s.meta.v1.ObjectMetaArgsDict:
    """Metadata of the picker's objects, all named <pool>-epp in the pool's namespace."""
    epp = picker_name(args.pool_name)
    out: k8s.meta.v1.ObjectMetaArgsDict = {**meta(epp, labels=picker_labels(epp)), "namespace": args.namespace}
    if annotations:
        out["annotations"] = dict(annotations)
    return out


class InferencePool(pulumi.ComponentResource):
    pool: k8s.apiextensions.CustomResource
    picker: k8s.apps.v1.Deployment
    pool_name: str

    def __init__(self, name: str, args: InferencePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:InferencePool", name, None, opts)
        self.pool_name = args.pool_name
        self.picker = self._picker(name, args, opts)
        service = self._picker_network(name, args, opts)
        self._pool(name, args, service, opts)
        self.register_outputs({"poolName": args.pool_name, "picker": picker_name(args.pool_name),
                               "objectives": sorted(args.objectives)})

    def _picker(self, name: str, args: InferencePoolArgs,
                opts: Optional[pulumi.ResourceOptions]) -> k8s.apps.v1.Deployment:
        """The picker's identity, its RBAC, its plugin config and its Deployment."""
        k8s_opts = child_opts(self, opts, provider=args.provider)
        epp = picker_name(args.pool_name)
        sa = k8s.core.v1.ServiceAccount(f"{name}-epp-sa", metadata=picker_metadata(args), opts=k8s_opts)
        role = k8s.rbac.v1.Role(f"{name}-epp-role", metadata=picker_metadata(args), rules=api_body(ROLE_RULES),
                                opts=k8s_opts)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-epp-binding", metadata=picker_metadata(args),
            role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}),
            subjects=[{"kind": "ServiceAccount", "name": epp, "namespace": args.namespace}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[role, sa]))
        plugins = picker_config()
        config = k8s.core.v1.ConfigMap(f"{name}-epp-config", metadata=picker_metadata(args),
                                       data={CONFIG_FILE: plugins}, opts=k8s_opts)
        container = picker_container(args.pool_name, args.namespace, args.image.uri, args.model_metrics)
        return k8s.apps.v1.Deployment(
            # Only the leader turns ready, by design: Pulumi waits for it, not for every replica
            # (its default wait would never end).
            f"{name}-epp", metadata=picker_metadata(args, {"pulumi.com/waitFor": "jsonpath={.status.readyReplicas}=1"}),
            spec=api_body(picker_deployment_spec(epp, container, content_digest(plugins))),
            # Its RBAC first: without it the picker's watches fail and it restarts until RBAC lands.
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa, binding]))

    def _picker_network(self, name: str, args: InferencePoolArgs,
                        opts: Optional[pulumi.ResourceOptions]) -> k8s.core.v1.Service:
        """Who may reach the picker, its Service and its scrape."""
        k8s_opts = child_opts(self, opts, provider=args.provider)
        epp = picker_name(args.pool_name)
        if not args.load_balancer_sources:
            # An ingress rule with no sources admits every source: never declare one.
            raise ValueError(f"InferencePool {args.pool_name}: load_balancer_sources (the proxy-only subnet and "
                             "the health-check ranges) are required")
        k8s.networking.v1.NetworkPolicy(
            f"{name}-epp-ingress", metadata=picker_metadata(args),
            spec=api_body(picker_ingress(epp, args.load_balancer_sources, args.metrics_sources)), opts=k8s_opts)
        service = k8s.core.v1.Service(
            # The standby replicas are unready by design (only the leader is ready): Pulumi's wait
            # for a Service with no unready address would fail every update of it.
            f"{name}-epp-svc", metadata=picker_metadata(args, {"pulumi.com/skipAwait": "true"}),
            spec=api_body(picker_service_spec(epp)), opts=k8s_opts)
        custom_resource(f"{name}-epp-monitoring", "monitoring.googleapis.com/v1", "PodMonitoring",
                        picker_metadata(args), picker_monitoring_spec(epp), k8s_opts)
        return service

    def _pool(self, name: str, args: InferencePoolArgs, service: k8s.core.v1.Service,
              opts: Optional[pulumi.ResourceOptions]) -> None:
        """The InferencePool, its tenants' objectives and the load balancer's policies on it."""
        pool_meta: k8s.meta.v1.ObjectMetaArgsDict = {**meta(args.pool_name), "namespace": args.namespace}
        self.pool = custom_resource(
            f"{name}-pool", POOL_API, "InferencePool", pool_meta,
            pool_spec(picker_name(args.pool_name), args.port, args.selector),
            child_opts(self, opts, provider=args.provider, depends_on=[service]))
        after_pool = child_opts(self, opts, provider=args.provider, depends_on=[self.pool])
        for objective, priority in sorted(args.objectives.items()):
            custom_resource(f"{name}-objective-{objective}", OBJECTIVE_API, "InferenceObjective",
                            {**meta(objective), "namespace": args.namespace},
                            objective_spec(args.pool_name, priority), after_pool)
        target = pool_ref(args.pool_name)
        custom_resource(f"{name}-hc", "networking.gke.io/v1", "HealthCheckPolicy", pool_meta,
                        vllm_health_check(target, args.port), after_pool)
        custom_resource(
            f"{name}-bp", "networking.gke.io/v1", "GCPBackendPolicy", pool_meta,
            {"default": {**backend_defaults(args.request_timeout_seconds), "logging": {"enabled": True}},
             "targetRef": target}, after_pool)
