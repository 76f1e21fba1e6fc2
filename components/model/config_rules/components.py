"""The components' own checks on their args: a component validates what it is given as the stack
config does (the same checks), so a program that declares it directly, or through the package
(components/provider/), gets the stack config's message. Keys name the args as the package's
inputs spell them (`targets[qwen-7b].canaryWeight`); each check raises one ConfigError with every
problem. The stack program passes only what its own checks accepted: there they never fire."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from ..specs import ClusterSpec
from ..stack_config import ConfigError, ConfigIssue
from .cluster import check_inference_gateway_class, check_length_routing_class, check_network, check_zones


class Problems:
    """One component's problems, raised together (a user fixes them in one pass)."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.issues: list[ConfigIssue] = []

    def add(self, key: str, problem: str) -> None:
        self.issues.append(ConfigIssue(key, problem))

    def raise_any(self) -> None:
        if self.issues:
            raise ConfigError(self.issues, f"{self.component} args")


class Route(Protocol):
    """What the Gateway's checks read of a target (components/gateway.py's RouteTarget)."""

    @property
    def route_name(self) -> str: ...
    @property
    def canary_short_service(self) -> Optional[str]: ...
    @property
    def canary_long_service(self) -> Optional[str]: ...
    @property
    def canary_weight(self) -> int: ...
    @property
    def picker(self) -> Optional[object]: ...


def route_key(targets: Sequence[Route], i: int) -> str:
    """A target by its routeName where that names one target ('targets[qwen-7b]'), else by index."""
    name = targets[i].route_name
    return f"targets[{name}]" if name and sum(t.route_name == name for t in targets) == 1 else f"targets[{i}]"


def check_gateway(class_name: str, targets: Sequence[Route]) -> None:
    """Each route its own name, a canary with both pools and a weight of 0-100, and a class whose
    load balancer can program the routes (the stack config's inference_gateway and length_routing)."""
    problems = Problems("Gateway")
    for i, t in enumerate(targets):
        key = route_key(targets, i)
        if (t.canary_short_service is None) != (t.canary_long_service is None):
            problems.add(key, "set both canaryShortService and canaryLongService, or neither")
        if not 0 <= t.canary_weight <= 100 or (t.canary_weight and t.canary_short_service is None):
            problems.add(f"{key}.canaryWeight", f"{t.canary_weight} must be 0-100, and needs the canary services")
    names = [t.route_name for t in targets]
    for route in sorted({n for n in names if names.count(n) > 1}):
        problems.add("targets", f"routeName '{route}' is used more than once; each route needs its own name")
    if any(t.picker for t in targets):
        check_inference_gateway_class(problems.add, "gateway.className", class_name,
                                      "a target routes to an InferencePool")
    if any(not t.picker for t in targets):
        check_length_routing_class(problems.add, "gateway.className", class_name, "a target routes by length")
    problems.raise_any()


def check_gpu_cluster(region: str, cluster: ClusterSpec) -> None:
    """The stack config's checks on the cluster alone: zones in the region, ranges apart."""
    problems = Problems("GpuCluster")
    check_zones(problems.add, region, cluster.zones, "cluster.zones", "region")
    check_network(problems.add, cluster)
    problems.raise_any()


def check_keda(project: str) -> None:
    problems = Problems("Keda")
    if not project:
        problems.add("project", "is required: the project whose Managed Prometheus KEDA reads")
    problems.raise_any()


def check_limit_store(client_namespaces: Sequence[str]) -> None:
    problems = Problems("LimitStore")
    if not client_namespaces:
        problems.add("clientNamespaces", "none given, so no server could count limits here; list the namespaces "
                     "of the servers (MeshNamespace.name)")
    problems.raise_any()


def check_tenant_auth(shared_models: Sequence[str], picker_models: Sequence[str]) -> None:
    """Each shared model once; the picker's models among them."""
    problems = Problems("TenantAuth")
    for model in sorted({m for m in shared_models if list(shared_models).count(m) > 1}):
        problems.add("sharedModels", f"'{model}' is listed more than once")
    for model in picker_models:
        if model not in shared_models:
            problems.add("pickerModels", f"'{model}' is not in sharedModels; list the shared models behind the "
                         "endpoint picker")
    problems.raise_any()
