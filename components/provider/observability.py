"""Observability, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..model.specs import MonitoringSpec as MonitoringModel
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from ..observability import Observability as _Observability
from ..observability import ObservabilityArgs
from ..options import child_opts
from ..project_apis import ProjectApis, ProjectApisArgs
from .convert import Problems
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


class Observability(pulumi.ComponentResource):
    """A Cloud Monitoring dashboard (GPU per MIG slice, queue time, TTFT, tokens/s, KV cache) and
    alert policies over Managed Prometheus."""

    dashboard_id: pulumi.Output[str]
    """The dashboard's id."""
    alert_policy_names: pulumi.Output[list[str]]
    """The alert policies' display names."""

    def __init__(self, name: str, args: ObservabilityInputs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Observability", name, {}, opts)
        problems = Problems("Observability")
        spec = problems.spec(MonitoringModel, args.get("monitoring"), "monitoring")
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        problems.raise_any()
        inner = _Observability(name, ObservabilityArgs(
            project=args["project"], cluster_name=args["cluster_name"], spec=spec, title=args["title"],
            kv_cache_metric=RELEASES[version].kv_cache_metric, limit_store=bool(args.get("limit_store")),
            apis=ProjectApis(f"{name}-apis", ProjectApisArgs(args["project"], ["monitoring.googleapis.com"]),
                             opts=child_opts(self, opts)) if args.get("enable_apis", True) else None),
            opts=child_opts(self, opts))
        self.dashboard_id = inner.dashboard.id
        self.alert_policy_names = pulumi.Output.from_input([a["display_name"] for a in inner.alert_definitions])
        self.register_outputs({"dashboardId": self.dashboard_id, "alertPolicyNames": self.alert_policy_names})
