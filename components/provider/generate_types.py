"""Generate components/provider/types.py: the package's input types, from the pydantic specs.

    .venv/bin/python -m vllm_gke.components.provider.generate_types

The specs (components/model/specs/) stay the one definition of what a setting means and accepts;
this writes them as TypedDicts the Pulumi schema analyzer understands (it infers the package
schema from annotations and attribute docstrings), with each field's comment in the specs as its
description. A test regenerates the file and fails if the checked-in one differs.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.alias_generators import to_pascal
from pydantic.fields import FieldInfo

from ..model import specs
from ..model.specs import Spec
from ..model.stack_config import StackConfig
from .convert import UNION_PREFIX

OUT = Path(__file__).with_name("types.py")
# The specs the package exposes, roots first; nested specs are followed.
ROOTS = (specs.ClusterSpec, specs.NodePoolSpec, specs.ModelSpec, specs.TenantSpec, specs.GatewaySpec,
         specs.WeightsSpec, specs.MonitoringSpec, specs.ImageRef, StackConfig)
# A spec field typed `str | <Spec>` becomes two optional fields: the string form under its own
# name and the structured form under `custom_<name>` (the schema has no unions).

def _comments(cls: type) -> dict[str, str]:
    """The `# ...` lines right above each field in the spec's source, and the docstring."""
    out: dict[str, str] = {}
    lines = inspect.getsource(cls).splitlines()
    pending: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"\s{4}([a-z_][a-z0-9_]*)\s*:", line)
        if m and not stripped.startswith("def"):
            trailing = line.split("#", 1)[1].strip() if "#" in line and "=" not in line.split("#")[0][-3:] else ""
            text = " ".join(pending + ([trailing] if trailing and not pending else []))
            if text:
                out[m.group(1)] = text
        pending = []
    return out


def _describe(name: str, field: FieldInfo, comment: str | None) -> str:
    parts = [comment.rstrip(".") + "." if comment else name.replace("_", " ").capitalize() + "."]
    ann = field.annotation
    literal = _literal_values(ann)
    if literal:
        parts.append("One of: " + ", ".join(literal) + ".")
    if not field.is_required():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, (str, int, float, bool)) and not isinstance(default, BaseModel):
            parts.append(f"Default: {str(default).lower() if isinstance(default, bool) else default}.")
    return " ".join(parts)


def _strip_optional(ann: Any) -> tuple[Any, bool]:
    if get_origin(ann) in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) < len(get_args(ann)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True
    return ann, False


def _literal_values(ann: Any) -> list[str]:
    ann, _ = _strip_optional(ann)
    ann = _unannotate(ann)
    return [str(v) for v in get_args(ann)] if get_origin(ann) is Literal else []


def _unannotate(ann: Any) -> Any:
    return get_args(ann)[0] if get_origin(ann) is typing.Annotated else ann


class Enums:
    """The enums the specs' Literal fields become: named after the field (ReleaseChannel), or after
    spec and field where two fields of one name take different values."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, ...]] = {}
        self.docs: dict[str, str] = {}

    def name_for(self, spec: str, field: str, values: tuple[str, ...], doc: str) -> str:
        name = to_pascal(field)
        if self.values.get(name, values) != values:
            name = to_pascal(spec.removesuffix("Spec")) + name
        self.values.setdefault(name, values)
        self.docs.setdefault(name, doc)
        return name

    def render(self) -> list[str]:
        out = []
        for name, values in self.values.items():
            out += [f"class {name}(str, Enum):", f'    """{self.docs[name]}"""', ""]
            for value in values:
                member = re.sub(r"\W", "_", value).upper()
                out += [f"    {'V' + member if member[0].isdigit() else member} = {value!r}"]
            out += ["", ""]
        return out


def _type_text(ann: Any, nested: list[type], enum: Callable[[tuple[str, ...]], str] | None = None) -> str:
    ann = _unannotate(ann)
    origin = get_origin(ann)
    if origin is Literal:
        return enum(tuple(str(v) for v in get_args(ann))) if enum else "str"
    if origin is list:
        return f"list[{_type_text(get_args(ann)[0], nested, enum)}]"
    if origin is dict:
        k, v = get_args(ann)
        return f"dict[{_type_text(k, nested)}, {_type_text(v, nested, enum)}]"
    if isinstance(ann, type) and issubclass(ann, Spec):
        if ann not in nested:
            nested.append(ann)
        return ann.__name__
    if ann in (str, int, float, bool):
        return ann.__name__
    raise TypeError(f"no schema type for {ann!r}")


def _union_parts(ann: Any) -> tuple[Any, type] | None:
    """(scalar, spec) for `scalar | Spec` annotations."""
    args = get_args(_unannotate(ann))
    if get_origin(ann) in (Union, getattr(__import__("types"), "UnionType", Union)) and len(args) == 2:
        scalar = next((a for a in args if not (isinstance(a, type) and issubclass(a, Spec))), None)
        spec = next((a for a in args if isinstance(a, type) and issubclass(a, Spec)), None)
        if scalar is not None and spec is not None:
            return scalar, spec
    return None


def render() -> str:
    out = [
        '"""Input types of the vllm-gke component package.',
        "",
        "GENERATED from components/model/specs/ by components/provider/generate_types.py: do not edit;",
        "change the specs and regenerate. Keys are the specs' fields; the package components validate",
        'them with the specs themselves."""',
        "",
        "# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.",
        "from enum import Enum",
        "from typing import TypedDict",
        "",
        "from typing_extensions import NotRequired",
        "",
    ]
    blocks: dict[type, list[str]] = {}
    order: list[type] = []
    enums = Enums()

    def emit(cls: type) -> None:
        """Nested types first: the analyzer follows real classes, not forward references."""
        if cls in blocks:
            return
        blocks[cls] = []
        nested: list[type] = []
        comments = _comments(cls)
        doc = (cls.__doc__ or "").strip() if cls.__doc__ and cls.__doc__ != Spec.__doc__ else ""
        body = [f"class {cls.__name__}(TypedDict):"]
        body.append(f'    """{doc or cls.__name__ + " settings (see docs/reference/config.md)."}"""')
        body.append("")
        for name, field in cls.model_fields.items():
            ann, optional = _strip_optional(field.annotation)
            required = field.is_required() and not optional
            union = _union_parts(ann)
            comment = comments.get(name)

            def enum(values: tuple[str, ...], cls: type = cls, name: str = name, comment: str | None = comment) -> str:
                return enums.name_for(cls.__name__, name, values,
                                      (comment or name.replace("_", " ").capitalize()).rstrip(".") + ".")

            entries = []
            if union:
                scalar, spec = union
                entries.append((name, _type_text(scalar, nested), False))
                entries.append((f"{UNION_PREFIX}{name}", _type_text(spec, nested), False))
            else:
                entries.append((name, _type_text(ann, nested, enum), required))
            for key, text, req in entries:
                body.append(f"    {key}: {text if req else f'NotRequired[{text}]'}")
                description = _describe(name, field, comments.get(name))
                if key.startswith(UNION_PREFIX):
                    description = f"The structured form of `{name}` (give one of the two). " + description
                elif union:
                    description = f"The named form of `{name}` (or give `{UNION_PREFIX}{name}`). " + description
                body.append(f'    """{description}"""')
        for n in nested:
            emit(n)
        blocks[cls] = body + ["", ""]
        order.append(cls)

    for root in ROOTS:
        emit(root)
    out += enums.render()
    for cls in order:
        out += blocks[cls]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
