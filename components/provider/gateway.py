"""Gateway, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from pydantic.alias_generators import to_camel
from typing_extensions import NotRequired

from ..gateway import Gateway as _Gateway
from ..gateway import GatewayArgs, RouteTarget
from ..model.config_rules import check_inference_gateway_class, check_length_routing_class
from ..model.gateway_routes import PickerTarget
from ..model.serving_api import PICKER_MIN_BODY_BYTES, objective_name, picker_routes
from ..model.specs import GatewaySpec as GatewayModel
from ..options import child_opts
from ..project_apis import ProjectApis, ProjectApisArgs
from .convert import Problems, kubernetes_provider
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


class Gateway(pulumi.ComponentResource):
    """Cloud Load Balancing through the GKE Gateway: HTTPS only when external, length-aware
    routes to each model's short and long pools, health checks and backend timeouts."""

    gateway_name: pulumi.Output[str]
    """The Gateway's name."""
    listener: pulumi.Output[str]
    """The listener the model routes attach to (https where TLS is configured)."""
    address: pulumi.Output[str]
    """The reserved address ('' without staticIp)."""
    dns_authorization_record: pulumi.Output[str]
    """For a managed certificate: the DNS record to create, 'NAME TYPE DATA' ('' otherwise)."""

    def __init__(self, name: str, args: GatewayInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Gateway", name, {}, opts)
        problems = Problems("Gateway")
        spec = problems.spec(GatewayModel, args.get("gateway"), "gateway")
        targets = []
        given = list(args.get("targets") or [])
        names = [t.get("route_name") for t in given]
        for i, t in enumerate(given):
            # Named by routeName where it names one target ('targets[qwen-7b]'), else by index.
            key = (f"targets[{names[i]}]" if isinstance(names[i], str) and names[i] and names.count(names[i]) == 1
                   else f"targets[{i}]")
            picker = None
            inference_pool, tenant = t.get("inference_pool"), t.get("tenant")
            if inference_pool and (missing := [to_camel(k) for k in ("route_name", "namespace", "path_prefix")
                                               if t.get(k) is None]):
                problems.add(key, f"{', '.join(missing)} required but not set")
                continue
            if inference_pool:
                if not tenant:
                    problems.add(f"{key}.tenant", "required with inferencePool: the tenant whose objective "
                                 "the route requires")
                    continue
                if any(t.get(k) for k in ("short_service", "long_service", "canary_short_service", "canary_weight")):
                    problems.add(key, "inferencePool routes to the picker: leave out the Services and "
                                 "the canary")
                    continue
                pool = str(inference_pool)
                picker = PickerTarget(pool, objective_name(str(tenant), pool), str(tenant),
                                      routes=tuple((r.path, r.method) for r in picker_routes()),
                                      max_body_bytes=int(t.get("max_body_bytes") or PICKER_MIN_BODY_BYTES))
                targets.append(RouteTarget(t["route_name"], t["namespace"], t["path_prefix"], f"{pool}-short", "", 0,
                                           int(t.get("port") or 8000), picker=picker))
                continue
            missing = [to_camel(k) for k in ("route_name", "namespace", "path_prefix", "short_service", "long_service",
                                             "long_request_bytes") if t.get(k) is None]
            if missing:
                problems.add(key, f"{', '.join(missing)} required but not set (or give inferencePool)")
                continue
            short, long, long_bytes = t.get("short_service"), t.get("long_service"), t.get("long_request_bytes")
            assert short is not None and long is not None and long_bytes is not None  # none is missing
            canary = (t.get("canary_short_service"), t.get("canary_long_service"))
            weight = int(t.get("canary_weight") or 0)
            if (canary[0] is None) != (canary[1] is None):
                problems.add(key, "set both canaryShortService and canaryLongService, or neither")
            if not 0 <= weight <= 100 or (weight and canary[0] is None):
                problems.add(f"{key}.canaryWeight", f"{weight} must be 0-100, and needs the canary services")
            targets.append(RouteTarget(t["route_name"], t["namespace"], t["path_prefix"], short,
                                       long, int(long_bytes), int(t.get("port") or 8000),
                                       canary_short_service=canary[0], canary_long_service=canary[1],
                                       canary_weight=weight,
                                       max_rate_per_endpoint={k: int(v) for k, v in
                                                              (t.get("max_rate_per_endpoint") or {}).items()}))
        for route in sorted({t.route_name for t in targets if [x.route_name for x in targets].count(t.route_name) > 1}):
            problems.add("targets", f"routeName '{route}' is used more than once; each route needs its own name")
        if spec is not None and any(t.picker for t in targets):
            check_inference_gateway_class(problems.add, "gateway.className", spec.class_name,
                                          "a target routes to an InferencePool")
        if spec is not None and any(not t.picker for t in targets):
            check_length_routing_class(problems.add, "gateway.className", spec.class_name,
                                       "a target routes by length")
        problems.raise_any()
        apis = None
        if args.get("enable_apis", True):
            needed = ["compute.googleapis.com"] + (["certificatemanager.googleapis.com"] if spec.managed_certificate else [])
            needed += ["networkservices.googleapis.com"] if any(t.picker for t in targets) else []
            apis = ProjectApis(f"{name}-apis", ProjectApisArgs(args["project"], needed),
                               opts=child_opts(self, opts))
        inner = _Gateway(name, GatewayArgs(
            spec, args["namespace"], targets, kubernetes_provider(name, args["kubeconfig"], self),
            project=args["project"], region=args["region"], subnetwork=args.get("subnetwork"),
            name_prefix=args.get("name_prefix") or "vllm", apis=apis), opts=child_opts(self, opts))
        self.gateway_name = pulumi.Output.from_input("vllm")
        self.listener = pulumi.Output.from_input(inner.serving_listener)
        self.address = inner.address if inner.address is not None else pulumi.Output.from_input("")
        records = inner.dns_authorization
        self.dns_authorization_record = records.apply(
            lambda rs: " ".join(f"{r.name} {r.type} {r.data}" for r in rs or [])) if records is not None \
            else pulumi.Output.from_input("")
        self.register_outputs({"gatewayName": self.gateway_name, "listener": self.listener, "address": self.address,
                               "dnsAuthorizationRecord": self.dns_authorization_record})
