"""Offline plan: run the real stack program under Pulumi's mock runtime and collect what it declares."""

from __future__ import annotations

import asyncio
import contextvars
import json
import runpy
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

import pulumi
import yaml
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from ..components.platform import Platform
from ..policies.rules import Resource
from .config import ConfigError, ConfigIssue, StackConfig, load
from .mocks import PlannedResource, RecordingMocks, RecordingMonitor
from .model_configs import CACHE_FOLDER, with_stack_model_configs
from .program import build
from .system_pool import check_system_pool

REPO_ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = REPO_ROOT / "stacks"


def default_stacks_dir() -> Path:
    """./stacks where the user runs the command (a project of their own, the package installed),
    else this checkout's."""
    here = Path.cwd() / "stacks"
    return here if here.is_dir() else STACKS_DIR
PROJECT = "vllm-gke"


def is_manifest(resource: PlannedResource) -> bool:
    """A Kubernetes object the provider applies (a Helm release is the chart's, not one manifest)."""
    return (resource.type.startswith("kubernetes:") and resource.custom
            and resource.type != "kubernetes:helm.sh/v3:Release")


@dataclass
class Plan:
    stack: str
    config: StackConfig
    platform: Platform
    resources: list[PlannedResource]

    def of_type(self, type_: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_]

    def kubernetes(self) -> list[PlannedResource]:
        return [r for r in self.resources if is_manifest(r)]

    def manifests(self) -> list[dict[str, Any]]:
        """Each Kubernetes resource as the manifest the provider would apply."""
        return [manifest(r) for r in self.kubernetes()]

    def policy_resources(self) -> list[Resource]:
        return [Resource(type=r.type, name=r.name, props=r.props, urn=r.urn) for r in self.resources if r.custom]

    @cached_property
    def _by_urn(self) -> dict[str, PlannedResource]:
        return {r.urn: r for r in self.resources}

    def named(self, type_: str, name: str) -> PlannedResource:
        """The resource of this type whose logical name (Pulumi resource name) is `name`."""
        return next(r for r in self.resources if r.type == type_ and r.name == name)

    def kube(self, kind: str, name: str, namespace: Optional[str] = None) -> PlannedResource:
        """The Kubernetes resource of this kind with this metadata.name (and namespace)."""
        return next(r for r in self.kubernetes() if r.props.get("kind") == kind
                    and (r.props.get("metadata") or {}).get("name") == name
                    and (namespace is None or r.props["metadata"].get("namespace") == namespace))

    def prerequisites(self, resource: PlannedResource) -> set[str]:
        """Every URN the engine must finish before creating `resource` (transitive)."""
        seen: set[str] = set()
        todo = list(resource.dependencies)
        while todo:
            urn = todo.pop()
            if urn in seen:
                continue
            seen.add(urn)
            dep = self._by_urn.get(urn)
            if dep is not None:
                todo.extend(dep.dependencies)
        return seen

    def waits_for(self, resource: PlannedResource, prerequisite: PlannedResource) -> bool:
        return prerequisite.urn in self.prerequisites(resource)

    def component_of(self, resource: PlannedResource) -> str:
        parent = self._by_urn.get(resource.parent or "")
        return f"{parent.type.split(':')[-1]}/{parent.name}" if parent and not parent.custom else "-"


def _clean(value: Any) -> Any:
    """Wire values to manifest values: integral floats back to ints, no unset keys."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def manifest(resource: PlannedResource) -> dict[str, Any]:
    doc = _clean(resource.props)
    order = ["apiVersion", "kind", "metadata"]
    return {**{k: doc[k] for k in order if k in doc}, **{k: v for k, v in doc.items() if k not in order}}


def stack_file(stack: str, stacks_dir: Path = STACKS_DIR) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def read_stack_config(stack: str, stacks_dir: Path = STACKS_DIR) -> dict[str, Any]:
    path = stack_file(stack, stacks_dir)
    if not stacks_dir.is_dir():
        raise ConfigError([ConfigIssue("--stacks-dir", f"no stacks folder at {stacks_dir}: run where ./stacks holds "
                                       "Pulumi.<stack>.yaml files or pass --stacks-dir; for a Pulumi program of your "
                                       "own, `vllm-gke preview PROGRAM_DIR`")], "stack selection")
    if not path.exists():
        known = sorted(p.name.split(".")[1] for p in stacks_dir.glob("Pulumi.*.yaml"))
        raise ConfigError([ConfigIssue("--stack", f"no stack '{stack}': {path} does not exist; "
                                       f"use one of {', '.join(known) or '(none)'}")], "stack selection")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue(str(path), f"is not valid YAML: {exc}")], str(path)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise ConfigError([ConfigIssue(f"{path}:config", "must be a mapping of config keys")], str(path))
    return dict(doc.get("config") or {})


def _as_pulumi_config(values: dict[str, Any]) -> dict[str, str]:
    """Pulumi passes structured config as JSON text; do the same so `load()` sees what `pulumi up` sees."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _under_mocks(project: str, stack: str, config: dict[str, Any], body: Callable[[], None],
                 root_directory: Optional[Path] = None) -> list[PlannedResource]:
    """Run `body` as a Pulumi program under the recording mocks, with `config` as stack config,
    and return what it registered. `root_directory`: the project folder, as the language host
    passes it (pulumi.runtime.get_root_directory; the mocks leave a placeholder)."""
    def _run() -> list[PlannedResource]:
        # Our own event loop: asyncio.run() elsewhere in the process leaves none behind.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            mocks = RecordingMocks(str(config.get("gcp:project", "mock-project")))
            monitor = RecordingMonitor(mocks)
            pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
            pulumi.runtime.set_all_config(_as_pulumi_config(config))
            if root_directory is not None:
                # A context property of the SDK's settings, set as the language host's --root_directory sets it.
                pulumi.runtime.settings.SETTINGS.root_directory = str(root_directory)  # pyright: ignore[reportAttributeAccessIssue]
            _sync_await(run_pulumi_func(body))
            return monitor.recorded
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    # A fresh context per run: Pulumi keeps its settings, config and root stack in contextvars.
    return contextvars.Context().run(_run)


def run_program(stack: str, values: dict[str, Any],
                program: Callable[[StackConfig], Platform] = build) -> Plan:
    """Run `program` under mocks with the given raw stack config; raise ConfigError on bad config."""
    result: dict[str, Any] = {}

    def body() -> None:
        cfg = load()
        result["config"], result["platform"] = cfg, program(cfg)

    recorded = _under_mocks(PROJECT, stack, values, body)
    plan = Plan(stack, result["config"], result["platform"], recorded)
    cluster = plan.config.cluster
    check_system_pool(cluster.system_machine_type, cluster.system_pool_max, plan.manifests())
    return plan


def run_plan(stack: str, stacks_dir: Optional[Path] = None) -> Plan:
    """The stack file's program; models given by id take their shapes from the config.json cache in
    the stacks folder's model-configs/ (fetched there once where missing)."""
    folder = stacks_dir or default_stacks_dir()
    values = with_stack_model_configs(read_stack_config(stack, folder), f"config of stack '{stack}'",
                                      lambda: folder / CACHE_FOLDER)
    return run_program(stack, values)


def run_program_file(path: Path, config: dict[str, Any], stack: str = "dev") -> list[PlannedResource]:
    """A Pulumi program of one's own (a Python file, as `pulumi up` runs its __main__) under the
    same mocks: what it would declare, for the policy pack and the tests."""
    def body() -> None:
        runpy.run_path(str(path), run_name="__main__")

    return _under_mocks(path.parent.name, stack, config, body)
