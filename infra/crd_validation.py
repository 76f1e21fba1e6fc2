"""Validate custom resources against the upstream CRDs, as the Kubernetes API server does.

For each custom resource, every upstream CRD version we hold for its apiVersion and kind
(../shared/upstream-crds: Gateway API, Istio, GKE, GMP, Secrets Store CSI) is applied in the
API server's order:
  1. pruning: a field the structural schema does not declare is dropped silently by the
     server, so here it is an error (a typo would otherwise vanish without a trace);
  2. defaulting: `default` values fill absent fields, so rules see what the server sees;
  3. the OpenAPI schema (types, enums, patterns, bounds, required, list-type set/map);
  4. every `x-kubernetes-validations` CEL rule, evaluated with cel-python plus the
     Kubernetes CEL library functions the CRDs use (strings, url). Transition rules
     (those reading `oldSelf`) only run on update and are skipped for a create.
A resource must pass every version we hold, so what we emit works on old and new clusters.
"""

from __future__ import annotations

import copy
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional

import celpy
import jsonschema
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel  # where defined: celpy re-exports these two as private names
from celpy.evaluation import CELEvalError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CRD_DIR = REPO_ROOT.parent / "shared" / "upstream-crds"
CRD_DIR_ENV = "VLLM_GKE_CRDS_DIR"

Schema = dict[str, Any]


def crd_dir() -> Optional[Path]:
    """Where the upstream CRDs are: $VLLM_GKE_CRDS_DIR, else ../shared/upstream-crds; None if absent.
    Never the network (the tests' folder); a user's plan also has the pinned files fetched into a
    cache (infra/crd_cache.py: crd_folder)."""
    path = Path(os.environ.get(CRD_DIR_ENV) or DEFAULT_CRD_DIR)
    return path if path.is_dir() else None


@dataclass(frozen=True)
class CrdVersion:
    source: str  # file name it came from
    api_version: str
    kind: str
    schema: Schema


@dataclass
class CrdCatalog:
    by_kind: dict[tuple[str, str], list[CrdVersion]] = field(default_factory=dict)

    def add(self, version: CrdVersion) -> None:
        self.by_kind.setdefault((version.api_version, version.kind), []).append(version)

    def versions(self, api_version: str, kind: str) -> list[CrdVersion]:
        return self.by_kind.get((api_version, kind), [])

    def kinds(self) -> set[tuple[str, str]]:
        return set(self.by_kind)


def _crd_documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            yield doc


@lru_cache(maxsize=4)
def load_catalog(directory: Path) -> CrdCatalog:
    """Every served version of every CRD file in `directory`, plus the datree schema dumps
    (openAPIV3Schema as installed on GKE; file name <group>_<kind>_<version>.json)."""
    catalog = CrdCatalog()
    kind_names: dict[tuple[str, str], str] = {}
    for path in sorted(directory.glob("*.yaml")):
        for crd in _crd_documents(path):
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            kind_names[(group, kind.lower())] = kind
            for v in crd["spec"]["versions"]:
                if v.get("served", True) and "schema" in v:
                    catalog.add(CrdVersion(path.name, f"{group}/{v['name']}", kind,
                                           v["schema"]["openAPIV3Schema"]))
    for path in sorted(directory.glob("datree-*.json")):
        group, kind_lower, version = path.stem.removeprefix("datree-").rsplit("_", 2)
        kind = kind_names.get((group, kind_lower))
        if kind is not None:
            catalog.add(CrdVersion(path.name, f"{group}/{version}", kind, json.loads(path.read_text())))
    return catalog


# --- structural schema walk: pruning, defaulting, list types, CEL ------------------------

def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def _preserves_unknown(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def unknown_fields(value: Any, schema: Schema, path: tuple[Any, ...] = ()) -> list[str]:
    """Fields the API server would prune: present in the object, absent from the schema."""
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            if path == () and key in ROOT_FIELDS:
                continue  # TypeMeta and ObjectMeta are the server's own, not the CRD schema's
            if props is not None and key in props:
                out += unknown_fields(child, props[key], path + (key,))
            elif isinstance(extra, dict):
                out += unknown_fields(child, extra, path + (key,))
            elif props is not None and not _preserves_unknown(schema) and extra is not True:
                out.append(f"{_where(path + (key,))}: unknown field '{key}' (the API server prunes it silently)")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += unknown_fields(item, schema["items"], path + (i,))
    return out


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Structural defaulting: absent properties with a `default` get it, recursively."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, child in value.items():
            sub = props.get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                value[key] = apply_defaults(child, sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def to_json_schema(schema: Any) -> Any:
    """OpenAPI v3 (Kubernetes dialect) to JSON Schema draft 4: nullable, int-or-string."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_json_schema(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k not in ("nullable", "default", "description", "example")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in schema:
        out["properties"] = {k: to_json_schema(v) for k, v in schema["properties"].items()}
    return out


def list_type_errors(value: Any, schema: Schema, path: tuple[Any, ...] = ()) -> list[str]:
    out: list[str] = []
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        if kind == "set":
            seen = [json.dumps(v, sort_keys=True) for v in value]
            if len(seen) != len(set(seen)):
                out.append(f"{_where(path)}: duplicate entries in a list of type set")
        elif kind == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen_keys = [tuple(json.dumps(v.get(k)) for k in keys) for v in value if isinstance(v, dict)]
            if len(seen_keys) != len(set(seen_keys)):
                out.append(f"{_where(path)}: duplicate entries for map keys {keys}")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                out += list_type_errors(item, schema["items"], path + (i,))
    elif isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, child in value.items():
            if key in props:
                out += list_type_errors(child, props[key], path + (key,))
    return out


# --- CEL with the Kubernetes library ---------------------------------------------------------

def _substring(s: Any, start: Any, end: Any = None) -> celtypes.StringType:
    return celtypes.StringType(str(s)[int(start):] if end is None else str(s)[int(start):int(end)])


def _split(s: Any, sep: Any, limit: Any = None) -> celtypes.ListType:
    parts = str(s).split(str(sep)) if limit is None else str(s).split(str(sep), max(int(limit) - 1, 0))
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _is_url(s: Any) -> celtypes.BoolType:
    # Kubernetes' isURL: an absolute URI or an absolute path, parsed by Go's url.ParseRequestURI.
    text = str(s)
    parsed = urllib.parse.urlsplit(text)
    ok = bool(text) and " " not in text and (bool(parsed.scheme) or text.startswith("/"))
    return celtypes.BoolType(ok)


def _url(s: Any) -> celtypes.MapType:
    if not _is_url(s):
        raise ValueError(f"url: invalid URL {s!r}")
    p = urllib.parse.urlsplit(str(s))
    return celtypes.MapType({celtypes.StringType("scheme"): celtypes.StringType(p.scheme),
                             celtypes.StringType("host"): celtypes.StringType(p.netloc),
                             celtypes.StringType("hostname"): celtypes.StringType(p.hostname or ""),
                             celtypes.StringType("port"): celtypes.StringType(str(p.port or "")),
                             celtypes.StringType("path"): celtypes.StringType(p.path),
                             celtypes.StringType("query"): celtypes.StringType(p.query)})


def _url_part(part: str):
    return lambda u: u[celtypes.StringType(part)]


_NUMBERS = (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)


def _heterogeneous_eq(a: Any, b: Any) -> Any:
    """cel-go (and so Kubernetes) compares values of different types as unequal, not as an error."""
    if isinstance(a, CELEvalError):
        return a
    if isinstance(b, CELEvalError):
        return b
    if type(a) is not type(b) and not (isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS)):
        return celtypes.BoolType(False)
    return celtypes.BoolType(a == b)


def _heterogeneous_ne(a: Any, b: Any) -> Any:
    eq = _heterogeneous_eq(a, b)
    return eq if isinstance(eq, CELEvalError) else celtypes.BoolType(not eq)


CEL_FUNCTIONS = {
    "_==_": _heterogeneous_eq, "_!=_": _heterogeneous_ne,
    "substring": _substring, "split": _split, "isURL": _is_url, "url": _url,
    "getScheme": _url_part("scheme"), "getHost": _url_part("host"), "getHostname": _url_part("hostname"),
    "getPort": _url_part("port"), "getEscapedPath": _url_part("path"), "getQuery": _url_part("query"),
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "indexOf": lambda s, sub: celtypes.IntType(str(s).find(str(sub))),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "join": lambda items, sep="": celtypes.StringType(str(sep).join(str(i) for i in items)),
}

_ENV = celpy.Environment()


@lru_cache(maxsize=None)
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule), functions=CEL_FUNCTIONS)


def is_transition_rule(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


def eval_rule(rule: str, value: Any) -> tuple[bool, Optional[str]]:
    """(passed, error): a rule that fails to evaluate fails validation, as on the server."""
    try:
        result = _program(rule).evaluate({"self": json_to_cel(value)})
    except Exception as exc:  # compile or evaluation error: the server rejects the object
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    if isinstance(result, CELEvalError):
        return False, str(result.args[0] if result.args else result).splitlines()[0][:200]
    return bool(result) and isinstance(result, celtypes.BoolType), None


def cel_errors(value: Any, schema: Schema, path: tuple[Any, ...] = ()) -> list[str]:
    out: list[str] = []
    for v in schema.get("x-kubernetes-validations") or []:
        rule = v["rule"]
        if is_transition_rule(rule):
            continue
        ok, err = eval_rule(rule, value)
        if not ok:
            reason = v.get("message") or f"failed rule: {rule}"
            out.append(f"{_where(path)}: {reason}" + (f" (evaluation error: {err})" if err else ""))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None and not (path == () and key in ROOT_FIELDS):
                out += cel_errors(child, sub, path + (key,))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += cel_errors(item, schema["items"], path + (i,))
    return out


@lru_cache(maxsize=None)
def _validator(source: str, api_version: str, kind: str, schema_json: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(to_json_schema(json.loads(schema_json)))


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_against(doc: dict[str, Any], crd: CrdVersion) -> list[str]:
    """Problems the API server would report creating `doc` under this CRD version."""
    errors = unknown_fields(doc, crd.schema)
    defaulted = apply_defaults(copy.deepcopy(doc), crd.schema)
    validator = _validator(crd.source, crd.api_version, crd.kind, json.dumps(crd.schema, sort_keys=True))
    for e in sorted(validator.iter_errors(defaulted), key=lambda e: list(e.absolute_path)):
        errors.append(f"{_where(tuple(e.absolute_path))}: {e.message}")
    errors += list_type_errors(defaulted, crd.schema)
    errors += cel_errors(defaulted, crd.schema)
    name = (doc.get("metadata") or {}).get("name", "")
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name: '{name}' is not a DNS subdomain")
    return errors


def validate_custom_resource(doc: dict[str, Any], catalog: CrdCatalog) -> Optional[list[str]]:
    """Problems against every upstream version held; None when no CRD for the kind is held."""
    versions = catalog.versions(doc.get("apiVersion", ""), doc.get("kind", ""))
    if not versions:
        return None
    return [f"[{crd.source}] {err}" for crd in versions for err in validate_against(doc, crd)]


def defaulted(doc: dict[str, Any], crd: CrdVersion) -> dict[str, Any]:
    """`doc` as the server stores it under `crd`: with every default applied."""
    return apply_defaults(copy.deepcopy(doc), crd.schema)
