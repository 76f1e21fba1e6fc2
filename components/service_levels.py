"""ServiceLevels: SLOs as code, and the burn-rate alerts that page on them (what each SLO counts
and how the alerts burn: components/model/service_levels.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .model.service_levels import BURN_WINDOWS, TTFT_METRIC, Objective, burn_rate_policy, objectives, ttft_buckets
from .model.specs import MonitoringSpec
from .options import child_opts
from .project_apis import ProjectApis
from .slo_metrics import SloMetrics, SloMetricsArgs


@dataclass
class ServiceLevelsArgs:
    project: str
    cluster_name: str
    spec: MonitoringSpec
    models: Sequence[str]
    tenants: Sequence[str]
    # Where the burn-rate alerts go (Observability's notification channels).
    channels: Sequence[pulumi.Input[str]] = ()
    apis: Optional[ProjectApis] = None
    # The servers add ttftSloSeconds to their TTFT buckets (VllmServiceArgs.ttft_slo_seconds): cut there.
    exact_ttft: bool = False
    # The gateway's class and region: an availability SLO on its load balancer's own count.
    gateway_class: Optional[str] = None
    region: str = ""
    # The cluster (its provider and Workload Identity pool): where the metrics the SLOs read are
    # seeded before the SLOs are created (components/slo_metrics.py). None: no seeding.
    provider: Optional[k8s.Provider] = None
    workload_pool: Optional[pulumi.Input[str]] = None
    # The node subnet: the seed admits Managed Prometheus' scrapes from it too.
    metrics_sources: Sequence[str] = ()
    # More SLOs, kept as these are (the Cloud Run models': components/model/cloud_run_monitoring.py).
    extra_objectives: Sequence[Objective] = ()


class ServiceLevels(pulumi.ComponentResource):
    services: dict[str, gcp.monitoring.CustomService]
    slos: list[gcp.monitoring.Slo]
    objectives: list[Objective]
    # What the plan validates: each SLO and each alert policy as the API's message.
    slo_definitions: list[dict[str, Any]]
    alert_definitions: list[dict[str, Any]]
    alert_policies: list[gcp.monitoring.AlertPolicy]
    # (title, SLO resource name) for the dashboard's budget tiles.
    budget_names: list[tuple[str, pulumi.Output[str]]]
    # Makes the Managed Prometheus metrics the SLOs read known first (None: not seeded).
    metrics: Optional[SloMetrics]

    def __init__(self, name: str, args: ServiceLevelsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:ServiceLevels", name, None, opts)
        child = child_opts(self, opts, depends_on=args.apis.needs("monitoring.googleapis.com") if args.apis else [])
        window = args.spec.slos.window_days
        self.objectives = objectives(args.cluster_name, args.spec, args.models, args.tenants, args.exact_ttft,
                                     args.gateway_class, args.region) + list(args.extra_objectives)
        # Cloud Monitoring refuses an SLO on a metric it has no descriptor for, and Managed
        # Prometheus makes one only when it first ingests the metric: seeded first, on a new project too.
        self.metrics = SloMetrics(f"{name}-metrics", SloMetricsArgs(
            args.project, args.provider, args.workload_pool, [o.sli for o in self.objectives], apis=args.apis,
            histogram_bounds={TTFT_METRIC: ttft_buckets(args.spec.ttft_slo_seconds, args.exact_ttft)},
            metrics_sources=args.metrics_sources),
            opts=child_opts(self, opts)) if args.provider is not None and args.workload_pool is not None else None
        slo_opts = child_opts(self, opts, depends_on=[*(args.apis.needs("monitoring.googleapis.com") if args.apis else []),
                                                      *([self.metrics.job] if self.metrics else [])])
        self.services, self.slos, self.slo_definitions = {}, [], []
        self.alert_definitions, self.alert_policies, self.budget_names = [], [], []
        for objective in self.objectives:
            if objective.service not in self.services:
                self.services[objective.service] = gcp.monitoring.CustomService(
                    f"{name}-{objective.service}", project=args.project, service_id=objective.service,
                    display_name=objective.service, user_labels={"cluster": args.cluster_name}, opts=child)
            service = self.services[objective.service]
            slo_args = objective.slo_args(window)
            self.slo_definitions.append(slo_args)
            slo = gcp.monitoring.Slo(f"{name}-{objective.service}-{objective.slo_id}", project=args.project,
                                     service=service.service_id, **slo_args, opts=slo_opts)
            self.slos.append(slo)
            self.budget_names.append((objective.display_name, slo.name))
            for burn in BURN_WINDOWS:
                # The definition as the plan checks it; the conditions name the SLO once it exists.
                policy = burn_rate_policy(objective, "<slo>", burn, window)
                self.alert_definitions.append(policy)
                conditions = slo.name.apply(lambda n, o=objective, b=burn: burn_rate_policy(o, n, b, window)["conditions"])
                self.alert_policies.append(gcp.monitoring.AlertPolicy(
                    f"{name}-{objective.service}-{objective.slo_id}-{burn.name.replace(' ', '-')}",
                    project=args.project, notification_channels=list(args.channels),
                    alert_strategy={"auto_close": "1800s"}, user_labels={"cluster": args.cluster_name},
                    display_name=policy["display_name"], combiner=policy["combiner"], severity=policy["severity"],
                    documentation=policy["documentation"], conditions=conditions, opts=child))
        self.register_outputs({"services": [s.service_id for s in self.services.values()],
                               "slos": [s.name for s in self.slos]})


