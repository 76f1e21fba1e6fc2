"""Run a TypeScript example as `pulumi up` would, minus the engine: tsc compiles it, node runs it
against a stand-in @pulumi/vllm-gke that records each component it constructs (name, inputs,
dependsOn, and which other component's output feeds which input), and `replay` builds the same
components through the package's Python classes (what the provider host calls) under the mocks.
What the TypeScript program wires is then judged like any plan."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from tests.ts_declarations import declarations

# Every output a stand-in component is asked for is a reference to (component, output).
STUB_SDK = """
const records = [];
function ref(name, prop) { return { __ref: [name, prop] }; }
function component(type) {
  return class {
    constructor(name, args, opts) {
      records.push({ type, name, args, dependsOn: ((opts || {}).dependsOn || []).map(r => r.__name) });
      this.__name = name;
      return new Proxy(this, { get: (t, p) => (p in t ? t[p] : ref(name, p)) });
    }
  };
}
process.on("exit", () => require("fs").writeFileSync(process.env.RECORD_TO, JSON.stringify(records)));
"""
STUB_PULUMI = """
class Config { constructor(ns) { this.ns = ns; }
  require(key) { return JSON.parse(process.env.STUB_CONFIG)[`${this.ns}:${key}`]; } }
module.exports = { Config };
"""


def record_program(schema: dict[str, Any], source: Path, work: Path, config: dict[str, str]) -> list[dict[str, Any]]:
    """The components `source` constructs, in order, as recorded by the stand-in SDK."""
    sdk = work / "node_modules" / "@pulumi" / "vllm-gke"
    pulumi = work / "node_modules" / "@pulumi" / "pulumi"
    sdk.mkdir(parents=True)
    pulumi.mkdir(parents=True)
    (sdk / "index.d.ts").write_text(declarations(schema))
    components = sorted(token.rsplit(":", 1)[-1] for token in schema["resources"])
    (sdk / "index.js").write_text(STUB_SDK + "".join(
        f"exports.{c} = component({json.dumps(c)});\n" for c in components))
    (pulumi / "index.d.ts").write_text(
        "export type Input<T> = T | Output<T>;\nexport interface Output<T> { apply<U>(f: (t: T) => U): Output<U>; }\n"
        "export class Config { constructor(name?: string); require(key: string): string; }\n")
    (pulumi / "index.js").write_text(STUB_PULUMI)
    shutil.copy(source, work / "index.ts")
    tsc = subprocess.run(["tsc", "--strict", "--target", "es2020", "--module", "commonjs", "--moduleResolution", "node",
                          "index.ts"], cwd=work, capture_output=True, text=True)
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr
    out = work / "records.json"
    run = subprocess.run(["node", "index.js"], cwd=work, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "RECORD_TO": str(out), "STUB_CONFIG": json.dumps(config)})
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text())


def snake(value: Any) -> Any:
    """Schema (camelCase) names to Python names, as the provider host maps them (map keys that
    are the user's own, such as consumerNamespaces', are lower-case and stay as they are)."""
    if isinstance(value, dict) and "__ref" not in value:
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


def replay(records: list[dict[str, Any]], classes: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    """Construct each recorded component with the package's classes, outputs wired as recorded."""
    import pulumi

    built: dict[str, Any] = {}

    def resolve(value: Any) -> Any:
        if isinstance(value, dict) and "__ref" in value:
            name, prop = value["__ref"]
            return getattr(built[name], re.sub(r"(?<!^)(?=[A-Z])", "_", prop).lower())
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    for record in records:
        opts = pulumi.ResourceOptions(depends_on=[built[n] for n in record["dependsOn"]])
        built[record["name"]] = classes[record["type"]](record["name"], resolve(snake(record["args"])), opts)
    return built


# The same replay through the provider host's own entry point (VllmGkeProvider.construct: schema
# names, enum members, input mapping), in a process of its own, as the plugin runs (its protos clash
# with Google's API client's). Prints what the mocks recorded, as JSON.
REPLAY_THROUGH_HOST = """
import json, sys
from dataclasses import asdict
from pulumi.resource import ResourceOptions
from vllm_gke.components.provider.host import VllmGkeProvider
from vllm_gke.infra.plan import _under_mocks

records, config = json.loads(sys.stdin.read())


class Recording(VllmGkeProvider):
    # Keeps the component each construct built, for the program's dependsOn.
    instances = []

    def get_state(self, instance, component_def):
        self.instances.append(instance)
        return super().get_state(instance, component_def)


provider = Recording()

def body():
    built = {}
    def resolve(value):
        if isinstance(value, dict) and "__ref" in value:
            name, prop = value["__ref"]
            return built[name][0].state[prop]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value
    for r in records:
        opts = ResourceOptions(depends_on=[built[n][1] for n in r["dependsOn"]])
        result = provider.construct(r["name"], f"vllm-gke:index:{r['type']}", resolve(r["args"]), opts)
        built[r["name"]] = (result, provider.instances[-1])

recorded = _under_mocks("ts", "dev", config, body)
print(json.dumps([{**asdict(r), "dependencies": sorted(r.dependencies)} for r in recorded], default=str))
"""


def replay_through_host(records: list[dict[str, Any]], config: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    import sys

    result = subprocess.run([sys.executable, "-c", REPLAY_THROUGH_HOST], input=json.dumps([records, config]),
                            capture_output=True, text=True, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)
