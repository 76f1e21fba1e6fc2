"""Two pictures of a plan, as Mermaid (rendered by GitHub, GitLab and most Markdown viewers): the
node pools packed with their serving pools at baseline and peak, and the route map from a path
to the tenants that call it to the pool that serves it. Written with the plan; docs/capacity-and-cost.md shows
the prod stack's, and a test keeps them equal to what the plan writes."""

from __future__ import annotations

import re

from ..components.model.capacity import placements
from ..components.model.serving_plan import flagger_pools, servings
from ..components.model.stack_config import StackConfig
from ..components.model.tenant_urls import path_prefix
from .cost import CostReport


class _Ids:
    """Mermaid node ids: readable (the parts, with what Mermaid does not take as '_'), and one per
    distinct node - parts that read alike ('a-b', 'a_b') get a numbered id, never a shared one."""

    def __init__(self) -> None:
        self._given: dict[tuple[str, ...], str] = {}
        self._taken: set[str] = set()

    def __call__(self, *parts: str) -> str:
        if parts in self._given:
            return self._given[parts]
        base = re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))
        node, n = base, 1
        while node in self._taken:
            n += 1
            node = f"{base}_{n}"
        self._given[parts] = node
        self._taken.add(node)
        return node


def node_pools_picture(cfg: StackConfig, cost: CostReport) -> str:
    """Each node pool with its slots (GPUs or MIG slices) and the serving pools on them: replicas
    x GPUs each at baseline (minReplicas) and peak (maxReplicas)."""
    nodes = {p.pool: p for p in cost.pools}
    _id = _Ids()
    lines = ["flowchart TB"]
    for pool in cfg.node_pools:
        c = nodes[pool.name]
        per_node = pool.slices_per_node
        unit = pool.gpu_partition_size or ("TPU chip" if pool.is_tpu else "GPU")
        spot = ", spot" if pool.spot else ""
        capped = f", capped: {c.wanted_peak_nodes} wanted, {c.reach_nodes} at most" if c.capped else ""
        lines.append(f'  subgraph {_id("np", pool.name)}["{pool.name}: {pool.machine_type}{spot}, {per_node} x {unit} '
                     f'per node; nodes {c.baseline_nodes} baseline, {c.peak_nodes} peak{capped}"]')
        used_low = used_high = 0
        for model, node_pool, tenant in placements(cfg):
            if node_pool != pool.name:
                continue
            for which in model.pool_names:
                sp = getattr(model, which)
                tp = model.devices_per_replica
                used_low += sp.min_replicas * tp
                used_high += sp.max_replicas * tp
                owner = f" for {tenant}" if tenant else ""
                canary = " canary" if model.revision != cfg.model(model.name).revision else ""
                lines.append(f'    {_id("sp", pool.name, model.name, which, tenant or "", canary)}'
                             f'["{model.name}{canary} {which}{owner}: {sp.min_replicas}-{sp.max_replicas} replicas '
                             f'x {tp} {unit}"]')
        peak_slots = c.peak_nodes * per_node
        peak_use = (f"{used_high} wanted, {peak_slots} available peak" if used_high > peak_slots
                    else f"{used_high} of {peak_slots} peak")
        lines.append(f'    {_id("slots", pool.name)}(["{unit} slots used: {used_low} of '
                     f'{c.baseline_nodes * per_node} baseline, {peak_use}"])')
        lines.append("  end")
    return "\n".join(lines) + "\n"


def routes_picture(cfg: StackConfig) -> str:
    """Path -> the tenants whose tokens it admits -> the pool(s) behind it (by request length,
    the endpoint picker, or a tenant's dedicated copy)."""
    _id = _Ids()
    lines = ["flowchart LR", '  lb(["load balancer"])']
    seen_paths: set[str] = set()
    cloud_run = {m.name for m in cfg.cloud_run_models}
    for tenant in cfg.tenants:
        dedicated = set(tenant.dedicated.models) if tenant.dedicated else set()
        lines.append(f'  {_id("t", tenant.name)}{{{{"tenant {tenant.name}"}}}}')
        for name in tenant.models:
            if name in cloud_run:  # behind the Cloud Run models' own load balancer, not this Gateway
                continue
            model = cfg.model(name)
            own = name in dedicated
            path = f"/{path_prefix(model, tenant, own)}/v1"
            pid = _id("p", path)
            if path not in seen_paths:
                seen_paths.add(path)
                lines.append(f'  lb --> {pid}["{path}"]')
                where = f" ({tenant.name}'s own)" if own else ""
                owner = tenant.name if own else ""
                if model.routing == "inference-gateway":
                    lines.append(f'  {pid} -->|"endpoint picker"| {_id("ip", name, *([owner] if owner else []))}'
                                 f'[("InferencePool {name}{where}")]')
                else:
                    serving = next(s for s in servings(cfg) if s.model.name == name and s.tenant == (owner or None))
                    flagger = flagger_pools(cfg, serving)
                    for which in model.pool_names:
                        label = (f"body under {model.long_request_bytes} B" if which == "short"
                                 else f"body {model.long_request_bytes} B or more")
                        # A Flagger pool: its primary, and a canary of each change at a growing share.
                        rolled = ", primary + canary" if which in flagger else ""
                        lines.append(f'  {pid} -->|"{label}"| {_id("s", name, which, owner)}'
                                     f'[("{name} {which}{where}{rolled}")]')
                    if model.canary is not None and model.canary.weight:
                        lines.append(f'  {pid} -->|"canary {model.canary.weight}%"| {_id("c", name, owner)}'
                                     f'[("{name} canary {model.canary.revision[:12]}{where}")]')
            lines.append(f'  {_id("t", tenant.name)} -.->|JWT| {pid}')
    return "\n".join(lines) + "\n"


def pictures(cfg: StackConfig, cost: CostReport) -> dict[str, str]:
    """File name -> Mermaid text."""
    return {"node-pools.mmd": node_pools_picture(cfg, cost), "routes.mmd": routes_picture(cfg)}
