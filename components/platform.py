"""Platform: a whole serving platform from one StackConfig - the stack program's composition as
a component, for teams whose own Pulumi program declares the platform (and for the stack program,
which is this and its exports).

Every resource the stacks declared at the top level is now a child of the Platform; each carries
an alias to the stack root, so a stack created before the component existed keeps its resources
(the engine matches them by the old URNs) instead of replacing them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi

from .cloud_run import CloudRunServices, CloudRunServicesArgs
from .cloud_run_gateway import CloudRunGateway, build_cloud_run_gateway
from .flagger import Flagger, FlaggerArgs
from .gateway import Gateway, GatewayArgs
from .gpu_cluster import GpuCluster, GpuClusterArgs
from .identity_extension import IdentityExtension, IdentityExtensionArgs
from .inference_objective_crd import InferenceObjectiveCrd, InferenceObjectiveCrdArgs
from .inference_pool import InferencePool, InferencePoolArgs
from .keda import Keda, KedaArgs
from .leader_worker_set import LeaderWorkerSetController, LeaderWorkerSetControllerArgs
from .limit_store import PORT as LIMITS_PORT
from .limit_store import CloudRunStoreArgs, LimitStore, LimitStoreArgs
from .load_test import LoadTest, LoadTestArgs, Target
from .mesh_namespace import MeshNamespace, MeshNamespaceArgs, TrustedSources
from .mesh_readiness import MeshReadiness, MeshReadinessArgs
from .model.capacity import consumer_models, hosts_per_replica, placements
from .model.cloud_run import cloud_run_egress_region, cloud_run_services, weights_models
from .model.cloud_run_monitoring import run_targets
from .model.cloud_run_store import cloud_run_access, secret_env
from .model.cloud_run_tenancy import invoker_members
from .model.config_errors import in_program_words, stack_config
from .model.config_rules import cross_field_issues
from .model.disaggregation_cluster import forwards_token as pd_forwards_token
from .model.fallback import forwards_token
from .model.gateway_routes import GATEWAY_NAME, RouteTarget, serving_listener
from .model.gcp_apis import required_apis
from .model.gcp_names import service_account_id
from .model.identity_extension import config_text, identity_image, needs_identity
from .model.keda_scaling import KedaScaling
from .model.mesh_identity import STANDBY_SA, jwks_host, tenant_namespace
from .model.picker_prefix import (
    index_mib,
    pool_picker,
    precise_extension,
    reads_kv_events,
    render_deployment_spec,
    render_weights_prefixes,
)
from .model.picker_wake import inference_pool_selector, picker_queue
from .model.rollout_webhooks import LoadTestRef, load_test_webhooks
from .model.rollouts import FlaggerPool, gates
from .model.serving_api import picker_salted_paths
from .model.serving_plan import (
    PoolService,
    Serving,
    dedicated_models,
    flagger_pools,
    floor_dollars_per_hour,
    picker_objectives,
    pool_services,
    rollout_load_tests,
    route_targets,
    servings,
    shared_models,
)
from .model.specs import LoadTestSpec
from .model.stack_config import ConfigError, ConfigIssue, StackConfig
from .model.tenant_urls import TenantUrl, tenant_urls
from .model.vllm_versions import release
from .model.weights_backends import backend_of
from .model.weights_layout import SERVER_SA, model_dir, reads_hub_token_from_secret_manager
from .model_store import ModelStore, ModelStoreArgs, WeightsPrune
from .observability import Observability, ObservabilityArgs
from .options import child_opts
from .prefill_pool import PrefillPaths, PrefillPathsArgs
from .project_apis import ProjectApis, ProjectApisArgs
from .render_server import RenderServer, RenderServerArgs
from .standby import Standby
from .tenant_auth import TenantAuth, TenantAuthArgs
from .trace_collector import TraceCollector, TraceCollectorArgs
from .vllm_service import VllmService, VllmServiceArgs
from .weights_bucket import BucketStorage

__all__ = ["Platform", "PlatformArgs", "PlatformConfigError"]


class PlatformConfigError(ConfigError, pulumi.RunError):
    """A Platform's config problems, as a RunError: `pulumi up` prints them without a stack trace."""


def _validated(name: str, config: StackConfig | Mapping[str, Any]) -> StackConfig:
    """The stack config's checks (per key, then across fields: capacity, fit, references, the vLLM
    release's parser), with its messages, whoever builds the config."""
    source = f"Platform '{name}' config"
    if not isinstance(config, StackConfig):
        return _validated_mapping(name, config)
    if issues := cross_field_issues(config):
        raise PlatformConfigError(in_program_words(issues), source)
    return config


def _validated_mapping(name: str, config: Mapping[str, Any]) -> StackConfig:
    """Settings given as a mapping: every problem named as the code wrote it (`config.models[x]`)."""
    source = f"Platform '{name}' config"
    try:
        return stack_config(config, "config", source)
    except ConfigError as exc:
        raise PlatformConfigError(in_program_words(exc.issues), source) from None


@dataclass
class PlatformArgs:
    # The platform's settings: a StackConfig, or the mapping a stack file's config holds (camelCase
    # keys), validated here with the stack config's messages (`config.nodePools[gpu].minNode is not
    # a known setting; did you mean minNodes?`) rather than pydantic's.
    config: StackConfig | Mapping[str, Any]
    # What the children's names start with: by default the Platform's own name and '-', so two
    # platforms in one program (two regions, say) never share a URN. The stack program uses "".
    child_prefix: Optional[str] = None
    # Only the stack program: alias each child to the stack root, where stacks made before this
    # component declared it (so they keep those resources). Elsewhere an alias to the root could
    # take over a top-level resource of the same name.
    stack_aliases: bool = False
    # Machine type -> (on-demand, spot) $ an hour: the load tests' dollars per million tokens (the
    # stack program passes the plan's price table; without one the tests report no cost).
    machine_prices: Mapping[str, tuple[float, float]] = field(default_factory=dict[str, tuple[float, float]])


class Platform(pulumi.ComponentResource):
    """GKE with GPU pools, the weights store, tenants, vLLM pools behind the gateway, autoscaling,
    limits and monitoring: everything one stack declares. What is served is computed as data
    first (components/model/serving_plan.py); each method here declares one part of it."""

    # The validated settings everything here is declared from (the plan reads them back).
    config: StackConfig
    apis: ProjectApis
    cluster: GpuCluster
    mesh: MeshReadiness
    serving: MeshNamespace
    store: ModelStore
    keda: Keda
    lws: Optional[LeaderWorkerSetController]
    tenants: dict[str, TenantAuth]
    services: dict[str, VllmService]
    inference_pools: dict[str, InferencePool]
    limit_store: Optional[LimitStore]
    trace_collector: Optional[TraceCollector]
    load_tests: dict[str, LoadTest]
    weights_prune: WeightsPrune
    standbys: dict[str, Standby]
    gateway: Gateway
    # The tenant identity extension, where some model is behind an endpoint picker.
    identity: Optional[IdentityExtension]
    observability: Observability
    # Flagger, where some pool rolls out by canary (rollouts.enabled).
    flagger: Optional[Flagger]
    routes: dict[str, str]
    # The models on Cloud Run GPUs (vllm-gke:cloudRun), where the stack has some.
    cloud_run: Optional[CloudRunServices]
    # Their load balancer, of the gateway's class, beside the Gateway.
    cloud_run_gateway: Optional[CloudRunGateway] = None

    def __init__(self, name: str, args: PlatformArgs, opts: Optional[pulumi.ResourceOptions] = None):
        cfg = _validated(name, args.config)
        super().__init__("vllm-gke:index:Platform", name, None, opts)
        self.config, self._given_opts = cfg, opts
        self._prefix = f"{name}-" if args.child_prefix is None else args.child_prefix
        self._root_aliases = [pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)] if args.stack_aliases else []
        self.services, self.inference_pools, self.standbys, self.load_tests = {}, {}, {}, {}
        # model -> what reads its folders (servers of every pool, canary, dedicated copy; load tests).
        self._readers: dict[str, list[pulumi.Resource]] = {}
        self._cluster()
        self._namespaces()
        self._store()
        self._shared_services()
        self._observe()
        self._rollouts()
        targets = [target for serving in servings(cfg) for target in self._serve(serving)]
        self._front(targets)
        self._cloud_run()
        self._load_tests(args.machine_prices)
        # Only once all of them were updated onto the kept folders are the others removed.
        self.weights_prune = WeightsPrune(f"{self._prefix}weights-prune", self.store, weights_models(cfg), self._readers,
                                          self.cluster.provider, opts=self._opts_for(),
                                          unpruned=sorted({s.model.name for s in servings(cfg) if flagger_pools(cfg, s)}))
        self.routes = {t.route_name: f"/{t.path_prefix}/v1" for t in targets}
        self.register_outputs({"clusterName": self.cluster.cluster.name, "kubeconfig": self.cluster.kubeconfig,
                               "routes": self.routes, "dashboard": self.observability.dashboard.id,
                               "filestore": {"tier": self.store.tier, "capacityGb": self.store.capacity_gb}})

    def _opts_for(self, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
        """Parented here, waiting for what the Platform waits for (and, in the stack program,
        aliased to the stack root, where earlier stacks declared the same resource)."""
        return child_opts(self, self._given_opts, depends_on=depends_on, aliases=self._root_aliases)

    def _cluster(self) -> None:
        """The project's APIs, the cluster and its pools, the mesh, KEDA and (for replicas across
        hosts) the LeaderWorkerSet controller."""
        cfg, p = self.config, self._prefix
        self.apis = ProjectApis(f"{p}apis", ProjectApisArgs(cfg.project, required_apis(cfg)), opts=self._opts_for())
        self.cluster = GpuCluster(f"{p}gke", GpuClusterArgs(
            project=cfg.project, region=cfg.region, cluster=cfg.cluster, node_pools=cfg.node_pools,
            labels={"environment": cfg.environment}, apis=self.apis, gcs_fuse=backend_of(cfg.weights).needs_gcs_fuse,
            secret_manager=reads_hub_token_from_secret_manager(weights_models(cfg), cfg.weights),
            # The loaders write the bucket through Cloud Storage FUSE; Volume Populator's transfer
            # Jobs copy it onto the disks on nodes of their own pool.
            populator_machine_type=backend_of(cfg.weights).transfer_machine_type(cfg.weights)),
            opts=self._opts_for())
        provider, network = self.cluster.provider, self.cluster.network.id
        control_plane = cfg.cluster.master_cidr if cfg.cluster.private_nodes else None
        # Istio resources and meshed pods wait until the managed control plane serves the cluster.
        self.mesh = MeshReadiness(f"{p}mesh", MeshReadinessArgs(provider, cfg.cluster.release_channel),
                                  opts=self._opts_for())
        # KEDA scales every serving pool on vLLM's metrics in Managed Prometheus (and serves the
        # cluster's external metrics API: the one server of it).
        self.keda = Keda(f"{p}keda", KedaArgs(
            project=cfg.project, provider=provider, workload_pool=self.cluster.workload_pool,
            gsa_name=service_account_id(cfg.cluster.name, "keda"), apis=self.apis, network=network,
            control_plane_cidr=control_plane), opts=self._opts_for())
        # Replicas across hosts are LeaderWorkerSet groups: its controller, where a model needs one.
        self.lws = None
        if any(hosts_per_replica(m, cfg.pool(n)) > 1 for m, n, _t in placements(cfg)):
            self.lws = LeaderWorkerSetController(f"{p}lws", LeaderWorkerSetControllerArgs(
                project=cfg.project, provider=provider, network=network, apis=self.apis,
                control_plane_cidr=control_plane), opts=self._opts_for())

    def _namespaces(self) -> None:
        """The shared servers' namespace, and each tenant's (its auth, and a dedicated copy's servers)."""
        cfg, provider = self.config, self.cluster.provider
        self._sources = TrustedSources.for_cluster(self.cluster.proxy_only_cidr, cfg.cluster.pods_cidr,
                                                   cfg.cluster.subnet_cidr)
        after_mesh = self._opts_for([self.mesh])
        self.serving = MeshNamespace(f"{self._prefix}serving", MeshNamespaceArgs(
            cfg.serving_namespace, provider, sources=self._sources,
            jwks_hosts=sorted({jwks_host(t) for t in cfg.tenants if shared_models(t, cfg)}),
            service_accounts=(SERVER_SA, STANDBY_SA)), opts=after_mesh)
        self.tenants = {
            t.name: TenantAuth(f"{self._prefix}tenant-{t.name}", TenantAuthArgs(
                tenant=t, provider=provider, serving_namespace=self.serving.name, shared_models=shared_models(t, cfg),
                sources=self._sources,
                picker_models=[m for m in shared_models(t, cfg) if cfg.model(m).routing == "inference-gateway"],
                service_accounts=(SERVER_SA, STANDBY_SA) if t.dedicated else (),
                forward_token=forwards_token(cfg, t) or pd_forwards_token(cfg, t),
                disaggregated_models=[m for m in shared_models(t, cfg) if cfg.model(m).disaggregation is not None]),
                opts=after_mesh)
            for t in cfg.tenants
        }

    def _namespace(self, tenant: Optional[str]) -> Any:
        """Where a tenant's dedicated copy (or, for None, the shared servers) runs."""
        return self.tenants[tenant].namespace.name if tenant else self.serving.name

    def _identities(self, tenant: Optional[str]) -> pulumi.Resource:
        """The MeshNamespace holding the servers' and standbys' service accounts."""
        return self.tenants[tenant].namespace if tenant else self.serving

    def _store(self) -> None:
        """The one read-only copy of the weights, for every namespace that serves them."""
        cfg = self.config
        consumers: dict[str, pulumi.Input[str]] = {"serving": self.serving.name}
        consumers.update({t.name: self._namespace(t.name) for t in cfg.tenants if t.dedicated})
        self.store = ModelStore(f"{self._prefix}weights", ModelStoreArgs(
            project=cfg.project, zone=cfg.cluster.zones[0], region=cfg.region, network_name=self.cluster.network.name,
            workload_pool=self.cluster.workload_pool, models=weights_models(cfg), weights=cfg.weights,
            server_image=cfg.server_image, provider=self.cluster.provider, consumer_namespaces=consumers,
            consumer_models=consumer_models(cfg), zones=cfg.cluster.zones, transfer_ready=self.cluster.transfer_ready,
            instance_name=f"{cfg.cluster.name}-weights", apis=self.apis, protect=cfg.cluster.deletion_protection,
            vllm_release=release(cfg.vllm_version)), opts=self._opts_for())

    def _shared_services(self) -> None:
        """What the servers share: the limit store, the trace collector, the picker's CRD."""
        cfg, provider, after_mesh = self.config, self.cluster.provider, self._opts_for([self.mesh])
        # The vLLM servers' own identities (SERVER_SA) may connect, nothing else in their namespaces.
        clients = [cfg.serving_namespace, *(tenant_namespace(t) for t in cfg.tenants if t.dedicated)]
        access = cloud_run_access(cfg)  # the Cloud Run guards' way in, where the stack has them
        self.limit_store = LimitStore(f"{self._prefix}limits", LimitStoreArgs(
            provider, clients, cfg.global_limits.image, cloud_run=access and CloudRunStoreArgs(
                access, cfg.project, cfg.region, self.cluster.subnetwork.id, self.cluster.workload_pool, self.apis)),
            opts=after_mesh) if cfg.global_limits.enabled else None
        traces = cfg.monitoring.traces
        # Spans from the vLLM servers' own identities, nothing else (as for the limit store).
        self.trace_collector = TraceCollector(f"{self._prefix}traces", TraceCollectorArgs(
            project=cfg.project, provider=provider, workload_pool=self.cluster.workload_pool, client_namespaces=clients,
            image=traces.image, apis=self.apis), opts=after_mesh) if traces.enabled else None
        # Pools, pickers and objectives wait for llm-d's CRDs (the picker reads llm-d.ai objectives
        # only if their CRD exists when it starts) and for the API the controller programs.
        self._picker_deps: list[pulumi.Resource] = [self.mesh, *self.apis.needs("networkservices.googleapis.com")]
        if any(m.routing == "inference-gateway" for m in cfg.models):
            self._picker_deps.append(InferenceObjectiveCrd(
                f"{self._prefix}inference-objective-crd", InferenceObjectiveCrdArgs(provider), opts=self._opts_for()))

    def _rollouts(self) -> None:
        """Flagger, where some pool rolls out by canary: its gates' templates, the loadtester allowed
        to start the rollouts' load test, and an alert on the stack's channels when one rolls back."""
        cfg, self.flagger = self.config, None
        canary_namespaces = sorted({self._namespace_name(s.tenant) for s in servings(cfg) if flagger_pools(cfg, s)})
        if not canary_namespaces:
            return
        refs = {(ref.name, ref.namespace, ref.long): ref for s in servings(cfg) for which in flagger_pools(cfg, s)
                for ref in self._rollout_load_tests(s, which)}
        self.flagger = Flagger(f"{self._prefix}flagger", FlaggerArgs(
            project=cfg.project, provider=self.cluster.provider, workload_pool=self.cluster.workload_pool,
            cluster_name=cfg.cluster.name, frontend_gsa_name=service_account_id(cfg.cluster.name, "flagger-prom"),
            gates=gates(cfg.rollouts, cfg.monitoring, cfg.cluster.name), canary_namespaces=canary_namespaces,
            load_tests=[refs[k] for k in sorted(refs)],
            notification_channels=self.observability.channels, metrics_sources=[cfg.cluster.subnet_cidr],
            # The loadtester's Roles go into the serving namespaces: after them.
            apis=self.apis), opts=self._opts_for([self.mesh, self.serving, *self.tenants.values()]))

    def _rollout_load_tests(self, serving: Serving, which: str) -> list[LoadTestRef]:
        """The load tests the canary of the serving's pool `which` starts, each in its CronJob's
        namespace (the serving's own: where the replicas it tests run); the long pool's, their
        variants whose requests all go to the long pool."""
        return [LoadTestRef(spec.name, self._namespace_name(serving.tenant), long=which == "long")
                for spec in rollout_load_tests(self.config, serving)]

    def _starts_long_variant(self, spec: LoadTestSpec) -> bool:
        """A Flagger canary of a long pool starts this load test (its long-pool variant)."""
        cfg = self.config
        return any(spec.name in {t.name for t in rollout_load_tests(cfg, s)}
                   for s in servings(cfg) if "long" in flagger_pools(cfg, s))

    def _namespace_name(self, tenant: Optional[str]) -> str:
        """A serving namespace's name as the config has it (Roles and Canaries name it before it exists)."""
        cfg = self.config
        return tenant_namespace(next(t for t in cfg.tenants if t.name == tenant)) if tenant else cfg.serving_namespace

    def _serve(self, serving: Serving) -> list[RouteTarget]:
        """A serving's pools (and its canary's, or its InferencePool), and the routes to them (less
        the pools Flagger rolls out: their routes are Flagger's)."""
        store = (self.limit_store.host, LIMITS_PORT) if self.limit_store else None
        for service in pool_services(self.config, serving, limit_store=store):
            self._declare(service, serving)
        if serving.model.routing == "inference-gateway":
            self._picker_pool(serving)
        elif serving.model.canary_model():
            for service in pool_services(self.config, serving, canary=True, limit_store=store):
                self._declare(service, serving)
        return route_targets(serving, self._namespace(serving.tenant), flagger_pools(self.config, serving),
                             picker_salted_paths(self.config.release_for(serving.node_pool)))

    def _flagger_pool(self, service: PoolService, serving: Serving) -> Optional[FlaggerPool]:
        """A pool Flagger rolls out: its share of the model's route, the gates and the load test."""
        cfg = self.config
        if not service.rollout.is_canary:
            return None
        webhooks = tuple(hook for ref in self._rollout_load_tests(serving, service.which)
                         for hook in load_test_webhooks(ref, self.flagger.loadtester_url)) if self.flagger else ()
        return FlaggerPool(service.rollout, cfg.rollouts, cfg.monitoring, serving.path, service.model.long_request_bytes,
                           serving_listener(cfg.gateway), cfg.gateway.hostname, webhooks)

    def _declare(self, service: PoolService, serving: Serving) -> None:
        cfg, traces = self.config, self.config.monitoring.traces
        svc = VllmService(f"{self._prefix}{service.key}", VllmServiceArgs(
            model=service.model, pool_name=service.which, pool=service.pool, node_pool=service.node_pool,
            namespace=self._namespace(serving.tenant), image=service.image, pods_cidr=cfg.cluster.pods_cidr,
            load_seconds=service.load_seconds, provider=self.cluster.provider, guard_config=service.guard_config,
            # With SLOs kept the servers count TTFT at the objective's own bound (where the release can).
            ttft_slo_seconds=cfg.monitoring.ttft_slo_seconds if cfg.monitoring.slos.enabled else None,
            traces_endpoint=self.trace_collector.endpoint if self.trace_collector else None,
            trace_sample_ratio=traces.sample_ratio, release=service.release, tenant=service.tenant,
            canary=service.canary, weights=self.store.mount_for(serving.consumer, service.model),
            scaling=KedaScaling(cfg.project, self.keda.auth_name, service.standby_name, service.picker_pool),
            request_timeout_seconds=cfg.gateway.request_timeout_seconds, rolling=service.rolling,
            wait_behind_seconds=service.wait_behind_seconds, flagger=self._flagger_pool(service, serving),
            gateway_namespace=self.serving.name, flagger_ready=[self.flagger] if self.flagger else [],
            kv_events_picker=pool_picker(service.model) if service.kv_events else None, kv_peer=service.kv_peer),
            # Pods need the sidecar (so the mesh first), the read-only claim and the namespace's
            # identities (a pod of a missing service account is refused); KEDA's CRDs come with its chart.
            opts=self._opts_for([self.mesh, self.store, self.keda, self._identities(serving.tenant),
                              *([self.lws] if self.lws else [])]))
        self.services[service.key] = svc
        self._readers.setdefault(service.model.name, []).append(svc)
        if svc.standby is not None:
            self.standbys[service.key] = svc.standby

    def _picker_pool(self, serving: Serving) -> None:
        """An InferencePool for the model's one pool, with an objective per caller."""
        cfg, model = self.config, serving.model
        precise = reads_kv_events(cfg.picker, model)
        # Precise prefix scoring: the picker's plugins, its index bounded by what the pool holds.
        index = index_mib(model, cfg.pool(serving.node_pool)) if precise else 0
        pool = InferencePool(f"{self._prefix}{serving.key}-inference", InferencePoolArgs(
            pool_name=model.name, namespace=self._namespace(serving.tenant), provider=self.cluster.provider,
            # The vLLM pods (a standby only where it answers at zero: picker_wake.py).
            selector=inference_pool_selector(model, picker_queue(cfg)), objectives=picker_objectives(serving),
            request_timeout_seconds=cfg.gateway.request_timeout_seconds, picker=cfg.picker,
            extension=precise_extension(model.name, cfg.picker.scorers.prefix_cache, index) if precise else None,
            load_balancer_sources=self._sources.health_checks, metrics_sources=[cfg.cluster.subnet_cidr],
            pd_min_prompt_tokens=model.disaggregation.min_prompt_tokens if model.disaggregation else 0),
            opts=self._opts_for(self._picker_deps))
        self.inference_pools[serving.key] = pool
        if model.disaggregation is not None:  # the prefill pods open to the decode pods alone (prefill_pool.py)
            PrefillPaths(f"{self._prefix}{serving.key}-prefill-paths", PrefillPathsArgs(
                model.name, self._namespace_name(serving.tenant), self.cluster.provider, cfg.cluster.pods_cidr,
                self._sources.health_checks, [cfg.cluster.subnet_cidr]),
                opts=self._opts_for(self._picker_deps))
        if precise:
            self._render_server(serving)

    def _render_server(self, serving: Serving) -> None:
        """The precise picker's tokenizer, apart from it, on the model's shared weights (the picker never
        waits for it: a render failure costs the precise score only)."""
        cfg, model = self.config, serving.model
        reader = self.store.reader_for(serving.consumer, model)
        render = RenderServer(f"{self._prefix}{serving.key}-render", RenderServerArgs(
            model.name, self._namespace(serving.tenant), self.cluster.provider,
            render_deployment_spec(model, cfg.release_for(serving.node_pool), reader.mount),
            reader.bucket_reads, render_weights_prefixes(model)),
            opts=self._opts_for([*self._picker_deps, self.store]))
        self._readers.setdefault(model.name, []).append(render)

    def _front(self, targets: list[RouteTarget]) -> None:
        """The gateway in front of the routes."""
        cfg = self.config
        # The picker's routes match on what it sets: its pods and Service are up before they are.
        self.identity = IdentityExtension(f"{self._prefix}identity", IdentityExtensionArgs(
            self.serving.name, GATEWAY_NAME, identity_image(cfg.server_image).uri, config_text(cfg),
            self.cluster.provider, self._sources.health_checks, defer_extension=True),
            opts=self._opts_for()) if needs_identity(cfg) else None
        self.gateway = Gateway(f"{self._prefix}gateway", GatewayArgs(
            cfg.gateway, self.serving.name, targets, self.cluster.provider, project=cfg.project, region=cfg.region,
            subnetwork=self.cluster.subnetwork.id, name_prefix=cfg.cluster.name, apis=self.apis),
            # ...and after the pickers answer: a route to a pool whose picker is not ready fails closed.
            opts=self._opts_for([*([self.identity.deployment, self.identity.service] if self.identity else []),
                                 *self.inference_pools.values()]))
        if self.identity:
            # One release: the move from bf329cd's routes (issue 39); drop next release (then no
            # defer_extension, and the Gateway depends on self.identity again). The extension strips the
            # old objective header bf329cd's routes match: it goes live after the new routes, which take both.
            self.identity.attach(after=[self.gateway])

    def _cloud_run(self) -> None:
        """The models on Cloud Run GPUs (vllm-gke:cloudRun): their services, reading the weights the
        store's loaders write, and the load balancer in front of them."""
        cfg, self.cloud_run = self.config, None
        if cfg.cloud_run is None:
            return
        storage = self.store.storage
        if not isinstance(storage, BucketStorage):  # config_rules/cloud_run.py refuses any other backend
            raise PlatformConfigError([ConfigIssue("weights.backend", "the Cloud Run models (cloudRun) mount the weights "
                                                   "bucket: set it to gcs")], "Platform config")
        self.cloud_run = CloudRunServices(f"{self._prefix}cloud-run", CloudRunServicesArgs(
            project=cfg.project, services=cloud_run_services(cfg), network=self.cluster.network.id,
            egress_subnet_cidr=cfg.cloud_run.egress_subnet_cidr, egress_region=cloud_run_egress_region(cfg),
            bucket=storage.bucket.name, list_role=storage.list_role, name_prefix=cfg.cluster.name,
            apis=self.apis, deletion_protection=cfg.cluster.deletion_protection,
            invokers={m.name: invoker_members(cfg, m) for m in cfg.cloud_run_models},
            # The limit store's client certificate (where globalLimits is on), readable by each service's account.
            secret_env={m.name: secret_env(cfg) for m in cfg.cloud_run_models}, store_access=cloud_run_access(cfg)),
            # The first revision waits for its weights' loader (its entrypoint waits for the marker).
            opts=self._opts_for([self.store]))
        for model in cfg.cloud_run_models:
            self._readers.setdefault(model.name, []).append(self.cloud_run.services[model.name])
        self.cloud_run_gateway = build_cloud_run_gateway(f"{self._prefix}cloud-run-gateway", cfg, self.cluster,
                                                         self.cloud_run.services, self.apis, self._opts_for())

    def _observe(self) -> None:
        """The monitoring of it all (its channels page for Flagger's rollbacks too)."""
        cfg = self.config
        # Every release the stack runs exports the same KV-cache gauge and TTFT buckets flag (the
        # tests hold the TPU build to it); the GPU release's names are the dashboard's.
        rel = release(cfg.vllm_version)
        self.observability = Observability(f"{self._prefix}observability", ObservabilityArgs(
            project=cfg.project, cluster_name=cfg.cluster.name, spec=cfg.monitoring,
            title=f"vLLM on GKE - {cfg.cluster.name} ({cfg.environment})", apis=self.apis,
            kv_cache_metric=rel.kv_cache_metric, limit_store=cfg.global_limits.enabled,
            models=[m.name for m in cfg.models], tenants=[t.name for t in cfg.tenants], budget=cfg.budget,
            exact_ttft=cfg.monitoring.slos.enabled and rel.histogram_buckets_flag is not None,
            tpu=cfg.has_tpu_models, sheddable=any(t.priority < 0 for t in cfg.tenants),
            fallback=any(m.fallback for m in cfg.models),
            gateway_class=cfg.gateway.class_name, region=cfg.region, provider=self.cluster.provider,
            workload_pool=self.cluster.workload_pool, metrics_sources=[cfg.cluster.subnet_cidr],
            always_on=[m.name for m in cfg.models if any(getattr(m, w).min_replicas > 0 for w in m.pool_names)],
            cloud_run=run_targets(cfg)),
            opts=self._opts_for())

    def _load_tests(self, prices: Mapping[str, tuple[float, float]]) -> None:
        urls = {(u.tenant, u.model): u for u in tenant_urls(self.config)}
        for spec in self.config.load_tests:
            self._load_test(spec, urls[(spec.tenant, spec.model)], prices)

    def _load_test(self, spec: LoadTestSpec, url: TenantUrl, prices: Mapping[str, tuple[float, float]]) -> None:
        """As the tenant: its URL and headers, in the namespace of the replicas that serve it."""
        cfg = self.config
        tenant, model = next(t for t in cfg.tenants if t.name == spec.tenant), cfg.model(spec.model)
        owner = tenant.name if model.name in dedicated_models(tenant) else None
        name, _, value = url.header.partition(": ")
        node_pool = cfg.pool(tenant.dedicated.node_pool if owner and tenant.dedicated else model.node_pool)
        self.load_tests[spec.name] = LoadTest(f"{self._prefix}loadtest-{spec.name}", LoadTestArgs(
            spec=spec, provider=self.cluster.provider, namespace=self._namespace(owner),
            target=Target(base_url=url.url.removesuffix("/v1"), model=model.name,
                          adapters=[a.name for a in model.adapters if tenant.name in a.tenants],
                          headers={name: value} if url.header else {}, model_dir=model_dir(model),
                          request_timeout_seconds=cfg.gateway.request_timeout_seconds),
            ttft_slo_seconds=cfg.monitoring.ttft_slo_seconds, ttft_goal=cfg.monitoring.slos.ttft,
            availability=cfg.monitoring.slos.availability, long_variant=self._starts_long_variant(spec),
            dollars_per_hour=floor_dollars_per_hour(model, node_pool, prices),
            weights=self.store.reader_for(owner or "serving", model)),
            opts=self._opts_for([self.mesh, self.store, self._identities(owner)]))
        self._readers.setdefault(model.name, []).append(self.load_tests[spec.name])
