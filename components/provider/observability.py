"""Observability, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..model.specs import MonitoringSpec as MonitoringModel
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from ..observability import Observability as _Observability
from ..observability import ObservabilityArgs
from .convert import Problems
from .facade import Facade
from .types import MonitoringSpec


class ObservabilityInputs(TypedDict):
    """Inputs of Observability."""

    project: str
    """The GCP project."""
    cluster_name: str
    """The cluster whose metrics the dashboard and alerts select."""
    title: str
    """The dashboard's title."""
    monitoring: NotRequired[MonitoringSpec]
    """Notification e-mails and alert thresholds."""
    vllm_version: NotRequired[str]
    """The vLLM release serving (its metric names; default the newest supported)."""
    limit_store: NotRequired[bool]
    """A LimitStore counts the tenants' limits: alert when the guards cannot reach it (default false)."""
    enable_apis: NotRequired[bool]
    """Enable the Monitoring API first (default true)."""


class Observability(_Observability, Facade):
    """A Cloud Monitoring dashboard (GPU per MIG slice, queue time, TTFT, tokens/s, KV cache) and
    alert policies over Managed Prometheus."""

    dashboard_id: pulumi.Output[str]
    """The dashboard's id."""
    alert_policy_names: list[str]
    """The alert policies' display names."""

    def __init__(self, name: str, args: ObservabilityInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("Observability")
        spec = problems.spec(MonitoringModel, args.get("monitoring"), "monitoring")
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        problems.raise_any()
        self.inputs, self.args = args, ObservabilityArgs(
            project=args["project"], cluster_name=args["cluster_name"], spec=spec, title=args["title"],
            kv_cache_metric=RELEASES[version].kv_cache_metric, limit_store=bool(args.get("limit_store")))
        super().__init__(name, self.args, opts)
        self.dashboard_id = self.dashboard.id
        self.alert_policy_names = [a["display_name"] for a in self.alert_definitions]

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.apis = self.project_apis(name, opts, self.inputs["project"], ["monitoring.googleapis.com"],
                                           self.inputs.get("enable_apis", True))
