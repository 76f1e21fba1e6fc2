"""From package inputs (plain dicts, as the provider host hands them over) to the specs.

The package components validate with the same pydantic specs as the stack config, so a
TypeScript, Go or YAML program gets the same messages, naming the key as that program spelt it
(camelCase, as in the schema): `GpuCluster.cluster.masterCidr: '172.16.0.0/24' must be a /28 ...`.
"""

from __future__ import annotations

from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterator, Mapping, TypeVar, cast

import pulumi
import pulumi_kubernetes as k8s
from pydantic import ValidationError
from pydantic.alias_generators import to_camel, to_snake

from ..model.specs import Spec
from ..model.stack_config import ConfigError, ConfigIssue, plain_problem

S = TypeVar("S", bound=Spec)
# A spec field typed `str | <Spec>` is two package inputs: `<name>` and `custom_<name>`.
UNION_PREFIX = "custom_"


class InputError(ConfigError):
    """Bad package input: each problem names the component and the key (`VllmService.poolName`) and
    says the fix. The provider hands the problems to the engine one per input property
    (host.py), so a TypeScript or YAML program reports them without a Python traceback."""

    def __init__(self, problems: str | list[ConfigIssue], component: str = "") -> None:
        if isinstance(problems, str):
            key, _, problem = problems.partition(": ")
            problems = [ConfigIssue(key, problem)]
        component = component or problems[0].key.split(".", 1)[0].split("[", 1)[0]
        super().__init__(problems, f"{component} inputs")


def _unfold_unions(data: Any) -> Any:
    """`custom_<name>` (the structured form of a `str | Spec` field) back into `<name>`."""
    if isinstance(data, Mapping):
        out = {k: _unfold_unions(v) for k, v in data.items() if v is not None}
        for key in [k for k in out if k.startswith(UNION_PREFIX)]:
            out.setdefault(key.removeprefix(UNION_PREFIX), out.pop(key))
        return out
    if isinstance(data, list):
        return [_unfold_unions(v) for v in data]
    # The provider host hands enum inputs over as the schema's enum members.
    return data.value if isinstance(data, Enum) else data


def plain(value: Any) -> Any:
    """An enum input's value (the provider host passes enum members), anything else as given."""
    return value.value if isinstance(value, Enum) else value


def _where(component: str, field: str, loc: tuple[Any, ...], data: Any = None) -> str:
    """The key as the program spelt it: camelCase, list items by their name where they have a
    unique one (`nodePools[a100-mig].machineType`), as the stack config's messages name them."""
    # A list item's field arrives as spelt already (`nodePools[a100-mig]`).
    key = f"{component}.{field if '[' in field else to_camel(field)}" if field else component
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = item.get("name") if isinstance(item, Mapping) else None
            unique = isinstance(name, str) and name and sum(
                isinstance(x, Mapping) and x.get("name") == name for x in node) == 1
            key += f"[{name}]" if unique else f"[{part}]"
            node = item
        else:
            key += f".{to_camel(str(part))}"
            node = (node.get(str(part), node.get(to_snake(str(part)))) if isinstance(node, Mapping) else None)
    return key


def to_spec(model: type[S], data: Any, component: str, field: str) -> S:
    data = _unfold_unions(data or {})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = plain_problem(err)
            if err["type"] == "missing":
                msg = "is required but not set"
            elif err["type"] == "extra_forbidden":
                msg = "is not a known input; remove it or fix its spelling"
            problems.append(ConfigIssue(_where(component, field, tuple(err["loc"]), data), msg))
        raise InputError(problems, component) from None


def to_specs(model: type[S], items: Any, component: str, field: str) -> list[S]:
    """Every item checked, and every item's problems reported together."""
    specs, problems = [], []
    items = list(items or [])
    for i, item in enumerate(items):
        try:
            label = to_camel(field) + _where("", "", (i,), items)
            specs.append(to_spec(model, item, component, label))
        except InputError as exc:
            problems += exc.issues
    if problems:
        raise InputError(problems, component)
    return specs


class Problems:
    """Every problem of one component's inputs, reported together: a user fixes them in one pass."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.issues: list[ConfigIssue] = []

    def spec(self, model: type[S], data: Any, field: str) -> S:
        """The input as its spec; on problems, None (after `raise_any` the caller never sees it)."""
        try:
            return to_spec(model, data, self.component, field)
        except InputError as exc:
            self.issues += exc.issues
            return cast(S, None)

    def specs(self, model: type[S], items: Any, field: str) -> list[S]:
        try:
            return to_specs(model, items, self.component, field)
        except InputError as exc:
            self.issues += exc.issues
            return []

    def add(self, key: str, problem: str) -> None:
        """`key` as the schema spells it, without the component: `poolName`, `targets[qwen-7b].canaryWeight`."""
        self.issues.append(ConfigIssue(f"{self.component}.{key}", problem))

    def raise_any(self) -> None:
        if self.issues:
            raise InputError(self.issues, self.component)


@contextmanager
def named_inputs(component: str, field: str = "") -> Iterator[None]:
    """The library component's own checks (a ConfigError naming its args' keys, or a stack config's:
    `vllm-gke:models[x]`) as problems of this component's inputs: `Gateway.targets[a]`,
    `Platform.config.models[x]`."""
    try:
        yield
    except InputError:
        raise
    except ConfigError as exc:
        prefix = f"{component}.{field}." if field else f"{component}."
        # A stack file's key (`vllm-gke:models[x]`) or one already in a program's words (`config.models[x]`).
        raise InputError([ConfigIssue(prefix + (issue.key.split(":", 1)[-1] if ":" in issue.key
                                                else issue.key.removeprefix(f"{field}.")), issue.problem)
                          for issue in exc.issues], component) from None


def kubernetes_provider(name: str, kubeconfig: pulumi.Input[str], parent: pulumi.Resource) -> k8s.Provider:
    """A Kubernetes provider for a package component's children, from the cluster's kubeconfig."""
    return k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig, enable_server_side_apply=True,
                        opts=pulumi.ResourceOptions(parent=parent))
