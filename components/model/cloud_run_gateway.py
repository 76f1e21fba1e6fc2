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

A model with auth jwt has Cloud Run's invoker check off (the guard verifies the tenant's JWT), so any
request the load balancer passes starts an instance (a cold start, then billed until it idles out)
before the guard can refuse it. A Cloud Armor policy on its backend service (ArmorPolicy) therefore
passes only a well-formed `Bearer <JWT>`, at most a per-IP rate derived from its callers' limits, and
refuses everything else at the load balancer. A model with auth iam has none: Cloud Run's invoker
check refuses an unverified request before any instance starts, so there is nothing to save, and
the guard's per-tenant limits bound the verified ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

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


# The JWT's compact form (RFC 7519 section 3): three base64url segments joined by dots, the last (the
# signature) not empty, so an unsigned `alg: none` token never wakes an instance. Unbounded runs: RE2
# (Cloud Armor's matches()) is linear in the header's length, bounds would refuse a large real token
# (group-heavy claims) that GKE and the guard (16 KB) take, and counted repeats compile to a program
# RE2's default DFA cannot hold (~30,000 instructions for 1,000-character bounds).
RE2_REPEAT_MAX = 1000
_B64URL = "[A-Za-z0-9_-]"
_SEGMENT = f"{_B64URL}+"
_PAYLOAD = _SEGMENT
# Anchored: matches() is a partial match. A repeated Authorization header reaches the rule joined by
# ', ' (the rules language's request.headers), which the pattern refuses, as the guard does.
BEARER_JWT_PATTERN = f"^Bearer {_SEGMENT}[.]{_PAYLOAD}[.]{_SEGMENT}$"
BEARER_JWT_EXPRESSION = f"request.headers['authorization'].matches('{BEARER_JWT_PATTERN}')"
# Per-IP rate: this many times what the guards admit of all the model's callers in a minute, so a
# legitimate client meets the guard's own 429 (which names the limit) long before Cloud Armor's.
ARMOR_HEADROOM = 2
ARMOR_INTERVAL_S = 60
# Cloud Armor's most for a throttle's threshold count.
THROTTLE_COUNT_MAX = 1_000_000
THROTTLE_PRIORITY = 1000
DEFAULT_RULE_PRIORITY = 2147483647


@dataclass(frozen=True)
class ArmorPolicy:
    """The Cloud Armor policy in front of one auth jwt model (regional in a regional class's region,
    global for the global class): a well-formed bearer JWT is throttled per client IP, and the
    default rule refuses everything else, so a request without one (or one whose header cannot be
    read) never reaches Cloud Run. Fail closed: nothing is allowed by the default rule."""

    name: str
    # Requests one client IP may send in ARMOR_INTERVAL_S before the excess is answered 429.
    per_ip_per_minute: int

    def rules(self) -> list[dict[str, Any]]:
        """The policy's rules as the provider's input (snake_case), in priority order."""
        throttle = {"priority": THROTTLE_PRIORITY, "action": "throttle",
                    "description": "well-formed Bearer JWT, throttled per client IP",
                    "match": {"expr": {"expression": BEARER_JWT_EXPRESSION}},
                    "rate_limit_options": {"conform_action": "allow", "exceed_action": "deny(429)",
                                           "enforce_on_key": "IP", "rate_limit_threshold": {
                                               "count": self.per_ip_per_minute, "interval_sec": ARMOR_INTERVAL_S}}}
        refuse = {"priority": DEFAULT_RULE_PRIORITY, "action": "deny(403)",
                  "description": "no well-formed Bearer JWT: refused before Cloud Run",
                  "match": {"versioned_expr": "SRC_IPS_V1", "config": {"src_ip_ranges": ["*"]}}}
        return [throttle, refuse]


def guard_admits_per_minute(cfg: StackConfig, model: CloudRunModelSpec) -> int:
    """The most requests a minute the model's guards admit of all its callers together: each caller's
    requestsPerMinute, across all instances with globalLimits, else per instance (maxInstances)."""
    per_instance = sum(t.rate_limit.requests_per_minute for t in cloud_run_callers(cfg, model.name))
    return per_instance * (1 if cfg.global_limits.enabled else model.max_instances)


def armor_policy(cfg: StackConfig, model: CloudRunModelSpec) -> Optional[ArmorPolicy]:
    """The Cloud Armor policy of an auth jwt model (None for auth iam: see the module's docstring)."""
    if model.auth != "jwt":
        return None
    count = min(THROTTLE_COUNT_MAX, max(1, ARMOR_HEADROOM * guard_admits_per_minute(cfg, model)))
    return ArmorPolicy(backend_name(cfg, model.name), count)


@dataclass(frozen=True)
class CloudRunBackend:
    """One Cloud Run model behind the load balancer."""

    model: str
    region: str
    # The serverless NEG's and the backend service's name.
    name: str
    # '/<model>' and '/<tenant>/<model>' of each tenant that lists it (cloud_run_prefixes).
    prefixes: tuple[str, ...]
    # The Cloud Armor policy on its backend service (auth jwt), None without one (auth iam).
    armor: Optional[ArmorPolicy] = None

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
                                     tuple(cloud_run_prefixes(cfg, m.name)), armor_policy(cfg, m)) for m in models)
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
