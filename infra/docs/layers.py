"""The code's layers, drawn from the import graph (the `code-layers` block of README.md and
docs/architecture.md)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .common import REPO_ROOT


@dataclass(frozen=True)
class Layer:
    id: str
    label: str
    where: str
    # Folders or files (relative to the repository) whose modules the layer holds; the first that
    # matches a module wins.
    paths: tuple[str, ...]


LAYERS: tuple[Layer, ...] = (
    Layer("model", "model layer: config, catalogs, capacity, argv, pods", "components/model/ (no Pulumi)",
          ("components/model/",)),
    Layer("scripts", "pod scripts", "components/scripts/", ("components/scripts/",)),
    Layer("package", "component package", "components/provider/", ("components/provider/",)),
    Layer("components", "components", "components/*.py", ("components/",)),
    Layer("program", "stack program", "infra/program.py, __main__.py, config.py",
          ("infra/program.py", "infra/__main__.py", "infra/config.py", "infra/model_configs.py")),
    Layer("plan", "offline plan and CLI", "infra/", ("infra/",)),
    Layer("policies", "policy pack", "policies/", ("policies/",)),
    Layer("images", "server image", "images/: serve.py, vllm_gke_guard/", ("images/",)),
)
# What ties layers together other than an import: drawn dashed.
RUNTIME_EDGES: tuple[tuple[str, str, str], ...] = (
    ("components", "images", "declare the pods that run"),
    ("components", "scripts", "mount and run in pods"),
    ("policies", "program", "judge under pulumi preview"),
)
SOURCE_FOLDERS = ("components", "infra", "policies", "images")


def layer_of(path: str) -> Optional[Layer]:
    return next((layer for layer in LAYERS if any(path == p or (p.endswith("/") and path.startswith(p))
                                                  for p in layer.paths)), None)


def _modules(root: Path) -> dict[str, Path]:
    """vllm_gke.<folder>.<...> -> file, for every module of the installed package's folders."""
    out = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(("vllm_gke", *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def import_edges(root: Path = REPO_ROOT) -> set[tuple[str, str]]:
    """(importer, imported) for every import between the project's own modules, relative or
    absolute, at module level or inside functions."""
    modules = _modules(root)
    edges = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target.split(".")[0] in SOURCE_FOLDERS:
                    target = f"vllm_gke.{target}"
                if target in modules and target != name:
                    edges.add((name, target))
    return edges


def layer_edges(root: Path = REPO_ROOT) -> set[tuple[str, str]]:
    """(layer that is imported, layer that imports it) across layers."""
    modules = _modules(root)

    def layer(module: str) -> Optional[Layer]:
        return layer_of(modules[module].relative_to(root).as_posix())

    out = set()
    for importer, imported in import_edges(root):
        a, b = layer(imported), layer(importer)
        if a is not None and b is not None and a != b:
            out.add((a.id, b.id))
    return out


def code_layers(root: Path = REPO_ROOT) -> str:
    """The code's layers as a Mermaid flowchart: a solid arrow from a layer to one that imports it,
    dashed ones for what ties them at run time."""
    out = ["flowchart LR"]
    for layer in LAYERS:
        out.append(f'  {layer.id}["{layer.label}<br/>{layer.where}"]')
    for a, b in sorted(layer_edges(root), key=lambda e: ([x.id for x in LAYERS].index(e[0]), e[1])):
        out.append(f"  {a} --> {b}")
    for a, b, label in RUNTIME_EDGES:
        out.append(f'  {a} -.->|"{label}"| {b}')
    return "\n".join(out) + "\n"
