"""Observability: a Cloud Monitoring dashboard and alert policies over Managed Prometheus.

vLLM metrics come from each VllmService's PodMonitoring, GPU metrics from GKE's managed DCGM
package. The dashboard and the alert policies are plain data in the Cloud Monitoring API's
shape (components/model/monitoring.py); the offline plan parses both with the API's own protos (infra/manifests.py), so a
misspelt field fails at plan time. (Not here: importing those protos next to the Pulumi
provider SDK's own copy of google.rpc.Status would break the component package's process.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .billing_budget import BillingBudget, BillingBudgetArgs
from .model.cloud_run_monitoring import RUN_TITLE, CloudRunTarget, run_alert_policies, run_dashboard_json, run_objectives
from .model.monitoring import alert_policies, dashboard_json, tenant_dashboard_json
from .model.specs import BudgetSpec, MonitoringSpec
from .options import child_opts
from .project_apis import ProjectApis
from .service_levels import ServiceLevels, ServiceLevelsArgs


@dataclass
class ObservabilityArgs:
    project: str
    cluster_name: str
    spec: MonitoringSpec
    title: str
    apis: Optional[ProjectApis] = None
    # The serving release's KV-cache gauge (components.vllm_versions).
    kv_cache_metric: str = "vllm:kv_cache_usage_perc"
    # Guards count tenants' limits in the shared store (globalLimits): chart and alert its outages.
    limit_store: bool = False
    # What the SLOs are kept for (monitoring.slos): the served models and the tenants.
    models: Sequence[str] = ()
    tenants: Sequence[str] = ()
    # A Cloud Billing budget on the project, alerting the same channels (the stack key budget).
    budget: Optional[BudgetSpec] = None
    # The servers have ttftSloSeconds among their TTFT buckets (ServiceLevelsArgs.exact_ttft).
    exact_ttft: bool = False
    # Models with a replica floor: paged when none of their replicas reports.
    always_on: Sequence[str] = ()
    # Models serve on TPUs: their TensorCore, HBM bandwidth and HBM charts.
    tpu: bool = False
    # Some tenant has a negative priority (the guards may shed it): a WARNING while they do.
    sheddable: bool = False
    # Some model sends the tenants it sheds to a fallback model: a chart of how many go, and how they fare.
    fallback: bool = False
    # The gateway's class and region (ServiceLevelsArgs): its load balancer's availability SLO.
    gateway_class: Optional[str] = None
    region: str = ""
    # The cluster's provider and Workload Identity pool: the SLOs' metrics are seeded there first.
    provider: Optional[k8s.Provider] = None
    workload_pool: Optional[pulumi.Input[str]] = None
    # The node subnet (ServiceLevelsArgs.metrics_sources).
    metrics_sources: Sequence[str] = ()
    # The models on Cloud Run (model layer's run_targets): their SLOs and a dashboard of their own.
    cloud_run: Sequence[CloudRunTarget] = ()


class Observability(pulumi.ComponentResource):
    dashboard: gcp.monitoring.Dashboard
    dashboard_definition: dict[str, Any]
    # Per tenant: its requests, tokens and error budget (what the plan checks; the resource is tenant_dashboard).
    tenant_dashboard: Optional[gcp.monitoring.Dashboard]
    tenant_dashboard_definition: Optional[dict[str, Any]]
    alert_definitions: list[dict[str, Any]]
    alert_policies: list[gcp.monitoring.AlertPolicy]
    service_levels: Optional[ServiceLevels]
    billing_budget: Optional[BillingBudget]
    # The Cloud Run models' dashboard (None without any), and its definition as the plan checks it.
    run_dashboard: Optional[gcp.monitoring.Dashboard]
    run_dashboard_definition: Optional[dict[str, Any]]

    def __init__(self, name: str, args: ObservabilityArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Observability", name, None, opts)
        child = child_opts(self, opts, depends_on=args.apis.needs("monitoring.googleapis.com") if args.apis else [])
        channels: Sequence[pulumi.Output[str]] = [
            gcp.monitoring.NotificationChannel(
                f"{name}-email-{i}", project=args.project, type="email",
                display_name=f"vllm-gke {args.cluster_name}: {email}",
                labels={"email_address": email}, opts=child).name
            for i, email in enumerate(args.spec.notification_emails)
        ]
        # The stack's notification channels (Flagger's rollback alert pages them too).
        self.channels = channels
        self.service_levels = ServiceLevels(f"{name}-slos", ServiceLevelsArgs(
            args.project, args.cluster_name, args.spec, args.models, args.tenants, channels, args.apis,
            exact_ttft=args.exact_ttft, gateway_class=args.gateway_class, region=args.region,
            provider=args.provider, workload_pool=args.workload_pool, metrics_sources=args.metrics_sources,
            extra_objectives=run_objectives(args.cluster_name, args.spec, args.cloud_run, args.exact_ttft)),
            opts=child_opts(self, opts)) if args.spec.slos.enabled and (args.models or args.tenants or args.cloud_run) \
            else None
        self.billing_budget = BillingBudget(f"{name}-budget", BillingBudgetArgs(
            args.project, args.cluster_name, args.budget, channels, args.apis),
            opts=child_opts(self, opts)) if args.budget else None
        every_budget = self.service_levels.budget_names if self.service_levels else []
        # The Cloud Run models' budgets are on their own dashboard (_run_dashboard).
        budgets = [(t, n) for t, n in every_budget if RUN_TITLE not in t]
        # The definition the plan checks names each SLO as "<slo>"; the resource, by its name.
        self.dashboard_definition = dashboard_json(args.title, args.cluster_name, args.kv_cache_metric,
                                                   args.limit_store, [(title, "<slo>") for title, _ in budgets],
                                                   tpu=args.tpu, fallback=args.fallback)
        titles = [title for title, _ in budgets]
        definition = pulumi.Output.all(*[n for _, n in budgets]).apply(lambda names: json.dumps(dashboard_json(
            args.title, args.cluster_name, args.kv_cache_metric, args.limit_store, list(zip(titles, names)),
            tpu=args.tpu, fallback=args.fallback), sort_keys=True))
        self.dashboard = gcp.monitoring.Dashboard(f"{name}-dashboard", project=args.project,
                                                  dashboard_json=definition, opts=child)
        tenant_title = f"{args.title}: tenants"
        self.tenant_dashboard_definition = tenant_dashboard_json(
            tenant_title, args.cluster_name, args.tenants, [(title, "<slo>") for title, _ in budgets]) \
            if args.tenants else None
        self.tenant_dashboard = gcp.monitoring.Dashboard(
            f"{name}-tenant-dashboard", project=args.project, opts=child,
            dashboard_json=pulumi.Output.all(*[n for _, n in budgets]).apply(lambda names: json.dumps(
                tenant_dashboard_json(tenant_title, args.cluster_name, args.tenants, list(zip(titles, names))),
                sort_keys=True))) if args.tenants else None
        self._run_dashboard(name, args, every_budget, child)
        # The Cloud Run models' after the GKE ones, which keep their resource names.
        self.alert_definitions = [*alert_policies(args.cluster_name, args.spec, args.kv_cache_metric, args.limit_store,
                                                  args.always_on, args.sheddable),
                                  *run_alert_policies(args.cloud_run, args.limit_store)]
        self.alert_policies = []
        for i, kwargs in enumerate(self.alert_definitions):
            self.alert_policies.append(gcp.monitoring.AlertPolicy(
                f"{name}-alert-{i}", project=args.project, notification_channels=list(channels),
                alert_strategy={"auto_close": "1800s"}, user_labels={"cluster": args.cluster_name},
                **kwargs, opts=child))

        self.register_outputs({"dashboard": self.dashboard.id,
                               "alertPolicies": [p.display_name for p in self.alert_policies]})

    def _run_dashboard(self, name: str, args: ObservabilityArgs, budgets: Sequence[tuple[str, pulumi.Output[str]]],
                       child: pulumi.ResourceOptions) -> None:
        """The Cloud Run models' charts and their SLOs' budgets (titled "<model> (Cloud Run): ...")."""
        self.run_dashboard, self.run_dashboard_definition = None, None
        if not args.cloud_run:
            return
        title = f"{args.title}: Cloud Run"
        mine = [(t, n) for t, n in budgets if RUN_TITLE in t]
        self.run_dashboard_definition = run_dashboard_json(title, args.cloud_run, [(t, "<slo>") for t, _ in mine])
        self.run_dashboard = gcp.monitoring.Dashboard(
            f"{name}-run-dashboard", project=args.project, opts=child,
            dashboard_json=pulumi.Output.all(*[n for _, n in mine]).apply(lambda names: json.dumps(run_dashboard_json(
                title, args.cloud_run, list(zip([t for t, _ in mine], names))), sort_keys=True)))
