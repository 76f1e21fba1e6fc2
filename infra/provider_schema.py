"""Every Google Cloud resource the plan records, checked against the provider's schema as the engine
would send it: the inputs the mocks recorded (infra/mocks.py) against pulumi_gcp's Python SDK.

No provider plugin and no network here, so the schema is the SDK's own: each resource's Args class
and the `@pulumi.input_type` classes of its module's _inputs.py, read through their
`pulumi.getter(name=...)` wire names and type annotations, recursively. A resource's inputs fail on
a key no input type declares (a typo, or a key the SDK passed through untranslated from a plain dict
or a transform), a required key missing, a value of the wrong wire type (string, integer, number,
boolean, list, map, object) and, where a field's docstring says exactly "Possible values are: `A`,
`B`." (or "Each value may be one of: ..." for a list of strings), a value outside that list. The same
for the providers' own inputs (pulumi:providers:gcp and :kubernetes, whose non-string values the SDK
sends as JSON text) and a Helm release (the one Kubernetes resource that is not a manifest the
manifest check sees). Output-only properties are not inputs, so setting one fails as unknown.

Stricter than the provider on purpose. The bridge's own type check (pulumi/pulumi-terraform-bridge@59de6c66:
pkg/tfbridge/provider.go Check, pkg/tfbridge/typechecker/typechecker.go) only warns unless
PULUMI_ERROR_TYPE_CHECKER is set, lets keys the schema lacks flow through, and takes "true"/"false" for a
boolean and a string for a number, which it coerces; what Terraform then refuses, ignores or coerces depends on
the resource. A value the schema does not type as sent is a defect here wherever the engine would have let it by.
"""

from __future__ import annotations

import collections.abc as abc
import difflib
import functools
import importlib
import importlib.metadata
import json
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union, get_args, get_origin, get_type_hints, is_typeddict

import pulumi
from pulumi.runtime import rpc

from .mocks import PlannedResource

# The SDK of each provider package a type token names ("gcp:compute/network:Network").
SDKS = {"gcp": "pulumi_gcp", "kubernetes": "pulumi_kubernetes"}
# Kubernetes objects are checked as manifests against their OpenAPI schemas and CRDs
# (infra/manifests.py); of that package only these go through the SDK's types here.
KUBERNETES_CHECKED = ("kubernetes:helm.sh/v3:Release", "pulumi:providers:kubernetes")
# The engine's placeholder for a value unknown at preview (never under the mocks, which resolve all).
UNKNOWN = rpc.UNKNOWN
_ENUM = re.compile(r"Possible values are: ((?:`[^`]*`)(?:, `[^`]*`)*)\.")
_EACH_ENUM = re.compile(r"Each value may be one of: ((?:`[^`]*`)(?:, `[^`]*`)*)\.")


@dataclass(frozen=True)
class Prop:
    """One input property: its annotation, whether it must be set, and its documented values."""

    hint: Any
    required: bool
    # The docstring's "Possible values are" list (for a string), or "Each value may be one of" (for
    # each string of a list); empty where the docstring states none in those exact words.
    values: tuple[str, ...] = ()


def sdk_version(package: str = "gcp") -> str:
    return importlib.metadata.version(SDKS[package])


def in_scope(resource: PlannedResource) -> bool:
    """A custom resource of a Google Cloud SDK type, a provider, or a Helm release."""
    package = package_of(resource.type)
    if not resource.custom or package not in SDKS:
        return False
    return package == "gcp" or resource.type in KUBERNETES_CHECKED


def package_of(type_: str) -> str:
    parts = type_.split(":")
    return parts[2] if parts[:2] == ["pulumi", "providers"] else parts[0]


@functools.cache
def args_class(type_: str) -> Optional[type]:
    """The SDK's Args class for a type token: "gcp:cloudrunv2/service:Service" is
    pulumi_gcp.cloudrunv2's Service, whose module defines ServiceArgs; "pulumi:providers:gcp" is
    pulumi_gcp.Provider. None where the SDK has no such resource."""
    sdk = SDKS[package_of(type_)]
    if type_.startswith("pulumi:providers:"):
        module, name = sdk, "Provider"
    else:
        _, mod, name = type_.split(":")
        group, _, version = mod.partition("/")
        # gcp: "cloudrunv2/service" -> .cloudrunv2; kubernetes: "helm.sh/v3" -> .helm.v3
        path = group if group != "index" else ""
        if package_of(type_) == "kubernetes":
            path = f"{group.split('.')[0]}.{version}"
        module = f"{sdk}.{path}" if path else sdk
    try:
        resource_cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return getattr(sys.modules[resource_cls.__module__], f"{name}Args", None)


@functools.cache
def properties(cls: type) -> dict[str, Prop]:
    """An input type's properties by wire name, from its getters (as pulumi._types reads them):
    each annotation resolved in the globals of the class's module."""
    globalns = dict(sys.modules[cls.__module__].__dict__)
    localns = {"Output": pulumi.Output, "T": type(None)}  # what pulumi.Input names, as pulumi._types passes them
    out: dict[str, Prop] = {}
    for base in reversed(cls.__mro__):
        for attr in vars(base).values():
            getter = attr.fget if isinstance(attr, property) else None
            wire = getattr(getter, "_pulumi_name", None)
            if getter is None or wire is None:
                continue
            hint = get_type_hints(getter, globalns=globalns, localns=localns)["return"]
            out[wire] = Prop(hint, required=type(None) not in _flatten(hint), values=_documented(getter, hint))
    return out


def _flatten(hint: Any) -> list[Any]:
    """The members of a hint's unions, less Input's Awaitable[T] and Output[T]: T stands beside them,
    and Output's T is not T (pulumi.Input spells it "Output[T]", a forward reference that
    subscripting leaves alone, so it resolves to the T of the local namespace)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return [m for a in get_args(hint) for m in _flatten(a)]
    if origin in (pulumi.Output, abc.Awaitable):
        return []
    return [hint]


def members(hint: Any) -> list[Any]:
    """What a value may be on the wire: the hint's members less None, and less the TypedDicts and
    output types that stand beside an input type as other spellings of the same object."""
    out: list[Any] = []
    for m in _flatten(hint):
        if m is type(None) or m in out:
            continue
        if isinstance(m, type) and (is_typeddict(m) or _is_output_type(m)):
            continue
        out.append(m)
    return out


def _is_output_type(cls: type) -> bool:
    return bool(getattr(cls, "_pulumi_output_type", False))


def _is_input_type(cls: Any) -> bool:
    return isinstance(cls, type) and bool(getattr(cls, "_pulumi_input_type", False))


def _documented(getter: Any, hint: Any) -> tuple[str, ...]:
    doc = " ".join((getter.__doc__ or "").split())
    shape = members(hint)
    if shape == [str]:
        found = _ENUM.findall(doc)
    elif len(shape) == 1 and get_origin(shape[0]) in (abc.Sequence, list) and members(get_args(shape[0])[0]) == [str]:
        found = _EACH_ENUM.findall(doc)
    else:
        return ()
    # One list, stated once: two lists in one docstring (a field's and a sub-field's) are not guessed at.
    if len(set(found)) != 1:
        return ()
    return tuple(v.strip("`") for v in found[0].split(", "))


def check_value(value: Any, hint: Any, path: str, values: tuple[str, ...] = ()) -> list[str]:
    """Where `value` (as the wire carries it) departs from `hint`, the property's declared type."""
    if value is None or value == UNKNOWN or (isinstance(value, dict) and rpc._special_sig_key in value):  # pyright: ignore[reportPrivateUsage]
        return []  # unset, unknown, or an asset, archive or resource reference the engine resolves
    shape = members(hint)
    if len(shape) != 1:  # Any, or a union of several wire types: the first that takes it
        if not shape or any(not check_value(value, m, path, values) for m in shape):
            return []
        return [f"{path}: {_wire(value)} where the SDK takes {' or '.join(_name(m) for m in shape)}"]
    return _check_one(value, shape[0], path, values)


def _check_one(value: Any, typ: Any, path: str, values: tuple[str, ...]) -> list[str]:
    origin = get_origin(typ)
    if _is_input_type(typ):
        return check_object(value, typ, path) if isinstance(value, dict) else [_wrong(path, value, typ)]
    if origin in (abc.Sequence, list):
        if not isinstance(value, list):
            return [_wrong(path, value, typ)]
        return [e for i, v in enumerate(value) for e in check_value(v, get_args(typ)[0], f"{path}[{i}]", values)]
    if origin in (abc.Mapping, dict):
        if not isinstance(value, dict):
            return [_wrong(path, value, typ)]
        return [e for k, v in value.items() for e in check_value(v, get_args(typ)[1], f"{path}.{k}")]
    if origin is Literal:
        return [] if value in get_args(typ) else [f"{path}: {_wire(value)} where the SDK takes one of {list(get_args(typ))}"]
    if typ is Any or typ is object or not isinstance(typ, type) or typ not in (str, int, float, bool):
        return []  # Any, pulumi.Asset and the like: no shape to hold it to
    if not _scalar_fits(value, typ):
        return [_wrong(path, value, typ)]
    if values and typ is str and value not in values:
        return [f"{path}: {value!r} is not one of the documented values: {', '.join(values)}"]
    return []


def _scalar_fits(value: Any, typ: type) -> bool:
    # bool is an int to Python, never to the provider; the wire's numbers are all floats.
    if typ is bool or isinstance(value, bool):
        return typ is bool and isinstance(value, bool)
    if typ is int:
        return isinstance(value, (int, float)) and float(value).is_integer()
    if typ is float:
        return isinstance(value, (int, float))
    return isinstance(value, str)


def check_object(value: dict[str, Any], cls: type, path: str) -> list[str]:
    """Unknown keys, missing required keys, and each value against its property's type."""
    props = properties(cls)
    errors: list[str] = []
    for key, v in value.items():
        where = f"{path}.{key}" if path else key
        if key not in props:
            close = difflib.get_close_matches(key, list(props), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            errors.append(f"{where}: unknown key ({cls.__name__} has no '{key}'{hint})")
        else:
            errors += check_value(v, props[key].hint, where, props[key].values)
    for key, prop in props.items():
        if prop.required and value.get(key) is None:
            errors.append(f"{f'{path}.' if path else ''}{key}: required by {cls.__name__}, missing")
    return errors


def _name(typ: Any) -> str:
    origin = get_origin(typ)
    if origin in (abc.Sequence, list):
        return f"list of {_name(members(get_args(typ)[0])[0]) if members(get_args(typ)[0]) else 'any'}"
    if origin in (abc.Mapping, dict):
        return "map"
    if _is_input_type(typ):
        return f"object ({typ.__name__})"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(typ, getattr(typ, "__name__", str(typ)))


def _wire(value: Any) -> str:
    kind = {bool: "boolean", str: "string", list: "list", dict: "object"}.get(type(value), "number")
    return f"{kind} {json.dumps(value, default=str)[:60]}"


def _wrong(path: str, value: Any, typ: Any) -> str:
    return f"{path}: {_wire(value)} where the SDK takes {_name(typ)}"


def _provider_inputs(resource: PlannedResource, cls: type) -> tuple[dict[str, Any], list[str]]:
    """A provider's inputs as its configuration: the SDK sends each value that is not a string as
    JSON text, so read those back where the property is not a string."""
    props = properties(cls)
    out: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in resource.props.items():
        if isinstance(value, str) and key in props and members(props[key].hint) != [str]:
            try:
                value = json.loads(value)
            except ValueError:
                errors.append(f"{key}: {value!r} is not the JSON text a provider's {_name(props[key].hint)} is sent as")
                continue
        out[key] = value
    return out, errors


def check_resource(resource: PlannedResource) -> list[str]:
    """Where one recorded resource's inputs depart from its provider's schema."""
    cls = args_class(resource.type)
    if cls is None:
        return [f"{SDKS[package_of(resource.type)]} {sdk_version(package_of(resource.type))} has no resource "
                f"{resource.type}"]
    try:
        props, errors = resource.props, []
        if resource.type.startswith("pulumi:providers:"):
            props, errors = _provider_inputs(resource, cls)
        return errors + check_object(props, cls, "")
    except NameError as exc:  # an annotation the SDK's own module cannot resolve
        return [f"the SDK's schema for {resource.type} could not be read: {exc}"]


def problems(resources: list[PlannedResource]) -> list[tuple[str, list[str]]]:
    """(resource, where its inputs depart from the schema) for each checked resource that fails."""
    return [(f"{r.type} {r.name}", errs) for r in resources if in_scope(r) and (errs := check_resource(r))]


def checked(resources: list[PlannedResource]) -> int:
    return sum(in_scope(r) for r in resources)
