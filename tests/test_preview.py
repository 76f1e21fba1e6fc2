"""`vllm-gke preview PROGRAM_DIR`: a platform team's own Pulumi program, run under the plan's mocks and
reported as a stack plan is; settings given in code get the stack config's messages."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO_ROOT
from vllm_gke.infra.cli import app

EXAMPLE = REPO_ROOT / "examples" / "python"
runner = CliRunner()


def _program(tmp_path: Path, main: str, name: str = "team-llm", stack_config: str | None = None) -> Path:
    """A Pulumi project folder holding `main` as its program (and a stack file)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "Pulumi.yaml").write_text(f"name: {name}\nruntime:\n  name: python\n")
    (folder / "__main__.py").write_text(main)
    if stack_config is not None:
        (folder / "Pulumi.dev.yaml").write_text(stack_config)
    return folder


@pytest.fixture(scope="module")
def example_json() -> dict:
    result = runner.invoke(app, ["preview", str(EXAMPLE), "--config", "gcp:project=team-llm", "--no-write",
                                 "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_python_example_previews_as_a_stack_plan(example_json, plans):
    """Capacity, cost, options, URLs, checks and policies: the plan's own document, key for key."""
    stack_doc = json.loads(runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--output", "json"]).stdout)
    assert set(example_json) == set(stack_doc)
    assert {(r["model"], r["pool"]) for r in example_json["capacity"]} == {("qwen-7b", "short"), ("qwen-7b", "long")}
    assert [u["url"] for u in example_json["tenantUrls"]] == ["http://<gatewayAddress>/qwen-7b/v1"]
    assert example_json["cost"]["baselineMonth"] > 0
    mandatory = [v for p in example_json["policies"] if p["level"] == "mandatory" for v in p["violations"]]
    assert mandatory == []


def test_a_platform_with_a_prefix_holds_every_contract(example_json):
    """The Platform's children carry its name (`llm-keda-monitoring-viewer`): the contracts find them."""
    assert example_json["checks"]["contracts"] == []
    assert example_json["checks"]["manifests"] == [] and example_json["checks"]["vllmArgs"] == []


def test_a_misspelt_key_in_code_is_named_as_written(tmp_path):
    text = (EXAMPLE / "__main__.py").read_text().replace('"minNodes": 1', '"minNode": 1')
    folder = _program(tmp_path, text)
    result = runner.invoke(app, ["preview", str(folder), "-c", "gcp:project=team-llm", "--no-write"])
    assert result.exit_code == 2, result.output
    assert "config.nodePools[a100-mig].minNode: is not a known setting; did you mean minNodes?" in result.output
    assert "Traceback" not in result.output and "Extra inputs are not permitted" not in result.output


def test_the_stack_file_gives_the_programs_config(tmp_path):
    """Pulumi.<stack>.yaml beside the program, keys without a namespace being the project's."""
    main = textwrap.dedent("""
        import pulumi
        # Run in its own folder, as Pulumi's language host runs it.
        open("seen.txt", "w").write(pulumi.Config().require("team") + "@" + pulumi.Config("gcp").require("project"))
    """)
    folder = _program(tmp_path, main, stack_config="config:\n  team: search\n  gcp:project: p1\n")
    result = runner.invoke(app, ["preview", str(folder), "--no-write"])
    assert result.exit_code == 0, result.output
    assert (folder / "seen.txt").read_text() == "search@p1"
    assert "no Platform in the program" in result.output


def test_a_required_key_the_program_lacks_is_exit_2_naming_it(tmp_path):
    folder = _program(tmp_path, (EXAMPLE / "__main__.py").read_text())
    result = runner.invoke(app, ["preview", str(folder), "--no-write"])
    assert result.exit_code == 2, result.output
    assert "gcp:project" in result.output and "--config gcp:project=VALUE" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("runtime, problem", [("nodejs", "preview runs Python programs"), (None, "holds no Pulumi.yaml")])
def test_what_is_not_a_python_project_is_exit_2(tmp_path, runtime, problem):
    folder = tmp_path / "p"
    folder.mkdir()
    if runtime:
        (folder / "Pulumi.yaml").write_text(f"name: p\nruntime: {runtime}\n")
    result = runner.invoke(app, ["preview", str(folder)])
    assert result.exit_code == 2 and problem in result.output, result.output


def test_two_platforms_report_one_each(tmp_path):
    text = (EXAMPLE / "__main__.py").read_text()
    text += textwrap.dedent("""
        second = Platform("llm-eu", PlatformArgs({**config, "region": "europe-west4",
                                                  "cluster": {**config["cluster"], "name": "team-llm-eu",
                                                              "zones": ["europe-west4-a", "europe-west4-b"]}}))
    """)
    folder = _program(tmp_path, text)
    result = runner.invoke(app, ["preview", str(folder), "-c", "gcp:project=team-llm", "--no-write", "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc["platforms"]) == {"dev/llm", "dev/llm-eu"}
    assert all(d["checks"]["contracts"] == [] for d in doc["platforms"].values())


def test_resources_beside_a_platform_are_checked_for_schema_and_policies(tmp_path):
    """A program of its own resources (no Platform): a Deployment without limits breaks a mandatory
    policy, so the preview exits 1 and says which."""
    main = textwrap.dedent("""
        import pulumi_kubernetes as k8s
        k8s.apps.v1.Deployment("web", metadata={"name": "web", "namespace": "vllm"}, spec={
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web", "app.kubernetes.io/name": "vllm"}},
                         "spec": {"containers": [{"name": "web", "image": "nginx"}]}}})
    """)
    folder = _program(tmp_path, main)
    result = runner.invoke(app, ["preview", str(folder), "--no-write", "--output", "json"])
    assert result.exit_code == 1, result.output
    other = json.loads(result.stdout)["otherResources"]
    assert other["manifests"] == 1 and other["manifestProblems"] == []
    assert {v["policy"] for v in other["violations"] if v["level"] == "mandatory"} >= {"images-pinned"}


def test_plan_without_a_stacks_folder_says_how_to_preview(tmp_path):
    result = runner.invoke(app, ["plan", "--stacks-dir", str(tmp_path / "none"), "--no-write"])
    assert result.exit_code == 2, result.output
    assert "vllm-gke preview" in result.output and "--stacks-dir" in result.output


def test_the_quick_start_shows_the_preview():
    text = (REPO_ROOT / "docs" / "quick-start.md").read_text()
    assert "vllm-gke preview examples/python --config gcp:project=" in text


def test_the_program_sees_its_project_folder_as_pulumi_up_shows_it(tmp_path):
    """pulumi.runtime.get_root_directory() is the project's folder, so what finds files beside the stack
    (the config.json cache of models given by id, in stackConfigDir/model-configs) finds the same ones."""
    main = textwrap.dedent("""
        import pulumi
        from vllm_gke.infra.model_configs import default_cache_dir
        open("where.txt", "w").write(pulumi.runtime.get_root_directory() + "|" + str(default_cache_dir()))
    """)
    folder = _program(tmp_path, main)
    (folder / "Pulumi.yaml").write_text("name: team-llm\nruntime: python\nstackConfigDir: cfg\n")
    result = runner.invoke(app, ["preview", str(folder), "--no-write"])
    assert result.exit_code == 0, result.output
    root, cache = (folder / "where.txt").read_text().split("|")
    assert Path(root) == folder.resolve() and Path(cache) == folder.resolve() / "cfg" / "model-configs"


def test_a_relative_program_folder_previews_as_the_docs_write_it(monkeypatch):
    """`vllm-gke preview examples/python` from the checkout, as the quick start has it."""
    monkeypatch.chdir(REPO_ROOT)
    result = runner.invoke(app, ["preview", "examples/python", "-c", "gcp:project=x", "--no-write", "--output", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tenantUrls"]


def test_a_check_across_fields_names_the_key_as_the_code_wrote_it(tmp_path):
    """A 70B model on a 3g.20gb slice: `config.models[qwen-7b]`, not the stack file's `vllm-gke:` key."""
    text = (EXAMPLE / "__main__.py").read_text().replace('"shape": "qwen2.5-7b"', '"shape": "llama-3-70b"')
    result = runner.invoke(app, ["preview", str(_program(tmp_path, text)), "-c", "gcp:project=x", "--no-write"])
    assert result.exit_code == 2, result.output
    assert "config.models[qwen-7b]" in result.output and "vllm-gke:" not in result.output


def test_the_system_pools_check_is_exit_2_in_the_programs_words(tmp_path, monkeypatch):
    from vllm_gke.infra import preview
    from vllm_gke.infra.config import ConfigError, ConfigIssue

    def too_small(*_args):
        raise ConfigError([ConfigIssue("vllm-gke:cluster.systemMaxNodes", "too few; raise vllm-gke:cluster.systemMaxNodes")],
                          "system pool")

    monkeypatch.setattr(preview, "check_system_pool", too_small)
    result = runner.invoke(app, ["preview", str(EXAMPLE), "-c", "gcp:project=x", "--no-write"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "config.cluster.systemMaxNodes: too few; raise config.cluster.systemMaxNodes" in result.output


@pytest.mark.parametrize("main, said", [
    ("def build():\n    raise ValueError('no such region')\n\nbuild()\n",
     "raised ValueError: no such region (at __main__.py:4 in <module>, __main__.py:2 in build)"),
    ("from vllm_gke.components.model.specs import NodePoolSpec\nNodePoolSpec.model_validate("
     "{'name': 'gpu', 'machineType': 'g2-standard-8', 'minNode': 0})\n", "NodePoolSpec.minNode: is not a known setting"),
])
def test_the_programs_own_failure_is_exit_2_with_its_own_frames(tmp_path, main, said):
    result = runner.invoke(app, ["preview", str(_program(tmp_path, main)), "--no-write"])
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()) and "Traceback" not in result.output
    assert "infra/preview.py" not in result.output


def test_project_config_defaults_and_what_the_program_prints(tmp_path):
    """Pulumi.yaml's config defaults reach the program (the stack file overrides them), and what the
    program prints does not corrupt the JSON on standard output."""
    main = "import pulumi\nprint('hello from the program')\nopen('seen.txt', 'w').write(pulumi.Config().require('team'))\n"
    folder = _program(tmp_path, main)
    (folder / "Pulumi.yaml").write_text("name: team-llm\nruntime: python\nconfig:\n  team:\n    default: search\n")
    result = runner.invoke(app, ["preview", str(folder), "--no-write", "--output", "json"])
    assert result.exit_code == 0, result.output
    assert (folder / "seen.txt").read_text() == "search"
    assert json.loads(result.stdout)["otherResources"]["resources"] == 0


def test_two_platforms_of_one_name_are_refused(tmp_path):
    text = (EXAMPLE / "__main__.py").read_text() + (
        "\nclass Eu(pulumi.ComponentResource):\n    def __init__(self):\n        super().__init__('team:index:Eu', 'eu')\n"
        "        Platform('llm', PlatformArgs(config), pulumi.ResourceOptions(parent=self))\n\nEu()\n")
    result = runner.invoke(app, ["preview", str(_program(tmp_path, text)), "-c", "gcp:project=x", "--no-write"])
    assert result.exit_code == 2, result.output
    assert "two Platforms are named 'llm'" in result.output


def test_a_stack_the_project_lacks_is_named(tmp_path):
    folder = _program(tmp_path, "pass\n", stack_config="config: {}\n")
    result = runner.invoke(app, ["preview", str(folder), "--stack", "prdo", "--no-write"])
    assert result.exit_code == 2 and "no stack 'prdo'" in result.output and "dev" in result.output


@pytest.mark.parametrize("code", ["0", "'missing setting FOO'"])
def test_a_program_that_exits_is_exit_2_not_a_clean_plan(tmp_path, code):
    folder = _program(tmp_path, f"import sys\nsys.exit({code})\n")
    result = runner.invoke(app, ["preview", str(folder), "--no-write", "--output", "json"])
    assert result.exit_code == 2 and "exited" in result.output and "Traceback" not in result.output, result.output
