"""The examples/ programs, run as a user's own Pulumi programs would be, under mocks, and judged by
the policy pack: each declares a whole platform that serves, and every mandatory policy passes."""

from __future__ import annotations

import copy
import os
import shutil
from collections import Counter

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.components.model.stack_config import ConfigError
from vllm_gke.infra.plan import run_program_file
from vllm_gke.policies.rules import Resource, evaluate

PYTHON_EXAMPLE = REPO_ROOT / "examples" / "python" / "__main__.py"


@pytest.fixture(scope="module")
def python_example():
    return run_program_file(PYTHON_EXAMPLE, {"gcp:project": "team-llm-prod"})


def test_the_python_example_declares_a_platform_that_serves(python_example):
    kinds = Counter(r.props.get("kind") for r in python_example if r.type.startswith("kubernetes:"))
    assert kinds["Deployment"] >= 2 and kinds["HTTPRoute"] >= 1 and kinds["ScaledObject"] == 2
    assert kinds["RequestAuthentication"] >= 1 and kinds["AuthorizationPolicy"] >= 2
    (platform,) = [r for r in python_example if r.type == "vllm-gke:index:Platform"]
    assert all(r.parent for r in python_example if r is not platform)
    servers = [r.props for r in python_example if r.props.get("kind") == "Deployment"
               and r.props["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]
    for dep in servers:
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "https://auth.team.example/search" in env["GKE_LLM_GUARD_CONFIG"]  # the tenant is admitted


def test_the_python_example_passes_every_policy(python_example):
    resources = [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in python_example if r.custom]
    assert [(v.policy, v.message[:80]) for v in evaluate(resources) if v.level == "mandatory"] == []


def test_a_platform_built_in_a_program_gets_the_stack_configs_checks(tmp_path):
    """A 70B model on a 3g.20gb slice fails in the user's program with the stack config's message."""
    text = PYTHON_EXAMPLE.read_text().replace('"shape": "qwen2.5-7b"', '"shape": "llama-3-70b"')
    program = tmp_path / "team" / "__main__.py"
    program.parent.mkdir()
    program.write_text(text)
    with pytest.raises(ConfigError) as exc:
        run_program_file(program, {"gcp:project": "team-llm-prod"})
    assert "weights need 141.2 GB per GPU" in str(exc.value) and "models[qwen-7b]" in str(exc.value)


@pytest.mark.skipif(shutil.which("tsc") is None and not os.environ.get("CI"),
                    reason="tsc not installed: the TypeScript program cannot be compiled and run here")
def test_the_typescript_components_example_serves_and_passes_every_policy(tmp_path):
    """The finer-component TypeScript program, compiled and run by node against a recording SDK,
    then built through the package's classes under mocks: its namespace exists, its pools scale,
    and every mandatory policy passes."""
    from types import SimpleNamespace

    from tests.test_package import package_schema
    from tests.ts_program import record_program, replay_through_host

    config = {"gcp:project": "acme-llm-prod"}
    records = record_program(package_schema(), REPO_ROOT / "examples" / "typescript-components" / "index.ts",
                             tmp_path, config)
    # Built through the provider host's construct, with the camelCase inputs the engine sends.
    recorded = [SimpleNamespace(**r) for r in replay_through_host(records, config, REPO_ROOT)]
    manifests = [r.props for r in recorded if r.type.startswith("kubernetes:")]
    namespaces = {m["metadata"]["name"] for m in manifests if m.get("kind") == "Namespace"}
    used = {m["metadata"].get("namespace") for m in manifests if m.get("metadata", {}).get("namespace")}
    assert "vllm" in namespaces and used <= namespaces | {"kube-system", "default"}, used - namespaces
    kinds = Counter(m.get("kind") for m in manifests)
    assert kinds["ScaledObject"] == 2 and kinds["HTTPRoute"] >= 1 and kinds["RequestAuthentication"] >= 1
    servers = [m for m in manifests if m.get("kind") == "Deployment"
               and m["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]
    assert len(servers) == 2 and all(d["spec"]["template"]["spec"]["serviceAccountName"] == "vllm-server"
                                     for d in servers)
    resources = [Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in recorded if r.custom]
    assert [(v.policy, v.message[:100]) for v in evaluate(resources) if v.level == "mandatory"] == []
    # Waiting as wired: every server waits for the mesh, KEDA and the weights.
    server_urns = [r for r in recorded if r.props.get("kind") == "Deployment" and "qwen-7b-short" in r.name]
    assert server_urns and all(any("mesh" in d for d in r.dependencies) for r in server_urns)
