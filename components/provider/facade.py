"""What every package component shares: it IS the library component it exposes (one resource, the
library's type token and URN), with the package's typed inputs and outputs.

`class Keda(_Keda, Facade)`: Keda's typed `__init__` converts the package's inputs to KedaArgs and
calls the library's `__init__`, whose first act, registering the component, runs through Facade.
The SDK's analyzer reads the package class's own annotations only (host.schema_view): the library
component's attributes are no outputs.
"""

from typing import Any, Optional, Sequence

import pulumi

from ..options import child_opts
from ..project_apis import ProjectApis, ProjectApisArgs

# An args field `prepare` fills in (the library reads it only once the component is registered).
LATER: Any = None


def former_urn(t: str, name: str, opts: Optional[pulumi.ResourceOptions]) -> pulumi.Output[str]:
    """Where the library component was while package components wrapped it (up to 0.3.0): an
    inner component of the same type and name under the outer one. Aliasing it keeps the URNs of its
    children, which Pulumi derives from their parent's aliases: a stack made then replaces nothing."""
    outer = pulumi.create_urn(name, t, parent=opts.parent if opts else None)
    return pulumi.create_urn(name, t, parent=outer)


class Facade(pulumi.ComponentResource):
    """The package's side of a library component. Python runs the library component's `__init__`,
    whose `super().__init__(token, ...)` lands here (before ComponentResource's): once registered,
    and before the library declares its first child, `prepare` makes what the library's args take
    from the package's inputs - the Kubernetes provider from the kubeconfig, the APIs to enable -
    as this component's children, and fills it into those args (where the package left None)."""

    def __init__(self, t: str, name: str, props: Optional[pulumi.Inputs] = None,
                 opts: Optional[pulumi.ResourceOptions] = None, remote: bool = False, package_ref: Any = None) -> None:
        aliased = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[former_urn(t, name, opts)]))
        super().__init__(t, name, props, aliased, remote, package_ref)
        self.prepare(name, opts)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        """Children the library's args need, made from the inputs; none by default."""

    def project_apis(self, name: str, opts: Optional[pulumi.ResourceOptions], project: str,
                     apis: Sequence[str], enable: bool) -> Optional[ProjectApis]:
        """The APIs a component calls, enabled first (unless the inputs say enableApis: false)."""
        if not enable:
            return None
        return ProjectApis(f"{name}-apis", ProjectApisArgs(project, apis), opts=child_opts(self, opts))
