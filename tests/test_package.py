"""The components as a Pulumi package: the schema the SDK's analyzer infers is complete, the
examples in YAML and TypeScript use it correctly, the package components validate like the
stack config, and Python users import them under a namespace that cannot collide."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, cast

import pulumi
import pytest
import tomllib
import yaml

from tests.conftest import REPO_ROOT
from vllm_gke.components.provider import generate_types

EXAMPLES = REPO_ROOT / "examples"
COMPONENTS = {"Platform", "GpuCluster", "MeshReadiness", "Keda", "MeshNamespace", "TenantAuth", "ModelStore", "VllmService",
              "InferenceObjectiveCrd", "InferencePool", "IdentityExtension", "LimitStore", "Gateway", "Observability"}


def package_schema() -> dict[str, Any]:
    """The schema the plugin serves, built in a fresh process as the plugin's own: the Pulumi
    provider SDK and Google's API protos (which other tests import) cannot share one."""
    code = ("import json\nfrom vllm_gke.components.provider.host import package_schema\n"
            "print(json.dumps(package_schema()))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return package_schema()


def resource(schema, name):
    return schema["resources"][f"vllm-gke:index:{name}"]


def type_of(schema, ref: str) -> dict[str, Any]:
    return schema["types"][ref.removeprefix("#/types/")]


def test_every_component_is_in_the_schema(schema):
    assert schema["name"] == "vllm-gke"
    assert {k.rsplit(":", 1)[1] for k in schema["resources"]} == COMPONENTS
    assert all(r["isComponent"] for r in schema["resources"].values())


def test_the_schema_version_is_the_one_version(schema):
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert schema["version"] == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert f"## [{version}]" in (REPO_ROOT / "CHANGELOG.md").read_text()


def _properties(schema):
    for name, r in schema["resources"].items():
        for kind in ("inputProperties", "properties"):
            for prop, spec in r.get(kind, {}).items():
                yield f"{name}.{kind}.{prop}", spec
    for name, t in schema["types"].items():
        for prop, spec in t.get("properties", {}).items():
            yield f"{name}.{prop}", spec


def test_every_input_and_output_is_typed_and_described(schema):
    seen = 0
    for where, spec in _properties(schema):
        seen += 1
        assert spec.get("description"), where
        text = json.dumps(spec)
        assert "pulumi.json#/Any" not in text, where  # no Any anywhere
        assert "type" in spec or "$ref" in spec, where
        for ref in re.findall(r'"\$ref": "(#/types/[^"]+)"', text):
            assert ref.removeprefix("#/types/") in schema["types"], (where, ref)
    assert seen > 150
    for name in COMPONENTS:
        r = resource(schema, name)
        assert r["description"] and r["inputProperties"] and r["properties"], name


def test_secrets_are_marked(schema):
    assert resource(schema, "GpuCluster")["properties"]["kubeconfig"]["secret"] is True
    for name in ("ModelStore", "VllmService", "Gateway", "TenantAuth"):
        assert resource(schema, name)["inputProperties"]["kubeconfig"]["secret"] is True


def test_inputs_use_the_stack_configs_names(schema):
    cluster = type_of(schema, "vllm-gke:index:ClusterSpec")["properties"]
    assert {"masterCidr", "authorizedNetworks", "releaseChannel", "proxyOnlyCidr"} <= set(cluster)
    model = type_of(schema, "vllm-gke:index:ModelSpec")["properties"]
    assert {"shape", "customShape", "maxModelLen", "extraArgs"} <= set(model)
    assert "One of: RAPID, REGULAR, STABLE" in cluster["releaseChannel"]["description"]


def test_generated_types_are_up_to_date():
    assert (REPO_ROOT / "components" / "provider" / "types.py").read_text() == generate_types.render(), \
        "components/provider/types.py is stale: run python -m vllm_gke.components.provider.generate_types"


def test_plugin_layout():
    plugin = yaml.safe_load((REPO_ROOT / "components" / "provider" / "PulumiPlugin.yaml").read_text())
    assert plugin["runtime"]["name"] == "python"
    assert (REPO_ROOT / "components" / "provider" / "__main__.py").exists()
    assert "-e ../.." in (REPO_ROOT / "components" / "provider" / "requirements.txt").read_text()


# --- examples, checked against the schema ---------------------------------------------------------

def check_value(schema, spec: dict[str, Any], value: Any, where: str, errors: list[str]) -> None:
    if isinstance(value, str) and value.startswith("${"):
        # A resource's output cannot feed a plain input (config values can: they are known).
        if spec.get("plain") and "." in value:
            errors.append(f"{where}: is plain; it cannot take {value}")
        return  # an interpolation: typed at run time
    if "$ref" in spec:
        target = type_of(schema, spec["$ref"])
        if "enum" in target:
            allowed = [e["value"] for e in target["enum"]]
            if value not in allowed:
                errors.append(f"{where}: {value!r} is not one of {allowed}")
            return
        if not isinstance(value, dict):
            errors.append(f"{where}: expected an object")
            return
        check_object(schema, target, value, where, errors)
    elif spec.get("type") == "array":
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list")
            return
        for i, item in enumerate(value):
            check_value(schema, spec["items"], item, f"{where}[{i}]", errors)
    elif spec.get("type") == "object":
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a map")
    else:
        expected = {"string": str, "integer": int, "number": (int, float), "boolean": bool}[spec["type"]]
        if not isinstance(value, expected) or (spec["type"] != "boolean" and isinstance(value, bool)):
            errors.append(f"{where}: expected {spec['type']}, got {value!r}")


def check_object(schema, target: dict[str, Any], value: dict[str, Any], where: str, errors: list[str],
                 props_key: str = "properties") -> None:
    props = target.get(props_key, {})
    for key, item in value.items():
        if key not in props:
            errors.append(f"{where}.{key}: not an input of the schema")
        else:
            check_value(schema, props[key], item, f"{where}.{key}", errors)
    for key in target.get("requiredInputs" if props_key == "inputProperties" else "required", []):
        if key not in value:
            errors.append(f"{where}.{key}: required")


def test_the_yaml_example_matches_the_schema(schema):
    program = yaml.safe_load((EXAMPLES / "yaml" / "Pulumi.yaml").read_text())
    errors: list[str] = []
    for name, res in program["resources"].items():
        token = res["type"]
        assert token in schema["resources"], token
        check_object(schema, schema["resources"][token], res["properties"], name, errors, "inputProperties")
    for output in program["outputs"].values():
        resource_name, prop = re.fullmatch(r"\$\{(\w+)\.(\w+)\}", output).groups()
        token = program["resources"][resource_name]["type"]
        assert prop in schema["resources"][token]["properties"], output
    assert errors == []


def test_the_yaml_example_serves_under_mocks_and_passes_the_policy_pack():
    """The YAML program's one Platform, constructed as the provider host would construct it: a
    whole platform for one model and one tenant, every mandatory policy passing; a setting that
    would not serve fails with the stack config's message."""
    import copy

    from vllm_gke.components.model.stack_config import ConfigError
    from vllm_gke.components.provider import Platform
    from vllm_gke.components.provider.facade import former_parent
    from vllm_gke.infra.plan import read_stack_config, run_program
    from vllm_gke.policies.rules import Resource, evaluate

    program = yaml.safe_load((EXAMPLES / "yaml" / "Pulumi.yaml").read_text())
    props = snake(program["resources"]["platform"]["properties"])
    props["config"]["project"] = "acme-llm-dev"
    plan = run_program("dev", read_stack_config("dev"), program=lambda _cfg: Platform("platform", props))
    kinds = {r.props.get("kind") for r in plan.resources if r.type.startswith("kubernetes:")}
    assert {"Deployment", "HTTPRoute", "ScaledObject", "RequestAuthentication", "AuthorizationPolicy"} <= kinds
    servers = [r.props for r in plan.resources if r.props.get("kind") == "Deployment" and
               r.props["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]
    assert len(servers) == 2 and all("auth.acme.example/search" in json.dumps(d) for d in servers)
    resources = [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in plan.resources if r.custom]
    assert [(v.policy, v.message[:80]) for v in evaluate(resources) if v.level == "mandatory"] == []

    # A stack made with 0.3.0's Platform keeps a pool's standby, now the VllmService's child: it is
    # aliased where the library's Platform made it, under the former inner Platform.
    asleep = json.loads(json.dumps(props))
    asleep["config"]["models"][0]["long"] = {**asleep["config"]["models"][0].get("long", {}), "min_replicas": 0}
    slept = run_program("dev", read_stack_config("dev"), program=lambda _cfg: Platform("platform", asleep))
    (platform,) = [r for r in slept.resources if r.type == "vllm-gke:index:Platform"]
    standbys = [r for r in slept.resources if r.type == "vllm-gke:index:Standby"]
    assert standbys and all(former_parent(platform.urn, platform.type) in r.alias_parents for r in standbys)

    bad = json.loads(json.dumps(props))
    bad["config"]["models"][0]["shape"] = "llama-3-70b"
    with pytest.raises(ConfigError) as exc:
        run_program("dev", read_stack_config("dev"), program=lambda _cfg: Platform("platform", bad))
    assert "weights need 141.2 GB per GPU" in str(exc.value)


def snake(value: Any) -> Any:
    """Schema (camelCase) names to Python names, as the provider host maps them."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


TS_NEW = re.compile(r"new vllmgke\.(\w+)\(")


@pytest.mark.parametrize("example,components", [("typescript", {"Platform"}),
                                                  # InferencePool: test_the_picker_path_composes_from_the_facades
                                                  ("typescript-components", COMPONENTS - {
                                                      "Platform", "InferencePool", "InferenceObjectiveCrd",
                                                      "IdentityExtension"})])
def test_the_typescript_examples_use_only_schema_names(schema, example, components):
    text = (EXAMPLES / example / "index.ts").read_text()
    used = set(TS_NEW.findall(text))
    assert used == components
    known = {p for r in schema["resources"].values() for p in r["inputProperties"]}
    known |= {p for t in schema["types"].values() for p in t.get("properties", {})}
    known |= {"dependsOn"}  # a resource option, as every SDK spells it
    body = re.sub(r"//.*", "", text)
    keys = set(re.findall(r"(?<![\w.\"'])(\w+):\s", body))
    assert keys - known == set(), f"not in the schema: {sorted(keys - known)}"


@pytest.mark.skipif(shutil.which("tsc") is None and not os.environ.get("CI"),
                    reason="tsc not installed: the TypeScript examples are only checked for schema names here")
def test_the_typescript_example_compiles_against_the_schema(schema, tmp_path):
    from tests.ts_declarations import declarations

    work = tmp_path / "ts"
    (work / "node_modules" / "@pulumi" / "vllm-gke").mkdir(parents=True)
    (work / "node_modules" / "@pulumi" / "vllm-gke" / "index.d.ts").write_text(declarations(schema))
    (work / "node_modules" / "@pulumi" / "pulumi").mkdir(parents=True)
    (work / "node_modules" / "@pulumi" / "pulumi" / "index.d.ts").write_text(
        "export type Input<T> = T | Output<T>;\nexport interface Output<T> { apply<U>(f: (t: T) => U): Output<U>; }\n"
        "export class Config { constructor(name?: string); require(key: string): string; }\n")
    for example in ("typescript", "typescript-components"):
        shutil.copy(EXAMPLES / example / "index.ts", work / f"{example}.ts")
    result = subprocess.run(["tsc", "--noEmit", "--strict", "--target", "es2020", "--moduleResolution", "node",
                             "typescript.ts", "typescript-components.ts"], cwd=work, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_python_users_import_a_namespace_that_cannot_collide(tmp_path):
    """A `components` package of someone else's next to ours: both import, neither shadows the other."""
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("MINE = True\n")
    code = ("import components, vllm_gke.components as v\n"
            "from vllm_gke.components import GpuCluster\n"
            "print(components.MINE, v.__name__, GpuCluster.__module__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "vllm_gke.components", "vllm_gke.components.gpu_cluster"]


def test_the_plugin_serves_its_schema_over_the_provider_protocol():
    """What `pulumi package add` does first: start the plugin and ask for the schema."""
    import grpc
    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

    proc = subprocess.Popen([sys.executable, "-m", "vllm_gke.components.provider", "127.0.0.1:1"],
                            cwd=REPO_ROOT / "components" / "provider", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline().decode().strip())  # the plugin prints its port, as for the engine
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            reply = stub.GetSchema(provider_pb2.GetSchemaRequest(version=0), timeout=30)
        served = json.loads(reply.schema)
        assert set(served["resources"]) == {f"vllm-gke:index:{c}" for c in COMPONENTS}
        assert served["resources"]["vllm-gke:index:GpuCluster"]["properties"]["kubeconfig"]["secret"] is True
    finally:
        proc.kill()
        proc.wait()


def test_component_users_can_run_a_canary_through_the_facades():
    """VllmService(canary: true) and Gateway canary targets, as a YAML or TypeScript program would declare them."""
    from tests.conftest import by_hand
    from vllm_gke.components.provider import Gateway, VllmService
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.config import parse
    from vllm_gke.infra.plan import read_stack_config, run_program

    values = read_stack_config("prod")
    by_hand(values)
    cfg = parse(values)
    model = next(m for m in cfg.models if m.canary).model_dump(mode="json", exclude_none=True)
    common = {"node_pool": cfg.pool(cfg.model(model["name"]).node_pool).model_dump(mode="json", exclude_none=True),
              "namespace": "llm", "image": cfg.server_image.model_dump(mode="json", exclude_none=True),
              "claim_name": "weights", "kubeconfig": "kc", "project": cfg.project,
              "tenants": [cfg.tenants[0].model_dump(mode="json", by_alias=True, exclude_none=True)],
              "global_limits": cfg.global_limits.enabled}
    gateway = cfg.gateway.model_dump(mode="json", exclude_none=True)

    def build(_cfg):
        stable = VllmService("m-short", {"model": model, "pool_name": "short", **common})
        canary = VllmService("m-canary-short", {"model": model, "pool_name": "short", "canary": True, **common})
        target = {"route_name": "m", "namespace": "llm", "path_prefix": "m", "short_service": stable.service_name,
                  "long_service": stable.service_name, "long_request_bytes": 4096,
                  "canary_short_service": canary.service_name, "canary_long_service": canary.service_name,
                  "canary_weight": 25}
        return Gateway("gw", {"gateway": gateway, "namespace": "llm", "targets": [target], "kubeconfig": "kc",
                              "project": cfg.project, "region": cfg.region})

    plan = run_program("prod", values, program=build)
    deployments = {d["metadata"]["name"]: d for d in manifests_of_plan(plan, "Deployment")}
    canary_pod = next(d for n, d in deployments.items() if "canary" in n)["spec"]["template"]["spec"]
    assert model["canary"]["revision"] in json.dumps(canary_pod)
    (route,) = [r for r in manifests_of_plan(plan, "HTTPRoute") if r["metadata"]["name"] == "m"]
    weights = sorted(b["weight"] for rule in route["spec"]["rules"] for b in rule["backendRefs"])
    assert set(weights) == {25, 75}

    without = dict(model, canary=None)
    with pytest.raises(Exception, match="VllmService.canary"):
        run_program("prod", values, program=lambda _c: VllmService(
            "x", {"model": {k: v for k, v in without.items() if v is not None}, "pool_name": "short",
                  "canary": True, **common}))
    with pytest.raises(InputError, match="canaryWeight"):
        run_program("prod", values, program=lambda _c: Gateway("gw", {
            "gateway": gateway, "namespace": "llm", "kubeconfig": "kc", "project": cfg.project, "region": cfg.region,
            "targets": [{"route_name": "m", "namespace": "llm", "path_prefix": "m", "short_service": "a",
                         "long_service": "b", "long_request_bytes": 1, "canary_weight": 10}]}))


def manifests_of_plan(plan: Any, kind: str) -> list[dict[str, Any]]:
    return [d for d in plan.manifests() if d.get("kind") == kind]


def test_the_pulumi_floor_hosts_the_package():
    """The floor in pyproject.toml is the first published release whose component-provider
    analyzer infers this package's schema (found from the wheels: 3.166.0 first has
    ComponentProvider, every release before 3.237.0 fails on the package's types). Run where
    `PULUMI_FLOOR_CHECK=1` (it downloads that wheel): the floor's own wheel hosts the package."""
    import os
    import re
    import subprocess
    import sys
    import tempfile

    floor = re.search(r'"pulumi>=([0-9.]+),', (REPO_ROOT / "pyproject.toml").read_text()).group(1)
    assert tuple(int(x) for x in floor.split(".")) >= (3, 237)
    if not os.environ.get("PULUMI_FLOOR_CHECK"):
        pytest.skip("set PULUMI_FLOOR_CHECK=1 to install the floor's wheel and host the package with it")
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                        f"pulumi=={floor}.0"], check=True)
        code = ("import pulumi, sys; assert pulumi.__file__.startswith(sys.argv[1]);"
                "from vllm_gke.components.provider.host import package_schema;"
                "assert 'vllm-gke:index:VllmService' in package_schema()['resources']")
        env = {**os.environ, "PYTHONPATH": target}
        assert subprocess.run([sys.executable, "-c", code, target], env=env).returncode == 0


CONSTRUCT_BAD_INPUTS = """
import json, sys
from pulumi.errors import InputPropertiesError
from vllm_gke.components.provider.host import VllmGkeProvider
from vllm_gke.infra.plan import read_stack_config, run_program

provider = VllmGkeProvider()
out = []
for name, token, inputs in json.loads(sys.stdin.read()):
    try:
        run_program("dev", read_stack_config("dev"), program=lambda _c: provider.construct(name, token, inputs))
        out.append(None)
    except InputPropertiesError as exc:
        out.append({"message": exc.message, "errors": exc.errors})
print(json.dumps(out))
"""


def test_bad_inputs_reach_the_engine_as_input_errors_not_tracebacks():
    """What a TypeScript or YAML user sees: the provider's Construct fails with one input-property
    error per problem (the engine prints `config.models[qwen-7b]: ...`), not a Python traceback. In a
    process of its own, as the plugin runs: its protos clash with Google's API client's."""
    program = yaml.safe_load((EXAMPLES / "yaml" / "Pulumi.yaml").read_text())
    config = json.loads(json.dumps(program["resources"]["platform"]["properties"]["config"]))
    config["project"] = "acme-llm-dev"
    config["models"][0]["shape"] = "llama-3-70b"  # does not fit its slice: a cross-field check
    cases = [["platform", "vllm-gke:index:Platform", {"config": config}],
             # A schema-level problem in a finer component: every bad key named, all in one run.
             ["gke", "vllm-gke:index:GpuCluster", {
                 "project": "p", "region": "us-central1",
                 "cluster": {"name": "c", "zones": ["us-central1-a"], "masterCidr": "172.16.0.0/24"},
                 "nodePools": [{"name": "a", "machineType": "nope"}, {"name": "b", "machineType": "nope2"}]}]]
    result = subprocess.run([sys.executable, "-c", CONSTRUCT_BAD_INPUTS], input=json.dumps(cases), cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    platform, cluster = json.loads(result.stdout)
    (problem,) = [e for e in platform["errors"] if "weights need" in e["reason"]]
    assert problem["property_path"].startswith("config.models[qwen-7b]")
    assert "Traceback" not in platform["message"]
    paths = {e["property_path"] for e in cluster["errors"]}
    assert {"cluster.masterCidr", "nodePools[a].machineType", "nodePools[b].machineType"} <= paths, paths


def test_a_callers_depends_on_reaches_every_resource_a_facade_declares():
    """`dependsOn` on a package component: its resources wait too (Pulumi does not pass a
    component's dependsOn to its children by itself)."""
    from vllm_gke.components.provider import Observability
    from vllm_gke.infra.plan import _under_mocks

    def body() -> None:
        first = pulumi.CustomResource("test:index:First", "first", {})
        Observability("obs", {"project": "p", "cluster_name": "c", "title": "t", "monitoring": {}},
                      opts=pulumi.ResourceOptions(depends_on=[first]))

    recorded = _under_mocks("p", "dev", {}, body)
    children = [r for r in recorded if r.custom and "obs" in r.urn]
    assert children and all(any("first" in d for d in r.dependencies) for r in children), \
        [(r.name, r.dependencies) for r in children]


def test_the_package_vllm_service_runs_the_stack_configs_fit_checks():
    """A 70B model on a 3g.20gb slice, declared through the package: the stack config's message,
    key named, and the fix that helps (not fewer sequences)."""
    from vllm_gke.components.provider import VllmService
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import read_stack_config, run_program

    model = {"name": "big", "source": "hf://meta-llama/Llama-3.1-70B-Instruct", "shape": "llama-3-70b",
             "node_pool": "mig", "extra_args": ["--no-such-flag"]}
    args = {"model": model, "pool_name": "short", "namespace": "vllm", "claim_name": "weights", "kubeconfig": "kc",
            "project": "p", "node_pool": {"name": "mig", "machine_type": "a2-highgpu-8g",
                                          "gpu_partition_size": "3g.20gb"},
            "image": {"repository": "r", "tag": "v0.34.0"},
            "tenants": [{"name": "t", "jwt": {"issuer": "https://i.example", "jwks_uri": "https://i.example/jwks",
                                              "audiences": ["a"]}, "models": ["big"]}]}
    with pytest.raises(InputError) as exc:
        run_program("dev", read_stack_config("dev"), program=lambda _c: VllmService("big-short", args))
    problems = {i.key: i.problem for i in exc.value.issues}
    assert "weights need 141.2 GB per GPU" in problems["VllmService.model"]
    assert "quantise" in problems["VllmService.model"] and "maxNumSeqs" not in problems["VllmService.model"]
    assert "--no-such-flag" in problems["VllmService.model.extraArgs"]


def test_the_picker_path_composes_from_the_facades():
    """A model behind GKE Inference Gateway's endpoint picker, wired from the package's finer
    components as a TypeScript or YAML program would: the route reaches the InferencePool only
    with the tenant's own objective, the replica's guard requires it, every mandatory policy passes."""
    import copy

    from vllm_gke.components.model.identity_extension import IDENTITY_TAG
    from vllm_gke.components.provider import (
        Gateway,
        GpuCluster,
        IdentityExtension,
        InferenceObjectiveCrd,
        InferencePool,
        MeshNamespace,
        TenantAuth,
        VllmService,
    )
    from vllm_gke.infra.plan import _under_mocks
    from vllm_gke.policies.rules import Resource, evaluate

    cluster = {"name": "c", "zones": ["us-central1-a"], "min_master_version": "1.34"}
    tenant = {"name": "search", "jwt": {"issuer": "https://auth.acme.example/search",
                                        "jwks_uri": "https://auth.acme.example/search/jwks", "audiences": ["llm"]},
              "models": ["qwen-7b"], "priority": -1, "rate_limit": {"requests_per_minute": 60}, "max_tokens": 1024}
    model = {"name": "qwen-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct", "shape": "qwen2.5-7b",
             "node_pool": "gpu", "routing": "inference-gateway",
             "short": {"min_replicas": 1, "max_replicas": 2, "max_num_seqs": 8}}

    def body() -> None:
        GpuCluster("gke", {"project": "p", "region": "us-central1", "cluster": cluster,
                           "node_pools": [{"name": "gpu", "machine_type": "g2-standard-8"}]})
        ns = MeshNamespace("serving", {"name": "vllm", "kubeconfig": "kc", "cluster": cluster, "tenants": [tenant]})
        TenantAuth("search", {"tenant": tenant, "kubeconfig": "kc", "serving_namespace": ns.name,
                              "shared_models": ["qwen-7b"], "picker_models": ["qwen-7b"], "cluster": cluster})
        VllmService("qwen-7b-short", {
            "model": model, "pool_name": "short", "node_pool": {"name": "gpu", "machine_type": "g2-standard-8"},
            "namespace": ns.name, "image": {"repository": "r", "tag": "v0.34.0"}, "claim_name": "weights",
            "kubeconfig": "kc", "project": "p", "tenants": [tenant]})
        crd = InferenceObjectiveCrd("objectives", {"kubeconfig": "kc"})
        pool = InferencePool("qwen-7b", {"project": "p", "model": model, "namespace": ns.name, "kubeconfig": "kc",
                                         "tenants": [tenant], "cluster": cluster},
                             opts=pulumi.ResourceOptions(depends_on=[crd]))
        # Verifies the tenant and sets the objective the route requires: up before the route.
        identity = IdentityExtension("identity", {"namespace": ns.name, "kubeconfig": "kc", "tenants": [tenant],
                                                  "models": [model], "cluster": cluster,
                                                  "server_image": {"repository": "reg/vllm/server", "tag": "v0.34.0"}})
        Gateway("gw", {"gateway": {"class_name": "gke-l7-rilb"}, "namespace": ns.name, "kubeconfig": "kc",
                       "project": "p", "region": "us-central1", "targets": [{
                           "route_name": "qwen-7b.search", "namespace": ns.name, "path_prefix": "search/qwen-7b",
                           "inference_pool": "qwen-7b", "tenant": "search"}]},
                opts=pulumi.ResourceOptions(depends_on=[pool, identity]))

    recorded = _under_mocks("p", "dev", {}, body)
    manifests = [r.props for r in recorded if r.type.startswith("kubernetes:")]
    (route,) = [m for m in manifests if m.get("kind") == "HTTPRoute"]
    backends = [b for rule in route["spec"]["rules"] for b in rule.get("backendRefs", [])]
    assert backends and all(b["kind"] == "InferencePool" and b["name"] == "qwen-7b" for b in backends)
    # The routes whose bodies the extension salts match no Content-Length (Envoy drops it in front of
    # them, so such a match would answer 404); the others keep the bound.
    lengths = {m["path"]["value"]: any(h["name"] == "content-length" for h in m.get("headers") or [])
               for rule in route["spec"]["rules"] for m in rule.get("matches") or []
               if any(h["name"] == "x-llm-d-inference-objective" for h in m.get("headers") or [])}
    assert lengths["/search/qwen-7b/v1/chat/completions"] is False and lengths["/search/qwen-7b/v1/completions"] is False
    objectives = [m for m in manifests if m.get("kind") == "InferenceObjective"]
    assert [(o["metadata"]["name"], o["spec"]["priority"]) for o in objectives] == [("search.qwen-7b", -1)]
    (server,) = [m for m in manifests if m.get("kind") == "Deployment" and "epp" not in m["metadata"]["name"]
                 and "identity" not in m["metadata"]["name"]]
    env = {e["name"]: e.get("value") for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert '"objective": "search.qwen-7b"' in env["GKE_LLM_GUARD_CONFIG"]
    (extension,) = [m for m in manifests if m.get("kind") == "GCPRoutingExtension"]
    assert extension["spec"]["targetRefs"][0]["name"] == route["spec"]["parentRefs"][0]["name"]
    (config,) = [json.loads(m["data"]["identity.json"]) for m in manifests if "identity.json" in m.get("data", {})]
    assert config["prefixes"]["/search/qwen-7b"]["objective"] == "search.qwen-7b"
    (identity,) = [m for m in manifests if m.get("kind") == "Deployment" and "identity" in m["metadata"]["name"]]
    assert identity["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/vllm/vllm-gke-identity:" + IDENTITY_TAG
    resources = [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in recorded if r.custom]
    assert [(v.policy, v.message[:100]) for v in evaluate(resources) if v.level == "mandatory"] == []


# Where the docs tell how to consume the package (the README links to both).
INSTALL_DOCS = ("docs/guides/multi-language.md", "docs/installation-configuration.md")


def test_the_readme_consumes_the_current_release_and_the_release_is_tagged():
    """The docs' `pulumi package add` source names this version's tag, and the tag exists
    (where the checkout carries tags at all: a source archive has none)."""
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    readme = "\n".join((REPO_ROOT / page).read_text() for page in ("README.md", *INSTALL_DOCS))
    refs = set(re.findall(r"(?:checkout |@)v(\d+\.\d+\.\d+)", readme))
    assert refs == {version}, f"the docs point at {refs}, the release is {version}"
    sources = [readme] + [p.read_text() for p in (REPO_ROOT / "examples").rglob("*")
                          if p.is_file() and p.suffix in (".txt", ".json", ".yaml", ".ts", ".py")]
    assert not any("github.com/acme/vllm-gke" in text for text in sources)  # no placeholder owner as a source
    assert not any(re.search(r"@v(?!" + re.escape(version) + r")\d+\.\d+\.\d+", text) for text in sources)
    tags = subprocess.run(["git", "tag", "--list"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.split()
    if not tags:
        pytest.skip("this checkout carries no tags")
    assert f"v{version}" in tags, f"release {version} is not tagged: git tag v{version} on its commit"


TENANT = {"name": "search", "jwt": {"issuer": "https://auth.acme.example/search",
                                    "jwks_uri": "https://auth.acme.example/search/jwks", "audiences": ["llm"]},
          "models": ["qwen-7b"], "rate_limit": {"requests_per_minute": 60}, "max_tokens": 1024}
MODEL = {"name": "qwen-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct", "shape": "qwen2.5-7b", "node_pool": "gpu",
         "short": {"max_num_seqs": 8}, "long": {"max_num_seqs": 2}}
CLUSTER = {"name": "c", "zones": ["us-central1-a"]}
PICKED = {**{k: v for k, v in MODEL.items() if k != "long"}, "routing": "inference-gateway"}


def _service(**changes):
    args = {"model": MODEL, "pool_name": "short", "node_pool": {"name": "gpu", "machine_type": "g2-standard-8"},
            "namespace": "vllm", "image": {"repository": "r", "tag": "v0.34.0"}, "claim_name": "weights",
            "kubeconfig": "kc", "project": "p", "tenants": [TENANT]}
    return {**args, **changes}


@pytest.mark.parametrize("component,args,key,words", [
    # The stack config's checks, run by the component that holds the pieces.
    ("VllmService", _service(image={"repository": "r", "tag": "v0.11.0"}), "VllmService.image.tag", "not an image of vLLM"),
    ("VllmService", _service(tenants=[{**TENANT, "rate_limit": {"requests_per_minute": 60, "tokens_per_minute": 9000}}]),
     "VllmService.tenants[search].rateLimit.tokensPerMinute", "globalLimits"),
    ("VllmService", _service(tenants=[{**TENANT, "max_tokens": 100000}]), "VllmService.tenants[search].maxTokens",
     "exceeds what model"),
    ("VllmService", _service(model=PICKED, pool_name="long"), "VllmService.poolName",
     "nothing would route"),
    ("VllmService", _service(model={**MODEL, "node_pool": "other"}), "VllmService.model.nodePool", "not nodePool.name"),
    ("VllmService", _service(model={**MODEL, "enable_chunked_prefill": False,
                                    "short": {"max_num_seqs": 8, "max_num_batched_tokens": 512}}),
     "VllmService.model.short.maxNumBatchedTokens", "refuses to start"),
    ("VllmService", _service(request_timeout_seconds=7200), "VllmService.requestTimeoutSeconds", "30-3600"),
    # A replica across two a3 nodes needs the pod range its leader reaches its workers on.
    ("VllmService", _service(model={**MODEL, "shape": "llama-3-70b", "tensor_parallel_size": 8,
                                    "pipeline_parallel_size": 2},
                             node_pool={"name": "gpu", "machine_type": "a3-highgpu-8g", "max_nodes": 2}),
     "VllmService.podsCidr", "spans hosts"),
    # On a TPU pool the image is the TPU build's, and so is the release.
    ("VllmService", _service(node_pool={"name": "gpu", "machine_type": "ct6e-standard-1t"}),
     "VllmService.image.tag", "not an image of vLLM TPU 0.32.0"),
    ("GpuCluster", {"project": "p", "region": "europe-west4", "cluster": CLUSTER,
                    "node_pools": [{"name": "gpu", "machine_type": "g2-standard-8"}]},
     "GpuCluster.cluster.zones", "not in region europe-west4"),
    ("InferencePool", {"project": "p", "model": PICKED, "namespace": "vllm",
                       "kubeconfig": "kc", "tenants": [TENANT], "cluster": CLUSTER},
     "InferencePool.cluster.minMasterVersion", "1.34"),
    ("Gateway", {"gateway": {"class_name": "gke-l7-global-external-managed", "hostname": "h.example",
                             "managed_certificate": True}, "namespace": "vllm", "kubeconfig": "kc", "project": "p",
                 "region": "us-central1", "targets": [{"route_name": "a", "namespace": "vllm", "path_prefix": "a",
                                                       "inference_pool": "qwen-7b", "tenant": "search"}]},
     "Gateway.gateway.className", "cannot route to an InferencePool"),
    # No regular-expression header match on the global external load balancer: no length routes.
    ("Gateway", {"gateway": {"class_name": "gke-l7-global-external-managed", "hostname": "h.example",
                             "managed_certificate": True}, "namespace": "vllm", "kubeconfig": "kc", "project": "p",
                 "region": "us-central1", "targets": [{"route_name": "a", "namespace": "vllm", "path_prefix": "a",
                                                       "short_service": "s", "long_service": "l",
                                                       "long_request_bytes": 1}]},
     "Gateway.gateway.className", "cannot program length routes"),
    ("Gateway", {"gateway": {}, "namespace": "vllm", "kubeconfig": "kc", "project": "p", "region": "us-central1",
                 "targets": [{"route_name": "a", "namespace": "vllm", "path_prefix": p, "short_service": "s",
                              "long_service": "l", "long_request_bytes": 1} for p in ("a", "b")]},
     "Gateway.targets", "routeName 'a' is used more than once"),
    # A target is named by its routeName, as the stack config names list items.
    ("Gateway", {"gateway": {}, "namespace": "vllm", "kubeconfig": "kc", "project": "p", "region": "us-central1",
                 "targets": [{"route_name": "qwen", "namespace": "vllm", "path_prefix": "qwen",
                              "inference_pool": "qwen-7b"}]},
     "Gateway.targets[qwen].tenant", "required with inferencePool"),
    ("Gateway", {"gateway": {}, "namespace": "vllm", "kubeconfig": "kc", "project": "p", "region": "us-central1",
                 "targets": [{"path_prefix": "qwen", "inference_pool": "qwen-7b", "tenant": "search"}]},
     "Gateway.targets[0]", "routeName, namespace required but not set"),
    ("MeshNamespace", {"name": "keda", "kubeconfig": "kc", "cluster": CLUSTER, "tenants": [TENANT]},
     "MeshNamespace.name", "owns"),
    ("MeshNamespace", {"name": "vllm", "kubeconfig": "kc", "cluster": CLUSTER, "tenants": []},
     "MeshNamespace.tenants", "refuse every token"),
    ("TenantAuth", {"tenant": TENANT, "kubeconfig": "kc", "serving_namespace": "vllm", "cluster": CLUSTER,
                    "shared_models": ["qwen-7b", "qwen-7b"]}, "TenantAuth.sharedModels", "more than once"),
    ("ModelStore", {"project": "p", "zone": "us-central1-a", "region": "us-central1", "network_name": "n",
                    "workload_pool": "p.svc.id.goog", "kubeconfig": "kc", "models": [MODEL],
                    "server_image": {"repository": "r", "tag": "v0.34.0"}, "consumer_namespaces": {"rw": "vllm"}},
     "ModelStore.consumerNamespaces.rw", "DNS label"),
])
def test_each_component_runs_the_stack_configs_checks_on_what_it_holds(component, args, key, words):
    from vllm_gke.components import provider
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import _under_mocks

    with pytest.raises(InputError) as exc:
        _under_mocks("p", "dev", {}, lambda: getattr(provider, component)("x", args))
    problems = {i.key: i.problem for i in exc.value.issues}
    assert key in problems and words in problems[key], problems


def test_the_facades_enable_the_apis_the_stack_program_would():
    """Composed from the finer components, a fresh project gets the APIs Platform enables: the
    share (file), Workload Identity (iamcredentials), the image (artifactregistry), logs,
    monitoring, and the picker's Network Services."""
    from vllm_gke.components import provider
    from vllm_gke.infra.plan import _under_mocks

    def body() -> None:
        provider.GpuCluster("gke", {"project": "p", "region": "us-central1", "cluster": CLUSTER,
                                    "node_pools": [{"name": "gpu", "machine_type": "g2-standard-8"}]})
        provider.ModelStore("weights", {"project": "p", "zone": "us-central1-a", "region": "us-central1",
                                        "network_name": "n", "workload_pool": "p.svc.id.goog", "kubeconfig": "kc",
                                        "models": [MODEL], "server_image": {"repository": "r", "tag": "v0.34.0"},
                                        "consumer_namespaces": {"serving": "vllm"}})
        provider.Observability("obs", {"project": "p", "cluster_name": "c", "title": "t"})
        provider.InferencePool("pool", {"project": "p", "model": PICKED,
                                        "namespace": "vllm", "kubeconfig": "kc", "tenants": [TENANT],
                                        "cluster": {**CLUSTER, "min_master_version": "1.34"}})

    recorded = _under_mocks("p", "dev", {}, body)
    enabled = {r.props["service"] for r in recorded if r.type == "gcp:projects/service:Service"}
    assert {"file.googleapis.com", "iamcredentials.googleapis.com", "artifactregistry.googleapis.com",
            "logging.googleapis.com", "monitoring.googleapis.com", "networkservices.googleapis.com"} <= enabled
    (share,) = [r for r in recorded if r.type == "gcp:filestore/instance:Instance"]
    file_api = {r.urn for r in recorded if r.props.get("service") == "file.googleapis.com"}
    assert file_api & share.dependencies, "the share waits for the Filestore API"


def test_facade_settings_the_stack_program_derives_reach_the_pods():
    """requestTimeoutSeconds drains as long as the load balancer waits; MeshReadiness follows the
    cluster's release channel; Observability alerts on the limit store; a dedicated tenant's
    namespace holds the servers' service accounts."""
    from vllm_gke.components import provider
    from vllm_gke.infra.plan import _under_mocks

    def body() -> None:
        provider.VllmService("s", _service(request_timeout_seconds=1800))
        provider.MeshReadiness("mesh", {"kubeconfig": "kc", "cluster": {**CLUSTER, "release_channel": "STABLE"}})
        provider.Observability("obs", {"project": "p", "cluster_name": "c", "title": "t", "limit_store": True})
        provider.TenantAuth("t", {"tenant": {**TENANT, "dedicated": {"models": ["qwen-7b"], "node_pool": "gpu"}},
                                  "kubeconfig": "kc", "serving_namespace": "vllm", "cluster": CLUSTER,
                                  "shared_models": []})

    recorded = _under_mocks("p", "dev", {}, body)
    manifests = [r.props for r in recorded if r.type.startswith("kubernetes:")]
    (server,) = [m for m in manifests if m.get("kind") == "Deployment"]
    assert server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 1800
    assert "1800" in server["spec"]["template"]["spec"]["containers"][0]["args"]
    (job,) = [m for m in manifests if m.get("kind") == "Job"]
    assert "asm-managed-stable" in json.dumps(job)
    alerts = [r.props["displayName"] for r in recorded if r.type == "gcp:monitoring/alertPolicy:AlertPolicy"]
    assert any("limit store" in a.lower() for a in alerts), alerts
    accounts = {m["metadata"]["name"] for m in manifests if m.get("kind") == "ServiceAccount"}
    assert {"vllm-server", "vllm-standby"} <= accounts


def test_a_package_pool_scales_to_zero_with_its_standby():
    """minReplicas 0 through the package: the pool's standby answers at zero and its request
    count is the ScaledObject's wake trigger, as in the stack program."""
    from vllm_gke.components import provider
    from vllm_gke.infra.plan import _under_mocks

    model = {**MODEL, "short": {"max_num_seqs": 8, "min_replicas": 0}}
    recorded = _under_mocks("p", "dev", {}, lambda: provider.VllmService("s", _service(model=model)))
    manifests = [r.props for r in recorded if r.type.startswith("kubernetes:")]
    deployments = {m["metadata"]["name"] for m in manifests if m.get("kind") == "Deployment"}
    assert deployments == {"qwen-7b-short", "qwen-7b-short-standby"}
    (scaled,) = [m for m in manifests if m.get("kind") == "ScaledObject"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert any("vllm_gke_standby_requests_total" in json.dumps(t) and "qwen-7b-short-standby" in json.dumps(t)
               for t in scaled["spec"]["triggers"])


def test_shared_and_dedicated_pools_at_zero_have_distinct_resources():
    """A model's shared pool and a tenant's dedicated copy, both scaling to zero, share the pool's
    Service name (in two namespaces): their standbys are named after the components, so every
    resource in the program keeps its own URN; the dedicated copy's node pool is the tenant's."""
    from vllm_gke.components import provider
    from vllm_gke.infra.plan import _under_mocks

    model = {**MODEL, "short": {"max_num_seqs": 8, "min_replicas": 0}}
    owner = {**TENANT, "dedicated": {"models": ["qwen-7b"], "node_pool": "search-gpu"}}

    def body() -> None:
        provider.VllmService("shared", _service(model=model))
        provider.VllmService("search-own", _service(
            model=model, namespace="search", tenant="search", tenants=[owner],
            node_pool={"name": "search-gpu", "machine_type": "g2-standard-8"}))

    recorded = _under_mocks("p", "dev", {}, body)
    urns = [r.urn for r in recorded]
    assert len(urns) == len(set(urns)), sorted(u for u in urns if urns.count(u) > 1)
    standbys = [r for r in recorded if r.type == "kubernetes:apps/v1:Deployment"
                and r.props["metadata"]["name"] == "qwen-7b-short-standby"]
    assert {r.props["metadata"]["namespace"] for r in standbys} == {"vllm", "search"}


def test_a_dedicated_copy_must_sit_on_its_tenants_pool():
    from vllm_gke.components import provider
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import _under_mocks

    owner = {**TENANT, "dedicated": {"models": ["qwen-7b"], "node_pool": "search-gpu"}}
    with pytest.raises(InputError) as exc:
        _under_mocks("p", "dev", {}, lambda: provider.VllmService("own", _service(
            namespace="search", tenant="search", tenants=[owner])))
    problems = {i.key: i.problem for i in exc.value.issues}
    assert "'search-gpu' is not nodePool.name 'gpu'" in problems["VllmService.tenants[search].dedicated.nodePool"], problems
    with pytest.raises(InputError) as exc:
        _under_mocks("p", "dev", {}, lambda: provider.VllmService("own", _service(tenant="ads")))
    assert "not among tenants" in {i.key: i.problem for i in exc.value.issues}["VllmService.tenant"]
    # An owner without a dedicated copy of the model has no server account in its namespace.
    with pytest.raises(InputError) as exc:
        _under_mocks("p", "dev", {}, lambda: provider.VllmService("own", _service(namespace="search", tenant="search")))
    assert "no dedicated copy of 'qwen-7b'" in {i.key: i.problem for i in exc.value.issues}["VllmService.tenant"]


def test_the_package_vllm_service_on_a_tpu_pool_allows_for_the_xla_compile():
    """Without coldStartSeconds a TPU pool's probe, rollout deadline and standby allow for the XLA
    compile components/model/cold_start.py estimates, not a GPU's 15 minutes."""
    from vllm_gke.components.model.cold_start import NODE_PROVISION_S, PACKAGE_LOAD_S, xla_compile_seconds
    from vllm_gke.components.model.serving_pool import startup_failure_threshold
    from vllm_gke.components.model.specs import ModelSpec
    from vllm_gke.components.provider import VllmService
    from vllm_gke.infra.plan import read_stack_config, run_program

    model = {"name": "big", "source": "hf://meta-llama/Llama-3.3-70B-Instruct", "shape": "llama-3-70b",
             "node_pool": "v6e", "tensor_parallel_size": 16, "multi_host": True,
             "short": {"min_replicas": 0, "max_replicas": 1, "max_num_seqs": 8, "context_tokens": 4096}}
    args = {"model": model, "pool_name": "short", "namespace": "vllm", "claim_name": "weights", "kubeconfig": "kc",
            "project": "p", "pods_cidr": "10.4.0.0/14",
            "node_pool": {"name": "v6e", "machine_type": "ct6e-standard-4t", "tpu_topology": "4x4", "min_nodes": 0,
                          "max_nodes": 4},
            "image": {"repository": "r", "tag": "v0.32.0"},
            "tenants": [{"name": "t", "jwt": {"issuer": "https://i.example", "jwks_uri": "https://i.example/jwks",
                                              "audiences": ["a"]}, "models": ["big"], "max_tokens": 1024,
                         "rate_limit": {"requests_per_minute": 60}}]}
    plan = run_program("dev", read_stack_config("dev"), program=lambda _c: VllmService("big-short", args))
    load = PACKAGE_LOAD_S + xla_compile_seconds(ModelSpec(**model)) + 600  # four hosts: the Ray joins
    (group,) = [d for d in plan.manifests() if d["kind"] == "LeaderWorkerSet"]
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["startupProbe"]["failureThreshold"] == startup_failure_threshold(load) > 180
    (standby,) = [d for d in plan.manifests()
                  if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("standby")]
    # A node, then the load, as the stack program's standbys tell callers.
    command = standby["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--expected-seconds") + 1] == str(int(NODE_PROVISION_S + load))


def test_a_package_component_is_the_library_component_it_exposes():
    """`class Keda(_Keda, Facade)`: one resource with the library's type token, its children
    directly under it (never an outer component around an inner one of the same token), and the
    APIs it enables among what they wait for."""
    from vllm_gke.components import provider
    from vllm_gke.components.provider.facade import Facade, former_parent
    from vllm_gke.infra.plan import _under_mocks

    made: list[pulumi.ComponentResource] = []

    def body() -> None:
        made.extend([
            provider.GpuCluster("gke", {"project": "p", "region": "us-central1", "cluster": CLUSTER,
                                        "node_pools": [{"name": "gpu", "machine_type": "g2-standard-8"}]}),
            provider.MeshReadiness("mesh", {"kubeconfig": "kc", "cluster": CLUSTER}),
            provider.Keda("keda", {"project": "p", "kubeconfig": "kc", "workload_pool": "p.svc.id.goog",
                                   "cluster": CLUSTER, "network_name": "n"}),
            provider.MeshNamespace("serving", {"name": "vllm", "kubeconfig": "kc", "cluster": CLUSTER,
                                               "tenants": [TENANT]}),
            provider.TenantAuth("search", {"tenant": TENANT, "kubeconfig": "kc", "serving_namespace": "vllm",
                                           "shared_models": ["qwen-7b"], "cluster": CLUSTER}),
            provider.InferenceObjectiveCrd("objectives", {"kubeconfig": "kc"}),
            provider.InferencePool("pool", {"project": "p", "model": PICKED, "namespace": "vllm", "kubeconfig": "kc",
                                            "tenants": [TENANT], "cluster": {**CLUSTER, "min_master_version": "1.34"}}),
            provider.LimitStore("limits", {"kubeconfig": "kc", "client_namespaces": ["vllm"],
                                           "image": {"repository": "redis", "tag": "7.4"}}),
            provider.Gateway("gw", {"gateway": {"class_name": "gke-l7-rilb"}, "namespace": "vllm", "kubeconfig": "kc",
                                    "project": "p", "region": "us-central1", "targets": [{
                                        "route_name": "qwen-7b.search", "namespace": "vllm",
                                        "path_prefix": "search/qwen-7b", "inference_pool": "qwen-7b",
                                        "tenant": "search"}]}),
            provider.Observability("obs", {"project": "p", "cluster_name": "c", "title": "t"}),
            provider.ModelStore("weights", {"project": "p", "zone": "us-central1-a", "region": "us-central1",
                                            "network_name": "n", "workload_pool": "p.svc.id.goog", "kubeconfig": "kc",
                                            "models": [MODEL], "server_image": {"repository": "r", "tag": "v0.34.0"}}),
            provider.VllmService("qwen-7b-short", _service(model={**MODEL, "short": {"max_num_seqs": 8,
                                                                                     "min_replicas": 0}}))])

    recorded = _under_mocks("p", "dev", {}, body)
    for component in made:
        library = type(component).__mro__[1]
        assert isinstance(component, Facade) and library.__module__.startswith("vllm_gke.components."), library
    tokens = {r.type for r in recorded if r.type.startswith("vllm-gke:index:")}
    nested = [r.urn for r in recorded for t in tokens if r.urn.count(f"{t}$") + r.urn.count(f"{t}::") > 1]
    assert nested == [], nested
    network_services = {r.urn for r in recorded if r.props.get("service") == "networkservices.googleapis.com"}
    pool_children = [r for r in recorded if r.custom and "InferencePool$kubernetes" in r.urn]
    assert pool_children and all(network_services & r.dependencies for r in pool_children)
    # A stack made with 0.3.0 had the library component inside an outer one of the same type and
    # name: each child the library declares is aliased under that former inner URN (the engine passes
    # an alias on only from a parent found through one); what the package itself adds is not.
    by_urn = {r.urn: r for r in recorded}
    for r in recorded:
        parent = by_urn.get(r.parent or "")
        if parent is None or parent.type not in tokens or parent.parent in by_urn:
            continue  # children of the package components (made at the top) only
        former = former_parent(parent.urn, parent.type)
        # Facade.prepare's: the APIs, and the Kubernetes provider from the kubeconfig (GpuCluster
        # makes its own, from the cluster it declares).
        added_by_package = (r.type == "vllm-gke:index:ProjectApis" or r.type.startswith("pulumi:providers:")
                            and parent.type != "vllm-gke:index:GpuCluster")
        assert (former in r.alias_parents) is not added_by_package, (r.urn, r.alias_parents)


CONSTRUCT = """
import json, sys
from vllm_gke.components.provider.host import VllmGkeProvider
from vllm_gke.infra.plan import _under_mocks

provider = VllmGkeProvider()
out = {}
for name, token, inputs in json.loads(sys.stdin.read()):
    _under_mocks("p", "dev", {}, lambda: out.update({token: sorted(provider.construct(name, token, inputs).state)}))
print(json.dumps(out))
"""


def test_the_provider_constructs_each_component_and_answers_every_output(schema):
    """Construct as the engine asks for it (the provider calls its view of the class, which makes
    the package component): the answer carries every output the schema declares."""
    cluster = {"name": "c", "zones": ["us-central1-a"]}
    tenant = {"name": "search", "jwt": {"issuer": "https://i.example", "jwksUri": "https://i.example/jwks",
                                        "audiences": ["llm"]}, "models": ["m"], "rateLimit": {"requestsPerMinute": 6},
              "maxTokens": 1024}
    cases = [["keda", "vllm-gke:index:Keda", {"project": "p", "kubeconfig": "kc", "workloadPool": "w",
                                               "cluster": cluster, "networkName": "n"}],
             ["search", "vllm-gke:index:TenantAuth", {"tenant": tenant, "kubeconfig": "kc", "servingNamespace": "vllm",
                                                      "sharedModels": ["m"], "cluster": cluster}],
             ["gw", "vllm-gke:index:Gateway", {"gateway": {"className": "gke-l7-rilb"}, "namespace": "vllm",
                                               "kubeconfig": "kc", "project": "p", "region": "us-central1",
                                               "targets": [{"routeName": "m", "namespace": "vllm", "pathPrefix": "m",
                                                            "shortService": "s", "longService": "l",
                                                            "longRequestBytes": 1}]}],
             ["obs", "vllm-gke:index:Observability", {"project": "p", "clusterName": "c", "title": "t"}]]
    result = subprocess.run([sys.executable, "-c", CONSTRUCT], input=json.dumps(cases), cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for token, outputs in json.loads(result.stdout).items():
        assert outputs == sorted(schema["resources"][token]["properties"]), token


def test_the_package_identity_extension_names_each_bad_input():
    """No image to derive its own from, a model not behind the picker, no tenant calling the models:
    each problem names its key and the fix, all in one run."""
    from vllm_gke.components.provider import IdentityExtension
    from vllm_gke.components.provider.convert import InputError
    from vllm_gke.infra.plan import _under_mocks

    cluster = {"name": "c", "zones": ["us-central1-a"], "min_master_version": "1.34"}
    tenant = {"name": "search", "jwt": {"issuer": "https://i.example", "jwks_uri": "https://i.example/jwks",
                                        "audiences": ["a"]}, "models": ["other"],
              "rate_limit": {"requests_per_minute": 60}, "max_tokens": 1024}
    model = {"name": "qwen-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct", "shape": "qwen2.5-7b", "node_pool": "gpu"}
    args: dict[str, Any] = {"namespace": "vllm", "kubeconfig": "kc", "tenants": [tenant], "cluster": cluster}

    def problems(**given: Any) -> dict[str, str]:
        def body() -> None:
            IdentityExtension("identity", cast(Any, {**args, **given}))
        with pytest.raises(InputError) as exc:
            _under_mocks("p", "dev", {}, body)
        return {i.key: i.problem for i in exc.value.issues}

    found = problems(models=[model], vllm_version="0.1.0")
    assert "routing: inference-gateway" in found["IdentityExtension.models[qwen-7b].routing"]
    assert "serverImage" in found["IdentityExtension.image"]
    assert "use one of 0.34.0" in found["IdentityExtension.vllmVersion"]
    picker = {**model, "routing": "inference-gateway"}
    found = problems(models=[picker], image={"repository": "r/identity", "tag": "1"})
    assert list(found) == ["IdentityExtension.tenants"] and "admit no request" in found["IdentityExtension.tenants"]
    # More tenant URLs than GKE's CEL conditions can name: an input error, not a traceback.
    many = [{**tenant, "name": f"t-{i:03}", "models": ["qwen-7b"]} for i in range(150)]
    found = problems(models=[picker], tenants=many, image={"repository": "r/identity", "tag": "1"})
    assert "GKE takes at most 10" in found["IdentityExtension.tenants"]
