"""The stack program: one Platform from the stack's validated config, and the stack's outputs.

Stacks differ only in config; everything is derived from it (components/platform.py).
"""

from __future__ import annotations

import pulumi

from ..components.model.machine_prices import MACHINE_PRICES
from ..components.model.stack_config import StackConfig
from ..components.platform import Platform, PlatformArgs

__all__ = ["build"]


def build(cfg: StackConfig) -> Platform:
    # Children keep the names stacks gave them before the Platform component existed, and their
    # aliases to the stack root keep those stacks' resources.
    platform = Platform("vllm-gke", PlatformArgs(cfg, child_prefix="", stack_aliases=True, machine_prices={
        machine: (price.on_demand_hour, price.spot_hour) for machine, price in MACHINE_PRICES.items()}))
    pulumi.export("clusterName", platform.cluster.cluster.name)
    pulumi.export("kubeconfig", platform.cluster.kubeconfig)
    pulumi.export("filestore", {"tier": platform.store.tier, "capacityGb": platform.store.capacity_gb})
    pulumi.export("routes", platform.routes)
    pulumi.export("dashboard", platform.observability.dashboard.id)
    if platform.gateway.address is not None:
        pulumi.export("gatewayAddress", platform.gateway.address)
    if platform.gateway.dns_authorization is not None:
        pulumi.export("dnsAuthorization", platform.gateway.dns_authorization)
    return platform
