"""The Cloud Run policies (policies/cloud_run.py): each passes a service as the stack plans it and fails
each way it can be broken, on a service of its own (here) and on the staging stack's (CLOUD_RUN_CASES,
which tests/test_policies.py runs with every policy's failing case)."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, cast

import pytest

from vllm_gke.policies.cloud_run import SERVICE
from vllm_gke.policies.rules import Resource, evaluate

GUARD = {"trustedPeers": [], "cloudRun": {"auth": "jwt", "tenants": {
    "search": {"issuer": "https://issuer.example", "jwksUri": "https://issuer.example/jwks", "audiences": ["a"]}}}}


def service(**props: Any) -> Resource:
    """A jwt-mode GPU service as components/cloud_run.py declares it, in the wire's names."""
    server = {"name": "vllm", "image": "r/vllm-server:v1",
              "envs": [{"name": "GKE_LLM_GUARD_CONFIG", "value": json.dumps(GUARD)},
                       {"name": "REDIS_PASSWORD", "valueSource": {"secretKeyRef": {"secret": "s", "version": "1"}}}],
              "resources": {"cpuIdle": False, "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}}
    sidecar = {"name": "gmp-collector", "image": "r/sidecar:1.2.0", "resources": {"limits": {"cpu": "1"}}}
    base = {"name": "vllm-m", "ingress": "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", "invokerIamDisabled": True,
            "defaultUriDisabled": True,
            "template": {"nodeSelector": {"accelerator": "nvidia-l4"}, "containers": [server, sidecar]}}
    return Resource(SERVICE, "svc", {**base, **props})


def found(rs: list[Resource], policy: str) -> list[str]:
    return [v.message for v in evaluate(rs) if v.policy == policy]


def server_of(r: Resource) -> dict[str, Any]:
    return r.props["template"]["containers"][0]


def set_guard(r: Resource, cfg: Any) -> None:
    env = next(e for e in server_of(r)["envs"] if e["name"] == "GKE_LLM_GUARD_CONFIG")
    env["value"] = cfg if isinstance(cfg, str) else json.dumps(cfg)


def test_a_service_as_planned_passes_every_policy():
    assert evaluate([service()]) == []


@pytest.mark.parametrize("iam_type,props", [
    ("gcp:cloudrunv2/serviceIamMember:ServiceIamMember", {"role": "roles/run.invoker", "member": "allUsers"}),
    ("gcp:cloudrunv2/serviceIamBinding:ServiceIamBinding",
     {"role": "roles/run.invoker", "members": ["serviceAccount:a@p.iam.gserviceaccount.com", "allAuthenticatedUsers"]}),
    ("gcp:cloudrunv2/serviceIamPolicy:ServiceIamPolicy",
     {"policyData": json.dumps({"bindings": [{"role": "roles/run.invoker", "members": ["allUsers"]}]})}),
    ("gcp:cloudrun/iamMember:IamMember", {"role": "roles/run.invoker", "member": "allUsers"}),
    ("gcp:cloudrun/iamBinding:IamBinding", {"role": "roles/run.invoker", "members": ["allUsers"]}),
    ("gcp:cloudrun/iamPolicy:IamPolicy",
     {"policyData": json.dumps({"bindings": [{"role": "roles/run.invoker", "members": ["allAuthenticatedUsers"]}]})}),
])
def test_a_public_invoker_is_refused_however_it_is_granted(iam_type, props):
    (message,) = found([service(), Resource(iam_type, "iam", props)], "cloud-run-invokers-authenticated")
    assert "grants roles/run.invoker to all" in message


def test_tenant_service_accounts_as_invokers_pass():
    iam = Resource("gcp:cloudrunv2/serviceIamMember:ServiceIamMember", "iam",
                   {"role": "roles/run.invoker", "member": "serviceAccount:search@p.iam.gserviceaccount.com"})
    assert found([service(invokerIamDisabled=False, ingress="INGRESS_TRAFFIC_ALL", defaultUriDisabled=False), iam],
                 "cloud-run-invokers-authenticated") == []


def _guard_iam(r: Resource) -> None:
    set_guard(r, {**GUARD, "cloudRun": {"auth": "iam", "accounts": {}}})


def _guard_trusts_peers(r: Resource) -> None:
    set_guard(r, {**GUARD, "trustedPeers": ["127.0.0.6"]})


def _tenant_without_jwks(r: Resource) -> None:
    set_guard(r, {**GUARD, "cloudRun": {"auth": "jwt", "tenants": {"search": {"issuer": "https://i"}}}})


def _no_guard(r: Resource) -> None:
    server_of(r)["envs"] = [e for e in server_of(r)["envs"] if e["name"] != "GKE_LLM_GUARD_CONFIG"]


def _guard_not_json(r: Resource) -> None:
    set_guard(r, "{not json")


@pytest.mark.parametrize("break_it,message", [
    (lambda r: r.props.update(ingress="INGRESS_TRAFFIC_ALL"), "with ingress INGRESS_TRAFFIC_ALL"),
    (lambda r: r.props.pop("ingress"), "with ingress INGRESS_TRAFFIC_ALL"),
    (lambda r: r.props.update(ingress="INGRESS_TRAFFIC_INTERNAL_ONLY"), "with ingress INGRESS_TRAFFIC_INTERNAL_ONLY"),
    (lambda r: r.props.pop("defaultUriDisabled"), "its run.app URL on"),
    (_guard_iam, "identity is 'iam', not jwt"),
    (_guard_trusts_peers, "trusts identity headers from peers"),
    (_tenant_without_jwks, "no issuer or JWKS for tenants search"),
    (_no_guard, "has no guard config"),
    (_guard_not_json, "has no guard config"),
])
def test_the_invoker_check_off_needs_the_load_balancer_and_the_guards_jwt(break_it: Callable[[Resource], None], message):
    r = service()
    break_it(r)
    messages = found([r], "cloud-run-invoker-check-guarded")
    assert any(message in m for m in messages), messages
    # With the invoker check on, Cloud Run verifies the caller: none of it is asked.
    r.props["invokerIamDisabled"] = False
    assert found([r], "cloud-run-invoker-check-guarded") == []


@pytest.mark.parametrize("idle", [True, None])
def test_a_gpu_container_with_cpu_only_during_requests_is_refused(idle):
    r = service()
    resources = server_of(r)["resources"]
    if idle is None:
        del resources["cpuIdle"]
    else:
        resources["cpuIdle"] = idle
    (message,) = found([r], "cloud-run-gpu-cpu-allocated")
    assert "container 'vllm' of a GPU service has CPU allocated only during requests" in message


def test_an_accelerator_without_a_named_gpu_limit_holds_the_first_container_to_it():
    r = service()
    del server_of(r)["resources"]["limits"]["nvidia.com/gpu"]
    assert found([r], "cloud-run-gpu-cpu-allocated") == []
    server_of(r)["resources"]["cpuIdle"] = True
    assert found([r], "cloud-run-gpu-cpu-allocated")
    del r.props["template"]["nodeSelector"]
    assert found([r], "cloud-run-gpu-cpu-allocated") == []  # no GPU: request-based billing is the owner's call


def test_a_secret_as_an_env_literal_is_refused():
    r = service()
    server_of(r)["envs"].append({"name": "REDIS_PASSWORD", "value": "hunter2"})
    (message,) = found([r], "cloud-run-secrets-referenced")
    assert "env REDIS_PASSWORD of container 'vllm' is a literal" in message


# --- on the staging stack (its Cloud Run model): tests/test_policies.py runs these ----------------

def _staging_service(rs: list[Resource]) -> Resource:
    (svc,) = [r for r in rs if r.type == SERVICE]
    return svc


def _public_invoker(rs: list[Resource]) -> None:
    svc = _staging_service(rs)
    rs.append(Resource("gcp:cloudrunv2/serviceIamMember:ServiceIamMember", "public",
                       {"name": svc.props["name"], "role": "roles/run.invoker", "member": "allUsers"}))


def _open_ingress(rs: list[Resource]) -> None:
    # Staging's model runs auth iam: the invoker check turned off too, as a jwt model's is.
    cast(dict[str, Any], _staging_service(rs).props).update(ingress="INGRESS_TRAFFIC_ALL", invokerIamDisabled=True)


def _cpu_throttled(rs: list[Resource]) -> None:
    for c in _staging_service(rs).props["template"]["containers"]:
        (c.get("resources") or {})["cpuIdle"] = True


def _secret_literal(rs: list[Resource]) -> None:
    containers = _staging_service(rs).props["template"]["containers"]
    containers[0] = copy.deepcopy(containers[0])
    containers[0].setdefault("envs", []).append({"name": "LIMIT_STORE_PASSWORD", "value": "hunter2"})


CLOUD_RUN_CASES: dict[str, tuple[Callable[[list[Resource]], None], str]] = {
    "cloud-run-invokers-authenticated": (_public_invoker, "grants roles/run.invoker to allUsers"),
    "cloud-run-invoker-check-guarded": (_open_ingress, "with ingress INGRESS_TRAFFIC_ALL"),
    "cloud-run-gpu-cpu-allocated": (_cpu_throttled, "has CPU allocated only during requests"),
    "cloud-run-secrets-referenced": (_secret_literal, "env LIMIT_STORE_PASSWORD of container 'vllm' is a literal"),
}
