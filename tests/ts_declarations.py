"""TypeScript declarations from the package schema, enough to type-check the example with tsc:
each type an interface, each component a class with typed args and outputs."""

from __future__ import annotations

from typing import Any


def _ts(spec: dict[str, Any], inputs: bool) -> str:
    if "$ref" in spec:
        return spec["$ref"].rsplit(":", 1)[-1]
    kind = spec.get("type")
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


def declarations(schema: dict[str, Any]) -> str:
    out = ['import { Input, Output } from "@pulumi/pulumi";']
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
        out.append(f"export declare class {name} {{\n    constructor(name: string, args: {name}Args, opts?: object);\n"
                   f"{outputs}\n}}")
    return "\n\n".join(out) + "\n"
