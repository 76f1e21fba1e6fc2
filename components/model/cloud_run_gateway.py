"""The load balancer in front of the Cloud Run models, as data (components/cloud_run_gateway.py
declares it).

GKE's Gateway takes no serverless backend, so the Cloud Run models sit behind an Application Load
Balancer of the gateway's class beside it (serverless NEGs are taken by the regional internal,
regional external and global external Application Load Balancers, not by network load balancers:
infra/contracts/cloud_run_gateway.py): one serverless NEG per model in the model's region, a
backend service each, one URL map with the GKE routes' path scheme. A serverless NEG forwards the
path as sent (no rewrite here either), so the guard strips /<model> or /<tenant>/<model> first
thing, as it does on GKE (images/vllm_gke_guard/prefixes.py): `cloud_run_prefixes` is what its
config lists. Any other path or host is answered 404 by the load balancer itself.

HTTPS where the gateway serves HTTPS (an external class always does), with a Google-managed
Certificate Manager certificate for cloudRun.hostname; plain HTTP then only redirects, as the
Gateway's HTTP listener does. Where the gateway is plain HTTP (gke-l7-rilb without TLS) so is this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .specs import CloudRunModelSpec, TenantSpec
from .stack_config import StackConfig

# The version segment every routed path carries after its prefix (the guard's Prefixes.VERSION).
VERSION = "/v1"
# A serverless NEG's and backend service's name: <cluster>-run-<model> within GCP's 63 characters.
NAME_LIMIT = 63


@dataclass(frozen=True)
class LoadBalancerKind:
    """What a gateway class means for the Cloud Run models' load balancer."""

    # The backend services' and forwarding rules' loadBalancingScheme.
    scheme: str
    # Regional resources (RegionUrlMap, RegionBackendService, ...), in the stack's region; the
    # serverless NEGs must be in it too (a regional load balancer reaches its own region only).
    regional: bool
    external: bool


LB_OF_CLASS: dict[str, LoadBalancerKind] = {
    "gke-l7-rilb": LoadBalancerKind("INTERNAL_MANAGED", regional=True, external=False),
    "gke-l7-regional-external-managed": LoadBalancerKind("EXTERNAL_MANAGED", regional=True, external=True),
    "gke-l7-global-external-managed": LoadBalancerKind("EXTERNAL_MANAGED", regional=False, external=True),
}


@dataclass(frozen=True)
class CloudRunBackend:
    """One Cloud Run model behind the load balancer."""

    model: str
    region: str
    # The serverless NEG's and the backend service's name.
    name: str
    # '/<model>' and '/<tenant>/<model>' of each tenant that lists it (cloud_run_prefixes).
    prefixes: tuple[str, ...]

    @property
    def paths(self) -> list[str]:
        """The URL map's path patterns: each prefix's /v1 and everything under it ('*' only ends a
        pattern, and '/x/v1/*' does not match '/x/v1' itself)."""
        return [p for prefix in self.prefixes for p in (f"{prefix}{VERSION}", f"{prefix}{VERSION}/*")]


@dataclass(frozen=True)
class CloudRunFront:
    """The Cloud Run models' load balancer: class, host, TLS and backends."""

    class_name: str
    kind: LoadBalancerKind
    # The host the URL map routes (and the certificate's domain); None: any host (internal, no TLS).
    hostname: Optional[str]
    tls: bool
    # The load balancer's region (the stack's); its resources' name prefix.
    region: str
    name: str
    backends: tuple[CloudRunBackend, ...]


def cloud_run_callers(cfg: StackConfig, model: str) -> list[TenantSpec]:
    """The tenants that list a Cloud Run model."""
    return [t for t in cfg.tenants if model in t.models]


def cloud_run_prefixes(cfg: StackConfig, model: str) -> list[str]:
    """The path prefixes ('/<prefix>', no '/v1') the load balancer routes to a Cloud Run model, which
    its guard strips: the shared /<model> and each caller's /<tenant>/<model> (so a model moved from a
    GKE pool behind the picker, or a dedicated copy, keeps its tenants' URLs). The guard binds a
    /<tenant>/ prefix to that tenant's verified identity (cloud_run_prefix_tenants)."""
    return sorted({f"/{model}", *(f"/{t.name}/{model}" for t in cloud_run_callers(cfg, model))})


def cloud_run_prefix_tenants(cfg: StackConfig, model: str) -> dict[str, Optional[str]]:
    """Each prefix of `model` -> the one tenant it names (None: the shared /<model>): a request on
    /<tenant>/<model>/v1 whose verified identity is another tenant's must be refused."""
    return {p: (p.strip("/").split("/")[0] if p.count("/") == 2 else None) for p in cloud_run_prefixes(cfg, model)}


def backend_name(cfg: StackConfig, model: str) -> str:
    """A Cloud Run model's serverless NEG and backend service."""
    return f"{front_name(cfg)}-{model}"


def front_name(cfg: StackConfig) -> str:
    """The name prefix of the Cloud Run models' load balancer resources."""
    return f"{cfg.cluster.name}-run"


def cloud_run_tls(cfg: StackConfig) -> bool:
    """HTTPS where the gateway serves HTTPS: a client of both never sends a token in clear to one."""
    return cfg.gateway.tls


def cloud_run_front(cfg: StackConfig) -> Optional[CloudRunFront]:
    """The load balancer the stack's Cloud Run models need (None without any)."""
    models: list[CloudRunModelSpec] = cfg.cloud_run_models
    if not models or cfg.cloud_run is None:
        return None
    backends = tuple(CloudRunBackend(m.name, cfg.cloud_run_region(m), backend_name(cfg, m.name),
                                     tuple(cloud_run_prefixes(cfg, m.name))) for m in models)
    return CloudRunFront(cfg.gateway.class_name, LB_OF_CLASS[cfg.gateway.class_name], cfg.cloud_run.hostname,
                         cloud_run_tls(cfg), cfg.region, front_name(cfg), backends)


def cloud_run_base(cfg: StackConfig) -> str:
    """The scheme and host tenants call the Cloud Run models at."""
    scheme = "https" if cloud_run_tls(cfg) else "http"
    host = cfg.cloud_run.hostname if cfg.cloud_run is not None else None
    return f"{scheme}://{host or '<cloudRunAddress>'}"


def cloud_run_url(cfg: StackConfig, model: str) -> str:
    """A tenant's URL of a Cloud Run model: the shared /<model>/v1, as for a length-routed GKE model."""
    return f"{cloud_run_base(cfg)}/{model}{VERSION}"


def front_url(front: CloudRunFront, model: str) -> str:
    """cloud_run_url from the load balancer's own data (what the component exports)."""
    return f"{'https' if front.tls else 'http'}://{front.hostname or '<cloudRunAddress>'}/{model}{VERSION}"


def is_cloud_run_model(cfg: StackConfig, name: str) -> bool:
    return any(m.name == name for m in cfg.cloud_run_models)
