"""Installed as users install it: a built wheel in a fresh environment (not this checkout's
editable one), planning a stacks folder outside the checkout; and the components importable
without the plan's extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PLAN_ONLY = ("typer", "rich", "kubernetes_validate", "jsonschema", "celpy", "pulumi_policy", "google.cloud.monitoring",
             "google.cloud.monitoring_dashboard")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding the built wheel; its dependencies come from the test environment's
    site-packages (a path entry: that environment's editable vllm_gke hook is not loaded)."""
    tmp = tmp_path_factory.mktemp("install")
    # From a copy of the sources: setuptools reuses a checkout's build/ folder, stale files and all.
    source = tmp / "source"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".vllm", "build", "dist", "plan-out", "node_modules", "__pycache__", "*.egg-info", "venv"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp / "dist").glob("vllm_gke-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    python = tmp / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return tmp


def test_the_wheel_plans_a_stack_outside_the_checkout(installed, tmp_path):
    project = tmp_path / "platform"
    (project / "stacks").mkdir(parents=True)
    (project / "stacks" / "Pulumi.dev.yaml").write_text((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    where = subprocess.run([installed / "venv" / "bin" / "python", "-c", "import vllm_gke.infra; print(vllm_gke.infra.__file__)"],
                           cwd=project, env=env, capture_output=True, text=True, check=True).stdout
    assert str(REPO_ROOT) not in where  # the installed copy, not the checkout
    result = subprocess.run([installed / "venv" / "bin" / "vllm-gke", "plan", "--stack", "dev"], cwd=project, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert (project / "plan-out" / "dev" / "manifests" / "all.yaml").exists()


def test_the_wheel_holds_the_guard_package(installed):
    """The guard is a package (images/vllm_gke_guard/), listed in [tool.setuptools] packages: every
    module of it is in the wheel, and the installed copy imports."""
    (wheel,) = (installed / "dist").glob("vllm_gke-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {f"vllm_gke/images/vllm_gke_guard/{p.name}" for p in (REPO_ROOT / "images" / "vllm_gke_guard").glob("*.py")}
    assert "vllm_gke/images/vllm_gke_guard/middleware.py" in modules
    assert modules <= names, sorted(modules - names)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    where = subprocess.run([installed / "venv" / "bin" / "python", "-c",
                            "import vllm_gke.images.vllm_gke_guard as g; print(g.GuardMiddleware.__module__, g.__file__)"],
                           cwd=installed, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith("vllm_gke.images.vllm_gke_guard.middleware ") and str(REPO_ROOT) not in where


def test_the_components_need_nothing_from_the_plan_extra():
    """A user's Pulumi program imports the components (and the package hosts them) with only the
    core dependencies: none of the plan's checks' libraries may be imported on the way."""
    blocker = (
        "import sys, importlib.abc\n"
        f"BLOCKED = {PLAN_ONLY!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == b or name.startswith(b + '.') for b in BLOCKED):\n"
        "            raise ModuleNotFoundError(f'plan-only module imported: {name}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pkgutil, importlib, vllm_gke.components\n"
        "for m in pkgutil.walk_packages(vllm_gke.components.__path__, 'vllm_gke.components.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_command_without_the_plan_extra_says_how_to_get_it():
    code = ("import sys\nsys.modules['typer'] = None\nfrom vllm_gke.infra.entry import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2 and "pip install 'vllm-gke[plan]'" in result.stderr and "Traceback" not in result.stderr
