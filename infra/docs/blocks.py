"""Blocks of hand-written pages, between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers: the
code's layers (`code-layers`), the platform picture of docs/architecture.md copied into the README
(`platform`), and the examples the overview shows (`include:<path>`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .common import ARCHITECTURE_PAGE, REPO_ROOT
from .layers import code_layers


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {re.escape(name)}:begin[^>]*-->\n)(.*?)(<!-- {re.escape(name)}:end -->)", re.S)


def block_names(text: str) -> list[str]:
    return re.findall(r"<!-- (\S+?):begin", text)


def _fence(path: str) -> str:
    return {".py": "python", ".ts": "typescript", ".yaml": "yaml", ".json": "json"}.get(Path(path).suffix, "")


def block_content(name: str, root: Path = REPO_ROOT) -> Optional[str]:
    """What a generated block holds; None for blocks this module does not fill (the plan's pictures)."""
    if name == "code-layers":
        return f"```mermaid\n{code_layers(root)}```\n"
    if name == "platform":
        match = _block("platform-source").search((root / ARCHITECTURE_PAGE).read_text())
        if match is None:
            raise ValueError(f"{ARCHITECTURE_PAGE} has lost its platform-source markers")
        return match.group(2)
    if name.startswith("include:"):
        path = name.removeprefix("include:")
        return f"```{_fence(path)}\n{(root / path).read_text().rstrip()}\n```\n"
    return None


def fill_blocks(text: str, root: Path = REPO_ROOT) -> str:
    for name in block_names(text):
        content = block_content(name, root)
        if content is not None:
            text = _block(name).sub(lambda m, c=content: m.group(1) + c + m.group(3), text)
    return text
