"""The link check: README.md and docs/**/*.md as GitHub renders them. Every relative link names a
file that exists and every #anchor a heading of that page (GitHub's slugs; mkdocs.yml gives mkdocs
the same slugs through `github_slug`, so `mkdocs build --strict` agrees)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Iterator

from .common import REPO_ROOT, github_slug

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text with front matter, fenced code and code spans blanked (links there are not links)."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    text = _FENCE.sub("", text)
    return _CODE.sub("", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page: each heading's slug (repeats numbered -1, -2, ...) and any
    id or name an HTML element sets."""
    seen: dict[str, int] = {}
    out = set()
    for match in _HEADING.finditer(_FENCE.sub("", re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S))):
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))
        title = re.sub(r"<[^>]+>", "", title)
        slug = github_slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r"<[^>]+\s(?:id|name)=\"([^\"]+)\"", text))
    return out


def link_targets(text: str) -> Iterator[str]:
    for match in _LINK.finditer(_prose(text)):
        yield match.group(1)


def broken_links(files: Iterable[Path], root: Path = REPO_ROOT) -> list[str]:
    """'file: link (why)' for every relative link that names no file of the repository, and every
    #anchor that names no heading of its page."""
    problems = []
    for path in files:
        text = path.read_text()
        for target in link_targets(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path.resolve()
            where = f"{path.relative_to(root).as_posix()}: {target}"
            if file_part.startswith("/"):
                problems.append(f"{where} (an absolute path; link relative to the page)")
            elif not dest.exists():
                problems.append(f"{where} (no such file)")
            elif root.resolve() not in (dest, *dest.parents):
                problems.append(f"{where} (outside the repository)")
            elif anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                problems.append(f"{where} (no heading #{anchor} in {dest.relative_to(root.resolve()).as_posix()})")
    return problems


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    return [p for p in (root / "README.md", root / "CONTRIBUTING.md") if p.exists()] + sorted((root / "docs").rglob("*.md"))
