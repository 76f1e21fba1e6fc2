"""The docs generated from the code, so they cannot drift from what they describe.

`vllm-gke docs` writes them; tests/test_docs.py regenerates them in memory and fails on any
difference, and checks every link:

- docs/reference/config.md: every stack config key, nested, from the pydantic models that validate
  it (components/model/specs/, components/model/stack_config.py): type, default, allowed values and ranges, and
  the comment on each field there (the same text the component package's schema carries)
  (config_reference.py);
- docs/reference/policies.md: the policy pack's table (policies/rules.py POLICIES) (policy_reference.py);
- docs/reference/components.md: the component package's Pulumi schema (`vllm-gke schema`)
  (component_reference.py);
- blocks of hand-written pages, between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers: the
  code's layers drawn from the import graph (`code-layers`, layers.py), the platform picture of
  docs/architecture.md copied into the README (`platform`), and the examples the overview shows
  (`include:<path>`) (blocks.py).

The link check (links.py) reads README.md and docs/**/*.md as GitHub renders them: every relative
link names a file that exists and every #anchor a heading of that page (GitHub's slugs; mkdocs.yml
gives mkdocs the same slugs through `github_slug`, so `mkdocs build --strict` agrees).

What the pages share (their paths, the footer, GitHub's slugs) is in common.py; this module puts
the pages together and writes them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from .blocks import block_content, block_names, fill_blocks
from .common import (
    ARCHITECTURE_PAGE,
    BLOCK_PAGES,
    COMMAND,
    COMPONENTS_PAGE,
    CONFIG_PAGE,
    POLICIES_PAGE,
    REPO_ROOT,
    footer,
    github_slug,
)
from .component_reference import components_page, package_schema
from .config_reference import config_page
from .layers import LAYERS, RUNTIME_EDGES, SOURCE_FOLDERS, Layer, code_layers, import_edges, layer_edges, layer_of
from .links import anchors, broken_links, doc_files, link_targets
from .policy_reference import POLICY_PREAMBLE, policies_page

__all__ = [
    "ARCHITECTURE_PAGE", "BLOCK_PAGES", "COMMAND", "COMPONENTS_PAGE", "CONFIG_PAGE", "LAYERS", "POLICIES_PAGE",
    "POLICY_PREAMBLE", "REPO_ROOT", "RUNTIME_EDGES", "SOURCE_FOLDERS", "Layer", "anchors", "block_content",
    "block_names", "broken_links", "code_layers", "components_page", "config_page", "doc_files", "fill_blocks",
    "footer", "generated", "github_slug", "import_edges", "layer_edges", "layer_of", "link_targets", "main",
    "package_schema", "policies_page", "stale", "write",
]


def generated(root: Path = REPO_ROOT, schema: Optional[Mapping[str, Any]] = None) -> dict[Path, str]:
    """Every generated page and every hand-written page with its blocks filled, by path relative to
    the repository."""
    pages = {CONFIG_PAGE: config_page(), POLICIES_PAGE: policies_page(),
             COMPONENTS_PAGE: components_page(schema if schema is not None else package_schema())}
    for page in BLOCK_PAGES:
        pages[page] = fill_blocks((root / page).read_text(), root)
    return pages


def stale(root: Path = REPO_ROOT, schema: Optional[Mapping[str, Any]] = None) -> list[Path]:
    return [path for path, text in generated(root, schema).items()
            if not (root / path).exists() or (root / path).read_text() != text]


def write(root: Path = REPO_ROOT) -> list[Path]:
    changed = []
    for path, text in generated(root).items():
        target = root / path
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed


def main(argv: Optional[list[str]] = None) -> int:
    changed = write()
    print("\n".join(f"wrote {p}" for p in changed) or "the docs were up to date")
    problems = broken_links(doc_files())
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    return 1 if problems else 0
