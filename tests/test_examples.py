"""The examples/ programs, run as a user's own Pulumi programs would be, under mocks, and judged by
the policy pack: each declares a whole platform that serves, and every mandatory policy passes."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.ts_declarations import node_package, write_sdk
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


# --- the examples as a fresh clone builds them ----------------------------------------------------

EXAMPLES = REPO_ROOT / "examples"
PACKAGE = REPO_ROOT / "components" / "provider"
TS_EXAMPLES = ("typescript", "typescript-components")
CHECKOUT_TAG = re.compile(r"git (?:-C \S+ )?checkout (v\d+\.\d+\.\d+\S*)")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    from tests.test_package import package_schema

    return package_schema()


@pytest.mark.parametrize("example", [*TS_EXAMPLES, "yaml"])
def test_each_example_names_the_package_of_this_checkout(schema, example):
    """`pulumi install` in an example generates the SDK from what its Pulumi.yaml's `packages`
    names, this checkout's component package; a TypeScript example's package.json links the SDK
    where that writes it, under the name it takes; git ignores what the install writes."""
    folder = EXAMPLES / example
    packages = yaml.safe_load((folder / "Pulumi.yaml").read_text()).get("packages", {})
    assert list(packages) == [schema["name"]]
    assert (folder / packages[schema["name"]]).resolve() == PACKAGE and (PACKAGE / "PulumiPlugin.yaml").is_file()
    if example in TS_EXAMPLES:
        name, sdk = node_package(schema)
        manifest = json.loads((folder / "package.json").read_text())
        assert manifest["dependencies"][name] == f"file:{sdk}"
        tsconfig = json.loads((folder / "tsconfig.json").read_text())
        assert tsconfig["files"] == [manifest["main"]] and tsconfig["compilerOptions"]["strict"] is True
    for written in ("sdks/vllm-gke/index.ts", "node_modules/@pulumi/pulumi/index.js", "package-lock.json"):
        path = f"examples/{example}/{written}"
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT).returncode == 0, path


@pytest.mark.skipif(shutil.which("npm") is None and not os.environ.get("CI"), reason="npm not installed")
@pytest.mark.parametrize("example", TS_EXAMPLES)
def test_npm_install_before_pulumi_install_names_the_step(schema, tmp_path, example):
    """On a fresh clone npm would link @pulumi/vllm-gke to a folder not generated yet: the
    example's preinstall stops it and says to run `pulumi install`; with the SDK there it passes."""
    shutil.copy(EXAMPLES / example / "package.json", tmp_path)
    preinstall = ["npm", "run", "--silent", "preinstall"]
    bare = subprocess.run(preinstall, cwd=tmp_path, capture_output=True, text=True)
    assert bare.returncode != 0 and "run pulumi install" in bare.stderr, bare.stderr
    write_sdk(schema, tmp_path)
    assert subprocess.run(preinstall, cwd=tmp_path, capture_output=True, text=True).returncode == 0


def node_modules_beside_tsc() -> Path | None:
    """The node_modules holding the tsc on PATH, where .ci/run installs @pulumi/pulumi and @types/node."""
    tsc = shutil.which("tsc")
    modules = Path(tsc).resolve().parents[2] if tsc else None
    return modules if modules and (modules / "@pulumi" / "pulumi" / "package.json").is_file() else None


def caret_satisfied(version: str, spec: str) -> bool:
    wanted, found = re.fullmatch(r"\^(\d+)\.(\d+)\.(\d+)", spec), re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    assert wanted and found, f"{spec}: only ^x.y.z ranges are checked here; {version}: not x.y.z"
    have, want = (tuple(int(x) for x in m.groups()) for m in (found, wanted))
    return have[0] == want[0] and have >= want


def installed_example(schema: dict[str, Any], example: str, work: Path) -> Path:
    """The example as `pulumi install` leaves it: its files, the SDK (declarations from the schema)
    where package.json links it, and node_modules holding what package.json names, the registry's
    packages from beside tsc, each within package.json's range."""
    modules = node_modules_beside_tsc()
    assert modules, "no @pulumi/pulumi beside the tsc on PATH: .ci/run installs it in .ci/node"
    program = work / example
    shutil.copytree(EXAMPLES / example, program, ignore=shutil.ignore_patterns("node_modules", "sdks", "package-lock.json"))
    write_sdk(schema, program)
    manifest = json.loads((program / "package.json").read_text())
    for name, spec in {**manifest["dependencies"], **manifest["devDependencies"]}.items():
        if spec.startswith("file:"):
            target = program / spec.removeprefix("file:")
            assert json.loads((target / "package.json").read_text())["name"] == name, spec
        else:
            target = modules / name
            version = json.loads((target / "package.json").read_text())["version"]
            assert caret_satisfied(version, spec), f"{name} {version} is outside package.json's {spec}"
        link = program / "node_modules" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return program


def tsc(program: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tsc", "-p", "tsconfig.json", "--noEmit", "--pretty", "false", *extra],
                          cwd=program, capture_output=True, text=True)


NEEDS_TSC = pytest.mark.skipif(
    node_modules_beside_tsc() is None and not os.environ.get("CI"),
    reason="tsc with @pulumi/pulumi and @types/node beside it not installed "
           "(npm install --prefix .ci/node typescript@5.6 @pulumi/pulumi@3 @types/node@20, as .ci/run does)")


@NEEDS_TSC
@pytest.mark.parametrize("example", TS_EXAMPLES)
def test_each_typescript_example_type_checks_with_its_own_tsconfig(schema, tmp_path, example):
    result = tsc(installed_example(schema, example, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


@NEEDS_TSC
def test_the_type_check_holds_the_examples_to_the_real_sdk_types(schema, tmp_path):
    """With the real @pulumi/pulumi, `dependsOn` takes resources only (a component's name fails)
    and an input the schema lacks fails."""
    program = installed_example(schema, "typescript-components", tmp_path)
    text = (program / "index.ts").read_text()
    assert "{ dependsOn: [mesh] }" in text and "clientNamespaces:" in text
    (program / "index.ts").write_text(text.replace("{ dependsOn: [mesh] }", '{ dependsOn: ["mesh"] }', 1)
                                      .replace("clientNamespaces:", "clientNamespace:", 1))
    errors = tsc(program, "--skipLibCheck").stdout
    assert "is not assignable to type 'Input<Resource>'" in errors, errors
    assert "'clientNamespace' does not exist in type 'LimitStoreArgs'" in errors, errors


def tags_missing(text: str, tags: list[str]) -> list[str]:
    """The tags `text` tells a user to `git checkout` that are not among `tags`."""
    return sorted(set(CHECKOUT_TAG.findall(text)) - set(tags))


def test_the_docs_check_out_no_tag_this_clone_lacks():
    """A clone may carry no tags: no page or example tells a user to check out one it lacks."""
    tags = subprocess.run(["git", "tag", "--list"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.split()
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")),
             *(p for p in sorted(EXAMPLES.glob("*/*")) if p.is_file())]
    missing = {str(p.relative_to(REPO_ROOT)): tags_missing(p.read_text(), tags) for p in pages}
    assert {page: found for page, found in missing.items() if found} == {}
    assert tags_missing("git -C vllm-gke checkout v0.3.0\n", []) == ["v0.3.0"]  # the form the docs had


INSTALL_PAGES = ("docs/installation-configuration.md", "docs/guides/multi-language.md")


def test_the_documented_example_steps_start_with_pulumi_install():
    """Each example folder the install docs `cd` into holds a Pulumi program here, and its steps
    run `pulumi install` (which generates the SDK package.json links) before anything else."""
    blocks = [block for page in INSTALL_PAGES
              for block in re.findall(r"```sh\n(.*?)```", (REPO_ROOT / page).read_text(), re.S)]
    checked = 0
    for block in blocks:
        lines = [line.split("#")[0].strip() for line in block.splitlines()]
        lines = [line for line in lines if line]
        for i, line in enumerate(lines):
            if line.startswith("cd vllm-gke/"):
                assert (REPO_ROOT / line.removeprefix("cd vllm-gke/") / "Pulumi.yaml").is_file(), line
                assert lines[i + 1:i + 2] == ["pulumi install"], block
                checked += 1
    assert checked
