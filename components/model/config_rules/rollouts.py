"""Rollouts against what they roll: no manual canary split beside Flagger's, a load test that
exists, and the SLO series the gates read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..rollout_webhooks import LONG_SUFFIX
from ..specs import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def rollouts(cfg: "StackConfig", add: Add) -> None:
    spec = cfg.rollouts
    if not spec.enabled:
        return
    for i, model in enumerate(cfg.models):
        if model.canary is not None:
            add(f"{item_key('models', cfg.models, i)}.canary",
                "a manual canary split and Flagger's would both hold the route: with rollouts.enabled, set the "
                "model's revision to the new one and remove canary (Flagger rolls it out, gated by the SLOs)")
    names = {t.name for t in cfg.load_tests}
    known = ", ".join(sorted(names)) or "(none: add one under loadTests)"
    for i, name in enumerate(spec.load_tests or []):
        if name not in names:
            add(f"rollouts.loadTests[{i}]", f"'{name}' is not a load test: use one of {known}")
    for i, test in enumerate(cfg.load_tests):
        # A long pool's canary starts <name>'s variant loadtest-<name>-long: the same objects' names.
        base = test.name.removesuffix(LONG_SUFFIX)
        if base != test.name and base in names:
            add(f"{item_key('loadTests', cfg.load_tests, i)}.name",
                f"its CronJob loadtest-{test.name} is the name of load test '{base}'s long-pool variant (what a "
                "long pool's canary starts): rename it")
    if not cfg.monitoring.slos.enabled:
        add("rollouts.enabled", "the gates read the SLOs' series (the TTFT bound the servers add to vLLM's "
            "histogram): set monitoring.slos.enabled, or turn rollouts off")
