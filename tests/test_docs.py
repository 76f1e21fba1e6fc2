"""The docs generated from the code are current, the README is a front page, and the docs build:
every link and #anchor of README.md and docs/ resolves (GitHub's slugs), and `mkdocs build
--strict` passes - and fails on a broken link or anchor."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.infra import docs

TWO_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/vllm-gke plan --stack dev\n"
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -q\n"
)


@pytest.fixture(scope="module")
def schema():
    return docs.package_schema()


def test_the_generated_pages_are_current(schema):
    """docs/reference/ and the generated blocks of README.md and docs/ are what the code makes now."""
    stale = [str(p) for p in docs.stale(schema=schema)]
    assert not stale, f"stale: {', '.join(stale)}; run: vllm-gke docs"


def test_the_command_checks_without_writing():
    """`vllm-gke docs --check` passes on the repository as committed (and writes nothing)."""
    from typer.testing import CliRunner

    from vllm_gke.infra.cli import app

    pages = (docs.CONFIG_PAGE, docs.POLICIES_PAGE, docs.COMPONENTS_PAGE, *docs.BLOCK_PAGES)
    before = {p: (REPO_ROOT / p).read_text() for p in pages}
    result = CliRunner().invoke(app, ["docs", "--check"])
    assert result.exit_code == 0, result.output
    assert {p: (REPO_ROOT / p).read_text() for p in before} == before


def test_generated_pages_say_so():
    for page in (docs.CONFIG_PAGE, docs.POLICIES_PAGE, docs.COMPONENTS_PAGE):
        last = (REPO_ROOT / page).read_text().rstrip().splitlines()[-1]
        assert "Generated" in last and "`vllm-gke docs`" in last, page


def test_the_config_reference_names_every_key_the_models_take(schema):
    """Every field of every spec the stack config reaches is a row, under its camelCase key."""
    from vllm_gke.components.model.stack_config import StackConfig
    from vllm_gke.infra.config import FOREIGN_KEYS

    text = (REPO_ROOT / docs.CONFIG_PAGE).read_text()
    for key in ("vllm-gke:nodePools", "gcp:project", "`hyperdiskThroughputMiBps`", "`readThroughputMiBps`",
                "`customShape`", "`tokensPerMinute`", "`gpuPartitionSize`", "## vllm-gke:models[].adapters[]"):
        assert key in text, key
    for name, field in StackConfig.model_fields.items():
        assert f"`{FOREIGN_KEYS.get(name, 'vllm-gke:' + (field.alias or name))}`" in text, name
    # The values a validator holds a field to come from the table it checks against.
    assert "`a2-ultragpu-8g`" in text and "`qwen2.5-72b`" in text and "`320`" in text


def test_the_policy_reference_lists_the_pack():
    from vllm_gke.policies.rules import POLICIES

    text = (REPO_ROOT / docs.POLICIES_PAGE).read_text()
    for p in POLICIES:
        assert re.search(rf"^\| `{re.escape(p.name)}` \| {p.level} \| .*Rejects", text, re.M), p.name


def test_the_component_reference_lists_the_package(schema):
    text = (REPO_ROOT / docs.COMPONENTS_PAGE).read_text()
    for token, resource in schema["resources"].items():
        assert f"## {token.rsplit(':', 1)[1]}\n" in text
        for name in resource.get("inputProperties") or {}:
            assert f"| `{name}` |" in text, (token, name)


def test_the_readme_is_a_front_page():
    """The two commands first, exactly; then what it is, the pictures, and links into docs/."""
    readme = (REPO_ROOT / "README.md").read_text()
    first = re.match(r"# vllm-gke\n\n```sh\n(.*?)```\n", readme, re.S)
    assert first and first.group(1) == TWO_COMMANDS
    assert len(readme.splitlines()) < 150
    assert readme.count("```mermaid") == 2
    for page in ("docs/quick-start.md", "docs/architecture.md", "docs/reference/config.md",
                 "docs/reference/policies.md", "docs/reference/components.md", "docs/installation-configuration.md"):
        assert f"]({page}" in readme, page


def test_the_layers_picture_is_the_import_graph():
    """The committed picture of the code's layers is the one the import graph draws, and the
    layering it shows holds: the model layer imports no other layer, nothing reaches from the
    program or the plan down past the components into a layer above it, nothing imports the plan."""
    drawn = docs.code_layers()
    for page in ("README.md", "docs/architecture.md"):
        block = re.search(r"<!-- code-layers:begin -->\n```mermaid\n(.*?)```\n<!-- code-layers:end -->",
                          (REPO_ROOT / page).read_text(), re.S)
        assert block and block.group(1) == drawn, f"{page}: run vllm-gke docs"
    edges = docs.layer_edges()
    assert {("model", "components"), ("model", "policies"), ("components", "program"), ("program", "plan"),
            ("policies", "plan")} <= edges
    assert not {e for e in edges if e[1] == "model"}, "the model layer imports no other layer"
    assert not {e for e in edges if e[0] in ("program", "plan") and e[1] in ("model", "components")}
    assert {e for e in edges if e[0] == "policies"} == {("policies", "plan")}, "only the plan runs the policies"
    assert {e for e in edges if e[1] == "policies"} == {("model", "policies")}, "the policies read the model only"
    assert not {e for e in edges if e[0] == "plan"}


def test_imports_are_read_relative_and_absolute(tmp_path):
    (tmp_path / "components" / "specs").mkdir(parents=True)
    (tmp_path / "infra").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("")
    (tmp_path / "components" / "specs" / "__init__.py").write_text("from ..catalog import X\n")
    (tmp_path / "components" / "catalog.py").write_text("X = 1\n")
    (tmp_path / "infra" / "plan.py").write_text("def f():\n    from vllm_gke.components.specs import X\n")
    (tmp_path / "infra" / "program.py").write_text("from ..components import catalog\n")
    assert docs.import_edges(tmp_path) == {
        ("vllm_gke.components.specs", "vllm_gke.components.catalog"),
        ("vllm_gke.infra.plan", "vllm_gke.components.specs"),
        ("vllm_gke.infra.program", "vllm_gke.components"),
        ("vllm_gke.infra.program", "vllm_gke.components.catalog")}


def test_every_link_and_anchor_resolves():
    assert docs.broken_links(docs.doc_files()) == []


def test_github_slugs():
    assert docs.github_slug("What the first `pulumi up` creates, in order") == "what-the-first-pulumi-up-creates-in-order"
    assert docs.github_slug("vllm-gke:models[].short") == "vllm-gkemodelsshort"
    assert docs.github_slug("Capacity & cost") == "capacity--cost"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "# Title\n\n## Usage\n\n## Usage\n\n"
        "[ok](docs/guides/a.md) [ok](docs/guides/a.md#the-part) [ok](#usage-1) [ok](https://example.com/x)\n"
        "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](docs/missing.md) [bad anchor](docs/guides/a.md#no-such-part) [here](#nothing)\n"
        "[absolute](/docs/guides/a.md)\n")
    (tmp_path / "docs" / "guides" / "a.md").write_text("# A\n\n## The part\n\n[up](../../README.md#usage)\n")
    problems = docs.broken_links(docs.doc_files(tmp_path), tmp_path)
    assert problems == ["README.md: docs/missing.md (no such file)",
                        "README.md: docs/guides/a.md#no-such-part (no heading #no-such-part in docs/guides/a.md)",
                        "README.md: #nothing (no heading #nothing in README.md)",
                        "README.md: /docs/guides/a.md (an absolute path; link relative to the page)"]


def _mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed; the test extra pins it: pip install -e '.[test]'")
        pytest.skip("mkdocs is not installed (pip install -e '.[test]')")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, cwd=config.parent)


def test_the_docs_build_strictly(tmp_path):
    _mkdocs()
    result = _build(REPO_ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()
    # The overview (docs/_index.md, the Pulumi Registry's name for it) is the site's root page.
    assert "they resolve on GitHub and on the" in (tmp_path / "site" / "index.html").read_text()
    assert not (tmp_path / "site" / "_index").exists()
    # The pictures are drawn on the site as on GitHub: a mermaid block is a diagram, not code.
    page = (tmp_path / "site" / "architecture" / "index.html").read_text()
    assert '<div class="mermaid">flowchart' in page and "language-mermaid" not in page
    assert 'src="../js/mermaid.mjs" type="module"' in page
    assert (tmp_path / "site" / "js" / "mermaid.mjs").exists()


def test_the_docs_build_fails_on_a_broken_link_or_anchor(tmp_path):
    """The repository's mkdocs settings (less its nav) on a page with a broken link, then a broken
    anchor: each fails the strict build; the same page with both fixed builds."""
    _mkdocs()
    settings = (REPO_ROOT / "mkdocs.yml").read_text()
    settings = re.sub(r"^nav:\n(?:^[ -].*\n)+", "", settings, flags=re.M)
    settings = settings.replace("infra/docs/site_hooks.py", str(REPO_ROOT / "infra" / "docs" / "site_hooks.py"))
    (tmp_path / "mkdocs.yml").write_text(settings)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## What the first `pulumi up` creates, in order\n")
    for link, broken in (("b.md#what-the-first-pulumi-up-creates-in-order", False), ("missing.md", True),
                         ("b.md#no-such-heading", True)):
        (tmp_path / "docs" / "index.md").write_text(f"# Home\n\n[there]({link})\n")
        result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert (result.returncode != 0) == broken, (link, result.stdout + result.stderr)
        if broken:
            assert link.split("#")[-1] in result.stdout + result.stderr


def test_the_pages_that_name_the_readme_commands_show_them_as_the_readme_gives_them():
    readme = (REPO_ROOT / "README.md").read_text()
    plan, tests = re.search(r"```sh\n(.*?)\n(.*?)\n```", readme).groups()
    assert plan in (REPO_ROOT / "docs" / "quick-start.md").read_text()
    assert tests in (REPO_ROOT / "docs" / "testing.md").read_text()
