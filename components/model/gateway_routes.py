"""The Gateway's listeners, HTTPRoutes and backend defaults as data (Gateway API field names).
Why they route as they do (by length, or through the endpoint picker; HTTPS only where TLS is
on): components/gateway.py, which declares them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .k8s_objects import ACCESS_LABEL
from .picker import pool_ref
from .serving_api import LEGACY_OBJECTIVE_HEADER, OBJECTIVE_HEADER, PICKER_PATHS, TENANT_HEADER, VERIFIED_HEADERS
from .specs import GatewaySpec
from .vllm_server import drain_seconds

GATEWAY_NAME = "vllm"
LENGTH_HINT_HEADER = "x-vllm-gke-length"
HTTP_LISTENER = "http"
HTTPS_LISTENER = "https"
# GCPBackendPolicy's connectionDraining.drainingTimeoutSec upper bound (Cloud Load Balancing).
MAX_DRAINING_S = 3600


def at_least_regex(n: int) -> str:
    """An RE2 pattern matching exactly the decimal integers >= n (no leading zeros)."""
    digits = str(n)
    width = len(digits)
    alternatives = [f"[1-9][0-9]{{{width},}}"]  # more digits than n
    alternatives.append(digits)
    for i in range(width - 1, -1, -1):
        d = int(digits[i])
        low = d + 1
        if low > 9 or (i == 0 and low < 1):
            continue
        rest = width - i - 1
        tail = f"[0-9]{{{rest}}}" if rest else ""
        alternatives.append(f"{digits[:i]}[{low}-9]{tail}")
    return "^(" + "|".join(alternatives) + ")$"


def at_most_regex(n: int) -> str:
    """An RE2 pattern matching exactly the decimal integers 0..n (no leading zeros)."""
    digits = str(n)
    width = len(digits)
    alternatives = ["0"]
    if width > 1:
        alternatives.append(f"[1-9][0-9]{{0,{width - 2}}}")  # fewer digits than n
    alternatives.append(digits)
    for i, ch in enumerate(digits):
        high = int(ch) - 1
        low = 1 if i == 0 else 0
        if high < low:
            continue
        rest = width - i - 1
        tail = f"[0-9]{{{rest}}}" if rest else ""
        alternatives.append(f"{digits[:i]}[{low}-{high}]{tail}")
    return "^(" + "|".join(alternatives) + ")$"


def backend_defaults(request_timeout_seconds: int) -> dict[str, Any]:
    """GCPBackendPolicy defaults for vLLM replicas. Long generations stream for minutes (the load
    balancer's 30 s default would cut them); a detached endpoint keeps its connections for as long
    as a stopping replica may still answer (preStop plus the longest request), so what it
    accepted finishes on a scale-down or drain."""
    return {"timeoutSec": request_timeout_seconds,
            "connectionDraining": {"drainingTimeoutSec": min(MAX_DRAINING_S, drain_seconds(request_timeout_seconds))}}


def service_backend_policy(service: str, request_timeout_seconds: int, max_rate_per_endpoint: int = 0
                           ) -> dict[str, Any]:
    """A length-routed pool's GCPBackendPolicy (`max_rate_per_endpoint`: the load balancer's target
    requests/s per replica, a capacity, not a cap; 0: none)."""
    policy = backend_defaults(request_timeout_seconds)
    if max_rate_per_endpoint:
        policy["maxRatePerEndpoint"] = max_rate_per_endpoint
    return {"default": policy, "targetRef": service_ref(service)}


def service_ref(service: str) -> dict[str, str]:
    """A policy's targetRef to a Service."""
    return {"group": "", "kind": "Service", "name": service}


@dataclass(frozen=True)
class PickerTarget:
    """A model's InferencePool as one tenant reaches it: only requests the tenant identity extension
    verified as the tenant's (images/vllm_gke_identity) match, by the objective and the tenant it
    set; a client's own copies never get that far (the extension removes them, and fails closed)."""

    pool_name: str
    objective: str
    tenant: str
    # (path, method) pairs the picker serves (serving_api.picker_routes()).
    routes: tuple[tuple[str, str], ...] = tuple(
        (p, "GET" if p == "/v1/models" else "POST") for p in PICKER_PATHS)
    # The largest Content-Length a body may declare (the picker buffers it whole).
    max_body_bytes: int = 1 << 20
    # Routes whose bodies the identity extension reads and salts (serving_api.picker_salted_paths).
    # Where there are any, its body chain takes every /v1/ path of the URL: it refuses (413) a
    # missing, chunked or larger Content-Length before reading and bounds what passes, and Envoy's
    # ext_proc in FullDuplexStreamed removes Content-Length from the request before the route is
    # chosen (envoy#39035), so none of the URL's routes can match on it.
    salted_paths: tuple[str, ...] = ()


def serving_listener(spec: GatewaySpec) -> str:
    """The listener model routes attach to: HTTPS where TLS is on (HTTP then only redirects)."""
    return HTTPS_LISTENER if spec.tls else HTTP_LISTENER


def listeners(spec: GatewaySpec, certificate: str = "") -> list[dict[str, Any]]:
    """`certificate`: a Certificate Manager certificate a regional HTTPS listener serves."""
    listener_host = {"hostname": spec.hostname} if spec.hostname else {}
    # Only namespaces this library labels may attach routes, and only to the serving listener.
    tenant_routes = {"namespaces": {"from": "Selector", "selector": {"matchLabels": {ACCESS_LABEL: "true"}}}}
    own_routes = {"namespaces": {"from": "Same"}}
    if not spec.tls:
        return [{"name": HTTP_LISTENER, "protocol": "HTTP", "port": 80,
                 "allowedRoutes": tenant_routes, **listener_host}]
    tls: dict[str, Any] = {"mode": "Terminate",
                           **({"options": {"networking.gke.io/cert-manager-certs": certificate}} if certificate else {})}
    if spec.tls_secret_name:
        tls["certificateRefs"] = [{"kind": "Secret", "name": spec.tls_secret_name}]
    return [{"name": HTTPS_LISTENER, "protocol": "HTTPS", "port": 443,
             "allowedRoutes": tenant_routes, "tls": tls, **listener_host},
            {"name": HTTP_LISTENER, "protocol": "HTTP", "port": 80,
             "allowedRoutes": own_routes, **listener_host}]


def gateway_spec(spec: GatewaySpec, certificate: str = "", address: str = "") -> dict[str, Any]:
    """`address`: a reserved address's name (NamedAddress), if any."""
    out: dict[str, Any] = {"gatewayClassName": spec.class_name, "listeners": listeners(spec, certificate)}
    if address:
        out["addresses"] = [{"type": "NamedAddress", "value": address}]
    return out


def https_redirect(spec: GatewaySpec) -> dict[str, Any]:
    """The HTTP listener's one route: everything to HTTPS."""
    return {"parentRefs": [{"name": GATEWAY_NAME, "sectionName": HTTP_LISTENER}],
            **({"hostnames": [spec.hostname]} if spec.hostname else {}),
            "rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {
                "scheme": "https", "statusCode": 301}}]}]}


def route_spec(parent_ref: dict[str, Any], rules: list[dict[str, Any]], hostname: Optional[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"parentRefs": [parent_ref], "rules": rules}
    if hostname:
        out["hostnames"] = [hostname]
    return out


def weighted_backends(service: str, canary: Optional[str], port: int, canary_weight: int) -> list[dict[str, Any]]:
    if not canary:
        return [{"name": service, "port": port}]
    # Weights are relative: stable and canary always both listed, so a rollback is a
    # config change of the weight and the canary can stay warm at 0.
    return [{"name": service, "port": port, "weight": 100 - canary_weight},
            {"name": canary, "port": port, "weight": canary_weight}]


def length_rules(path_prefix: str, long_request_bytes: int, short_backends: list[dict[str, Any]],
                 long_backends: list[dict[str, Any]], skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Long requests (a Content-Length of at least `long_request_bytes`, or the client's hint) to
    the long pool, everything else to the short one; a pool in `skip` has its rules in a route
    Flagger declares (components/model/rollouts.py: the same matches, so the same precedence)."""
    path = {"type": "PathPrefix", "value": f"/{path_prefix}/v1"}
    # No URLRewrite: GKE does not claim HTTPRoute path rewrites (infra/contracts/gateway.py), so
    # the path reaches the pod as sent; the mesh admits it prefixed and the guard strips the prefix.
    # The tenant is the issuer and subject Istio verified: a client's own copy never gets through.
    strip_verified = [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": list(VERIFIED_HEADERS)}}]
    long_backend = {"filters": strip_verified, "backendRefs": long_backends}
    # Header matches outrank the bare path match of the last rule (Gateway API precedence).
    long = [
        {"matches": [{"path": path, "headers": [{"type": "RegularExpression", "name": "content-length",
                                                 "value": at_least_regex(long_request_bytes)}]}],
         **long_backend},
        {"matches": [{"path": path, "headers": [{"type": "Exact", "name": LENGTH_HINT_HEADER,
                                                 "value": "long"}]}],
         **long_backend},
    ]
    short = [{"matches": [{"path": path}], "filters": strip_verified, "backendRefs": short_backends}]
    return [*(long if "long" not in skip else []), *(short if "short" not in skip else [])]


def picker_rules(path_prefix: str, picker: PickerTarget) -> list[dict[str, Any]]:
    """One rule per route the picker serves, each requiring what the tenant identity extension set
    from the tenant's verified token (its objective for this model and the tenant) and, for a body
    on a URL the extension does not salt, a Content-Length within the limit (no chunked or oversized
    body reaches the picker, which buffers it whole; on a salted URL the extension bounds every body
    and Envoy has removed the header: PickerTarget.salted_paths). A request without them matches
    nothing here: 404 from the load balancer, no picker, no GPU. No rule refuses the picker's other
    control headers any more: the extension removes every client copy before any route is chosen (a
    refusing rule per header and route would multiply the route's matches for nothing the extension
    lets through)."""
    prefix = f"/{path_prefix}"
    verified = [{"type": "Exact", "name": OBJECTIVE_HEADER, "value": picker.objective},
                {"type": "Exact", "name": TENANT_HEADER, "value": picker.tenant}]
    length = {"type": "RegularExpression", "name": "content-length", "value": at_most_regex(picker.max_body_bytes)}

    def served(path: str, method: str) -> dict[str, Any]:
        # No method match (GKE's conformance reports list it as unsupported): the mesh and the
        # guard refuse a wrong method; a body route the extension does not bound still needs its
        # bounded Content-Length.
        bounded = method == "POST" and not picker.salted_paths
        return {"path": {"type": "Exact", "value": f"{prefix}{path}"},
                "headers": [*verified, *([length] if bounded else [])]}

    def legacy(path: str, method: str) -> list[dict[str, Any]]:
        # One release: the move from bf329cd's routes (issue 39); drop next release. bf329cd's match:
        # the client-sent old objective header with the tenant's own objective and, on a body route, the
        # bounded Content-Length. It carries the requests of the minutes between these routes and the
        # identity extension's programming (which waits for them: components/platform.py); once the
        # extension runs it strips that header from every request, so this match is dead after the move.
        if not LEGACY_OBJECTIVE_HEADER:
            return []
        old = {"type": "Exact", "name": LEGACY_OBJECTIVE_HEADER, "value": picker.objective}
        return [{"path": {"type": "Exact", "value": f"{prefix}{path}"},
                 "headers": [old, *([length] if method == "POST" else [])]}]

    # The issuer and subject are Istio's to write at the replica: a client's copies are dropped.
    # Never PICKER_SETS (serving_api says why); the extension's headers go on to the replica's guard.
    strip = {"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": list(VERIFIED_HEADERS)}}
    backend = pool_ref(picker.pool_name)
    # Forwarded as sent (no URLRewrite, as above): the picker reads no path, the guard strips the prefix.
    return [{"matches": [served(path, method), *legacy(path, method)], "filters": [strip], "backendRefs": [backend]}
            for path, method in picker.routes]


@dataclass(frozen=True)
class RouteTarget:
    """The two pools of one model (or, with `picker`, its InferencePool), reachable under
    /<path_prefix>/v1/..."""

    route_name: str
    # Its namespace's name, or a Pulumi output of it (the route then waits for the namespace).
    namespace: Any
    path_prefix: str
    short_service: str
    long_service: str
    long_request_bytes: int
    port: int = 8000
    # A canary revision's two pools and its share of each rule's traffic (percent).
    canary_short_service: Optional[str] = None
    canary_long_service: Optional[str] = None
    canary_weight: int = 0
    # Load balancer target requests/s per replica (a capacity, not a cap), by Service (pools that set maxRatePerEndpoint).
    max_rate_per_endpoint: Mapping[str, int] = field(default_factory=dict[str, int])
    # Routing through GKE Inference Gateway's endpoint picker instead of by length.
    picker: Optional[PickerTarget] = None
    # Pools ("short", "long") whose rules Flagger's own HTTPRoute holds (to <service>-primary and
    # <service>-canary at its weights): left out of this route.
    flagger_pools: tuple[str, ...] = ()

    def services(self) -> list[str]:
        """The Services the load balancer sends to (none behind a picker: the pool has its own policies)."""
        if self.picker:
            return []
        canary = [s for s in (self.canary_short_service, self.canary_long_service) if s]
        out: list[str] = []
        for which, service in (("short", self.short_service), ("long", self.long_service)):
            out += [f"{service}-primary", f"{service}-canary"] if which in self.flagger_pools else [service]
        return [*out, *canary]

    def rate_for(self, service: str) -> int:
        """The load balancer's target rate per replica of a Service (a Flagger pool's two share its own)."""
        base = service.removesuffix("-primary").removesuffix("-canary")
        return self.max_rate_per_endpoint.get(service, self.max_rate_per_endpoint.get(base, 0))

    def rules(self) -> list[dict[str, Any]]:
        """The route's rules: through the picker, or by length to the two pools (each with its canary)."""
        if self.picker:
            return picker_rules(self.path_prefix, self.picker)
        return length_rules(
            self.path_prefix, self.long_request_bytes,
            weighted_backends(self.short_service, self.canary_short_service, self.port, self.canary_weight),
            weighted_backends(self.long_service, self.canary_long_service, self.port, self.canary_weight),
            self.flagger_pools)
