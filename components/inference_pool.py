"""InferencePool: one model's replicas behind the GKE Inference Gateway's endpoint picker.

Declares what llm-d-router v0.10.0's charts (config/charts/llm-d-router-gateway with the routerlib
library chart) install for the GKE provider, as typed Pulumi resources:
  - the InferencePool (inference.networking.k8s.io/v1) selecting the model's vLLM pods, failing
    open or closed as picker.failureMode says;
  - its endpoint picker (EPP): ServiceAccount, a Role that reads pools, objectives, model rewrites
    and pods (and, for leader election, leases and events), the EndpointPickerConfig built from
    the stack's picker settings (scorers, saturation, flow control with a band per priority),
    Deployment and Service, scraped by Managed Prometheus;
  - one InferenceObjective (llm-d.ai/v1alpha2) per tenant, carrying the tenant's priority;
  - the load balancer's HealthCheckPolicy and GCPBackendPolicy, which target the pool
    (GKE's "Deploy GKE Inference Gateway" guide: the default health check asks for '/'), and a
    HealthCheckPolicy on the picker's Service (its leader-only gRPC readiness, every 2 s).

The EPP runs outside the mesh: the load balancer calls it directly (Service Extensions, from
the proxy-only subnet) and it serves its own TLS (--secure-serving, the EPP default); a
sidecar would demand a mesh identity the load balancer does not have. It never serves a
tenant: it only answers "which replica", and the request itself still enters the chosen
replica through that replica's sidecar, JWT and AuthorizationPolicy.

Run as upstream runs it highly available (`--ha-enable-leader-election`): every replica serves
ext_proc, only the leader runs the flow controller and reports ready (cmd/epp/runner/health.go:82-100),
and a standby takes the lease (epp-<ns>-<pool>.llm-d.ai, pkg/epp/server/controller_manager.go:113)
once the leader releases it - on SIGTERM, once its manager has stopped (up to 30 s), the leader
then serving ext_proc for --drain-timeout (runner.go:279-336) - or 15 s after a crashed leader's
last renewal. With flow control on, a stopping leader answers its queued requests and every new
one 503 rejected-shutting-down (flowcontrol/controller/controller.go:271-275): the drain protects
dispatched requests only, and a HealthCheckPolicy on the picker's Service (gRPC 'readiness' every
2 s) takes it out of the load balancer within seconds. One
Ready pod by design shapes the rest: a rollout must be free to replace the old leader while it is
the only available pod; the two replicas run on different nodes, so no single drain or node failure
takes both; and no PodDisruptionBudget: it counts Ready pods, only the leader, so any budget
allows no eviction of the leader and would hold its node's drain for GKE's hour. No metric-name
flags (fatal at v0.10.0: the extractor's vllm defaults are vLLM 0.34's names), pprof is off, and a
NetworkPolicy admits only the load balancer's proxies and health checks to ext_proc and the
metrics scrapers to 9090 (where /debug/plugins/state is served without auth).

The Deployment and its ConfigMap are named <model>-router-epp, not the v1.2.0 picker's <model>-epp:
a stack coming from v1.2.0 gets the new picker, ready, beside the old one, which Pulumi deletes at
the end of the update (picker_migration_notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import yaml

from .k8s_meta import api_body, custom_resource, meta
from .model.disaggregation_cluster import pd_picker_config
from .model.gateway_routes import backend_defaults
from .model.k8s_objects import content_digest, vllm_health_check
from .model.picker import (
    CONFIG_FILE,
    EPP_IMAGE,
    OBJECTIVE_API,
    POOL_API,
    ROLE_RULES,
    PickerExtension,
    objective_spec,
    picker_config,
    picker_container,
    picker_deployment_spec,
    picker_health_check,
    picker_ingress,
    picker_labels,
    picker_monitoring_spec,
    picker_name,
    picker_service_spec,
    picker_workload,
    pool_ref,
    pool_spec,
)
from .model.specs import ImageRef, PickerSpec
from .options import child_opts


@dataclass
class InferencePoolArgs:
    # The pool's name (the HTTPRoute's backendRef); the picker is <name>-epp.
    pool_name: str
    namespace: pulumi.Input[str]
    # Labels of the vLLM pods the pool load-balances.
    selector: Mapping[str, str]
    provider: k8s.Provider
    # InferenceObjective name (the value routes set in the picker's objective header) -> priority.
    objectives: Mapping[str, int] = field(default_factory=dict[str, int])
    port: int = 8000
    # The load balancer's backend timeout: the longest stream, which the picker's drain outlasts.
    request_timeout_seconds: int = 600
    image: ImageRef = EPP_IMAGE
    # The stack's picker settings (failure mode, scorers, saturation, flow control).
    picker: PickerSpec = field(default_factory=PickerSpec)
    # What another concern adds to the picker's config (the KV-events prefix cache, whose tokenizer
    # runs apart: components/render_server.py) and its memory, or nothing.
    extension: Optional[PickerExtension] = None
    # Who may call ext_proc (the load balancer's proxy-only subnet and health-check ranges) and
    # scrape 9090 besides Managed Prometheus' collectors (the nodes' range, for host-network ones).
    load_balancer_sources: Sequence[pulumi.Input[str]] = ()
    metrics_sources: Sequence[str] = ()
    # models[].disaggregation.minPromptTokens: P/D scheduling (disaggregation_cluster.pd_picker_config); 0: none.
    pd_min_prompt_tokens: int = 0


def picker_metadata(args: InferencePoolArgs, annotations: Optional[Mapping[str, str]] = None,
                    name: Optional[str] = None) -> k8s.meta.v1.ObjectMetaArgsDict:
    """Metadata of the picker's objects, named <pool>-epp (or `name`) in the pool's namespace."""
    epp = picker_name(args.pool_name)
    out: k8s.meta.v1.ObjectMetaArgsDict = {**meta(name or epp, labels=picker_labels(epp)),
                                           "namespace": args.namespace}
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
        """The picker's identity, its RBAC, the tenants' objectives, its plugin config and its Deployment."""
        k8s_opts = child_opts(self, opts, provider=args.provider)
        epp, workload = picker_name(args.pool_name), picker_workload(args.pool_name)
        sa = k8s.core.v1.ServiceAccount(f"{name}-epp-sa", metadata=picker_metadata(args), opts=k8s_opts)
        role = k8s.rbac.v1.Role(f"{name}-epp-role", metadata=picker_metadata(args), rules=api_body(ROLE_RULES),
                                opts=k8s_opts)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-epp-binding", metadata=picker_metadata(args),
            role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}),
            subjects=[{"kind": "ServiceAccount", "name": epp, "namespace": args.namespace}],
            opts=child_opts(self, opts, provider=args.provider, depends_on=[role, sa]))
        # The llm-d.ai objectives (a new type token: created here, the old group's deleted at the end
        # of the update), before the picker, so it starts with every tenant's priority.
        objectives = [custom_resource(f"{name}-objective-{objective}", OBJECTIVE_API, "InferenceObjective",
                                      {**meta(objective), "namespace": args.namespace},
                                      objective_spec(args.pool_name, priority), k8s_opts)
                      for objective, priority in sorted(args.objectives.items())]
        plugins = picker_config(args.picker, args.objectives.values(), args.extension)
        if args.pd_min_prompt_tokens:
            plugins = yaml.safe_dump(pd_picker_config(yaml.safe_load(plugins), args.pd_min_prompt_tokens), sort_keys=False)
        config = k8s.core.v1.ConfigMap(f"{name}-epp-config", metadata=picker_metadata(args, name=workload),
                                       data={CONFIG_FILE: plugins}, opts=k8s_opts)
        container = picker_container(args.pool_name, args.namespace, args.image.uri, args.request_timeout_seconds,
                                     args.extension.memory_mib if args.extension else 0)
        spec = picker_deployment_spec(epp, container, content_digest(plugins), args.request_timeout_seconds, workload)
        return k8s.apps.v1.Deployment(
            # Only the leader turns ready, by design: Pulumi waits for it, not for every replica
            # (its default wait would never end).
            f"{name}-epp", metadata=picker_metadata(args, {"pulumi.com/waitFor": "jsonpath={.status.readyReplicas}=1"},
                                                    name=workload),
            spec=api_body(spec),
            # Its RBAC first: without it the picker's watches fail and it restarts until RBAC lands.
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, sa, binding, *objectives]))

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
        # The load balancer moves off a stopping leader within seconds (picker_health_check).
        custom_resource(f"{name}-epp-hc", "networking.gke.io/v1", "HealthCheckPolicy", picker_metadata(args),
                        picker_health_check(epp), child_opts(self, opts, provider=args.provider, depends_on=[service]))
        custom_resource(f"{name}-epp-monitoring", "monitoring.googleapis.com/v1", "PodMonitoring",
                        picker_metadata(args), picker_monitoring_spec(epp), k8s_opts)
        return service

    def _pool(self, name: str, args: InferencePoolArgs, service: k8s.core.v1.Service,
              opts: Optional[pulumi.ResourceOptions]) -> None:
        """The InferencePool and the load balancer's policies on it. Not after the picker's readiness: the
        picker reports ready only once it has read its pool (llm-d-router v0.10.0 cmd/epp/runner/health.go:56,84;
        pkg/epp/datastore/datastore.go:213-216), so a first `pulumi up` waiting for it would never end; the
        routes wait for the picker instead (platform)."""
        pool_meta: k8s.meta.v1.ObjectMetaArgsDict = {**meta(args.pool_name), "namespace": args.namespace}
        self.pool = custom_resource(
            f"{name}-pool", POOL_API, "InferencePool", pool_meta,
            pool_spec(picker_name(args.pool_name), args.port, args.selector, args.picker.failure_mode),
            child_opts(self, opts, provider=args.provider, depends_on=[service]))
        after_pool = child_opts(self, opts, provider=args.provider, depends_on=[self.pool])
        target = pool_ref(args.pool_name)
        custom_resource(f"{name}-hc", "networking.gke.io/v1", "HealthCheckPolicy", pool_meta,
                        vllm_health_check(target, args.port), after_pool)
        custom_resource(
            f"{name}-bp", "networking.gke.io/v1", "GCPBackendPolicy", pool_meta,
            {"default": {**backend_defaults(args.request_timeout_seconds), "logging": {"enabled": True}},
             "targetRef": target}, after_pool)
