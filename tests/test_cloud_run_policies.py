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

# The guard's tenants, keyed by issuer, each with its max_tokens cap (components/model/serving_api.py guard_config).
ISSUERS = {"https://issuer.example": {"tenant": "search", "maxTokens": 1024, "requestsPerMinute": 60}}
GUARD = {"trustedPeers": [], "issuers": ISSUERS, "cloudRun": {"auth": "jwt", "tenants": {
    "search": {"issuer": "https://issuer.example", "jwksUri": "https://issuer.example/jwks", "audiences": ["a"]}}}}
SERVER_ARGS = ["/models/m/main", "--served-model-name", "m", "--port", "8000",
               "--middleware", "vllm_gke_guard.GuardMiddleware"]


def service(**props: Any) -> Resource:
    """A jwt-mode GPU service as components/cloud_run.py declares it, in the wire's names."""
    server = {"name": "vllm", "image": "r/vllm-server:v1", "args": list(SERVER_ARGS),
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


IAM_GUARD = {"trustedPeers": [], "issuers": ISSUERS,
             "cloudRun": {"auth": "iam", "accounts": {"search@p.iam.gserviceaccount.com": "search"}}}


def iam_service(**props: Any) -> Resource:
    """An iam-mode GPU service (the default): Cloud Run's invoker check on, the guard mapping the verified account."""
    r = service(invokerIamDisabled=False, **props)
    set_guard(r, IAM_GUARD)
    return r


def test_an_iam_service_as_planned_passes_every_policy():
    assert evaluate([iam_service()]) == []


def guard_env(r: Resource) -> dict[str, Any]:
    return next(e for e in server_of(r)["envs"] if e["name"] == "GKE_LLM_GUARD_CONFIG")


def _guard_trusts_peers(r: Resource) -> None:
    set_guard(r, {**json.loads(guard_env(r)["value"]), "trustedPeers": ["0.0.0.0/0"]})


def _no_guard(r: Resource) -> None:
    server_of(r)["envs"] = [e for e in server_of(r)["envs"] if e["name"] != "GKE_LLM_GUARD_CONFIG"]


def _guard_only_in_the_sidecar(r: Resource) -> None:
    env = guard_env(r)
    _no_guard(r)
    r.props["template"]["containers"][1]["envs"] = [env]


def _guard_from_a_secret(r: Resource) -> None:
    env = guard_env(r)
    env.pop("value")
    env["valueSource"] = {"secretKeyRef": {"secret": "guard", "version": "1"}}


def _guard_not_json(r: Resource) -> None:
    set_guard(r, "{not json")


# Refused in either auth mode (the GPU makes it a model's service, judged with the invoker check on too).
EITHER_MODE: list[tuple[Callable[[Resource], None], str]] = [
    (lambda r: cast(dict[str, Any], r.props).update(ingress="INGRESS_TRAFFIC_ALL"), "with ingress INGRESS_TRAFFIC_ALL"),
    (lambda r: cast(dict[str, Any], r.props).pop("ingress"), "with ingress INGRESS_TRAFFIC_ALL"),
    (lambda r: cast(dict[str, Any], r.props).update(ingress="INGRESS_TRAFFIC_INTERNAL_ONLY"),
     "with ingress INGRESS_TRAFFIC_INTERNAL_ONLY"),
    (lambda r: cast(dict[str, Any], r.props).pop("defaultUriDisabled"), "its run.app URL on"),
    (_guard_trusts_peers, "trusts identity headers from peers"),
    (_no_guard, "has no guard config (GKE_LLM_GUARD_CONFIG) in container 'vllm'"),
    (_guard_only_in_the_sidecar, "has no guard config (GKE_LLM_GUARD_CONFIG) in container 'vllm'"),
    (_guard_from_a_secret, "from a secret or an unknown value, which this policy cannot read"),
    (_guard_not_json, "that is no JSON object"),
]


@pytest.mark.parametrize("make", [service, iam_service], ids=["jwt", "iam"])
@pytest.mark.parametrize("break_it,message", EITHER_MODE)
def test_a_models_service_is_reached_through_the_load_balancer_and_its_guard_verifies(
        make: Callable[[], Resource], break_it: Callable[[Resource], None], message: str):
    r = make()
    break_it(r)
    messages = found([r], "cloud-run-invoker-check-guarded")
    assert any(message in m for m in messages), messages


@pytest.mark.parametrize("make,guard,message", [
    (service, {**GUARD, "cloudRun": {"auth": "jwt", "tenants": {"search": {"issuer": "https://i"}}}},
     "no issuer or JWKS for tenants search"),
    # The invoker check off and the guard mapping an account: no one verified the token it reads the account from.
    (service, IAM_GUARD, "invoker check off and a guard in the iam identity mode"),
    (iam_service, {**IAM_GUARD, "cloudRun": {"auth": "iam", "accounts": {}}}, "maps no account"),
    (iam_service, {**IAM_GUARD, "cloudRun": {"auth": "none"}}, "'none', neither iam nor jwt"),
])
def test_the_guards_identity_mode_matches_the_invoker_check(make: Callable[[], Resource], guard: dict[str, Any],
                                                              message: str):
    r = make()
    set_guard(r, guard)
    messages = found([r], "cloud-run-invoker-check-guarded")
    assert any(message in m for m in messages), messages


def _without_the_guard(r: Resource) -> None:
    args = server_of(r)["args"]
    del args[args.index("--middleware"):args.index("--middleware") + 2]


def _another_middleware(r: Resource) -> None:
    args = server_of(r)["args"]
    args[args.index("--middleware") + 1] = "my.Middleware"


def _cap(value: Any) -> Callable[[Resource], None]:
    """The guard's one tenant with this maxTokens (absent: MISSING)."""
    def set_cap(r: Resource) -> None:
        cfg = json.loads(guard_env(r)["value"])
        entry = cfg["issuers"]["https://issuer.example"]
        entry.pop("maxTokens")
        if value is not MISSING:
            entry["maxTokens"] = value
        set_guard(r, cfg)
    return set_cap


MISSING = object()
NOT_LOADED = "container 'vllm' does not load vllm_gke_guard.GuardMiddleware"
UNCAPPED = "tenant issuer https://issuer.example has no positive maxTokens cap"


@pytest.mark.parametrize("make", [service, iam_service], ids=["jwt", "iam"])
@pytest.mark.parametrize("break_it,message", [
    (_without_the_guard, NOT_LOADED), (_another_middleware, NOT_LOADED),
    (_cap(MISSING), UNCAPPED), (_cap(0), UNCAPPED), (_cap(-5), UNCAPPED), (_cap(1.5), UNCAPPED), (_cap(True), UNCAPPED),
    (_cap("1024"), UNCAPPED), (_cap(None), UNCAPPED),
    (lambda r: set_guard(r, {**json.loads(guard_env(r)["value"]), "issuers": ["https://issuer.example"]}),
     "guard config whose issuers are not an object of tenants"),
], ids=["no-middleware", "another-middleware", "no-cap", "zero", "negative", "fraction", "bool", "string", "null",
        "issuers-a-list"])
def test_a_cloud_run_server_loads_the_guard_and_caps_every_tenant(make: Callable[[], Resource],
                                                                 break_it: Callable[[Resource], None], message: str):
    r = make()
    assert found([r], "cloud-run-max-tokens-cap") == []
    break_it(r)
    messages = found([r], "cloud-run-max-tokens-cap")
    assert [m for m in messages if message in m] == messages and messages, messages
    # The identity checks cannot see it: this rule alone does.
    assert found([r], "cloud-run-invoker-check-guarded") == []


def test_a_whole_cap_as_the_engine_hands_it_over_passes():
    r = service()
    _cap(1024.0)(r)
    assert found([r], "cloud-run-max-tokens-cap") == []


def test_staging_and_a_jwt_variant_load_the_guard_with_a_cap_for_every_tenant(plans, plan_variant):
    from tests.test_cloud_run_gateway import with_cloud_run
    from tests.test_policies import resources

    for auth, plan in (("iam", plans["staging"]), ("jwt", plan_variant("staging", lambda v: with_cloud_run(v, "jwt")))):
        rs = resources(plan)
        (svc,) = [r for r in rs if r.type == SERVICE]
        cfg = json.loads(guard_env(svc)["value"])
        assert cfg["cloudRun"]["auth"] == auth and cfg["issuers"]
        assert [v.message for v in evaluate(rs) if v.policy.startswith("cloud-run-")] == []
        _without_the_guard(svc)
        (message,) = found(rs, "cloud-run-max-tokens-cap")
        assert NOT_LOADED in message


def test_a_service_without_a_gpu_and_with_the_invoker_check_on_is_not_judged():
    r = iam_service(ingress="INGRESS_TRAFFIC_ALL")
    del r.props["template"]["nodeSelector"]
    del server_of(r)["resources"]["limits"]["nvidia.com/gpu"]
    _no_guard(r)
    assert found([r], "cloud-run-invoker-check-guarded") == []
    cast(dict[str, Any], r.props)["invokerIamDisabled"] = True  # with the invoker check off it is
    assert found([r], "cloud-run-invoker-check-guarded")


def v1_service(gpu: bool) -> Resource:
    container = {"name": "vllm", "image": "r/vllm-server:v1", "envs": [{"name": "REDIS_PASSWORD", "value": "hunter2"}],
                 "resources": {"limits": {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}}}
    selector = {"nodeSelector": {"run.googleapis.com/accelerator": "nvidia-l4"}} if gpu else {}
    return Resource("gcp:cloudrun/service:Service", "v1",
                    {"name": "vllm-old", "template": {"spec": {"containers": [container], **selector}}})


def test_a_v1_gpu_service_is_refused_and_its_env_literals_are_seen():
    (message,) = found([v1_service(gpu=True)], "cloud-run-invoker-check-guarded")
    assert "GPU service of the v1 API (gcp:cloudrun)" in message
    assert found([v1_service(gpu=False)], "cloud-run-invoker-check-guarded") == []
    (secret,) = found([v1_service(gpu=False)], "cloud-run-secrets-referenced")
    assert "Cloud Run service vllm-old: env REDIS_PASSWORD of container 'vllm' is a literal" in secret


@pytest.mark.parametrize("policy_data", [None, "04da6b54-80e4-46f7-96ec-b56ff0331ba9", "[]"])
def test_an_iam_policy_whose_policy_data_cannot_be_read_is_refused(policy_data: Any):
    iam = Resource("gcp:cloudrunv2/serviceIamPolicy:ServiceIamPolicy", "iam", {"name": "vllm-m", "policyData": policy_data})
    (message,) = found([service(), iam], "cloud-run-invokers-authenticated")
    assert "its policyData cannot be read" in message


@pytest.mark.parametrize("container,image", [(0, "r/vllm-server:latest"), (1, "r/sidecar"), (0, "r/vllm-server:")])
def test_cloud_run_images_are_pinned(container: int, image: str):
    r = service()
    c = r.props["template"]["containers"][container]
    c["image"] = image
    (message,) = found([r], "images-pinned")
    assert f"Cloud Run service vllm-m: container '{c['name']}' image '{image}' is not pinned" in message
    c["image"] = "r/x@sha256:" + "0" * 64
    assert found([r], "images-pinned") == []


@pytest.mark.parametrize("resources,throttled", [
    ({"cpuIdle": True, "limits": {"nvidia.com/gpu": "1"}}, True),
    (None, True),  # no resources: the provider's default, CPU only during requests
    ({"limits": {"cpu": "8", "nvidia.com/gpu": "1"}}, False),  # resources set, cpuIdle unset: always allocated
])
def test_a_gpu_container_with_cpu_only_during_requests_is_refused(resources: Any, throttled: bool):
    r = service()
    if resources is None:
        del server_of(r)["resources"]
    else:
        server_of(r)["resources"] = resources
    messages = found([r], "cloud-run-gpu-cpu-allocated")
    assert ["container 'vllm' of a GPU service has CPU allocated only during requests" in m for m in messages] == \
        ([True] if throttled else [])


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
    # Staging's model runs auth iam (the invoker check on): a model's GPU service is judged all the same.
    cast(dict[str, Any], _staging_service(rs).props)["ingress"] = "INGRESS_TRAFFIC_ALL"


def _cpu_throttled(rs: list[Resource]) -> None:
    for c in _staging_service(rs).props["template"]["containers"]:
        (c.get("resources") or {})["cpuIdle"] = True


def _secret_literal(rs: list[Resource]) -> None:
    containers = _staging_service(rs).props["template"]["containers"]
    containers[0] = copy.deepcopy(containers[0])
    containers[0].setdefault("envs", []).append({"name": "LIMIT_STORE_PASSWORD", "value": "hunter2"})


def _staging_uncapped(rs: list[Resource]) -> None:
    svc = _staging_service(rs)
    cfg = json.loads(guard_env(svc)["value"])
    for entry in cfg["issuers"].values():
        entry.pop("maxTokens")
    set_guard(svc, cfg)


CLOUD_RUN_CASES: dict[str, tuple[Callable[[list[Resource]], None], str]] = {
    "cloud-run-invokers-authenticated": (_public_invoker, "grants roles/run.invoker to allUsers"),
    "cloud-run-invoker-check-guarded": (_open_ingress, "with ingress INGRESS_TRAFFIC_ALL"),
    "cloud-run-max-tokens-cap": (_staging_uncapped, "has no positive maxTokens cap in its guard config"),
    "cloud-run-gpu-cpu-allocated": (_cpu_throttled, "has CPU allocated only during requests"),
    "cloud-run-secrets-referenced": (_secret_literal, "env LIMIT_STORE_PASSWORD of container 'vllm' is a literal"),
}
