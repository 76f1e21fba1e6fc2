"""What the generated pages share: where they are, the footer that names the command, a table cell,
and GitHub's heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
COMMAND = "vllm-gke docs"
CONFIG_PAGE = Path("docs/reference/config.md")
POLICIES_PAGE = Path("docs/reference/policies.md")
COMPONENTS_PAGE = Path("docs/reference/components.md")
ARCHITECTURE_PAGE = Path("docs/architecture.md")
# Hand-written pages that hold generated blocks.
BLOCK_PAGES = (Path("README.md"), ARCHITECTURE_PAGE, Path("docs/_index.md"))


def footer(source: str) -> str:
    return f"\n_Generated from {source} by `{COMMAND}`: edit the code, not this page._\n"


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped, and `<`, `>` outside code spans as entities
    (`/<name>/v1` would read as an HTML tag)."""
    parts = re.split(r"(`[^`]*`)", re.sub(r"\s+", " ", text).strip())
    text = "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
    return text.replace("|", "\\|")


def github_slug(value: str, separator: str = "-") -> str:
    """A heading's anchor as GitHub makes it (github-slugger): lowercase, every character but
    letters, digits, '_', '-' and spaces dropped, each space a '-'. Also mkdocs' slugify (mkdocs.yml),
    which passes the heading's text and a separator."""
    del separator  # GitHub's is always '-'
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", "-")
