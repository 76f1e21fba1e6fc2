"""The code's layers hold on disk: the model layer (components/model/) and the policy pack's rules
load no Pulumi SDK, product functions stay short enough to read at once, and imports sit at the
top of modules (benchmarks/code_metrics.py measures the same things and reports them)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from benchmarks import code_metrics
from tests.conftest import REPO_ROOT

PULUMI_SDKS = ("pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_policy")
# The longest a product function may be: a screen.
MAX_FUNCTION_LINES = 80


def _loaded_after(statement: str) -> list[str]:
    """The top-level packages a fresh interpreter has loaded after running `statement`."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _model_modules() -> list[str]:
    root = REPO_ROOT / "components" / "model"
    return sorted(".".join(("vllm_gke", "components", "model", *p.relative_to(root).with_suffix("").parts))
                  .removesuffix(".__init__") for p in root.rglob("*.py"))


def test_the_model_layer_loads_no_pulumi_sdk():
    imports = "\n".join(f"import {m}" for m in _model_modules())
    loaded = _loaded_after(imports)
    assert not set(PULUMI_SDKS) & set(loaded), "components/model/ must not import a Pulumi SDK"


def test_the_model_layer_imports_only_itself_from_the_project():
    """Nothing in components/model/ reaches up into the components, the plan or the policies."""
    root = REPO_ROOT / "components" / "model"
    for path in root.rglob("*.py"):
        depth = len(path.relative_to(root).parts)  # model/x.py: 1, model/specs/x.py: 2
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > depth:
                pytest.fail(f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports above the model layer")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad = [n for n in names if n.split(".")[0] in PULUMI_SDKS or
                       (n.startswith("vllm_gke.") and not (n + ".").startswith("vllm_gke.components.model."))]
                assert not bad, f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {bad}"


def test_the_policy_rules_load_no_pulumi_sdk():
    """The rules CrossGuard runs (and the plan judges with) need the model layer only."""
    assert not set(PULUMI_SDKS) & set(_loaded_after("import vllm_gke.policies.rules"))


def test_the_policy_pack_loads_no_cloud_sdk():
    """The pack itself needs pulumi_policy (and so pulumi), not the providers' SDKs."""
    loaded = set(_loaded_after("import vllm_gke.policies.pack"))
    assert "pulumi_policy" in loaded
    assert not {"pulumi_gcp", "pulumi_kubernetes"} & loaded


def test_no_product_function_is_longer_than_a_screen():
    long = [f"{f.path}:{f.name} ({f.lines} lines)" for f in code_metrics.functions(code_metrics.product_files())
            if f.lines > MAX_FUNCTION_LINES]
    assert not long, "split these into functions that read at once:\n" + "\n".join(long)


def test_components_and_the_model_layer_import_at_the_top():
    """An import inside a function body hides a dependency (often a cycle dodged): the components,
    the package and the model layer have none."""
    files = [p for p in code_metrics.product_files() if p.relative_to(REPO_ROOT).parts[0] == "components"
             and "scripts" not in p.parts]  # the pod scripts run in the pod, on its Python
    assert code_metrics.inner_imports(files) == []


def test_the_metrics_see_a_long_function_and_an_inner_import(tmp_path):
    """The two checks above would catch what they look for."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef lazy():\n    import json\n    return json\n")
    found = {f.name: f.lines for f in code_metrics.functions([tmp_path / "m.py"], root=tmp_path)}
    assert found["long"] > MAX_FUNCTION_LINES
    assert code_metrics.inner_imports([tmp_path / "m.py"], root=tmp_path) == [f"m.py:{MAX_FUNCTION_LINES + 5}"]
