"""TypeScript declarations from the package schema, enough to type-check the examples with tsc:
each type an interface, each component a class with typed args and outputs. `write_sdk` lays them
out as the package `pulumi install` generates (sdks/<name>, named as the SDK names itself), typed
against the real @pulumi/pulumi."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _ts(spec: dict[str, Any], inputs: bool) -> str:
    if "$ref" in spec:
        return spec["$ref"].rsplit(":", 1)[-1]
    kind = spec["type"]
    if kind == "array":
        return f"{_wrap(spec['items'], inputs)}[]"
    if kind == "object":
        return f"{{[key: string]: {_wrap(spec.get('additionalProperties', {'type': 'string'}), inputs)}}}"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}[kind]


def _wrap(spec: dict[str, Any], inputs: bool) -> str:
    text = _ts(spec, inputs)
    return text if not inputs or spec.get("plain") else f"Input<{text}>"


def _interface(name: str, props: dict[str, Any], required: list[str], inputs: bool) -> str:
    lines = [f"export interface {name} {{"]
    for prop, spec in props.items():
        lines.append(f"    {prop}{'' if prop in required else '?'}: {_wrap(spec, inputs)};")
    return "\n".join(lines + ["}"])


def declarations(schema: dict[str, Any], real_pulumi: bool = False) -> str:
    """With `real_pulumi`, each component is a pulumi.ComponentResource taking
    ComponentResourceOptions, as in the generated SDK (so `dependsOn` takes resources only);
    without, it needs of @pulumi/pulumi only Input and Output (the tests' stand-in)."""
    if real_pulumi:
        out = ['import * as pulumi from "@pulumi/pulumi";\ntype Input<T> = pulumi.Input<T>;\n'
               "type Output<T> = pulumi.Output<T>;"]
        base, options = " extends pulumi.ComponentResource", "pulumi.ComponentResourceOptions"
    else:
        out = ['import { Input, Output } from "@pulumi/pulumi";']
        base, options = "", "object"
    for token, t in schema.get("types", {}).items():
        if "enum" in t:  # as the SDK's enums: the values are the type (a string literal is assignable)
            values = " | ".join(f'"{e["value"]}"' for e in t["enum"])
            out.append(f"export type {token.rsplit(':', 1)[-1]} = {values};")
            continue
        out.append(_interface(token.rsplit(":", 1)[-1], t.get("properties", {}), t.get("required", []), True))
    for token, r in schema["resources"].items():
        name = token.rsplit(":", 1)[-1]
        out.append(_interface(f"{name}Args", r.get("inputProperties", {}), r.get("requiredInputs", []), True))
        outputs = "\n".join(f"    readonly {p}: Output<{_ts(spec, False)}>;" for p, spec in r.get("properties", {}).items())
        out.append(f"export declare class {name}{base} {{\n"
                   f"    constructor(name: string, args: {name}Args, opts?: {options});\n{outputs}\n}}")
    return "\n\n".join(out) + "\n"


def node_package(schema: dict[str, Any]) -> tuple[str, str]:
    """The npm name the SDK takes and the folder `pulumi package add` / `pulumi install` writes it
    to, relative to the program: language.nodejs.packageName, else @<namespace>/<name>, else
    @pulumi/<name>; in sdks/<namespace>-<name>, or sdks/<name> without a namespace."""
    namespace, name = schema.get("namespace", ""), schema["name"]
    package = schema.get("language", {}).get("nodejs", {}).get("packageName") or f"@{namespace or 'pulumi'}/{name}"
    return package, f"sdks/{namespace}-{name}" if namespace else f"sdks/{name}"


def write_sdk(schema: dict[str, Any], program: Path) -> Path:
    """Declarations-only stand-in for the SDK `pulumi install` generates in `program`: where
    the program's package.json links it, named as it names itself, typed against @pulumi/pulumi."""
    package, folder = node_package(schema)
    sdk = program / folder
    sdk.mkdir(parents=True)
    (sdk / "package.json").write_text(json.dumps({"name": package, "version": schema["version"], "types": "index.d.ts"}))
    (sdk / "index.d.ts").write_text(declarations(schema, real_pulumi=True))
    return sdk
