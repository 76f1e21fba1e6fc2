"""Gateway, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from pydantic.alias_generators import to_camel
from typing_extensions import NotRequired

from ..gateway import Gateway as _Gateway
from ..gateway import GatewayArgs
from ..model.gateway_routes import GATEWAY_NAME, PickerTarget, RouteTarget
from ..model.serving_api import PICKER_MIN_BODY_BYTES, objective_name, picker_routes, picker_salted_paths
from ..model.specs import GatewaySpec as GatewayModel
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from .convert import Problems, kubernetes_provider, named_inputs
from .facade import LATER, Facade
from .types import GatewaySpec


class RouteTargetSpec(TypedDict):
    """The two pools of one model, reachable under /<pathPrefix>/v1/..."""

    route_name: str
    """The HTTPRoute's name."""
    namespace: pulumi.Input[str]
    """The namespace of the route and the two Services."""
    path_prefix: str
    """The route's path: /<pathPrefix>/v1, forwarded as sent (GKE rewrites no path): the model's name, or
    <tenant>/<model> for a tenant's dedicated copy and behind inferencePool, the prefixes VllmService's guard
    strips and TenantAuth's policies admit."""
    short_service: NotRequired[str]
    """The short-request pool's Service, <model>-short (plain: it names the route's backends); not with
    inferencePool."""
    long_service: NotRequired[str]
    """The long-request pool's Service, <model>-long; not with inferencePool."""
    long_request_bytes: NotRequired[int]
    """Requests with a body of at least this many bytes go to the long pool; not with inferencePool."""
    inference_pool: NotRequired[str]
    """Route through GKE Inference Gateway's endpoint picker to this InferencePool (the model's name, plain)
    instead of by length; one target per tenant, whose objective the route requires."""
    tenant: NotRequired[str]
    """With inferencePool: the tenant this route serves (its path should name it: <tenant>/<model>)."""
    max_body_bytes: NotRequired[int]
    """With inferencePool: the largest request body the route admits (the picker buffers it whole). Default
    1 MiB; Platform gives 16 bytes per token of the pool's maxModelLen (at least 1 MiB), which a model with
    more than 64k context needs."""
    vllm_version: NotRequired[str]
    """With inferencePool: the pool's vLLM release (default the newest), as given to IdentityExtension: the
    routes whose bodies the extension salts match no Content-Length (Envoy drops it in front of them)."""
    port: NotRequired[int]
    """The Services' port (default 8000)."""
    canary_short_service: NotRequired[str]
    """The canary revision's short-request pool (VllmService with canary: true)."""
    canary_long_service: NotRequired[str]
    """The canary revision's long-request pool."""
    canary_weight: NotRequired[int]
    """Percent of each rule's traffic sent to the canary pools, 0-100 (default 0)."""
    max_rate_per_endpoint: NotRequired[dict[str, int]]
    """Load balancer target requests/s per replica (a capacity it balances by, not a cap), by Service name."""


class GatewayInputs(TypedDict):
    """Inputs of Gateway."""

    gateway: GatewaySpec
    """Gateway class, hostname and TLS."""
    namespace: pulumi.Input[str]
    """The namespace of the Gateway (the serving namespace)."""
    targets: list[RouteTargetSpec]
    """The models it routes to."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    project: str
    """The GCP project (reserved address, certificate)."""
    region: str
    """The region (regional address and certificate)."""
    subnetwork: NotRequired[pulumi.Input[str]]
    """The subnet an internal Gateway's address comes from (GpuCluster.subnetworkId)."""
    name_prefix: NotRequired[str]
    """Prefix of the address and certificate names (default vllm)."""
    enable_apis: NotRequired[bool]
    """Enable the APIs it needs first (default true)."""


def target_key(given: list[RouteTargetSpec], i: int) -> str:
    """Named by routeName where it names one target ('targets[qwen-7b]'), else by index."""
    name = given[i].get("route_name")
    return f"targets[{name}]" if name and [t.get("route_name") for t in given].count(name) == 1 else f"targets[{i}]"


def missing(t: RouteTargetSpec, *keys: str) -> list[str]:
    return [to_camel(k) for k in keys if t.get(k) is None]


def picker_target(problems: Problems, key: str, t: RouteTargetSpec) -> Optional[RouteTarget]:
    """A tenant's route to an InferencePool: the picker's routes, the tenant's own objective."""
    if absent := missing(t, "route_name", "namespace", "path_prefix"):
        problems.add(key, f"{', '.join(absent)} required but not set")
        return None
    tenant = t.get("tenant")
    if not tenant:
        problems.add(f"{key}.tenant", "required with inferencePool: the tenant whose objective the route requires")
        return None
    if any(t.get(k) for k in ("short_service", "long_service", "canary_short_service", "canary_weight")):
        problems.add(key, "inferencePool routes to the picker: leave out the Services and the canary")
        return None
    pool = str(t.get("inference_pool"))
    version = t.get("vllm_version") or DEFAULT_VLLM_VERSION
    if version not in RELEASES:
        problems.add(f"{key}.vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        return None
    picker = PickerTarget(pool, objective_name(tenant, pool), tenant,
                          routes=tuple((r.path, r.method) for r in picker_routes()),
                          max_body_bytes=int(t.get("max_body_bytes") or PICKER_MIN_BODY_BYTES),
                          salted_paths=picker_salted_paths(RELEASES[version]))
    return RouteTarget(t["route_name"], t["namespace"], t["path_prefix"], f"{pool}-short", "", 0,
                       int(t.get("port") or 8000), picker=picker)


def route_target(problems: Problems, key: str, t: RouteTargetSpec) -> Optional[RouteTarget]:
    """A model's two pools by request length (and its canary's), or with inferencePool its picker."""
    if t.get("inference_pool"):
        return picker_target(problems, key, t)
    if absent := missing(t, "route_name", "namespace", "path_prefix", "short_service", "long_service",
                         "long_request_bytes"):
        problems.add(key, f"{', '.join(absent)} required but not set (or give inferencePool)")
        return None
    return RouteTarget(t["route_name"], t["namespace"], t["path_prefix"], str(t.get("short_service")),
                       str(t.get("long_service")), int(t.get("long_request_bytes") or 0), int(t.get("port") or 8000),
                       canary_short_service=t.get("canary_short_service"),
                       canary_long_service=t.get("canary_long_service"), canary_weight=int(t.get("canary_weight") or 0),
                       max_rate_per_endpoint={k: int(v) for k, v in (t.get("max_rate_per_endpoint") or {}).items()})


class Gateway(_Gateway, Facade):
    """Cloud Load Balancing through the GKE Gateway: HTTPS only when external, length-aware
    routes to each model's short and long pools, health checks and backend timeouts."""

    gateway_name: str
    """The Gateway's name."""
    listener: str
    """The listener the model routes attach to (https where TLS is configured)."""
    address: pulumi.Output[str]
    """The reserved address ('' without staticIp)."""
    dns_authorization_record: pulumi.Output[str]
    """For a managed certificate: the DNS record to create, 'NAME TYPE DATA' ('' otherwise)."""

    def __init__(self, name: str, args: GatewayInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("Gateway")
        spec = problems.spec(GatewayModel, args.get("gateway"), "gateway")
        given = list(args.get("targets") or [])
        targets = [route_target(problems, target_key(given, i), t) for i, t in enumerate(given)]
        problems.raise_any()
        self.inputs, self.args = args, GatewayArgs(
            spec, args["namespace"], [t for t in targets if t is not None], LATER, project=args["project"],
            region=args["region"], subnetwork=args.get("subnetwork"), name_prefix=args.get("name_prefix") or "vllm")
        with named_inputs("Gateway"):
            super().__init__(name, self.args, opts)
        self.gateway_name, self.listener = GATEWAY_NAME, self.serving_listener
        if self.address is None:
            self.address = pulumi.Output.from_input("")
        records = self.dns_authorization
        self.dns_authorization_record = pulumi.Output.from_input("") if records is None else records.apply(
            lambda rs: " ".join(f"{r.name} {r.type} {r.data}" for r in rs or []))

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
        needed = ["compute.googleapis.com"]
        needed += ["certificatemanager.googleapis.com"] if self.args.spec.managed_certificate else []
        needed += ["networkservices.googleapis.com"] if any(t.picker for t in self.args.targets) else []
        self.args.apis = self.project_apis(name, opts, self.inputs["project"], needed,
                                           self.inputs.get("enable_apis", True))
