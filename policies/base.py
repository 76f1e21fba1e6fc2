"""What every policy works on: a planned resource, a finding, a policy, and helpers over the plan.

Each policy takes every resource of a plan (type token, name, input/output properties in
Pulumi's camelCase wire form) and yields (resource, message) for each violation. Only the
standard library: the pack must stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Sequence

from .flagger_objects import flagger_objects

Level = Literal["advisory", "mandatory", "disabled"]
LEVELS: tuple[Level, ...] = ("advisory", "mandatory", "disabled")


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""


Finding = tuple[Optional[Resource], str]


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    level: Level
    check: Callable[[Sequence[Resource]], Iterable[Finding]]


@dataclass(frozen=True)
class Violation:
    policy: str
    level: Level
    resource: str
    urn: str
    message: str


# --- helpers over the plan ---------------------------------------------------------------

NODE_POOL = "gcp:container/nodePool:NodePool"
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
VLLM_ENTRYPOINTS = ("vllm serve", "vllm.entrypoints.openai.api_server", "/opt/vllm-gke/serve.py")


def kube(resources: Sequence[Resource], kind: str) -> list[Resource]:
    """The plan's objects of a kind; for a Service or an HTTPRoute, also those Flagger will create for
    the plan's Canaries (flagger_objects.py), which the policies judge as they judge declared ones."""
    declared = [r for r in resources if r.type.startswith("kubernetes:") and r.props.get("kind") == kind]
    if kind not in ("Service", "HTTPRoute"):
        return declared
    canaries = [r.props for r in resources if r.type.startswith("kubernetes:") and r.props.get("kind") == "Canary"]
    if not canaries:
        return declared
    targets = [r.props for r in resources if r.type.startswith("kubernetes:") and r.props.get("kind") == "Deployment"]
    derived = [o for o in flagger_objects(canaries, targets) if o["kind"] == kind]
    return declared + [Resource(f"kubernetes:flagger:{kind}", f"{o['metadata']['name']} (created by Flagger)", o)
                       for o in derived]


def meta(r: Resource) -> Mapping[str, Any]:
    return r.props.get("metadata") or {}


def namespace_of(r: Resource) -> str:
    return meta(r).get("namespace") or "default"


def pod_templates(r: Resource) -> list[Mapping[str, Any]]:
    """Every pod template of a workload: one, or a LeaderWorkerSet's leader and worker templates."""
    spec = r.props.get("spec") or {}
    if r.props.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    if r.props.get("kind") in POD_TEMPLATE_KINDS:
        return [spec.get("template") or {}]
    return []


def pod_spec(r: Resource) -> Optional[Mapping[str, Any]]:
    kind = r.props.get("kind")
    spec = r.props.get("spec") or {}
    if kind == "LeaderWorkerSet":
        return (pod_templates(r) or [{}])[0].get("spec")
    if kind in POD_TEMPLATE_KINDS:
        return (spec.get("template") or {}).get("spec")
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec")
    if kind == "Pod":
        return spec
    return None


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(pod.get("initContainers") or []) + list(pod.get("containers") or [])


def workloads(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    """(workload, pod spec) for every pod a plan declares: a LeaderWorkerSet's leaders and workers both."""
    for r in resources:
        if not r.type.startswith("kubernetes:"):
            continue
        if r.props.get("kind") == "LeaderWorkerSet":
            for template in pod_templates(r):
                if (pod := template.get("spec")) is not None:
                    yield r, pod
        elif (pod := pod_spec(r)) is not None:
            yield r, pod


def is_vllm_server(container: Mapping[str, Any]) -> bool:
    line = " ".join(str(x) for x in (container.get("command") or []) + (container.get("args") or []))
    return any(e in line for e in VLLM_ENTRYPOINTS)


# A multi-host group's worker runs vLLM's ranks without an API server (`--headless`), or only joins
# its leader's Ray cluster (the entrypoint's GKE_LLM_RAY_JOIN): it serves nothing over HTTP.
RAY_JOIN_ENV = "GKE_LLM_RAY_JOIN"


def is_group_worker(container: Mapping[str, Any]) -> bool:
    return "--headless" in [str(a) for a in container.get("args") or []] or RAY_JOIN_ENV in env_of(container)


def vllm_servers(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any], Mapping[str, Any]]]:
    """Every container that serves vLLM's API (group workers, which serve none, are not among them:
    policies/multi_host.py holds them closed)."""
    for r, pod in workloads(resources):
        for c in pod.get("containers") or []:
            if is_vllm_server(c) and not is_group_worker(c):
                yield r, pod, c


# What LeaderWorkerSet's controller labels every pod of a set with (lws v0.10.0 types.go:29-98).
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
SERVING_KINDS = ("Deployment", "LeaderWorkerSet")


def template_labels(r: Resource) -> Mapping[str, Any]:
    """The labels of a workload's (serving) pod template: a LeaderWorkerSet's leader's, with the
    set's name label its controller adds."""
    if r.props.get("kind") == "LeaderWorkerSet":
        leader = (pod_templates(r) or [{}])[0]
        return {**((leader.get("metadata") or {}).get("labels") or {}), LWS_NAME_LABEL: meta(r).get("name")}
    return (((r.props.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A non-empty equality selector matches these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env_of(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e.get("name", ""): e for e in container.get("env") or []}


def where(r: Resource) -> str:
    return f"{r.props.get('kind', r.type.split(':')[-1])} {namespace_of(r)}/{meta(r).get('name', r.name)}" \
        if r.type.startswith("kubernetes:") else f"{r.type.split(':')[-1]} {r.name}"


# --- helpers over routes and mesh policies, shared by several concerns ------------------

def is_deny_all(policy: Resource) -> bool:
    spec = policy.props.get("spec") or {}
    return spec.get("action", "ALLOW") == "ALLOW" and not spec.get("rules")


def parent_gateways(route: Resource, gateways: Mapping[tuple[str, Any], Resource]) -> list[tuple[dict, Resource]]:
    ns = namespace_of(route)
    parents = (route.props.get("spec") or {}).get("parentRefs") or []
    return [(p, gateways[key]) for p in parents if (key := (p.get("namespace") or ns, p.get("name"))) in gateways]


def route_backends(route: Resource) -> list[Any]:
    return [b for rule in (route.props.get("spec") or {}).get("rules") or [] for b in rule.get("backendRefs") or []]


def mesh_only(resources: Sequence[Resource], ns: str, what: str, risk: str) -> Iterator[Finding]:
    """A service with no credential of its own, locked by the mesh alone: its namespace refuses
    plaintext (STRICT mTLS, no port exceptions), denies by default, and admits peers by mesh
    identity only."""
    strict = [p for p in kube(resources, "PeerAuthentication") if namespace_of(p) == ns
              and ((p.props.get("spec") or {}).get("mtls") or {}).get("mode") == "STRICT"
              and not (p.props.get("spec") or {}).get("portLevelMtls")]
    if not strict:
        yield None, f"{what} has no STRICT PeerAuthentication in '{ns}': plaintext clients get in"
    allows = [p for p in kube(resources, "AuthorizationPolicy") if namespace_of(p) == ns
              and (p.props.get("spec") or {}).get("action", "ALLOW") == "ALLOW"]
    if not any(is_deny_all(p) for p in allows):
        yield None, f"{what}: its namespace '{ns}' has no deny-all AuthorizationPolicy"
    for p in allows:
        for rule in (p.props.get("spec") or {}).get("rules") or []:
            sources = [f.get("source") or {} for f in rule.get("from") or []]
            if not sources or any(set(src) != {"principals"} or "*" in src["principals"] for src in sources):
                yield p, f"{where(p)} admits clients of {what} by something other than their mesh identity " \
                         f"(principals); {risk}"
