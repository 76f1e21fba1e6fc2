"""mkdocs hooks for the docs site (mkdocs.yml names this file under `hooks:`)."""

from __future__ import annotations

from mkdocs.structure.files import Files


def on_files(files: Files, config: object) -> Files:
    """docs/_index.md is the overview (the leading underscore keeps it first in the folder, as
    Hugo-style trees do); mkdocs would publish it at /_index/, leaving the site root without a
    page. Publish it as the site's index.html instead."""
    del config
    for file in files:
        if file.src_uri == "_index.md":
            file.dest_uri = "index.html"
            file.url = "./"
    return files
