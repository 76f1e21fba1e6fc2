"""Platform: a whole serving platform from one StackConfig - the stack program's composition as
a component, for teams whose own Pulumi program declares the platform (and for the stack program,
which is this and its exports).

Every resource the stacks declared at the top level is now a child of the Platform; each carries
an alias to the stack root, so a stack created before the component existed keeps its resources
(the engine matches them by the old URNs) instead of replacing them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi

from .gateway import Gateway, GatewayArgs, RouteTarget
from .gpu_cluster import GpuCluster, GpuClusterArgs
from .inference_objective_crd import InferenceObjectiveCrd, InferenceObjectiveCrdArgs
from .inference_pool import InferencePool, InferencePoolArgs
from .keda import Keda, KedaArgs
from .leader_worker_set import LeaderWorkerSetController, LeaderWorkerSetControllerArgs
from .limit_store import PORT as LIMITS_PORT
from .limit_store import LimitStore, LimitStoreArgs
from .load_test import LoadTest, LoadTestArgs, Target
from .mesh_namespace import MeshNamespace, MeshNamespaceArgs, TrustedSources
from .mesh_readiness import MeshReadiness, MeshReadinessArgs
from .model.capacity import consumer_models, hosts_per_replica, neighbours, placements, rollout_strategy, surge_room
from .model.cold_start import cold_start_seconds, rollout_seconds
from .model.config_rules import cross_field_issues
from .model.gateway_routes import PickerTarget
from .model.gcp_names import service_account_id
from .model.k8s_objects import MODEL_LABEL, POOL_LABEL, service_name_of
from .model.keda_scaling import KedaScaling
from .model.mesh_identity import STANDBY_SA, jwks_host, tenant_namespace
from .model.serving_api import (
    objective_name,
    picker_max_body_bytes,
    picker_routes,
    pool_guard_config,
)
from .model.specs import ModelSpec, NodePoolSpec, TenantSpec
from .model.stack_config import ConfigError, StackConfig
from .model.tenant_urls import path_prefix, tenant_urls
from .model.vllm_server import drain_seconds
from .model.vllm_versions import release
from .model.weights_backends import backend_of
from .model.weights_layout import SERVER_SA, model_dir, reads_hub_token_from_secret_manager
from .model_store import ModelStore, ModelStoreArgs, WeightsPrune
from .observability import Observability, ObservabilityArgs
from .options import child_opts
from .project_apis import ProjectApis, ProjectApisArgs
from .standby import Standby
from .tenant_auth import TenantAuth, TenantAuthArgs
from .trace_collector import TRACE_API, TraceCollector, TraceCollectorArgs
from .vllm_service import VllmService, VllmServiceArgs


class PlatformConfigError(ConfigError, pulumi.RunError):
    """A Platform's config problems, as a RunError: `pulumi up` prints them without a stack trace."""


BASE_APIS = (
    "serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com", "iam.googleapis.com",
    "iamcredentials.googleapis.com", "compute.googleapis.com", "container.googleapis.com",
    "containerfilesystem.googleapis.com", "artifactregistry.googleapis.com", "file.googleapis.com",
    "gkehub.googleapis.com", "mesh.googleapis.com", "monitoring.googleapis.com", "logging.googleapis.com",
)


def dedicated_models(tenant: TenantSpec) -> list[str]:
    return list(tenant.dedicated.models) if tenant.dedicated else []


def shared_models(tenant: TenantSpec) -> list[str]:
    return [m for m in tenant.models if m not in dedicated_models(tenant)]


def floor_dollars_per_hour(model: ModelSpec, pool: NodePoolSpec,
                           prices: Mapping[str, tuple[float, float]]) -> Optional[float]:
    """What a model's pools cost an hour at their floor (a pool that scales to zero, one replica):
    each replica its GPUs or MIG slices of the node pool's machine, at `prices` (machine type ->
    on-demand and spot $ an hour); None where the machine has no price."""
    if pool.machine_type not in prices:
        return None
    on_demand, spot = prices[pool.machine_type]
    slot = (spot if pool.spot else on_demand) / pool.slices_per_node
    return sum(max(getattr(model, w).min_replicas, 1) * model.devices_per_replica * slot for w in model.pool_names)


def required_apis(cfg: StackConfig) -> list[str]:
    apis: list[str] = list(BASE_APIS)
    if reads_hub_token_from_secret_manager(cfg.models, cfg.weights):
        apis.append("secretmanager.googleapis.com")
    if cfg.gateway.managed_certificate:
        apis.append("certificatemanager.googleapis.com")
    apis.extend(backend_of(cfg.weights).apis)
    if cfg.budget:
        # The Budget API bills its calls to the stack's project (components/billing_budget.py).
        apis.append("billingbudgets.googleapis.com")
    if cfg.monitoring.traces.enabled:
        # The trace collector writes spans through the Cloud Trace API (components/trace_collector.py).
        apis.append(TRACE_API)
    if any(m.routing == "inference-gateway" for m in cfg.models):
        # "Deploy GKE Inference Gateway": the load balancer calls the picker through Service
        # Extensions, part of the Network Services API.
        apis.append("networkservices.googleapis.com")
    return apis


@dataclass
class PlatformArgs:
    # The platform's settings, validated as a stack's config is (infra/config.py parse()).
    config: StackConfig
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
    limits and monitoring: everything one stack declares."""

    apis: ProjectApis
    cluster: GpuCluster
    mesh: MeshReadiness
    serving: MeshNamespace
    store: ModelStore
    keda: Keda
    tenants: dict[str, TenantAuth]
    services: dict[str, VllmService]
    inference_pools: dict[str, InferencePool]
    limit_store: Optional[LimitStore]
    trace_collector: Optional[TraceCollector]
    load_tests: dict[str, LoadTest]
    weights_prune: WeightsPrune
    standbys: dict[str, Standby]
    gateway: Gateway
    observability: Observability
    routes: dict[str, str]

    def __init__(self, name: str, args: PlatformArgs, opts: Optional[pulumi.ResourceOptions] = None):
        cfg = args.config
        # The stack config's own checks across fields (capacity, fit, references, ranges, the vLLM
        # release's parser), with its messages, whoever builds the config.
        if issues := cross_field_issues(cfg):
            raise PlatformConfigError(issues, f"Platform '{name}' config")
        super().__init__("vllm-gke:index:Platform", name, None, opts)
        self.services, self.inference_pools, self.standbys = {}, {}, {}
        self.limit_store = None
        self.trace_collector = None
        self.load_tests = {}

        p = f"{name}-" if args.child_prefix is None else args.child_prefix
        aliases = [pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)] if args.stack_aliases else []

        def child(depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
            """Parented here, waiting for what the Platform waits for (and, in the stack program,
            aliased to the stack root, where earlier stacks declared the same resource)."""
            return child_opts(self, opts, depends_on=depends_on, aliases=aliases)

        labels = {"environment": cfg.environment}
        apis = ProjectApis(f"{p}apis", ProjectApisArgs(cfg.project, required_apis(cfg)), opts=child())
        cluster = GpuCluster(f"{p}gke", GpuClusterArgs(
            project=cfg.project, region=cfg.region, cluster=cfg.cluster, node_pools=cfg.node_pools,
            labels=labels, apis=apis, gcs_fuse=backend_of(cfg.weights).needs_gcs_fuse,
            secret_manager=reads_hub_token_from_secret_manager(cfg.models, cfg.weights),
            # The loaders write the bucket through Cloud Storage FUSE; Volume Populator's transfer
            # Jobs copy it onto the disks on nodes of their own pool.
            populator_machine_type=backend_of(cfg.weights).transfer_machine_type(cfg.weights)),
            opts=child())
        provider = cluster.provider
        # Istio resources and meshed pods wait until the managed control plane serves the cluster.
        mesh = MeshReadiness(f"{p}mesh", MeshReadinessArgs(provider, cfg.cluster.release_channel), opts=child())
        after_mesh = child([mesh])
        # KEDA scales every serving pool on vLLM's metrics in Managed Prometheus (and serves the
        # cluster's external metrics API: the one server of it).
        keda = Keda(f"{p}keda", KedaArgs(
            project=cfg.project, provider=provider, workload_pool=cluster.workload_pool,
            gsa_name=service_account_id(cfg.cluster.name, "keda"), apis=apis, network=cluster.network.id,
            control_plane_cidr=cfg.cluster.master_cidr if cfg.cluster.private_nodes else None), opts=child())
        # Replicas across hosts are LeaderWorkerSet groups: its controller, where a model needs one.
        self.lws: LeaderWorkerSetController | None = None
        if any(hosts_per_replica(m, cfg.pool(n)) > 1 for m, n, _t in placements(cfg)):
            self.lws = LeaderWorkerSetController(f"{p}lws", LeaderWorkerSetControllerArgs(
                project=cfg.project, provider=provider, network=cluster.network.id, apis=apis,
                control_plane_cidr=cfg.cluster.master_cidr if cfg.cluster.private_nodes else None), opts=child())
        sources = TrustedSources.for_cluster(cluster.proxy_only_cidr, cfg.cluster.pods_cidr, cfg.cluster.subnet_cidr)
        serving_jwks = sorted({jwks_host(t) for t in cfg.tenants if shared_models(t)})
        serving = MeshNamespace(f"{p}serving", MeshNamespaceArgs(
            cfg.serving_namespace, provider, sources=sources, jwks_hosts=serving_jwks,
            service_accounts=(SERVER_SA, STANDBY_SA)), opts=after_mesh)

        tenants = {
            t.name: TenantAuth(f"{p}tenant-{t.name}", TenantAuthArgs(
                tenant=t, provider=provider, serving_namespace=serving.name, shared_models=shared_models(t),
                sources=sources, picker_models=[m for m in shared_models(t) if cfg.model(m).routing == "inference-gateway"],
                service_accounts=(SERVER_SA, STANDBY_SA) if t.dedicated else ()),
                opts=after_mesh)
            for t in cfg.tenants
        }
        consumers: dict[str, pulumi.Input[str]] = {"serving": serving.name}
        consumers.update({t.name: tenants[t.name].namespace.name for t in cfg.tenants if t.dedicated})
        store = ModelStore(f"{p}weights", ModelStoreArgs(
            project=cfg.project, zone=cfg.cluster.zones[0], region=cfg.region, network_name=cluster.network.name,
            workload_pool=cluster.workload_pool, models=cfg.models, weights=cfg.weights,
            server_image=cfg.server_image, provider=provider, consumer_namespaces=consumers,
            consumer_models=consumer_models(cfg), zones=cfg.cluster.zones, transfer_ready=cluster.transfer_ready,
            instance_name=f"{cfg.cluster.name}-weights", apis=apis, protect=cfg.cluster.deletion_protection,
            vllm_release=release(cfg.vllm_version)), opts=child())
        self.apis, self.cluster, self.mesh, self.serving, self.store = apis, cluster, mesh, serving, store
        self.keda, self.tenants = keda, tenants

        targets: list[RouteTarget] = []
        shared_store: tuple[str, int] | None = None
        if cfg.global_limits.enabled:
            # The vLLM servers' own identities (SERVER_SA) may connect, nothing else in their namespaces.
            clients = [cfg.serving_namespace, *(tenant_namespace(t) for t in cfg.tenants if t.dedicated)]
            self.limit_store = LimitStore(f"{p}limits", LimitStoreArgs(provider, clients, cfg.global_limits.image),
                                              opts=after_mesh)
            shared_store = (self.limit_store.host, LIMITS_PORT)
        traces = cfg.monitoring.traces
        if traces.enabled:
            # Spans from the vLLM servers' own identities, nothing else (as for the limit store).
            clients = [cfg.serving_namespace, *(tenant_namespace(t) for t in cfg.tenants if t.dedicated)]
            self.trace_collector = TraceCollector(f"{p}traces", TraceCollectorArgs(
                project=cfg.project, provider=provider, workload_pool=cluster.workload_pool, client_namespaces=clients,
                image=traces.image, apis=apis), opts=after_mesh)
        traces_endpoint = self.trace_collector.endpoint if self.trace_collector else None
        # Pools and objectives wait for the objective CRD and for the API the controller programs.
        picker_deps: list[pulumi.Resource] = [mesh, *apis.needs("networkservices.googleapis.com")]
        if any(m.routing == "inference-gateway" for m in cfg.models):
            picker_deps.append(InferenceObjectiveCrd(f"{p}inference-objective-crd", InferenceObjectiveCrdArgs(provider),
                                                     opts=child()))

        def identities(tenant: str | None) -> pulumi.Resource:
            """The MeshNamespace holding the servers' and standbys' service accounts."""
            return tenants[tenant].namespace if tenant else serving

        # model -> what reads its folders (servers of every pool, canary, dedicated copy; load tests).
        readers: dict[str, list[pulumi.Resource]] = {}
        # With SLOs kept the servers count TTFT at the objective's own bound (where the release can).
        slos_kept = cfg.monitoring.slos.enabled

        def wait_behind(pool_name: str, model: ModelSpec, tenant: str | None, which: str) -> float:
            """The other pools' whole rollouts on the node pool: a step of an in-place pool may
            lose every freed device to their pending pods (the scheduler favours no waiter) until
            they are done."""
            grace = drain_seconds(cfg.gateway.request_timeout_seconds) + 30
            return float(sum(
                rollout_seconds(getattr(m, w).max_replicas, cold_start_seconds(cfg, m, cfg.pool(pool_name)), grace)
                for m, w in neighbours(cfg, pool_name, model, tenant, which)))

        def serve(key: str, model: ModelSpec, pool_name: str, namespace: pulumi.Input[str],
                  callers: list[TenantSpec], tenant: str | None = None, canary: bool = False) -> dict[str, str]:
            names: dict[str, str] = {}
            # The release and image of the pool's accelerators: the TPU build on TPUs.
            rel = cfg.release_for(pool_name)
            node_pool = cfg.pool(pool_name)
            for which in model.pool_names:
                pool = getattr(model, which)
                to_zero = pool.min_replicas == 0
                standby_name = f"{service_name_of(model.name, which, canary)}-standby" if to_zero else ""
                svc = VllmService(f"{p}{key}-{which}", VllmServiceArgs(
                    model=model, pool_name=which, pool=pool, node_pool=node_pool,
                    namespace=namespace, image=cfg.image_for(pool_name),
                    pods_cidr=cfg.cluster.pods_cidr, load_seconds=cold_start_seconds(cfg, model, node_pool),
                    provider=provider,
                    guard_config=pool_guard_config(callers, model, rel, shared_store,
                                                   cfg.monitoring.queue_latency_slo_seconds, traces=traces.enabled,
                                                   dedicated=tenant is not None),
                    ttft_slo_seconds=cfg.monitoring.ttft_slo_seconds if slos_kept else None,
                    traces_endpoint=traces_endpoint, trace_sample_ratio=traces.sample_ratio,
                    release=rel, tenant=tenant, canary=canary, weights=store.mount_for(tenant or "serving", model),
                    scaling=KedaScaling(cfg.project, keda.auth_name, standby_name),
                    request_timeout_seconds=cfg.gateway.request_timeout_seconds,
                    rolling=rollout_strategy(surge_room(cfg, model, pool_name, tenant, which)),
                    wait_behind_seconds=wait_behind(pool_name, model, tenant, which)),
                    # Pods need the sidecar (so the mesh first) and the read-only claim; KEDA's CRDs
                    # come with its chart.
                    # ...and the namespace's identities (a pod of a missing service account is refused).
                    opts=child([mesh, store, keda, identities(tenant), *([self.lws] if self.lws else [])]))
                self.services[f"{key}-{which}"] = svc
                readers.setdefault(model.name, []).append(svc)
                names[which] = svc.service_name
                if svc.standby is not None:
                    self.standbys[f"{key}-{which}"] = svc.standby
            return names

        def rate_caps(model: ModelSpec, names: dict[str, str]) -> dict[str, int]:
            return {names[w]: cap for w in model.pool_names if (cap := getattr(model, w).max_rate_per_endpoint)}

        def route(key: str, path: str, model: ModelSpec, pool_name: str, namespace: pulumi.Input[str],
                  callers: list[TenantSpec], tenant: str | None = None) -> None:
            names = serve(key, model, pool_name, namespace, callers, tenant)
            if model.routing == "inference-gateway":
                picker_pool(key, model, namespace, callers, tenant)
                return
            canary_model = model.canary_model()
            canary = serve(f"{key}-canary", canary_model, pool_name, namespace, callers, tenant, canary=True) \
                if canary_model else {}
            targets.append(RouteTarget(
                key, namespace, path, names["short"], names["long"], model.long_request_bytes,
                canary_short_service=canary.get("short"), canary_long_service=canary.get("long"),
                canary_weight=model.canary.weight if model.canary else 0,
                max_rate_per_endpoint={**rate_caps(model, names),
                                       **(rate_caps(canary_model, canary) if canary_model and canary else {})}))

        def picker_pool(key: str, model: ModelSpec, namespace: pulumi.Input[str], callers: list[TenantSpec],
                          tenant: str | None) -> None:
            """An InferencePool for the model's pool, and per tenant a route /<tenant>/<model>/v1 that
            sets the tenant's objective: the tenant must be in the path for its priority to be bound
            to its token (the load balancer cannot read the JWT; the mesh checks the pair)."""
            objectives = {objective_name(t.name, model.name): t.priority for t in callers}
            self.inference_pools[key] = InferencePool(f"{p}{key}-inference", InferencePoolArgs(
                pool_name=model.name, namespace=namespace, provider=provider,
                selector={MODEL_LABEL: model.name, POOL_LABEL: "short"}, objectives=objectives,
                request_timeout_seconds=cfg.gateway.request_timeout_seconds,
                model_metrics=cfg.release_for(model.node_pool if tenant is None else pool_of_tenant(tenant)).picker_metrics,
                load_balancer_sources=sources.health_checks, metrics_sources=[cfg.cluster.subnet_cidr]),
                opts=child(picker_deps))
            for t in callers:
                # Dedicated: the tenant namespace's route keeps its key; shared: one route per tenant
                # ('.' never occurs in a name, so these never collide with a dedicated <tenant>-<model>).
                route_name = key if tenant else f"{model.name}.{t.name}"
                targets.append(RouteTarget(
                    route_name, namespace, path_prefix(model, t, tenant is not None), f"{model.name}-short", "",
                    model.long_request_bytes,
                    picker=PickerTarget(model.name, objective_name(t.name, model.name), t.name,
                                        routes=tuple((r.path, r.method) for r in picker_routes()),
                                        max_body_bytes=picker_max_body_bytes(model))))

        def pool_of_tenant(tenant: str) -> str:
            dedicated = next(t for t in cfg.tenants if t.name == tenant).dedicated
            assert dedicated is not None
            return dedicated.node_pool

        for model in cfg.models:
            callers = [t for t in cfg.tenants if model.name in shared_models(t)]
            route(model.name, model.name, model, model.node_pool, serving.name, callers)
        for t in cfg.tenants:
            for model_name in dedicated_models(t):
                assert t.dedicated is not None
                model = cfg.model(model_name)
                route(f"{t.name}-{model_name}", path_prefix(model, t, dedicated=True), model, t.dedicated.node_pool,
                      tenants[t.name].namespace.name, [t], tenant=t.name)

        self.gateway = Gateway(f"{p}gateway", GatewayArgs(
            cfg.gateway, serving.name, targets, provider, project=cfg.project, region=cfg.region,
            subnetwork=cluster.subnetwork.id, name_prefix=cfg.cluster.name, apis=apis), opts=child())
        # Every release the stack runs exports the same KV-cache gauge and TTFT buckets flag (the
        # tests hold the TPU build to it); the GPU release's names are the dashboard's.
        rel = release(cfg.vllm_version)
        exact_ttft = slos_kept and rel.histogram_buckets_flag is not None
        self.observability = Observability(f"{p}observability", ObservabilityArgs(
            project=cfg.project, cluster_name=cfg.cluster.name, spec=cfg.monitoring,
            title=f"vLLM on GKE - {cfg.cluster.name} ({cfg.environment})", apis=apis,
            kv_cache_metric=rel.kv_cache_metric, limit_store=cfg.global_limits.enabled,
            models=[m.name for m in cfg.models], tenants=[t.name for t in cfg.tenants], budget=cfg.budget,
            exact_ttft=exact_ttft, tpu=cfg.has_tpu_models, sheddable=any(t.priority < 0 for t in cfg.tenants),
            gateway_class=cfg.gateway.class_name, region=cfg.region, provider=provider,
            workload_pool=cluster.workload_pool, metrics_sources=[cfg.cluster.subnet_cidr],
            always_on=[m.name for m in cfg.models if any(getattr(m, w).min_replicas > 0 for w in m.pool_names)]),
            opts=child())

        urls = {(u.tenant, u.model): u for u in tenant_urls(cfg)}
        for spec in cfg.load_tests:
            # As the tenant: its URL and headers, in the namespace of the replicas that serve it.
            tenant, model = next(t for t in cfg.tenants if t.name == spec.tenant), cfg.model(spec.model)
            own = model.name in dedicated_models(tenant)
            url = urls[(tenant.name, model.name)]
            name, _, value = url.header.partition(": ")
            node_pool = cfg.pool(tenant.dedicated.node_pool if own and tenant.dedicated else model.node_pool)
            self.load_tests[spec.name] = LoadTest(f"{p}loadtest-{spec.name}", LoadTestArgs(
                spec=spec, provider=provider,
                namespace=tenants[tenant.name].namespace.name if own else serving.name,
                target=Target(base_url=url.url.removesuffix("/v1"), model=model.name,
                              adapters=[a.name for a in model.adapters if tenant.name in a.tenants],
                              headers={name: value} if url.header else {}, model_dir=model_dir(model),
                              request_timeout_seconds=cfg.gateway.request_timeout_seconds),
                ttft_slo_seconds=cfg.monitoring.ttft_slo_seconds, ttft_goal=cfg.monitoring.slos.ttft,
                availability=cfg.monitoring.slos.availability,
                dollars_per_hour=floor_dollars_per_hour(model, node_pool, args.machine_prices),
                weights=store.reader_for(tenant.name if own else "serving", model)),
                opts=child([mesh, store, identities(tenant.name if own else None)]))
            readers.setdefault(model.name, []).append(self.load_tests[spec.name])
        # Only once all of them were updated onto the kept folders are the others removed.
        self.weights_prune = WeightsPrune(f"{p}weights-prune", store, cfg.models, readers, provider, opts=child())

        self.routes = {t.route_name: f"/{t.path_prefix}/v1" for t in targets}
        self.register_outputs({"clusterName": cluster.cluster.name, "kubeconfig": cluster.kubeconfig,
                               "routes": self.routes, "dashboard": self.observability.dashboard.id,
                               "filestore": {"tier": store.tier, "capacityGb": store.capacity_gb}})
