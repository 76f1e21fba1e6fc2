"""Keda: the KEDA operator (Helm chart, pinned), which scales every serving pool, to zero and back.

An HPA cannot go below one replica; KEDA can, and it reads its triggers from Managed
Prometheus through the GMP query API (monitoring.googleapis.com), authenticated as a Google
service account through Workload Identity (the chart's podIdentity.gcp, KEDA's "GCP Workload
Identity" authentication provider). The account may read monitoring data and nothing else.

The chart registers the cluster's one `v1beta1.external.metrics.k8s.io` APIService (its metrics
server, pod port 6443) and an admission webhook (pod port 9443). A private cluster's control
plane reaches nodes only on 443 and 10250 by GKE's own firewall rule, so this component opens
those two ports from the control plane's range; without it the HPAs KEDA makes read no metric
and the webhook, failing open, is silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.config_rules.components import check_keda
from .options import child_opts
from .project_apis import ProjectApis
from .workload_identity import monitoring_reader

CHART_VERSION = "2.20.2"
CHART_REPO = "https://kedacore.github.io/charts"
NAMESPACE = "keda"
OPERATOR_SA = "keda-operator"
# The ClusterTriggerAuthentication ScaledObjects use to query Managed Prometheus.
GMP_AUTH = "gmp-workload-identity"
# What the control plane calls on KEDA's pods (chart values metricsServer's service.portHttpsTarget
# and the webhooks' port): see infra/contracts/keda.py.
METRICS_SERVER_PORT = 6443
WEBHOOK_PORT = 9443
# The operator's gRPC metrics service, which only the metrics server calls (chart: the metrics
# server's NetworkPolicy egress to the operator, keda/templates/metrics-server/networkpolicy.yaml).
OPERATOR_GRPC_PORT = 9666


def gmp_query_url(project: str) -> str:
    """Managed Prometheus' Prometheus-compatible query API for a project."""
    return f"https://monitoring.googleapis.com/v1/projects/{project}/location/global/prometheus"


@dataclass
class KedaArgs:
    project: str
    provider: k8s.Provider
    # The cluster's Workload Identity pool (GpuCluster.workload_pool).
    workload_pool: pulumi.Input[str]
    gsa_name: str
    apis: Optional[ProjectApis] = None
    # A private cluster: its VPC and control plane range (GpuCluster's network, cluster.masterCidr),
    # for the firewall rule that lets the API server reach KEDA's metrics server and webhook.
    network: Optional[pulumi.Input[str]] = None
    control_plane_cidr: Optional[str] = None


class Keda(pulumi.ComponentResource):
    release: k8s.helm.v3.Release
    auth_name: str = GMP_AUTH

    def __init__(self, name: str, args: KedaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        check_keda(args.project)
        super().__init__("vllm-gke:index:Keda", name, None, opts)
        gsa, binding = self._identity(name, args, opts)
        release_deps: list[pulumi.Resource] = [binding, *self._control_plane_firewall(name, args, opts)]
        k8s_opts = child_opts(self, opts, provider=args.provider)
        namespace = k8s.core.v1.Namespace(f"{name}-ns", metadata=meta(NAMESPACE), opts=k8s_opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release", name="keda", chart="keda", version=CHART_VERSION,
            repository_opts={"repo": CHART_REPO}, namespace=namespace.metadata.name,
            values={"podIdentity": {"gcp": {"enabled": True, "gcpIAMServiceAccount": gsa.email}},
                    "serviceAccount": {"operator": {"name": OPERATOR_SA}}},
            # The operator must not start before it may use its Google identity, nor the metrics
            # server before the control plane can reach it.
            opts=child_opts(self, opts, provider=args.provider, depends_on=release_deps))
        # KEDA runs outside the mesh: its pods accept only what they serve - the control plane's
        # calls to the metrics server and the webhook (from the control plane's addresses, not a
        # pod's, hence no source), and the metrics server's gRPC to the operator. Kubelet probes
        # come from the node, which Dataplane V2 always admits. Not the chart's own policies: their
        # egress stops at the cluster, so the operator could not reach Managed Prometheus.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-ingress", metadata={**meta("keda-serves-only"), "namespace": namespace.metadata.name},
            spec=api_body({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
                {"ports": [{"protocol": "TCP", "port": METRICS_SERVER_PORT}, {"protocol": "TCP", "port": WEBHOOK_PORT}]},
                {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": OPERATOR_GRPC_PORT}]}]}),
            opts=k8s_opts)
        custom_resource(
            f"{name}-gmp-auth", "keda.sh/v1alpha1", "ClusterTriggerAuthentication", meta(GMP_AUTH),
            {"podIdentity": {"provider": "gcp"}},
            child_opts(self, opts, provider=args.provider, depends_on=[self.release]))
        self.register_outputs({"chartVersion": CHART_VERSION, "namespace": NAMESPACE, "auth": GMP_AUTH})

    def _gcp_opts(self, args: KedaArgs, opts: Optional[pulumi.ResourceOptions], *api_names: str) -> pulumi.ResourceOptions:
        return child_opts(self, opts, depends_on=args.apis.needs(*api_names) if args.apis else [])

    def _identity(self, name: str, args: KedaArgs, opts: Optional[pulumi.ResourceOptions]
                  ) -> tuple[gcp.serviceaccount.Account, gcp.serviceaccount.IAMMember]:
        """The operator's Google service account (it may read monitoring data, nothing else) and
        its Workload Identity binding."""
        return monitoring_reader(name, args.project, args.gsa_name, "KEDA: reads Managed Prometheus to scale serving pools",
                                 args.workload_pool, NAMESPACE, OPERATOR_SA,
                                 lambda api: self._gcp_opts(args, opts, api))

    def _control_plane_firewall(self, name: str, args: KedaArgs,
                                opts: Optional[pulumi.ResourceOptions]) -> list[pulumi.Resource]:
        """A private cluster's rule letting the API server reach KEDA's metrics server and webhook."""
        if not args.control_plane_cidr:
            return []
        if args.network is None:
            raise ValueError("Keda: control_plane_cidr needs network (the cluster's VPC)")
        # The VPC is the cluster's own (GpuCluster), so the rule may target all its instances;
        # the source is the control plane alone.
        return [gcp.compute.Firewall(
            f"{name}-control-plane", project=args.project, network=args.network, direction="INGRESS",
            description="GKE control plane to KEDA's metrics server and admission webhook",
            source_ranges=[args.control_plane_cidr],
            allows=[{"protocol": "tcp", "ports": [str(METRICS_SERVER_PORT), str(WEBHOOK_PORT)]}],
            opts=self._gcp_opts(args, opts, "compute.googleapis.com"))]
