"""Resource options for a component's children.

Pulumi does not pass a component's `depends_on` to the resources it creates: children of
`VllmService(..., opts=ResourceOptions(depends_on=[mesh_ready]))` would not wait. Every
component here builds its children's options with `child_opts`, so waiting on a component
means every resource in it waits.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

import pulumi


def inherited_depends_on(opts: Optional[pulumi.ResourceOptions]) -> list[pulumi.Resource]:
    if opts is None or opts.depends_on is None:
        return []
    deps = opts.depends_on
    # Components are given resources, never an Output or awaitable of them.
    return [deps] if isinstance(deps, pulumi.Resource) else list(cast(Sequence[pulumi.Resource], deps))


def child_opts(parent: pulumi.Resource, opts: Optional[pulumi.ResourceOptions],
               provider: Optional[pulumi.ProviderResource] = None,
               depends_on: Sequence[pulumi.Resource] = (), **extra: Any) -> pulumi.ResourceOptions:
    """Parented to `parent`, waiting for what the component waits for plus `depends_on`."""
    return pulumi.ResourceOptions(parent=parent, provider=provider,
                                  depends_on=[*inherited_depends_on(opts), *depends_on], **extra)
