"""The stack program: composes the components from a validated StackConfig.

Stacks differ only in config; everything here is derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from components.gateway import Gateway, GatewayArgs, RouteTarget
from components.gpu_cluster import GpuCluster, GpuClusterArgs
from components.mesh_namespace import MeshNamespace, MeshNamespaceArgs
from components.metrics_adapter import MetricsAdapter, MetricsAdapterArgs
from components.model_store import ModelStore, ModelStoreArgs
from components.observability import Observability, ObservabilityArgs
from components.specs import ModelSpec, TenantSpec
from components.tenant_auth import ISSUER_HEADER, TenantAuth, TenantAuthArgs, guard_entry
from components.vllm_service import VllmService, VllmServiceArgs
from infra.config import StackConfig


@dataclass
class Platform:
    cluster: GpuCluster
    serving: MeshNamespace
    store: ModelStore
    metrics_adapter: MetricsAdapter
    tenants: dict[str, TenantAuth] = field(default_factory=dict)
    services: dict[str, VllmService] = field(default_factory=dict)
    gateway: Gateway | None = None
    observability: Observability | None = None


def dedicated_models(tenant: TenantSpec) -> list[str]:
    return list(tenant.dedicated.models) if tenant.dedicated else []


def shared_models(tenant: TenantSpec) -> list[str]:
    return [m for m in tenant.models if m not in dedicated_models(tenant)]


def guard_config(tenants: list[TenantSpec]) -> dict[str, Any]:
    issuers: dict[str, Any] = {}
    for tenant in tenants:
        issuers.update(guard_entry(tenant))
    return {"issuerHeader": ISSUER_HEADER, "issuers": issuers}


def build(cfg: StackConfig) -> Platform:
    labels = {"environment": cfg.environment}
    cluster = GpuCluster("gke", GpuClusterArgs(
        project=cfg.project, region=cfg.region, cluster=cfg.cluster, node_pools=cfg.node_pools,
        labels=labels))
    provider = cluster.provider
    # HPAs on vLLM's queue depth read it through the custom metrics API.
    adapter = MetricsAdapter("metrics-adapter", MetricsAdapterArgs(
        project=cfg.project, provider=provider, gsa_name=f"{cfg.cluster.name}-metrics"))
    serving = MeshNamespace("serving", MeshNamespaceArgs(cfg.serving_namespace, provider))

    tenants = {
        t.name: TenantAuth(f"tenant-{t.name}", TenantAuthArgs(
            tenant=t, provider=provider, serving_namespace=serving.name, shared_models=shared_models(t)))
        for t in cfg.tenants
    }
    consumers: dict[str, pulumi.Input[str]] = {"serving": serving.name}
    consumers.update({t.name: tenants[t.name].namespace.name for t in cfg.tenants if t.dedicated})
    store = ModelStore("weights", ModelStoreArgs(
        project=cfg.project, zone=cfg.cluster.zones[0], network_name=cluster.network.name,
        models=cfg.models, weights=cfg.weights, server_image=cfg.server_image, provider=provider,
        consumer_namespaces=consumers, instance_name=f"{cfg.cluster.name}-weights"))
    platform = Platform(cluster=cluster, serving=serving, store=store, metrics_adapter=adapter,
                        tenants=tenants)

    targets: list[RouteTarget] = []

    def serve(key: str, model: ModelSpec, pool_name: str, namespace: pulumi.Input[str],
              callers: list[TenantSpec], tenant: str | None = None) -> dict[str, str]:
        names = {}
        for which in ("short", "long"):
            svc = VllmService(f"{key}-{which}", VllmServiceArgs(
                model=model, pool_name=which, pool=getattr(model, which), node_pool=cfg.pool(pool_name),
                namespace=namespace, image=cfg.server_image, claim_name=store.claim_name,
                provider=provider, guard_config=guard_config(callers), tenant=tenant),
                opts=pulumi.ResourceOptions(depends_on=[store]))
            platform.services[f"{key}-{which}"] = svc
            names[which] = svc.service_name
        return names

    for model in cfg.models:
        callers = [t for t in cfg.tenants if model.name in shared_models(t)]
        names = serve(model.name, model, model.node_pool, serving.name, callers)
        targets.append(RouteTarget(model.name, serving.name, model.name, names["short"], names["long"],
                                   model.long_request_bytes))
    for t in cfg.tenants:
        for model_name in dedicated_models(t):
            assert t.dedicated is not None
            model = cfg.model(model_name)
            ns = tenants[t.name].namespace.name
            names = serve(f"{t.name}-{model.name}", model, t.dedicated.node_pool, ns, [t], tenant=t.name)
            targets.append(RouteTarget(f"{t.name}-{model.name}", ns, f"{t.name}/{model.name}",
                                       names["short"], names["long"], model.long_request_bytes))

    platform.gateway = Gateway("gateway", GatewayArgs(cfg.gateway, serving.name, targets, provider))
    platform.observability = Observability("observability", ObservabilityArgs(
        project=cfg.project, cluster_name=cfg.cluster.name, spec=cfg.monitoring,
        title=f"vLLM on GKE - {cfg.cluster.name} ({cfg.environment})"))

    pulumi.export("clusterName", cluster.cluster.name)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("filestore", {"tier": store.tier, "capacityGb": store.capacity_gb})
    pulumi.export("routes", {t.route_name: f"/{t.path_prefix}/v1" for t in targets})
    pulumi.export("dashboard", platform.observability.dashboard.id)
    return platform
