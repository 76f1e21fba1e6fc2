"""`vllm-gke preview PROGRAM_DIR`: a platform team's own Pulumi program, run offline under the plan's
mocks, reported as `vllm-gke plan` reports a stack.

The program runs as Pulumi's Python language host runs it: its folder the working directory and
first on sys.path, its `main` (Pulumi.yaml) or __main__.py as __main__, its stack's config from
Pulumi.yaml's config defaults under Pulumi.<stack>.yaml's (a key without a namespace taken as the
project's). Each
Platform it declares becomes a Plan of the resources under it, so capacity, cost, tenant URLs,
checks and policy verdicts are the stack plan's own; resources outside any Platform (the finer
components, or the program's own) are checked for schema and policies.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pulumi
import yaml
from pydantic import ValidationError

from ..components.model.config_errors import key_path, problem
from ..components.platform import Platform
from .config import ConfigError, ConfigIssue
from .mocks import PlannedResource
from .plan import Plan, _under_mocks
from .system_pool import check_system_pool


@dataclass(frozen=True)
class Project:
    """A Pulumi project folder: its name, the program file to run and where its stack files are."""

    name: str
    directory: Path
    program: Path
    stack_dir: Path
    # Pulumi.yaml's `config:` values and defaults (keys without a namespace, as written there).
    defaults: dict[str, Any]


@dataclass
class Program:
    """What a user's program declared under the mocks."""

    project: Project
    stack: str
    resources: list[PlannedResource]
    platforms: list[Platform]


def _issue(key: str, problem: str, source: str = "preview") -> ConfigError:
    return ConfigError([ConfigIssue(key, problem)], source)


def _project_doc(directory: Path) -> dict[str, Any]:
    path = directory / "Pulumi.yaml"
    if not directory.is_dir():
        raise _issue("PROGRAM_DIR", f"{directory} is not a folder; give the folder holding your Pulumi.yaml")
    if not path.is_file():
        raise _issue("PROGRAM_DIR", f"{directory} holds no Pulumi.yaml; give your Pulumi project's folder "
                     "(where `pulumi up` runs)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise _issue(str(path), f"is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise _issue(f"{path}:name", "is required: the project's name")
    return doc


def read_project(directory: Path) -> Project:
    """The project's name, program and stack folder; only Python programs run here."""
    directory = directory.resolve()  # the program runs from its own folder: a relative path would move
    doc = _project_doc(directory)
    runtime = doc.get("runtime")
    runtime_name = runtime.get("name") if isinstance(runtime, dict) else runtime
    if runtime_name != "python":
        raise _issue(f"{directory / 'Pulumi.yaml'}:runtime", f"is {runtime_name!r}: preview runs Python programs; "
                     "a TypeScript, Go or YAML program's resources are checked by the policy pack under "
                     "`pulumi preview --policy-pack` (docs/guides/multi-language.md)")
    main = directory / str(doc.get("main") or ".")
    program = main / "__main__.py" if main.is_dir() else main
    if not program.is_file():
        raise _issue(f"{directory / 'Pulumi.yaml'}:main", f"{program} does not exist; Pulumi runs __main__.py "
                     "of the project folder, or the file or folder `main` names")
    return Project(doc["name"], directory, program, directory / str(doc.get("stackConfigDir") or "."),
                   project_config(doc))


def project_config(doc: dict[str, Any]) -> dict[str, Any]:
    """Pulumi.yaml's `config:`: a value, or a declaration with a `default` (or `value`), which the
    stack's own config overrides (pulumi/pulumi pkg/workspace/config.go mergeConfig)."""
    out: dict[str, Any] = {}
    for key, spec in (doc.get("config") or {}).items() if isinstance(doc.get("config"), dict) else ():
        if not isinstance(spec, dict):
            out[str(key)] = spec
        elif "value" in spec or "default" in spec:
            out[str(key)] = spec.get("value", spec.get("default"))
    return out


def stack_names(project: Project) -> list[str]:
    return sorted(p.name.split(".")[1] for p in project.stack_dir.glob("Pulumi.*.yaml"))


def choose_stack(project: Project, stack: Optional[str]) -> str:
    """The stack named, else the only one the project has, else `dev` (config from --config alone)."""
    known = stack_names(project)
    if stack is not None:
        if known and stack not in known:
            raise _issue("--stack", f"the project has no stack '{stack}' (no Pulumi.{stack}.yaml in "
                         f"{project.stack_dir}); use one of {', '.join(known)}")
        return stack
    if len(known) > 1:
        raise _issue("--stack", f"the project has stacks {', '.join(known)}: name one with --stack")
    return known[0] if known else "dev"


def _namespaced(project: str, key: str) -> str:
    # Pulumi reads a key without a namespace as the project's own.
    return key if ":" in key else f"{project}:{key}"


def program_config(project: Project, stack: str, overrides: dict[str, str]) -> dict[str, Any]:
    """The stack's config as `pulumi up` would hand it over: the stack file's, then --config's."""
    path = project.stack_dir / f"Pulumi.{stack}.yaml"
    values = {_namespaced(project.name, k): v for k, v in project.defaults.items()}
    if path.is_file():
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise _issue(str(path), f"is not valid YAML: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("config") or {}, dict):
            raise _issue(f"{path}:config", "must be a mapping of config keys")
        values |= {_namespaced(project.name, str(k)): v for k, v in (doc.get("config") or {}).items()}
    return {**values, **{_namespaced(project.name, k): v for k, v in overrides.items()}}


@contextmanager
def _in_program_folder(folder: Path) -> Iterator[None]:
    """The working directory and sys.path[0] the language host gives a program, then back."""
    cwd, path = Path.cwd(), list(sys.path)
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def run_user_program(project: Project, stack: str, config: dict[str, Any]) -> Program:
    """The program under the mocks, in its folder for the whole run (its outputs' callbacks too);
    every Platform it constructs is kept for the report. What it prints goes to standard error, so
    the JSON on standard output stays one document."""
    platforms: list[Platform] = []

    def keep(args: pulumi.ResourceTransformationArgs) -> None:
        if isinstance(args.resource, Platform):
            platforms.append(args.resource)

    def body() -> None:
        pulumi.runtime.register_stack_transformation(keep)
        runpy.run_path(str(project.program), run_name="__main__")

    try:
        with _in_program_folder(project.program.parent), contextlib.redirect_stdout(sys.stderr):
            resources = _under_mocks(project.name, stack, config, body, project.directory)
    except pulumi.ConfigMissingError as exc:
        raise _issue(exc.key, f"the program requires it; set it in {project.stack_dir}/Pulumi.{stack}.yaml "
                     f"or pass --config {exc.key}=VALUE") from None
    except ConfigError:
        raise
    except ValidationError as exc:  # a spec built in the program's own code (NodePoolSpec(...), ...)
        raise ConfigError([ConfigIssue(key_path(tuple(e["loc"]), None, lambda k, t=exc.title: f"{t}.{k}"),
                                       problem(e, "the program")) for e in exc.errors()], "program settings") from None
    except SystemExit as exc:  # sys.exit() in the program: no plan to report, whatever the code
        raise _issue(str(project.program), f"exited ({exc.code}) before it declared everything", "program") from None
    except Exception as exc:  # the program's own failure: its frames, not the preview's
        raise _issue(str(project.program), _program_failure(exc, project.directory), "program") from None
    return Program(project, stack, resources, platforms)


def _program_failure(exc: BaseException, folder: Path) -> str:
    """`ValueError: ...` and the program's own frames (file:line), as Pulumi's language host trims them."""
    frames = [f"{Path(f.filename).relative_to(folder)}:{f.lineno} in {f.name}"
              for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).is_relative_to(folder)]
    return f"raised {type(exc).__name__}: {exc}" + (f" (at {', '.join(frames)})" if frames else "")


def _under(resources: list[PlannedResource], root: str) -> list[PlannedResource]:
    """The resource at `root` and everything parented below it."""
    children: dict[str, list[PlannedResource]] = {}
    for r in resources:
        children.setdefault(r.parent or "", []).append(r)
    out = [r for r in resources if r.urn == root]
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child.urn)
    return out


def platform_plans(program: Program) -> list[Plan]:
    """One Plan per Platform: its settings and the resources under it (named stack/platform when
    the program declares more than one)."""
    plans = []
    names = [p._name for p in program.platforms]  # pyright: ignore[reportPrivateUsage]
    if len(set(names)) < len(names):
        raise _issue("Platform", f"two Platforms are named {sorted(n for n in names if names.count(n) > 1)[0]!r}: "
                     "give each its own name (their children's names start with it)", "program")
    by_name = {r.name: r for r in program.resources if r.type == "vllm-gke:index:Platform"}
    for platform in program.platforms:
        name = platform._name  # pyright: ignore[reportPrivateUsage]  # the SDK keeps the name there
        label = program.stack if len(program.platforms) == 1 else f"{program.stack}/{name}"
        plan = Plan(label, platform.config, platform, _under(program.resources, by_name[name].urn))
        cluster = plan.config.cluster
        check_system_pool(cluster.system_machine_type, cluster.system_pool_max, plan.manifests())
        plans.append(plan)
    return plans


def outside_platforms(program: Program, plans: list[Plan]) -> list[PlannedResource]:
    """What the program declares beside its Platforms."""
    inside = {r.urn for plan in plans for r in plan.resources}
    return [r for r in program.resources if r.urn not in inside and r.custom]
