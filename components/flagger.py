"""Flagger: the progressive-delivery operator (Helm chart, pinned) that rolls serving pools out as
canaries, with what its analysis needs (components/model/flagger_install.py says what each is):

- Flagger's chart in flagger-system, on the Gateway API provider, querying Google's PromQL frontend;
- the frontend (a Deployment and a Service), running as a Google service account that may read
  monitoring data and nothing else (Workload Identity), reachable from Flagger's pods alone;
- one MetricTemplate per gate (components/model/rollouts.py: gates), reading the frontend;
- Flagger's loadtester, which starts the stack's load tests as the canaries' webhooks
  (components/model/rollout_webhooks.py), reachable from Flagger's pods alone, allowed in each
  serving namespace to start only those load tests;
- Flagger's own metrics scraped by Managed Prometheus, and an alert policy paging the stack's
  channels while a canary is rolled back.

Nothing here is called by the control plane (Flagger runs no admission webhook): a private cluster
needs no firewall rule for it. The chart installs its CRDs (its crds/ folder, Canary, MetricTemplate
and AlertProvider) on first install only, as Helm does: a later chart version's CRDs are applied by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, deny_all_ingress, meta
from .model.flagger_install import (
    CHART_REPO,
    CHART_VERSION,
    FRONTEND,
    FRONTEND_LABELS,
    FRONTEND_PORT,
    LOADTESTER,
    LOADTESTER_LABELS,
    LOADTESTER_PORT,
    RELEASE,
    canary_failed_alert,
    chart_values,
    flagger_ingress,
    flagger_pod_monitoring,
    frontend_deployment_spec,
    loadtester_deployment_spec,
    loadtester_url,
    metrics_address,
    only_from_flagger,
    service_spec,
)
from .model.rollout_webhooks import LoadTestRef, loadtester_rules
from .model.rollouts import FLAGGER_API, FLAGGER_NAMESPACE, Gate, metric_template
from .options import child_opts
from .project_apis import ProjectApis
from .workload_identity import monitoring_reader

NAMESPACE = FLAGGER_NAMESPACE


@dataclass
class FlaggerArgs:
    project: str
    provider: k8s.Provider
    # The cluster's Workload Identity pool (GpuCluster.workload_pool) and name (the alert's series).
    workload_pool: pulumi.Input[str]
    cluster_name: str
    # The PromQL frontend's Google service account id (gcp_names.service_account_id).
    frontend_gsa_name: str
    # The canaries' gates (rollouts.gates(config.rollouts, config.monitoring)): one MetricTemplate each.
    gates: Sequence[Gate]
    # The namespaces Canaries run in (the loadtester takes tasks for these alone).
    canary_namespaces: Sequence[str] = ()
    # The load tests the canaries' webhooks start, each in its CronJob's namespace.
    load_tests: Sequence[LoadTestRef] = ()
    # The stack's notification channels (Observability's), paged while a canary is rolled back.
    notification_channels: Sequence[pulumi.Input[str]] = ()
    # The node subnet: host-network scrapers of Flagger's /metrics (ObservabilityArgs.metrics_sources).
    metrics_sources: Sequence[str] = ()
    apis: Optional[ProjectApis] = None


class Flagger(pulumi.ComponentResource):
    release: k8s.helm.v3.Release
    # Flagger's -metrics-server and the MetricTemplates' provider address.
    metrics_address: str
    # The webhooks' URL (rollout_webhooks.load_test_webhooks).
    loadtester_url: str
    metric_templates: list[k8s.apiextensions.CustomResource]
    alert_policy: gcp.monitoring.AlertPolicy

    def __init__(self, name: str, args: FlaggerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Flagger", name, None, opts)
        self.metrics_address, self.loadtester_url = metrics_address(), loadtester_url()
        k8s_opts = child_opts(self, opts, provider=args.provider)
        namespace = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        ns = namespace.metadata.name
        # Nothing in the namespace is reached but what the policies below let through.
        deny_all_ingress(f"{name}-deny-ingress", ns, k8s_opts)
        frontend = self._frontend(name, args, ns, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release", name=RELEASE, chart="flagger", version=CHART_VERSION,
            repository_opts={"repo": CHART_REPO}, namespace=ns, values=chart_values(self.metrics_address),
            # Its first analysis must find the frontend serving.
            opts=child_opts(self, opts, provider=args.provider, depends_on=[frontend]))
        k8s.networking.v1.NetworkPolicy(
            f"{name}-flagger-ingress", metadata={**meta("flagger-metrics-only"), "namespace": ns},
            spec=api_body(flagger_ingress(args.metrics_sources)), opts=k8s_opts)
        custom_resource(f"{name}-podmonitoring", "monitoring.googleapis.com/v1", "PodMonitoring",
                        {**meta(RELEASE), "namespace": ns}, flagger_pod_monitoring(), k8s_opts)
        # The chart installs the CRDs: the templates wait for it.
        after_chart = child_opts(self, opts, provider=args.provider, depends_on=[self.release])
        self.metric_templates = [
            custom_resource(f"{name}-template-{g.name}", FLAGGER_API, "MetricTemplate",
                            {**meta(g.name), "namespace": ns}, metric_template(g, self.metrics_address), after_chart)
            for g in args.gates]
        self._loadtester(name, args, ns, opts)
        self.alert_policy = gcp.monitoring.AlertPolicy(
            f"{name}-canary-failed", project=args.project, notification_channels=list(args.notification_channels),
            alert_strategy={"auto_close": "1800s"}, user_labels={"cluster": args.cluster_name},
            **canary_failed_alert(args.cluster_name), opts=self._gcp_opts(args, opts, "monitoring.googleapis.com"))
        self.register_outputs({"chartVersion": CHART_VERSION, "namespace": NAMESPACE,
                               "metricsAddress": self.metrics_address, "loadtesterUrl": self.loadtester_url})

    def _gcp_opts(self, args: FlaggerArgs, opts: Optional[pulumi.ResourceOptions], *api_names: str
                  ) -> pulumi.ResourceOptions:
        return child_opts(self, opts, depends_on=args.apis.needs(*api_names) if args.apis else [])

    def _frontend(self, name: str, args: FlaggerArgs, ns: pulumi.Input[str],
                  opts: Optional[pulumi.ResourceOptions]) -> k8s.core.v1.Service:
        """The PromQL frontend, as its own Google identity, reachable from Flagger's pods alone."""
        gsa, binding = self._frontend_identity(name, args, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-frontend-ksa",
            metadata={**meta(FRONTEND), "namespace": ns, "annotations": {"iam.gke.io/gcp-service-account": gsa.email}},
            opts=k8s_opts)
        # It must not start before it may use its Google identity.
        k8s.apps.v1.Deployment(
            f"{name}-frontend", metadata={**meta(FRONTEND, labels=FRONTEND_LABELS), "namespace": ns},
            spec=api_body(frontend_deployment_spec(args.project)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[sa, binding]))
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-frontend-pdb", metadata={**meta(FRONTEND), "namespace": ns},
            spec=api_body({"maxUnavailable": 1, "selector": {"matchLabels": FRONTEND_LABELS}}), opts=k8s_opts)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-frontend-ingress", metadata={**meta(f"{FRONTEND}-from-flagger"), "namespace": ns},
            spec=api_body(only_from_flagger(FRONTEND_LABELS, FRONTEND_PORT)), opts=k8s_opts)
        return k8s.core.v1.Service(
            f"{name}-frontend-svc", metadata={**meta(FRONTEND, labels=FRONTEND_LABELS), "namespace": ns},
            spec=api_body(service_spec(FRONTEND_LABELS, FRONTEND_PORT, "web")), opts=k8s_opts)

    def _frontend_identity(self, name: str, args: FlaggerArgs, opts: Optional[pulumi.ResourceOptions]
                           ) -> tuple[gcp.serviceaccount.Account, gcp.serviceaccount.IAMMember]:
        """The frontend's Google service account (it may read monitoring data, nothing else) and its
        Workload Identity binding to the frontend's Kubernetes service account."""
        return monitoring_reader(f"{name}-frontend", args.project, args.frontend_gsa_name,
                                 "Flagger's PromQL frontend: reads Managed Prometheus for canary analysis",
                                 args.workload_pool, NAMESPACE, FRONTEND, lambda api: self._gcp_opts(args, opts, api))

    def _loadtester(self, name: str, args: FlaggerArgs, ns: pulumi.Input[str],
                    opts: Optional[pulumi.ResourceOptions]) -> None:
        """The loadtester, reachable from Flagger's pods alone, and in each namespace of a load test a
        Role to start that load test (rollout_webhooks.loadtester_rules) and nothing else."""
        k8s_opts = child_opts(self, opts, provider=args.provider)
        sa = k8s.core.v1.ServiceAccount(f"{name}-loadtester-ksa", metadata={**meta(LOADTESTER), "namespace": ns},
                                        opts=k8s_opts)
        k8s.apps.v1.Deployment(
            f"{name}-loadtester", metadata={**meta(LOADTESTER, labels=LOADTESTER_LABELS), "namespace": ns},
            spec=api_body(loadtester_deployment_spec(args.canary_namespaces)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[sa]))
        k8s.core.v1.Service(
            f"{name}-loadtester-svc", metadata={**meta(LOADTESTER, labels=LOADTESTER_LABELS), "namespace": ns},
            spec=api_body(service_spec(LOADTESTER_LABELS, 80, "http")), opts=k8s_opts)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-loadtester-ingress", metadata={**meta(f"{LOADTESTER}-from-flagger"), "namespace": ns},
            spec=api_body(only_from_flagger(LOADTESTER_LABELS, LOADTESTER_PORT)), opts=k8s_opts)
        for test_ns in sorted({r.namespace for r in args.load_tests}):
            refs = [r for r in args.load_tests if r.namespace == test_ns]
            role = k8s.rbac.v1.Role(f"{name}-loadtester-{test_ns}", metadata={**meta(LOADTESTER), "namespace": test_ns},
                                    rules=api_body(loadtester_rules(refs)), opts=k8s_opts)
            k8s.rbac.v1.RoleBinding(
                f"{name}-loadtester-{test_ns}-binding", metadata={**meta(LOADTESTER), "namespace": test_ns},
                role_ref=api_body({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.metadata.name}),
                subjects=api_body([{"kind": "ServiceAccount", "name": LOADTESTER, "namespace": NAMESPACE}]), opts=k8s_opts)
