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


def former_parent(urn: str, t: str) -> str:
    """Where the library component's children were while package components wrapped it (up to
    0.3.0): under an inner component of the same type and name as the outer one, whose URN this
    component now has. `urn` is this component's (the engine's, with the whole parent type chain:
    urn:pulumi:STACK::PROJECT::CHAIN::NAME), the former inner one's chain ends in `$t` once more."""
    head, name = urn.rsplit("::", 1)
    return f"{head}${t}::{name}"


class Facade(pulumi.ComponentResource):
    """The package's side of a library component. Python runs the library component's `__init__`,
    whose `super().__init__(token, ...)` lands here (before ComponentResource's): once registered,
    and before the library declares its first child, `prepare` makes what the library's args take
    from the package's inputs - the Kubernetes provider from the kubeconfig, the APIs to enable -
    as this component's children, and fills it into those args (where the package left None).

    Each child the library then declares gets an alias under the former inner component: the engine
    finds this component by its own URN (the former outer one's), so it passes no alias on, and only
    a child found through its alias passes it to its own children (pulumi/pulumi
    pkg/resource/deploy/step_generator.go, generateAliases). So a stack made with 0.3.0 keeps its
    cluster, share and workloads. What `prepare` makes was the outer component's child: no alias."""

    def __init__(self, t: str, name: str, props: Optional[pulumi.Inputs] = None,
                 opts: Optional[pulumi.ResourceOptions] = None, remote: bool = False, package_ref: Any = None) -> None:
        self._library_declares = False
        self._former_type = t
        moved = pulumi.ResourceOptions(transformations=[self._under_former_parent])
        super().__init__(t, name, props, pulumi.ResourceOptions.merge(opts, moved), remote, package_ref)
        self.prepare(name, opts)
        self._library_declares = True

    def _under_former_parent(self, args: pulumi.ResourceTransformationArgs
                             ) -> Optional[pulumi.ResourceTransformationResult]:
        # Its children, and what a child declares that was this component's child before (a
        # VllmService's Standby: aliased to this component, where the library's Platform made it).
        was_mine = any(isinstance(a, pulumi.Alias) and a.parent is self for a in args.opts.aliases or [])
        if not self._library_declares or not (args.opts.parent is self or was_mine):
            return None
        former = pulumi.Alias(parent=self.urn.apply(lambda urn: former_parent(urn, self._former_type)))
        return pulumi.ResourceTransformationResult(
            args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(aliases=[former])))

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        """Children the library's args need, made from the inputs; none by default."""

    def project_apis(self, name: str, opts: Optional[pulumi.ResourceOptions], project: str,
                     apis: Sequence[str], enable: bool) -> Optional[ProjectApis]:
        """The APIs a component calls, enabled first (unless the inputs say enableApis: false)."""
        if not enable:
            return None
        return ProjectApis(f"{name}-apis", ProjectApisArgs(project, apis), opts=child_opts(self, opts))
