"""The Cloud Run models' services (cloudrunv2.Service and the IAM on them): no one invokes them
unauthenticated, the invoker check is off only where the load balancer is the one way in and the
guard verifies each tenant's token itself, the server loads the guard with a cap for every tenant, a GPU
instance keeps its CPU, no secret is a literal."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Optional, Sequence, cast

from .base import Finding, Resource
from .tenant_limits import GUARD_MIDDLEWARE, loads_guard, uncapped
from .workloads import SECRETISH, image_pinned, images_pinned

SERVICE = "gcp:cloudrunv2/service:Service"
# The v1 API's service: its ingress, invoker check and CPU allocation are annotations these rules do not read.
V1_SERVICE = "gcp:cloudrun/service:Service"
# Every way the provider sets IAM on a Cloud Run service: v2's and v1's member, binding and policy.
IAM_TYPES = {f"gcp:{mod}/{res}" for mod, kinds in (
    ("cloudrunv2", ("serviceIamMember:ServiceIamMember", "serviceIamBinding:ServiceIamBinding",
                    "serviceIamPolicy:ServiceIamPolicy")),
    ("cloudrun", ("iamMember:IamMember", "iamBinding:IamBinding", "iamPolicy:IamPolicy"))) for res in kinds}
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
LB_ONLY = "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
GUARD_CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
GPU_LIMIT = "nvidia.com/gpu"


def _services(resources: Sequence[Resource]) -> list[Resource]:
    return [r for r in resources if r.type == SERVICE]


def _containers(service: Resource) -> list[Mapping[str, Any]]:
    """A service's containers: v2's template.containers, v1's template.spec.containers."""
    template = service.props.get("template") or {}
    if service.type == V1_SERVICE:
        template = template.get("spec") or {}
    return list(template.get("containers") or [])


def cloud_run_containers(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    """Every container of every Cloud Run service, of either API."""
    for r in resources:
        if r.type in (SERVICE, V1_SERVICE):
            yield from ((r, c) for c in _containers(r))


def _name(r: Resource) -> str:
    return f"Cloud Run service {r.props.get('name') or r.name}" if r.type in (SERVICE, V1_SERVICE) \
        else f"{r.type.split(':')[-1]} {r.name}"


def _members(r: Resource) -> Optional[list[tuple[str, str]]]:
    """(role, member) of an IAM member, binding or policy (its policyData's bindings); None where a
    policy's policyData cannot be read (unknown at preview, or not JSON)."""
    if r.type.endswith("IamPolicy"):
        try:
            policy = json.loads(str(r.props.get("policyData")))
        except ValueError:
            return None
        if not isinstance(policy, dict):
            return None
        bindings = cast(list[dict[str, Any]], policy.get("bindings") or [])
        return [(str(b.get("role", "")), str(m)) for b in bindings for m in b.get("members") or []]
    members = [r.props["member"]] if r.props.get("member") else list(r.props.get("members") or [])
    return [(str(r.props.get("role", "")), str(m)) for m in members]


def cloud_run_invokers_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type not in IAM_TYPES:
            continue
        if (members := _members(r)) is None:
            yield r, (f"{_name(r)}: its policyData cannot be read (unknown until applied, or not JSON), so who it lets "
                      "invoke the service cannot be judged; grant roles/run.invoker with ServiceIamMember instead")
            continue
        for role, member in members:
            if member in PUBLIC_MEMBERS:
                yield r, (f"{_name(r)} grants {role} to {member}: anyone could call the model past every "
                          "check Cloud Run makes; grant roles/run.invoker to the tenants' service accounts "
                          "(tenants[].cloudRunInvokers) or use auth jwt")


def _gpu_containers(service: Resource) -> list[Mapping[str, Any]]:
    """The containers holding the GPU; where none names it but the template asks for an accelerator,
    the first (the one Cloud Run sends requests to)."""
    holders = [c for c in _containers(service) if ((c.get("resources") or {}).get("limits") or {}).get(GPU_LIMIT)]
    asks = ((service.props.get("template") or {}).get("nodeSelector") or {}).get("accelerator")
    return holders or (_containers(service)[:1] if asks else [])


def _v1_asks_gpu(service: Resource) -> bool:
    spec = (service.props.get("template") or {}).get("spec") or {}
    return bool((spec.get("nodeSelector") or {}).get("run.googleapis.com/accelerator")) or any(
        ((c.get("resources") or {}).get("limits") or {}).get(GPU_LIMIT) for c in _containers(service))


def guard_config(service: Resource) -> tuple[Optional[dict[str, Any]], str]:
    """The guard's config in the GPU container's environment (the ingress container's, or the first's, on a
    service without a GPU), or None and why not."""
    gpu = _gpu_containers(service)
    holders = gpu or [c for c in _containers(service) if c.get("ports")] or _containers(service)[:1]
    where = f"in container '{holders[0].get('name')}'" if holders else "(it has no container)"
    envs = [e for c in holders[:1] for e in c.get("envs") or [] if e.get("name") == GUARD_CONFIG_ENV]
    if not envs:
        return None, f"has no guard config ({GUARD_CONFIG_ENV}) {where}"
    if not isinstance(envs[0].get("value"), str):
        return None, (f"takes its guard config ({GUARD_CONFIG_ENV}) {where} from a secret or an unknown value, which "
                      "this policy cannot read; set it as the env's value (it holds no secret)")
    try:
        config = json.loads(envs[0]["value"])
    except ValueError:
        config = None
    if not isinstance(config, dict):
        return None, f"has a guard config ({GUARD_CONFIG_ENV}) {where} that is no JSON object"
    return cast(dict[str, Any], config), ""


def _identity_problem(service: Resource) -> Optional[str]:
    """Why the guard may take a caller for a tenant it is not (None: it may not). With the invoker check on the
    guard maps the account Cloud Run verified (auth iam) or verifies a JWT itself (auth jwt); with it off only jwt."""
    config, why = guard_config(service)
    if config is None:
        return why
    if config.get("trustedPeers"):
        return "has a guard that trusts identity headers from peers: a client could name its tenant"
    run = cast(dict[str, Any], config.get("cloudRun") or {})
    if run.get("auth") == "iam":
        if service.props.get("invokerIamDisabled"):
            return ("has the invoker check off and a guard in the iam identity mode: it would map an account from a "
                    "token Cloud Run never verified; turn the invoker check on, or use auth jwt")
        return None if run.get("accounts") else "has a guard in the iam identity mode that maps no account to a tenant"
    if run.get("auth") != "jwt":
        return f"has a guard whose Cloud Run identity is '{run.get('auth')}', neither iam nor jwt"
    tenants = cast(dict[str, Any], run.get("tenants") or {})
    bad = [t for t, v in tenants.items() if not (v or {}).get("issuer") or not (v or {}).get("jwksUri")]
    return f"has a guard with no issuer or JWKS for tenants {', '.join(sorted(bad))}" if bad else None


def cloud_run_invoker_check_guarded(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A model's (GPU) service, and any with the invoker check off: only the stack's load balancer may reach it,
    no run.app URL may exist beside it (reachable from the VPC even with load-balancer-only ingress), and its
    guard must know each caller's tenant from what was verified (Cloud Run's invoker check, or the tenant's JWT),
    never from what a client sends. A v1 GPU service is refused: its settings are annotations these do not read."""
    for r in resources:
        if r.type == V1_SERVICE and _v1_asks_gpu(r):
            yield r, (f"{_name(r)} is a GPU service of the v1 API (gcp:cloudrun), whose ingress, invoker check and "
                      "CPU allocation the policies cannot judge; declare it with gcp.cloudrunv2.Service")
    for r in _services(resources):
        off = bool(r.props.get("invokerIamDisabled"))
        if not off and not _gpu_containers(r):
            continue
        state = "the invoker check off" if off else "a model's GPU"
        if r.props.get("ingress") != LB_ONLY:
            yield r, (f"{_name(r)} has {state} with ingress {r.props.get('ingress') or 'INGRESS_TRAFFIC_ALL'}: "
                      f"clients reach it past the load balancer; set ingress {LB_ONLY}")
        if not r.props.get("defaultUriDisabled"):
            yield r, (f"{_name(r)} has {state} and its run.app URL on: set defaultUriDisabled, the "
                      "load balancer's serverless NEG needs none")
        if (why := _identity_problem(r)) is not None:
            yield r, (f"{_name(r)} {why}; the guard must know the tenant from a verified identity (auth iam with the "
                      "invoker check on, or auth jwt)")


def cloud_run_max_tokens_cap(resources: Sequence[Resource]) -> Iterator[Finding]:
    """max-tokens-cap for a Cloud Run model: its GPU container's server loads the guard (else every tenant
    check is gone: identity, caps, limits), and the guard caps every tenant. A guard config this cannot read
    is cloud-run-invoker-check-guarded's finding."""
    for r in _services(resources):
        for c in _gpu_containers(r):
            if not loads_guard(c.get("args") or []):
                yield r, (f"{_name(r)}: container '{c.get('name')}' does not load {GUARD_MIDDLEWARE} (`--middleware "
                          f"{GUARD_MIDDLEWARE}` in its args), so no tenant is checked, capped or limited")
        config, _ = guard_config(r) if _gpu_containers(r) else (None, "")
        issuers = (config or {}).get("issuers") or {}
        if not isinstance(issuers, dict):
            yield r, f"{_name(r)} has a guard config whose issuers are not an object of tenants"
            continue
        for issuer in uncapped(cast(dict[str, Any], issuers)):
            yield r, f"{_name(r)}: tenant issuer {issuer} has no positive maxTokens cap in its guard config"


def _throttled(container: Mapping[str, Any]) -> bool:
    """CPU allocated only during requests: cpuIdle true, or unset with no resources at all (the provider's
    default; with resources set, unset means always allocated: pulumi_gcp 10.2.0 cloudrunv2 _inputs.py cpu_idle)."""
    resources = container.get("resources")
    idle = (resources or {}).get("cpuIdle")
    return idle is True or (idle is None and resources is None)


def cloud_run_gpu_cpu_allocated(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A GPU instance is billed whole while up: with its CPU throttled between requests the engine's
    scheduler and the metrics sidecar's scrapes stall for nothing saved."""
    for r in _services(resources):
        for c in _gpu_containers(r):
            if _throttled(c):
                yield r, (f"{_name(r)}: container '{c.get('name')}' of a GPU service has CPU allocated only "
                          "during requests; set resources.cpuIdle false")


def cloud_run_secrets_referenced(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, c in cloud_run_containers(resources):
        for e in c.get("envs") or []:
            if SECRETISH.search(str(e.get("name", ""))) and e.get("value") is not None:
                yield r, (f"{_name(r)}: env {e.get('name')} of container '{c.get('name')}' is a literal; use "
                          "valueSource.secretKeyRef (Secret Manager)")


def images_pinned_everywhere(resources: Sequence[Resource]) -> Iterator[Finding]:
    """images-pinned over the Kubernetes workloads' containers and the Cloud Run services'."""
    yield from images_pinned(resources)
    for r, c in cloud_run_containers(resources):
        if not image_pinned(image := str(c.get("image", ""))):
            yield r, f"{_name(r)}: container '{c.get('name')}' image '{image}' is not pinned to a tag or digest"
