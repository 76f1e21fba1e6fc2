"""Writes an offline plan to disk: manifests, dashboard, alert policies, resource inventory."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Optional

import yaml

from .plan import Plan


def _manifest_path(doc: dict[str, Any]) -> Path:
    meta = doc["metadata"]
    folder = meta.get("namespace") or "_cluster"
    return Path("manifests") / folder / f"{doc['kind'].lower()}-{meta['name']}.yaml"


def redact(props: dict[str, Any], secret_paths: list[tuple[Any, ...]]) -> dict[str, Any]:
    """What `pulumi preview` shows: secret values replaced by [secret]."""
    out = copy.deepcopy(props)
    for path in secret_paths:
        node = out
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = "[secret]"
    return out


def write_plan(plan: Plan, out_dir: Path, verdicts: Optional[dict[str, Any]] = None,
               pictures: Optional[dict[str, str]] = None) -> list[Path]:
    """Write everything under out_dir/<stack>/ and return the files written."""
    root = out_dir / plan.stack
    written: list[Path] = []
    # Only this plan's manifests: a resource renamed since an earlier plan must not linger there
    # for a scanner or a diff to read.
    shutil.rmtree(root / "manifests", ignore_errors=True)

    def write(rel: Path, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)

    # A stable order whatever order the engine registered resources in: diffs show changes only.
    docs = sorted(plan.manifests(), key=lambda d: (d.get("kind", ""), (d.get("metadata") or {}).get("namespace") or "",
                                                   (d.get("metadata") or {}).get("name") or ""))
    for doc in docs:
        write(_manifest_path(doc), yaml.safe_dump(doc, sort_keys=False))
    write(Path("manifests/all.yaml"), yaml.safe_dump_all(docs, sort_keys=False))
    obs = plan.platform.observability
    assert obs is not None
    write(Path("dashboard.json"), json.dumps(obs.dashboard_definition, indent=2) + "\n")
    if obs.tenant_dashboard_definition is not None:
        write(Path("tenant-dashboard.json"), json.dumps(obs.tenant_dashboard_definition, indent=2) + "\n")
    write(Path("alert-policies.json"), json.dumps(obs.alert_definitions, indent=2) + "\n")
    names = {r.urn: r.name for r in plan.resources}
    inventory = [{"type": r.type, "name": r.name, "component": plan.component_of(r),
                  "dependsOn": sorted(names.get(u, u) for u in r.dependencies),
                  "props": redact(r.props, r.secret_paths)} for r in plan.resources if r.custom]
    inventory.sort(key=lambda r: (r["type"], r["name"]))
    write(Path("resources.json"), json.dumps(inventory, indent=2, default=str) + "\n")
    if verdicts is not None:
        write(Path("verdicts.json"), json.dumps(verdicts, indent=2) + "\n")
    for file_name, text in (pictures or {}).items():
        write(Path(file_name), text)
    return written
