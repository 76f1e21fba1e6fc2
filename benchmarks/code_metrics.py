"""The code's shape in numbers: the largest functions, imports inside function bodies, lines per file,
and how long the policy pack's rules take to import (each in a fresh interpreter, median of five).

    .venv/bin/python benchmarks/code_metrics.py [--json]

Product code is what ships: components/, infra/, policies/, images/ (not tests/, benchmarks/, the
generated components/provider/types.py). docs/architecture.md records the figures before and after
the model layer was split out (issue 36); tests/test_layers.py holds the limits.
"""

from __future__ import annotations

import ast
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("components", "infra", "policies", "images")
GENERATED = {"components/provider/types.py"}
POLICY_RULES = "vllm_gke.policies.rules"


@dataclass(frozen=True)
class Function:
    path: str
    name: str
    lines: int


def product_files() -> list[Path]:
    files = [p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if p.relative_to(ROOT).as_posix() not in GENERATED]


def _functions(tree: ast.AST, path: str, prefix: str = "") -> list[Function]:
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            found.append(Function(path, name, (node.end_lineno or node.lineno) - node.lineno + 1))
            found += _functions(node, path, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, path, f"{prefix}{node.name}.")
        else:
            found += _functions(node, path, prefix)
    return found


def functions(files: list[Path], root: Path = ROOT) -> list[Function]:
    return [f for p in files for f in _functions(ast.parse(p.read_text()), p.relative_to(root).as_posix())]


def inner_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """`import` statements inside a function body: each one a cycle dodged or a cost deferred."""
    found = []
    for p in files:
        for fn in ast.walk(ast.parse(p.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{p.relative_to(root).as_posix()}:{n.lineno}" for n in ast.walk(fn)
                          if isinstance(n, (ast.Import, ast.ImportFrom))]
    return sorted(set(found))


def import_ms(module: str, runs: int = 5) -> float:
    code = (f"import time; t = time.perf_counter(); import {module}; "
            "print((time.perf_counter() - t) * 1000)")
    times = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                  text=True).stdout) for _ in range(runs)]
    return round(statistics.median(times), 1)


def metrics() -> dict:
    files = product_files()
    fns = sorted(functions(files), key=lambda f: -f.lines)
    lines = sorted(len(p.read_text().splitlines()) for p in files)
    return {
        "largest_functions": [f"{f.path}:{f.name} {f.lines}" for f in fns[:8]],
        "functions_over_80_lines": sum(f.lines > 80 for f in fns),
        "imports_inside_functions": len(inner_imports(files)),
        "policy_rules_import_ms": import_ms(POLICY_RULES),
        "files": len(files),
        "lines_per_file": {"median": statistics.median(lines), "max": lines[-1],
                           "over_400": sum(n > 400 for n in lines)},
    }


if __name__ == "__main__":
    result = metrics()
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
