"""docs/reference/config.md: every stack config key, nested, from the pydantic models that validate
it (components/model/specs/, components/model/stack_config.py): type, default, allowed values and ranges, and
the comment on each field there (the same text the component package's schema carries)."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterable, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from ...components.model import specs
from ...components.model.catalog import ACCELERATORS, CPU_MACHINE_TYPES, GPU_MACHINE_TYPES, MODEL_SHAPES
from ...components.model.specs import LORA_RANKS, AdapterSpec, ClusterSpec, ImageRef, ModelSpec, NodePoolSpec
from ...components.model.stack_config import StackConfig
from ...components.model.vllm_versions import RELEASES
from ...components.provider.convert import UNION_PREFIX
from ...components.provider.generate_types import (
    _comments,
    _strip_optional,  # the schema reads types the same way
)
from ..config import FOREIGN_KEYS, PROJECT
from .common import _cell, footer, github_slug


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _unannotate(ann: Any) -> tuple[Any, list[Any]]:
    """(type, metadata) of an Annotated[...] (or the type itself)."""

    if get_origin(ann) is Annotated:
        args = get_args(ann)
        return args[0], list(args[1:])
    return ann, []


def _formats() -> dict[Callable[..., Any], str]:
    """The validated string types of the specs, by their validator: what a value must look like."""

    named = {specs.Name: "name", specs.K8sName: "Kubernetes name", specs.Revision: "git ref",
             specs.Hostname: "DNS hostname", specs.Email: "e-mail address", specs.UtcTime: "UTC time (RFC 3339)",
             specs.WeightsSource: "`hf://` or `gs://` source", specs.Cidr: "IPv4 range",
             specs.SubnetCidr: "IPv4 range", specs.PodsCidr: "IPv4 range", specs.ServicesCidr: "IPv4 range",
             specs.MasterCidr: "IPv4 range", specs.ProxyOnlyCidr: "IPv4 range"}
    out: dict[Callable[..., Any], str] = {}
    for alias, text in named.items():
        for meta in get_args(alias)[1:]:
            func = getattr(meta, "func", None)
            if func is None:
                continue
            smallest = inspect.getclosurevars(func).nonlocals.get("smallest")
            if isinstance(smallest, int) and smallest < 32:
                text = f"{text}, a /{smallest} or larger"
            out[func] = text
    return out


def _choices() -> dict[tuple[type, str], str]:
    """Values a field's validator (not its type) holds it to, from the tables it checks against."""

    def one_of(values: Iterable[Any]) -> str:
        return "one of " + ", ".join(f"`{v}`" for v in values)

    mig = "; ".join(f"{a.gke_type}: " + ", ".join(f"`{p}`" for p in a.mig_profiles)
                    for a in ACCELERATORS.values() if a.mig_profiles)
    return {(NodePoolSpec, "machine_type"): one_of(GPU_MACHINE_TYPES),
            (NodePoolSpec, "gpu_partition_size"): f"a MIG profile of the machine's GPU ({mig})",
            (ClusterSpec, "system_machine_type"): one_of(CPU_MACHINE_TYPES),
            (ModelSpec, "shape"): one_of(MODEL_SHAPES),
            (ModelSpec, "source"): "`hf://` or `gs://` source",
            (AdapterSpec, "rank"): one_of(LORA_RANKS),
            (StackConfig, "vllm_version"): one_of(RELEASES)}


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _bounds(metadata: Iterable[Any]) -> list[str]:
    found: dict[str, Any] = {}
    for meta in metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(meta, attr, None) is not None:
                found[attr] = getattr(meta, attr)
    out = []
    if "ge" in found and "le" in found:
        out.append(f"{_number(found['ge'])} to {_number(found['le'])}")
    else:
        out += [f"at least {_number(found['ge'])}"] if "ge" in found else []
        out += [f"more than {_number(found['gt'])}"] if "gt" in found else []
        out += [f"at most {_number(found['le'])}"] if "le" in found else []
        out += [f"less than {_number(found['lt'])}"] if "lt" in found else []
    if "min_length" in found:
        out.append(f"at least {found['min_length']} item{'s' if found['min_length'] != 1 else ''}")
    if "max_length" in found:
        out.append(f"at most {found['max_length']} items")
    return out


@dataclass
class _Section:
    key: str
    model: type[BaseModel]
    same_as: Optional[str] = None


class _ConfigPage:
    def __init__(self) -> None:

        self.comments = _comments
        self.union_prefix = UNION_PREFIX
        self.formats = _formats()
        self.choices = _choices()
        self.root = StackConfig
        self.sections: list[_Section] = []
        self.anchor: dict[str, str] = {}
        seen: dict[type, str] = {}
        self._walk(StackConfig, "", seen)

    def _key(self, parent: str, alias: str) -> str:

        if parent:
            return f"{parent}.{alias}"
        snake = {f.alias: n for n, f in self.root.model_fields.items()}.get(alias, alias)
        return FOREIGN_KEYS.get(snake, f"{PROJECT}:{alias}")

    def _nested(self, ann: Any) -> tuple[Optional[type[BaseModel]], bool]:
        """The spec a field holds (directly, optionally, in a list or a union) and whether in a list."""
        ann, _ = _strip_optional(_unannotate(ann)[0])
        if get_origin(ann) is list:
            inner = _unannotate(get_args(ann)[0])[0]
            return (inner if _is_model(inner) else None), True
        if _is_model(ann):
            return ann, False
        for arg in get_args(ann):
            if _is_model(arg):
                return arg, False
        return None, False

    def _walk(self, model: type[BaseModel], key: str, seen: dict[type, str]) -> None:
        if key:
            self.sections.append(_Section(key, model, seen.get(model)))
            self.anchor[key] = github_slug(key)
            if model in seen:
                return
            seen[model] = key
        for name, field in model.model_fields.items():
            nested, in_list = self._nested(field.annotation)
            if nested is not None:
                alias = self._alias(name, field)
                if self._union(field.annotation):
                    alias = to_camel(self.union_prefix + name)
                self._walk(nested, self._key(key, alias) + ("[]" if in_list else ""), seen)

    @staticmethod
    def _alias(name: str, field: FieldInfo) -> str:
        return field.alias or to_camel(name)

    @staticmethod
    def _union(ann: Any) -> bool:
        ann, _ = _strip_optional(_unannotate(ann)[0])
        args = get_args(ann)
        return get_origin(ann) in (Union, getattr(__import__("types"), "UnionType", Union)) and any(
            _is_model(a) for a in args) and any(not _is_model(a) for a in args)

    def _type(self, ann: Any, metadata: list[Any], key: str) -> str:
        ann, extra = _unannotate(ann)
        metadata = metadata + extra
        ann, _ = _strip_optional(ann)
        ann, extra = _unannotate(ann)
        metadata = metadata + extra
        bounds = _bounds(metadata)
        if get_origin(ann) is list:
            inner, inner_meta = _unannotate(get_args(ann)[0])
            text = "list of " + self._type(inner, inner_meta, key + "[]")
        elif get_origin(ann) is Literal:
            text = "one of " + ", ".join(f"`{v}`" for v in get_args(ann))
        elif _is_model(ann):
            text = f"[object](#{self.anchor[key]})"
        else:
            text = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(ann, str(ann))
            formats = [self.formats[m.func] for m in metadata if getattr(m, "func", None) in self.formats]
            if formats:
                text = formats[0]
        return ", ".join([text, *bounds])

    @staticmethod
    def _default(field: FieldInfo) -> str:
        if field.is_required():
            return "required"
        value = field.get_default(call_default_factory=True)
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, (list, tuple, dict)) and not value:
            return "none"
        if isinstance(value, BaseModel):

            if isinstance(value, ImageRef):
                return f"`{value.uri}`"
            changed = value.model_dump(by_alias=True, exclude_defaults=True, mode="json")
            if not changed:
                return "as below"
            return ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in changed.items())
        return f"`{_number(value) if isinstance(value, int) else value}`"

    def rows(self, model: type[BaseModel], key: str) -> list[str]:
        comments = self.comments(model)
        out = []
        for name, field in model.model_fields.items():
            alias = self._alias(name, field)
            text = field.description or comments.get(name, "")
            choices = self.choices.get((model, name))
            if self._union(field.annotation):
                structured = to_camel(self.union_prefix + name)
                ann, _ = _strip_optional(_unannotate(field.annotation)[0])
                scalar = next(a for a in get_args(ann) if not _is_model(a))
                out.append(self._row(self._key(key, alias), choices or self._type(scalar, [], ""), self._default(field),
                                     f"{text} Or give `{structured}` instead."))
                out.append(self._row(self._key(key, structured), f"[object](#{self.anchor[self._key(key, structured)]})",
                                     "unset", f"The structured form of `{alias}` (give one of the two)."))
                continue
            kind = self._type(field.annotation, list(field.metadata), self._key(key, alias))
            if choices:
                kind = choices + (", " + kind.split(", ", 1)[1] if ", " in kind else "")
            out.append(self._row(self._key(key, alias), kind, self._default(field), text))
        return out

    @staticmethod
    def _row(key: str, kind: str, default: str, text: str) -> str:
        """A row; within a section, the key as its last part (the heading names the rest)."""
        shown = key if ":" in key.split(".")[-1] else key.rsplit(".", 1)[-1]
        return f"| `{shown}` | {_cell(kind)} | {_cell(default)} | {_cell(text)} |"

    def render(self) -> str:
        head = ["| key | type | default | description |", "|---|---|---|---|"]
        out = [
            "# Stack configuration reference", "",
            "Every key a stack's config (`stacks/Pulumi.<stack>.yaml`) takes, from the pydantic models that",
            "validate it (`components/model/specs/`, `components/model/stack_config.py`). The same models type the components'",
            "arguments and the component package's inputs, and each description here is the comment on its",
            "field there. Nested keys are camelCase; `[]` is an item of a list (errors name it by its `name`:",
            "`vllm-gke:models[qwen-7b].short`). How a config is checked, across keys too, and what the plan",
            "warns about: [Configuring a stack](../guides/configuration.md).", "",
            "## Top-level keys", "", *head, *self.rows(self.root, ""), "",
        ]
        for section in self.sections:
            out += [f"## {section.key}", ""]
            if section.same_as is not None:
                out += [f"The same keys as [{section.same_as}](#{self.anchor[section.same_as]}).", ""]
                continue
            doc = section.model.__dict__.get("__doc__")
            if doc:
                out += [re.sub(r"\s+", " ", doc).strip(), ""]
            out += [*head, *self.rows(section.model, section.key), ""]
        return "\n".join(out).rstrip() + "\n" + footer("`components/model/specs/` and `components/model/stack_config.py`")


def config_page() -> str:
    return _ConfigPage().render()
