"""The docs generated from the code, so they cannot drift from what they describe.

`vllm-gke docs` writes them; tests/test_docs.py regenerates them in memory and fails on any
difference, and checks every link:

- docs/reference/config.md: every stack config key, nested, from the pydantic models that validate
  it (components/specs/, components/stack_config.py): type, default, allowed values and ranges, and
  the comment on each field there (the same text the component package's schema carries);
- docs/reference/policies.md: the policy pack's table (policies/rules.py POLICIES);
- docs/reference/components.md: the component package's Pulumi schema (`vllm-gke schema`);
- blocks of hand-written pages, between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers: the
  code's layers drawn from the import graph (`code-layers`), the platform picture of
  docs/architecture.md copied into the README (`platform`), and the examples the overview shows
  (`include:<path>`).

The link check reads README.md and docs/**/*.md as GitHub renders them: every relative link names a
file that exists and every #anchor a heading of that page (GitHub's slugs; mkdocs.yml gives mkdocs
the same slugs through `github_slug`, so `mkdocs build --strict` agrees).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMAND = "vllm-gke docs"
CONFIG_PAGE = Path("docs/reference/config.md")
POLICIES_PAGE = Path("docs/reference/policies.md")
COMPONENTS_PAGE = Path("docs/reference/components.md")
ARCHITECTURE_PAGE = Path("docs/architecture.md")
# Hand-written pages that hold generated blocks.
BLOCK_PAGES = (Path("README.md"), ARCHITECTURE_PAGE, Path("docs/_index.md"))


def footer(source: str) -> str:
    return f"\n_Generated from {source} by `{COMMAND}`: edit the code, not this page._\n"


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped, and `<`, `>` outside code spans as entities
    (`/<name>/v1` would read as an HTML tag)."""
    parts = re.split(r"(`[^`]*`)", re.sub(r"\s+", " ", text).strip())
    text = "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
    return text.replace("|", "\\|")


def github_slug(value: str, separator: str = "-") -> str:
    """A heading's anchor as GitHub makes it (github-slugger): lowercase, every character but
    letters, digits, '_', '-' and spaces dropped, each space a '-'. Also mkdocs' slugify (mkdocs.yml),
    which passes the heading's text and a separator."""
    del separator  # GitHub's is always '-'
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", "-")


# --- the stack config ---------------------------------------------------------------------------

def _strip_optional(ann: Any) -> tuple[Any, bool]:
    if get_origin(ann) in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) < len(get_args(ann)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True
    return ann, False


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _unannotate(ann: Any) -> tuple[Any, list[Any]]:
    """(type, metadata) of an Annotated[...] (or the type itself)."""
    from typing import Annotated

    if get_origin(ann) is Annotated:
        args = get_args(ann)
        return args[0], list(args[1:])
    return ann, []


def _formats() -> dict[Callable[..., Any], str]:
    """The validated string types of the specs, by their validator: what a value must look like."""
    from ..components import specs

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
    from ..components.catalog import ACCELERATORS, CPU_MACHINE_TYPES, GPU_MACHINE_TYPES, MODEL_SHAPES
    from ..components.specs import LORA_RANKS, AdapterSpec, ClusterSpec, ModelSpec, NodePoolSpec
    from ..components.stack_config import StackConfig
    from ..components.vllm_versions import RELEASES

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
        from ..components.provider.convert import UNION_PREFIX
        from ..components.provider.generate_types import _comments
        from ..components.stack_config import StackConfig

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
        from .config import FOREIGN_KEYS, PROJECT

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
            from ..components.specs import ImageRef

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
            "validate it (`components/specs/`, `components/stack_config.py`). The same models type the components'",
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
        return "\n".join(out).rstrip() + "\n" + footer("`components/specs/` and `components/stack_config.py`")


def config_page() -> str:
    return _ConfigPage().render()


# --- the policy pack -----------------------------------------------------------------------------

POLICY_PREAMBLE = """\
# Policies

`policies/` is a CrossGuard pack: `pulumi preview -s prod --policy-pack policies` (it runs in the
project's `.venv`; see `PulumiPolicy.yaml`). The rules themselves are plain functions in
modules by what they protect (`policies/cluster.py`, `weights.py`, `workloads.py`, `tenant_access.py`,
`inference_gateway.py`, `tenant_limits.py`, `availability.py`; `policies/rules.py` assembles the
table), which the offline plan calls on the planned resources, so both give the same
verdicts. Levels are defaults; override them with `--policy-pack-config policies/policy-config.example.json`
for Pulumi, or `vllm-gke plan --policy-config FILE` offline (same format: `{"all": "advisory",
"<policy>": "mandatory" | "disabled" | {"enforcementLevel": ...}}`). The offline plan exits 1 on any
mandatory violation.
"""


def policies_page() -> str:
    from ..policies.rules import POLICIES

    out = [POLICY_PREAMBLE, "| policy | default | what it holds, and what it rejects | rules in |", "|---|---|---|---|"]
    for p in POLICIES:
        module = p.check.__module__.removeprefix("vllm_gke.").replace(".", "/") + ".py"
        out.append(f"| `{p.name}` | {p.level} | {_cell(p.description)} | `{module}` |")
    return "\n".join(out) + "\n" + footer("`policies/rules.py` (POLICIES)")


# --- the component package -----------------------------------------------------------------------

def package_schema() -> dict[str, Any]:
    """The component package's schema, as `vllm-gke schema` writes it. In a process of its own: the
    provider's protos and google-cloud-monitoring's (which the plan's checks load) both define
    google.rpc.Status, and one process cannot hold both."""
    code = ("import json\nfrom vllm_gke.components.provider.host import package_schema\n"
            "print(json.dumps(package_schema(), indent=2, sort_keys=True))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the component package's schema could not be built:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def _short(token: str) -> str:
    return token.rsplit(":", 1)[-1]


def _schema_type(spec: Mapping[str, Any]) -> str:
    ref = spec.get("$ref")
    if isinstance(ref, str):
        if ref.startswith("#/types/"):
            name = _short(ref)
            return f"[{name}](#{github_slug(name)})"
        return "any" if ref.endswith("/Any") else f"`{ref}`"
    kind = spec.get("type")
    if kind == "array":
        return "list of " + _schema_type(spec.get("items") or {})
    if kind == "object" and "additionalProperties" in spec:
        return "map of " + _schema_type(spec["additionalProperties"])
    return str(kind or "any")


def _properties(props: Mapping[str, Any], required: Iterable[str], inputs: bool) -> list[str]:
    required = set(required)
    head = "| input | type | required | description |" if inputs else "| output | type | description |"
    out = [head, "|---|---|---|---|" if inputs else "|---|---|---|"]
    for name in sorted(props):
        spec = props[name]
        kind = _schema_type(spec) + (", secret" if spec.get("secret") else "") + \
            (", plain" if inputs and spec.get("plain") else "")
        text = _cell(spec.get("description") or "")
        if inputs:
            out.append(f"| `{name}` | {_cell(kind)} | {'yes' if name in required else 'no'} | {text} |")
        else:
            out.append(f"| `{name}` | {_cell(kind)} | {text} |")
    return out


def components_page(schema: Mapping[str, Any]) -> str:
    resources = schema["resources"]
    out = ["# Component package reference", "",
           f"The components of the `{schema['name']}` Pulumi package (`components/provider`) as its schema",
           "describes them: what `pulumi package add` generates each language's SDK from (the schema is",
           "inferred from the provider's type annotations; `vllm-gke schema` prints it). Inputs marked plain",
           "take values, not outputs of other resources. How to add the package and use it from each",
           "language: [Using the components from any Pulumi language](../guides/multi-language.md); the",
           "settings the inputs share with a stack's config: [the configuration reference](config.md).", "",
           "Resources: " + ", ".join(f"[{_short(t)}](#{github_slug(_short(t))})" for t in sorted(resources)) + ".", ""]
    for token in sorted(resources):
        r = resources[token]
        out += [f"## {_short(token)}", "", f"`{token}`", "", _cell(r.get("description") or ""), ""]
        inputs = r.get("inputProperties") or {}
        if inputs:
            out += ["### Inputs", "", *_properties(inputs, r.get("requiredInputs") or [], True), ""]
        outputs = r.get("properties") or {}
        if outputs:
            out += ["### Outputs", "", *_properties(outputs, [], False), ""]
    out += ["## Types", "", "The inputs' object types and enums.", ""]
    for token in sorted(schema.get("types") or {}, key=_short):
        t = schema["types"][token]
        out += [f"### {_short(token)}", "", _cell(t.get("description") or ""), ""]
        if "enum" in t:
            out += ["| value | name |", "|---|---|"]
            out += [f"| `{e['value']}` | `{e['name']}` |" for e in t["enum"]]
            out.append("")
        else:
            out += [*_properties(t.get("properties") or {}, t.get("required") or [], True), ""]
    return "\n".join(out).rstrip() + "\n" + footer("the component package's schema (`vllm-gke schema`)")


# --- the code's layers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    id: str
    label: str
    where: str
    # Folders or files (relative to the repository) whose modules the layer holds; the first that
    # matches a module wins.
    paths: tuple[str, ...]


LAYERS: tuple[Layer, ...] = (
    Layer("catalog", "facts", "components/catalog.py, gcp_names.py, vllm_versions.py",
          ("components/catalog.py", "components/gcp_names.py", "components/vllm_versions.py")),
    Layer("config", "config", "components/specs/, stack_config.py",
          ("components/specs/", "components/stack_config.py")),
    Layer("scripts", "pod scripts", "components/scripts/", ("components/scripts/",)),
    Layer("package", "component package", "components/provider/", ("components/provider/",)),
    Layer("components", "components", "components/*.py", ("components/",)),
    Layer("program", "stack program", "infra/program.py, __main__.py, config.py",
          ("infra/program.py", "infra/__main__.py", "infra/config.py")),
    Layer("plan", "offline plan and CLI", "infra/", ("infra/",)),
    Layer("policies", "policy pack", "policies/", ("policies/",)),
    Layer("images", "server image", "images/: serve.py, vllm_gke_guard/", ("images/",)),
)
# What ties layers together other than an import: drawn dashed.
RUNTIME_EDGES: tuple[tuple[str, str, str], ...] = (
    ("components", "images", "declare the pods that run"),
    ("components", "scripts", "mount and run in pods"),
    ("policies", "program", "judge under pulumi preview"),
)
SOURCE_FOLDERS = ("components", "infra", "policies", "images")


def layer_of(path: str) -> Optional[Layer]:
    return next((layer for layer in LAYERS if any(path == p or (p.endswith("/") and path.startswith(p))
                                                  for p in layer.paths)), None)


def _modules(root: Path) -> dict[str, Path]:
    """vllm_gke.<folder>.<...> -> file, for every module of the installed package's folders."""
    out = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(("vllm_gke", *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def import_edges(root: Path = REPO_ROOT) -> set[tuple[str, str]]:
    """(importer, imported) for every import between the project's own modules, relative or
    absolute, at module level or inside functions."""
    modules = _modules(root)
    edges = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target.split(".")[0] in SOURCE_FOLDERS:
                    target = f"vllm_gke.{target}"
                if target in modules and target != name:
                    edges.add((name, target))
    return edges


def layer_edges(root: Path = REPO_ROOT) -> set[tuple[str, str]]:
    """(layer that is imported, layer that imports it) across layers."""
    modules = _modules(root)

    def layer(module: str) -> Optional[Layer]:
        return layer_of(modules[module].relative_to(root).as_posix())

    out = set()
    for importer, imported in import_edges(root):
        a, b = layer(imported), layer(importer)
        if a is not None and b is not None and a != b:
            out.add((a.id, b.id))
    return out


def code_layers(root: Path = REPO_ROOT) -> str:
    """The code's layers as a Mermaid flowchart: a solid arrow from a layer to one that imports it,
    dashed ones for what ties them at run time."""
    out = ["flowchart LR"]
    for layer in LAYERS:
        out.append(f'  {layer.id}["{layer.label}<br/>{layer.where}"]')
    for a, b in sorted(layer_edges(root), key=lambda e: ([x.id for x in LAYERS].index(e[0]), e[1])):
        out.append(f"  {a} --> {b}")
    for a, b, label in RUNTIME_EDGES:
        out.append(f'  {a} -.->|"{label}"| {b}')
    return "\n".join(out) + "\n"


# --- blocks of hand-written pages ---------------------------------------------------------------

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


# --- all of it ----------------------------------------------------------------------------------

def generated(root: Path = REPO_ROOT, schema: Optional[Mapping[str, Any]] = None) -> dict[Path, str]:
    """Every generated page and every hand-written page with its blocks filled, by path relative to
    the repository."""
    pages = {CONFIG_PAGE: config_page(), POLICIES_PAGE: policies_page(),
             COMPONENTS_PAGE: components_page(schema if schema is not None else package_schema())}
    for page in BLOCK_PAGES:
        pages[page] = fill_blocks((root / page).read_text(), root)
    return pages


def stale(root: Path = REPO_ROOT, schema: Optional[Mapping[str, Any]] = None) -> list[Path]:
    return [path for path, text in generated(root, schema).items()
            if not (root / path).exists() or (root / path).read_text() != text]


def write(root: Path = REPO_ROOT) -> list[Path]:
    changed = []
    for path, text in generated(root).items():
        target = root / path
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed


# --- links ---------------------------------------------------------------------------------------

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
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main(argv: Optional[list[str]] = None) -> int:
    changed = write()
    print("\n".join(f"wrote {p}" for p in changed) or "the docs were up to date")
    problems = broken_links(doc_files())
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
