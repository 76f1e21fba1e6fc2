"""A contract (one row of the table) and the plan helpers the checks share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ...components.model.vllm_argv import load_snapshot
from ...components.model.vllm_versions import TPU_RELEASES
from ...policies.flagger_objects import flagger_objects
from ..plan import Plan, manifest

Check = Callable[[Plan], list[str]]


@dataclass(frozen=True)
class Contract:
    component: str
    version: str
    # What the component does that the platform depends on.
    behaviour: str
    # Where upstream establishes it, at that version.
    source: str
    # What the plan does about it.
    honoured_by: str
    check: Check


# --- plan helpers ---------------------------------------------------------------------------

def _docs(plan: Plan, kind: str) -> list[dict[str, Any]]:
    """The plan's objects of a kind; for a Service or an HTTPRoute, with those Flagger will create for
    the plan's Canaries (policies/flagger_objects.py): the checks hold Flagger's routes to the same
    contracts as declared ones."""
    declared = [manifest(r) for r in plan.kubernetes() if r.props.get("kind") == kind]
    if kind not in ("Service", "HTTPRoute"):
        return declared
    canaries, targets = _docs(plan, "Canary"), _docs(plan, "Deployment")
    return declared + [o for o in flagger_objects(canaries, targets) if o["kind"] == kind]


def _vllm_deployments(plan: Plan) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, "Deployment")
            if (d["spec"]["template"]["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "vllm"]


def _vllm_containers(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in _vllm_deployments(plan):
        (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        yield f"{d['metadata']['namespace']}/{d['metadata']['name']}", c


def _flag(args: list[Any], flag: str) -> Optional[str]:
    items = [str(a) for a in args]
    return items[items.index(flag) + 1] if flag in items and items.index(flag) + 1 < len(items) else None


def _exported(plan: Plan) -> set[str]:
    """The metrics every vLLM build the stack runs exports: the release's, and the TPU build's where
    models run on TPUs (the dashboards, KEDA, the picker and the guard read one set of names)."""
    cfg = plan.config
    names = {m["name"] for m in load_snapshot(cfg.vllm_version)["metrics"]}
    if cfg.has_tpu_models:
        names &= {m["name"] for m in load_snapshot(TPU_RELEASES[cfg.tpu_vllm_version].snapshot)["metrics"]}
    return names


def _env(container: dict[str, Any]) -> dict[str, Any]:
    """A container's literal environment, name -> value."""
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def _guard_configs(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each vLLM container's guard configuration (its environment's JSON)."""
    for name, c in _vllm_containers(plan):
        yield name, json.loads(_env(c).get("GKE_LLM_GUARD_CONFIG") or "{}")


def _writable_mounts(container: dict[str, Any]) -> set[str]:
    """Where a container may write besides its root filesystem."""
    return {m["mountPath"] for m in container.get("volumeMounts") or [] if not m.get("readOnly")}
