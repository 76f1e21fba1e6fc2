"""The Cloud Run models' services (cloudrunv2.Service and the IAM on them): no one invokes them
unauthenticated, the invoker check is off only where the load balancer is the one way in and the
guard verifies each tenant's token itself, a GPU instance keeps its CPU, no secret is a literal."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Optional, Sequence

from .base import Finding, Resource
from .workloads import SECRETISH

SERVICE = "gcp:cloudrunv2/service:Service"
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
    return list((service.props.get("template") or {}).get("containers") or [])


def _name(r: Resource) -> str:
    return f"Cloud Run service {r.props.get('name') or r.name}" if r.type == SERVICE else f"{r.type.split(':')[-1]} {r.name}"


def _members(r: Resource) -> list[tuple[str, str]]:
    """(role, member) of an IAM member, binding or policy (its policyData's bindings)."""
    if "policyData" in r.props:
        try:
            policy = json.loads(str(r.props.get("policyData") or "{}"))
        except ValueError:
            return []
        return [(b.get("role", ""), m) for b in policy.get("bindings") or [] for m in b.get("members") or []]
    members = [r.props["member"]] if r.props.get("member") else list(r.props.get("members") or [])
    return [(str(r.props.get("role", "")), str(m)) for m in members]


def cloud_run_invokers_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type in IAM_TYPES:
            for role, member in _members(r):
                if member in PUBLIC_MEMBERS:
                    yield r, (f"{_name(r)} grants {role} to {member}: anyone could call the model past every "
                              "check Cloud Run makes; grant roles/run.invoker to the tenants' service accounts "
                              "(tenants[].cloudRunInvokers) or use auth jwt")


def guard_config(service: Resource) -> Optional[dict[str, Any]]:
    """The guard's config in the server container's environment (None if none, or not JSON)."""
    for c in _containers(service):
        for e in c.get("envs") or []:
            if e.get("name") == GUARD_CONFIG_ENV and isinstance(e.get("value"), str):
                try:
                    return json.loads(e["value"])
                except ValueError:
                    return None
    return None


def _jwt_verified(config: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the guard does not verify every tenant's own token (None: it does)."""
    if config is None:
        return f"has no guard config ({GUARD_CONFIG_ENV})"
    run = config.get("cloudRun") or {}
    if run.get("auth") != "jwt":
        return f"has a guard whose Cloud Run identity is '{run.get('auth')}', not jwt"
    if config.get("trustedPeers"):
        return "has a guard that trusts identity headers from peers: a client could name its tenant"
    bad = [t for t, v in (run.get("tenants") or {}).items() if not (v or {}).get("issuer") or not (v or {}).get("jwksUri")]
    return f"has a guard with no issuer or JWKS for tenants {', '.join(sorted(bad))}" if bad else None


def cloud_run_invoker_check_guarded(resources: Sequence[Resource]) -> Iterator[Finding]:
    """With Cloud Run's invoker check off anyone who reaches the service is let in: only the stack's
    load balancer may reach it, no run.app URL may exist beside it (reachable from the VPC even with
    load-balancer-only ingress), and the guard must verify each tenant's JWT itself."""
    for r in _services(resources):
        if not r.props.get("invokerIamDisabled"):
            continue
        if r.props.get("ingress") != LB_ONLY:
            yield r, (f"{_name(r)} has the invoker check off with ingress {r.props.get('ingress') or 'INGRESS_TRAFFIC_ALL'}: "
                      f"clients reach it past the load balancer; set ingress {LB_ONLY}")
        if not r.props.get("defaultUriDisabled"):
            yield r, (f"{_name(r)} has the invoker check off and its run.app URL on: set defaultUriDisabled, the "
                      "load balancer's serverless NEG needs none")
        if (why := _jwt_verified(guard_config(r))) is not None:
            yield r, f"{_name(r)} has the invoker check off and {why}; the guard must verify each tenant's JWT (auth jwt)"


def _gpu_containers(service: Resource) -> list[Mapping[str, Any]]:
    """The containers holding the GPU; where none names it but the template asks for an accelerator,
    the first (the one Cloud Run sends requests to)."""
    holders = [c for c in _containers(service) if ((c.get("resources") or {}).get("limits") or {}).get(GPU_LIMIT)]
    asks = ((service.props.get("template") or {}).get("nodeSelector") or {}).get("accelerator")
    return holders or (_containers(service)[:1] if asks else [])


def cloud_run_gpu_cpu_allocated(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A GPU instance is billed whole while up: with its CPU throttled between requests the engine's
    scheduler and the metrics sidecar's scrapes stall for nothing saved."""
    for r in _services(resources):
        for c in _gpu_containers(r):
            if (c.get("resources") or {}).get("cpuIdle") is not False:
                yield r, (f"{_name(r)}: container '{c.get('name')}' of a GPU service has CPU allocated only "
                          "during requests; set resources.cpuIdle false")


def cloud_run_secrets_referenced(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in _services(resources):
        for c in _containers(r):
            for e in c.get("envs") or []:
                if SECRETISH.search(str(e.get("name", ""))) and e.get("value") is not None:
                    yield r, (f"{_name(r)}: env {e.get('name')} of container '{c.get('name')}' is a literal; use "
                              "valueSource.secretKeyRef (Secret Manager)")
