"""The linter and the type checker, as CI runs them, each with its configuration in pyproject.toml:
ruff over the whole repository, pyright over components/, infra/, policies/, images/ and
benchmarks/. Any finding fails, warnings included. The tools are the venv's (the test extra pins
them), found next to this interpreter; under CI=true a missing one fails rather than skips.

Where VLLM_PYTHON names a python with the pinned vLLM (as for tests/test_guard_in_vllm.py), the
files whose imports need it are checked a second time against that venv."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest
import tomllib

from tests.conftest import REPO_ROOT

BIN = Path(sys.executable).parent
CHECKED = ("components", "infra", "policies", "images", "benchmarks")
# The one use of `# type: ignore` in this repo: an import from vLLM's own venv (see [tool.pyright]).
OPTIONAL_IMPORT = "# type: ignore[import-not-found]"
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore")


def _tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed next to {sys.executable}; the test extra pins it: "
                        "pip install -e '.[test]'")
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def _pyright(tmp_path: Path, python: str, files: Sequence[str] = (), **settings: object) -> list[str]:
    """pyright's findings (errors, warnings and information alike) as `path:line:col: rule: message`.
    Run from a config that extends pyproject's, so it checks with the given interpreter's packages
    rather than the venv the config names."""
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"extends": str(REPO_ROOT / "pyproject.toml"), "venv": "", **settings}))
    result = subprocess.run([_tool("pyright"), "--outputjson", "-p", str(config), "--pythonpath", python, *files],
                            cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"})
    try:
        report = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"pyright did not run (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    found = []
    for d in report["generalDiagnostics"]:
        start = d.get("range", {}).get("start", {"line": -1, "character": -1})
        where = f"{Path(d['file']).relative_to(REPO_ROOT)}:{start['line'] + 1}:{start['character'] + 1}"
        found.append(f"{where}: {d['severity']}: {d.get('rule', '')}: {d['message']}")
    assert report["summary"]["filesAnalyzed"] > 0, result.stdout[-3000:]
    return found


def _python_files() -> list[Path]:
    return sorted(p for folder in CHECKED for p in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _optional_import_files() -> list[str]:
    """The checked files that import from vLLM's venv (they carry OPTIONAL_IMPORT)."""
    return [str(p.relative_to(REPO_ROOT)) for p in _python_files() if OPTIONAL_IMPORT in p.read_text()]


def test_ruff_finds_nothing():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_ruff_covers_every_folder():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "--show-files", "."], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True)
    shown = {Path(line.strip()).resolve() for line in result.stdout.splitlines() if line.strip().endswith(".py")}
    for folder in (*CHECKED, "tests"):
        assert any(REPO_ROOT / folder in p.parents for p in shown), f"ruff checks nothing in {folder}/"


def test_pyright_finds_nothing(tmp_path):
    found = _pyright(tmp_path, sys.executable)
    assert not found, "\n".join(found)


def test_pyright_finds_nothing_in_the_vllm_files_against_vllm(tmp_path):
    """The files importing vLLM (and its server's packages), against the pinned vLLM: there the
    imports must resolve (`# type: ignore` off) and everything using them must type-check."""
    vllm_python = os.environ.get("VLLM_PYTHON", "")
    if not vllm_python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the vLLM files against the real vLLM: .ci/run installs it and sets VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    files = _optional_import_files()
    assert files, "no file imports from vLLM's venv: the second run would check nothing"
    found = _pyright(tmp_path, vllm_python, files, enableTypeIgnoreComments=False)
    assert not found, "\n".join(found)


def test_type_ignore_marks_only_optional_imports():
    """The second pyright run turns `# type: ignore` off to check these imports; anything else
    silenced that way would fail there, or, outside the vLLM files, go unchecked forever: a
    finding silenced on one line says `# pyright: ignore[rule]` instead."""
    misused = []
    for path in _python_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if TYPE_IGNORE.search(line) and not (OPTIONAL_IMPORT in line and re.match(r"\s*(from|import)\s", line)):
                misused.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not misused, "\n".join(misused)


def test_pyright_resolves_the_installed_layout():
    """typings/vllm_gke links each vllm_gke.<folder> package to its folder, as setuptools maps it."""
    package_dir = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = {name.split(".")[1]: folder.split("/")[0] for name, folder in package_dir.items()}
    links = REPO_ROOT / "typings" / "vllm_gke"
    assert (links / "__init__.py").is_file()
    for name, folder in top.items():
        assert (links / name).is_symlink() and (links / name).resolve() == REPO_ROOT / folder, name


def test_the_package_exports_are_spelt_out():
    """components/provider/__init__.py spells __all__ out (static tools read no computed one)."""
    import vllm_gke.components.provider as package

    assert package.__all__ == ["COMPONENTS", *(c.__name__ for c in package.COMPONENTS)]
