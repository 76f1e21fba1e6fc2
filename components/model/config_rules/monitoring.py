"""Objectives against their alerts: every burn-rate alert must be one the goal's budget can reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..service_levels import BURN_WINDOWS, max_burn_rate
from ..vllm_versions import release
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def slo_alerts_reachable(cfg: "StackConfig", add: Add) -> None:
    slos = cfg.monitoring.slos
    if not slos.enabled:
        return
    fastest = max(BURN_WINDOWS, key=lambda w: w.rate(slos.window_days))
    rate = fastest.rate(slos.window_days)
    for key, goal in (("availability", slos.availability), ("ttft", slos.ttft)):
        if max_burn_rate(goal) <= rate:
            least = 1 - 1 / rate
            add(f"monitoring.slos.{key}", (
                f"{goal:g} lets the error budget burn at most {max_burn_rate(goal):.3g} times as fast as it can afford, "
                f"under the {fastest.name} alert's {rate:g} ({fastest.share(slos.window_days):.0%} of the "
                f"{slos.window_days}-day budget in {fastest.long_s // 3600} h): it could never fire. Set a goal above "
                f"{least:.4g} or a shorter monitoring.slos.windowDays"))


def traces_exportable(cfg: "StackConfig", add: Add) -> None:
    if cfg.monitoring.traces.enabled and not release(cfg.vllm_version).ships_opentelemetry:
        add("monitoring.traces.enabled", f"vLLM {cfg.vllm_version}'s image does not ship OpenTelemetry (vLLM 0.34 "
                                         "requires it): --otlp-traces-endpoint would stop every server at start; "
                                         "use vllmVersion 0.34.0 or leave traces off")
