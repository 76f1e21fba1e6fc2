"""VllmService: one serving pool (short or long requests) of one model.

Declares the Deployment running vLLM's OpenAI server from the pinned image (its command line,
environment and resources: components/model/vllm_server.py), its Service, a PodDisruptionBudget, a KEDA
ScaledObject on queue depth (vllm:num_requests_waiting, read from Managed Prometheus;
components/model/keda_scaling.py) and a PodMonitoring for scraping.

Every pool is scaled by KEDA, whatever its floor: one autoscaling path, one external metrics
server (KEDA's), and a floor raised from 0 is a ScaledObject update that KEDA's operator acts on
at once (it scales a target below minReplicaCount up to it; an HPA never scales from zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, cast

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .keda import gmp_query_url
from .model.cold_start import NODE_PROVISION_S
from .model.k8s_objects import group_name_of
from .model.keda_scaling import KedaScaling, primary_queries, primary_scaled_object, scaled_object
from .model.mesh_identity import STANDBY_SA
from .model.picker_prefix import pool_events_ingress
from .model.pods.server import ServerPod, leader_pod, server_pod, worker_pod
from .model.rollouts import FLAGGER_API, WORKLOAD_LABEL, FlaggerPool, canary_spec
from .model.serving_plan import PoolName
from .model.serving_pool import (
    EXCLUSIVE_TOPOLOGY,
    LWS_API_VERSION,
    SERVER_LABELS,
    PoolIdentity,
    Rollout,
    budget_spec,
    check_pool,
    deployment_spec,
    grace_seconds,
    group_network_policy,
    leader_worker_set,
    pod_monitoring_spec,
    pool_identity,
    rollout,
    service_spec,
)
from .model.specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec
from .model.stack_config import ConfigError, ConfigIssue
from .model.vllm_server import xla_cache_host_path
from .model.vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .model.weights_layout import SERVER_SA
from .model.weights_mount import WeightsMount
from .options import child_opts
from .standby import Standby, StandbyArgs


class VllmServiceConfigError(ConfigError, pulumi.RunError):
    """What a pool is asked to serve does not run (the stack config's own checks, keyed as the
    package spells its inputs): `pulumi up` prints it without a stack trace."""


@dataclass
class VllmServiceArgs:
    model: ModelSpec
    pool_name: PoolName
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    namespace: pulumi.Input[str]
    image: ImageRef
    # How the pods read the weights (ModelStore.mount_for: the backend's volumes, mounts and annotations).
    weights: WeightsMount
    provider: k8s.Provider
    # What the in-server guard admits: serving_api.guard_config(tenants, routes, ...). Required: a
    # guard without tenants refuses every request.
    # Per-issuer max_tokens caps and rate limits the in-server guard enforces.
    guard_config: Mapping[str, Any]
    # The tenant owning dedicated replicas (their pods carry its label, which its mesh policies select).
    tenant: Optional[str] = None
    release: VllmRelease = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION))
    # A canary of another revision runs as its own pool beside the stable one.
    canary: bool = False
    # KEDA scales every pool (Keda installed; for minReplicas 0, with the standby's name).
    scaling: Optional[KedaScaling] = None
    # The load balancer's backend timeout (GatewaySpec.request_timeout_seconds): how long a
    # stopping replica keeps finishing the requests it accepted.
    request_timeout_seconds: int = 600
    # The servers' Kubernetes service account (MeshNamespace service_accounts creates it); None:
    # the namespace's default.
    service_account: Optional[str] = SERVER_SA
    # The TTFT SLO's threshold (monitoring.ttftSloSeconds, where SLOs are kept): added to vLLM's
    # TTFT buckets where it is not a bound, so the SLO counts exactly.
    ttft_slo_seconds: Optional[float] = None
    # Seconds a replica takes from start to warm (components/model/cold_start.py): its startup probe
    # allows half as long again, and a standby tells callers a wake takes a node and this long.
    load_seconds: float = 0.0
    # The cluster's pod range (cluster.podsCidr): a multi-host group's leader reaches its workers
    # there outside the mesh.
    pods_cidr: Optional[str] = None
    # Where the servers send traces (TraceCollector.endpoint) and the share of tenant requests
    # traced; None: no traces.
    traces_endpoint: Optional[str] = None
    trace_sample_ratio: float = 0.01
    # The rolling update (capacity.rollout_strategy, from the room the node pool has with its other
    # pools at their ceilings); None: from this pool's own room on the node pool.
    rolling: Optional[Mapping[str, int | str]] = None
    # Where the pool replaces replicas in place on a full node pool: how long a step may wait behind
    # the other pools' rollouts there (their pending pods may take each device it frees).
    wait_behind_seconds: float = 0.0
    # A disaggregated model's pool (models[].disaggregation): the other role's node pool, which NIXL's
    # transport (RDMA where both have it) depends on; None: TCP.
    kv_peer: Optional[NodePoolSpec] = None
    # A pool Flagger rolls out (serving_plan.pool_rollout): its Canary's route, gates and webhooks.
    # Its Deployment is then Flagger's target and Flagger owns its Services and its HTTPRoute.
    flagger: Optional[FlaggerPool] = None
    # The Gateway's namespace (the Canary's route attaches to it).
    gateway_namespace: pulumi.Input[str] = ""
    # What the Canary waits for: Flagger (its CRDs come with its chart) and the gates' templates.
    flagger_ready: Sequence[pulumi.Resource] = ()
    # The endpoint picker (its name, <pool>-epp, in this namespace) that reads the servers' KV-cache
    # events (picker.prefixCache precise): the servers publish them, to its pods alone. None: no events.
    kv_events_picker: Optional[str] = None

    def __post_init__(self) -> None:
        """Args that would not serve are refused here, with every problem at once."""
        issues: list[ConfigIssue] = []
        check_pool(lambda key, problem: issues.append(ConfigIssue(key, problem)), self.model, self.pool_name,
                   self.node_pool, self.image, self.release, self.pods_cidr, self.request_timeout_seconds)
        if issues:
            raise VllmServiceConfigError(issues, f"VllmService args ({self.model.name} {self.pool_name} pool)")


class VllmService(pulumi.ComponentResource):
    # One node a replica: a Deployment; across hosts: a LeaderWorkerSet (`workload` either way).
    deployment: Optional[k8s.apps.v1.Deployment] = None
    group_name: Optional[str] = None
    workload: pulumi.Resource
    # The pool's Service (None where Flagger owns it: <service>, -primary and -canary).
    service: Optional[k8s.core.v1.Service] = None
    service_name: str
    # A Flagger pool's Canary.
    canary_resource: Optional[pulumi.Resource] = None
    # With minReplicas 0: what answers at zero and wakes the pool.
    standby: Optional[Standby] = None

    def __init__(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if "issuers" not in (args.guard_config or {}):
            raise ValueError(f"VllmService {name}: guard_config has no issuers, so the guard would refuse every "
                             "request; build it with serving_api.guard_config(tenants, tenant_routes(), ...)")
        if args.scaling is None:
            raise ValueError(f"{args.model.name} {args.pool_name} pool: scaling (KEDA) is required")
        super().__init__("vllm-gke:index:VllmService", name, None, opts)
        who = pool_identity(args.model, args.pool_name, args.canary, args.tenant)
        self.service_name = who.service_name
        self.flagger = args.flagger if args.flagger is not None and args.flagger.plan.is_canary else None
        grace = grace_seconds(args.request_timeout_seconds)
        pods = server_pod_facts(args, who, grace, flagger=self.flagger is not None)
        plan = rollout(args.pool, args.node_pool, pods.hosts, args.load_seconds, grace, args.rolling,
                       args.wait_behind_seconds)
        if pods.hosts == 1:
            self._deployment(name, args, opts, who, pods, plan)
        else:
            self._group(name, args, opts, who, pods, plan)
        if self.flagger is None:
            self._service(name, args, opts, who)
        self._budget(name, args, opts, who)
        if args.kv_events_picker:
            # The events carry every tenant's prompt tokens, unauthenticated: the picker's pods alone.
            k8s.networking.v1.NetworkPolicy(
                f"{name}-kv-events", metadata={**meta(f"{self.service_name}-kv-events", labels=who.labels),
                                               "namespace": args.namespace},
                spec=api_body(pool_events_ingress({**who.selector, **SERVER_LABELS}, args.namespace,
                                                  args.kv_events_picker)),
                opts=child_opts(self, opts, provider=args.provider))
        self._scaling(name, args, args.scaling, opts, who)
        if self.flagger is not None:
            self._canary(name, args, self.flagger, opts)
        # A pool at zero behind a picker that queues has none (picker_wake.py): KEDA wakes it on the queue.
        if args.pool.min_replicas == 0 and args.scaling.standby:
            self.standby = self._standby(name, args, opts, who)
        self.register_outputs({"serviceName": self.service_name, "hosts": pods.hosts,
                               "deployment": self.service_name if pods.hosts == 1 else None,
                               "leaderWorkerSet": self.group_name})

    def _workload_opts(self, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
                       plan: Rollout) -> pulumi.ResourceOptions:
        return child_opts(self, opts, provider=args.provider,
                          # A first rollout waits for the weights to load: allow for it.
                          custom_timeouts=pulumi.CustomTimeouts(create=f"{plan.create_minutes}m",
                                                                update=f"{plan.update_minutes}m"),
                          # With server-side apply, pulumi-kubernetes drops an ignored field that
                          # another manager (KEDA, through the scale subresource) owns, so an
                          # update neither conflicts nor resets the count (pulumi-kubernetes#2566).
                          ignore_changes=["spec.replicas"])

    def _deployment(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
                    who: PoolIdentity, pods: ServerPod, plan: Rollout) -> None:
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy",
            metadata={**meta(self.service_name, labels=who.labels), "namespace": args.namespace},
            spec=api_body(deployment_spec(args.pool, {**who.selector, **self._workload()}, plan, server_pod(pods),
                                          start_at_zero=self.flagger is not None)),
            opts=self._workload_opts(args, opts, plan))
        self.workload = self.deployment

    def _workload(self) -> dict[str, str]:
        """A Flagger target's own label, in its selector and on its pods: Flagger suffixes it with
        -primary on the primary it copies, the one label that tells the two apart."""
        return {WORKLOAD_LABEL: self.service_name} if self.flagger is not None else {}

    def _group(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
               who: PoolIdentity, pods: ServerPod, plan: Rollout) -> None:
        self.group_name = group = group_name_of(self.service_name)
        self.workload = custom_resource(
            f"{name}-group", LWS_API_VERSION, "LeaderWorkerSet",
            {**meta(group, labels=who.labels, annotations=EXCLUSIVE_TOPOLOGY if args.node_pool.is_tpu else None),
             "namespace": args.namespace},
            leader_worker_set(args.pool, pods.hosts, leader_pod(pods), worker_pod(pods), surge=plan.surge),
            self._workload_opts(args, opts, plan))
        k8s.networking.v1.NetworkPolicy(
            f"{name}-group-netpol",
            metadata={**meta(f"{group}-group", labels=who.labels), "namespace": args.namespace},
            spec=api_body(group_network_policy(group)), opts=child_opts(self, opts, provider=args.provider))

    def _service(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
                 who: PoolIdentity) -> None:
        self.service = k8s.core.v1.Service(
            f"{name}-svc",
            # A pool that may go to zero shares its Service with a standby that is never ready
            # while the pool serves: Pulumi's wait for a Service with no unready address would
            # fail every update then.
            metadata={**meta(self.service_name, labels=who.labels,
                             annotations={"pulumi.com/skipAwait": "true"} if args.pool.min_replicas == 0 else None),
                      "namespace": args.namespace},
            spec=api_body(service_spec(who.selector)), opts=child_opts(self, opts, provider=args.provider))

    def _budget(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
                who: PoolIdentity) -> None:
        """Over the pool's pods, a Flagger pool's primary and canary alike (the selector has no workload label)."""
        self.pdb = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata={**meta(self.service_name, labels=who.labels), "namespace": args.namespace},
            spec=api_body(budget_spec(who.selector, self.group_name)), opts=child_opts(self, opts, provider=args.provider))

    def _canary(self, name: str, args: VllmServiceArgs, pool: FlaggerPool,
                opts: Optional[pulumi.ResourceOptions]) -> None:
        """The Canary that makes the Deployment Flagger's target (after it and its ScaledObject)."""
        service = self.service_name
        spec = pulumi.Output.all(args.namespace, args.gateway_namespace).apply(lambda ns: canary_spec(
            service, args.pool_name, args.pool.min_replicas, pool, ns[1], primary_queries(service, ns[0])))
        self.canary_resource = custom_resource(
            f"{name}-canary", FLAGGER_API, "Canary",
            {**meta(service, labels=pool_identity(args.model, args.pool_name, False, args.tenant).labels),
             "namespace": args.namespace},
            spec, child_opts(self, opts, provider=args.provider,
                             depends_on=[self.workload, self.autoscaler, *args.flagger_ready,
                                         *([self.primary_autoscaler] if self.primary_autoscaler else [])]))

    def _scaling(self, name: str, args: VllmServiceArgs, scaling: KedaScaling,
                 opts: Optional[pulumi.ResourceOptions], who: PoolIdentity) -> None:
        """KEDA's ScaledObject on the pool's queue (after the workload it scales) and the scrape; for a
        Flagger pool, the canary's and the primary's. Flagger pauses the canary's (KEDA's paused-replicas
        annotation) between analyses: the plan never declares that annotation, so an update never sets it
        back mid-analysis (pulumi-kubernetes' server-side apply leaves a field it does not declare to the
        manager that set it; an ignore_changes on it would not hold: its path splitting drops the key)."""
        service, group, flagger = self.service_name, self.group_name, self.flagger
        metadata: k8s.meta.v1.ObjectMetaArgsDict = {**meta(service, labels=who.labels), "namespace": args.namespace}
        spec = pulumi.Output.from_input(args.namespace).apply(lambda ns: scaled_object(
            service, ns, args.pool, scaling, gmp_query_url(scaling.project), group=group,
            canary_max=flagger.plan.canary_replicas if flagger else 0))
        self.autoscaler = custom_resource(
            f"{name}-scaledobject", "keda.sh/v1alpha1", "ScaledObject", metadata, spec,
            child_opts(self, opts, provider=args.provider, depends_on=[self.workload]))
        self.primary_autoscaler: Optional[pulumi.Resource] = None
        if flagger is not None:
            primary = f"{service}-primary"
            self.primary_autoscaler = custom_resource(
                f"{name}-primary-scaledobject", "keda.sh/v1alpha1", "ScaledObject",
                {**meta(primary, labels=who.labels), "namespace": args.namespace},
                pulumi.Output.all(spec, args.namespace).apply(lambda a: primary_scaled_object(
                    a[0], primary, args.pool.min_replicas, flagger.plan.primary_max, primary_queries(service, a[1]))),
                child_opts(self, opts, provider=args.provider, depends_on=[self.workload]))
        custom_resource(f"{name}-podmonitoring", "monitoring.googleapis.com/v1", "PodMonitoring", metadata,
                        pod_monitoring_spec(who.selector), child_opts(self, opts, provider=args.provider))

    def _standby(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions],
                 who: PoolIdentity) -> Standby:
        """At zero the standby answers (503, Retry-After) and its request count wakes the pool.
        Named after this component (unique among the program's resources), not the pool's Service:
        a shared and a dedicated copy of one model share the Service name. Declared beside this
        component before it was its child: aliased to where it was."""
        return Standby(f"{name}-standby", StandbyArgs(
            service_name=self.service_name, model=args.model.name, namespace=args.namespace,
            pool_selector=who.selector, vllm_only_labels=SERVER_LABELS, provider=args.provider,
            policy_labels=who.policy_labels, expected_seconds=int(NODE_PROVISION_S + args.load_seconds),
            service_account=STANDBY_SA),
            opts=child_opts(self, opts, aliases=sibling_aliases(opts)))


def server_pod_facts(args: VllmServiceArgs, who: PoolIdentity, grace: int, flagger: bool = False) -> ServerPod:
    # The pool's own XLA cache directory on its TPU nodes (the namespace may be another resource's output).
    xla_cache_path = pulumi.Output.from_input(args.namespace).apply(
        lambda ns: xla_cache_host_path(ns, who.service_name)) if args.node_pool.is_tpu else None
    return ServerPod(
        model=args.model, pool=args.pool, node_pool=args.node_pool, image_uri=args.image.uri, release=args.release,
        guard_config=args.guard_config, weights=args.weights,
        labels={**who.labels, **({WORKLOAD_LABEL: who.service_name} if flagger else {})}, selector=who.selector,
        service_name=who.service_name, grace_seconds=grace, load_seconds=args.load_seconds,
        request_timeout_seconds=args.request_timeout_seconds, service_account=args.service_account,
        ttft_slo_seconds=args.ttft_slo_seconds, traces_endpoint=args.traces_endpoint,
        trace_sample_ratio=args.trace_sample_ratio, pods_cidr=args.pods_cidr, xla_cache_path=xla_cache_path,
        kv_events=args.kv_events_picker is not None, kv_peer=args.kv_peer)


def sibling_aliases(opts: Optional[pulumi.ResourceOptions]) -> list[pulumi.Alias]:
    """Where a child of a component was declared as the component's sibling: under the component's
    parent (none: the stack root), and under each parent the component itself is aliased to."""
    parents: list[Any] = [opts.parent if opts else None]
    # An alias's parent is ... (Ellipsis) where it keeps the resource's own.
    parents += [parent for a in ((opts.aliases if opts else None) or [])
                if isinstance(a, pulumi.Alias) and (parent := cast(Any, a.parent)) is not ...]
    return [pulumi.Alias(parent=p) for p in parents]
