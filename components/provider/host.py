"""Hosting the package: the SDK's ComponentProvider, reading each package component as its own
class (schema_view), plus the secret flags its analyzer cannot infer (an annotation cannot say
`secret`), so generated SDKs and `pulumi preview` treat the kubeconfig as the credential-bearing
value it is."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional, cast

from pulumi.errors import InputPropertiesError
from pulumi.provider import ConstructResult, main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError
from pulumi.resource import ComponentResource, ResourceOptions

from ..model.stack_config import ConfigError
from . import COMPONENTS

if sys.version_info >= (3, 11):
    import tomllib

PACKAGE = "vllm-gke"
# Output properties whose values are secret, by component.
SECRET_OUTPUTS = {"GpuCluster": ("kubeconfig",), "Platform": ("kubeconfig",)}
# Inputs that carry credentials, by component.
SECRET_INPUTS = {name: ("kubeconfig",) for name in ("ModelStore", "VllmService", "Gateway", "TenantAuth", "MeshReadiness",
                                                     "Keda", "MeshNamespace", "InferencePool", "LimitStore",
                                                     "InferenceObjectiveCrd")}


def package_version() -> str:
    """The one version, from pyproject.toml (via the installed distribution)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        if sys.version_info < (3, 11):  # no tomllib: Python 3.10 needs the installed distribution
            raise
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


def mark_secrets(schema: dict[str, Any]) -> dict[str, Any]:
    for component, props in SECRET_OUTPUTS.items():
        for prop in props:
            schema["resources"][f"{PACKAGE}:index:{component}"]["properties"][prop]["secret"] = True
    for component, props in SECRET_INPUTS.items():
        for prop in props:
            schema["resources"][f"{PACKAGE}:index:{component}"]["inputProperties"][prop]["secret"] = True
    return schema


def schema_view(component: type[ComponentResource]) -> type[ComponentResource]:
    """A package component as the SDK's analyzer should read it. The analyzer takes every annotation
    along the class's bases as an output, and a package component's bases include the library
    component it is (`class Keda(_Keda, Facade)`), whose attributes (the Helm release, the cluster)
    are no outputs: the view has the package class's own name, docs, inputs (its `__init__`) and
    outputs only (its source, where the analyzer reads each output's description, is the class's).
    Calling the view, as the provider does to construct one, makes the package component."""
    make = cast(Callable[[str, Any, Optional[ResourceOptions]], ComponentResource], component)

    def new(_view: type, name: str, args: Any, opts: Optional[ResourceOptions] = None) -> ComponentResource:
        return make(name, args, opts)

    own = {key: getattr(component, key) for key in ("__module__", "__qualname__", "__doc__", "__init__")}
    return type(component.__name__, (ComponentResource,), {
        **own, "__annotations__": dict(component.__dict__.get("__annotations__", {})), "__new__": staticmethod(new)})


class VllmGkeProvider(ComponentProvider):
    def __init__(self, version: Optional[str] = None) -> None:
        super().__init__([schema_view(c) for c in COMPONENTS], PACKAGE, version=version or package_version())
        self.schema = json.dumps(mark_secrets(json.loads(self.schema or "{}")))

    def construct(self, name: str, resource_type: str, inputs: Any, options: Any = None) -> ConstructResult:
        """Bad inputs reach the engine as input-property errors (one per key, with the fix), which
        every language's CLI prints as such, instead of a Python traceback from inside the plugin."""
        try:
            return super().construct(name, resource_type, inputs, options)
        except ComponentInitError as exc:
            if isinstance(exc.inner, ConfigError):
                raise input_properties_error(resource_type, exc.inner) from None
            raise


def input_properties_error(resource_type: str, error: ConfigError) -> InputPropertiesError:
    component = resource_type.rsplit(":", 1)[-1]
    return InputPropertiesError(str(error), [
        {"property_path": issue.key.removeprefix(f"{component}."), "reason": issue.problem} for issue in error.issues])


def package_schema() -> dict[str, Any]:
    """The schema `pulumi package add` receives, built offline (tests check it)."""
    return json.loads(VllmGkeProvider().schema or "{}")


def serve(args: Optional[list[str]] = None) -> None:
    # The language host passes the plugin's folder, then the engine's address and flags.
    main(VllmGkeProvider(), list(sys.argv[1:] if args is None else args))
