"""docs/reference/components.md: the component package's Pulumi schema (`vllm-gke schema`)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Iterable, Mapping

from .common import _cell, footer, github_slug


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
