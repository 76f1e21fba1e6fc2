"""Monitoring (alerts, notification channels) and the cost assumptions."""

from __future__ import annotations

from pydantic import (
    Field,
)

from .base import (
    Email,
    Spec,
)


class MonitoringSpec(Spec):
    # Who alert policies notify.
    notification_emails: list[Email] = Field(default_factory=list)
    # p95 queue time that pages.
    queue_latency_slo_seconds: float = Field(default=2.0, gt=0)
    # p95 time to first token that warns.
    ttft_slo_seconds: float = Field(default=3.0, gt=0)
    # KV-cache usage that warns.
    kv_cache_alert_ratio: float = Field(default=0.95, gt=0, le=1)


class CostSpec(Spec):
    # Sustained generation throughput of one physical GPU for your models (measure it).
    tokens_per_second_per_gpu: float = Field(default=1500.0, gt=0)
    # Expected share of capacity in use.
    target_utilization: float = Field(default=0.6, gt=0, le=1)
    # Hours a month the report prices.
    hours_per_month: float = Field(default=730.0, gt=0, le=744)
