"""KEDA (chart and operator 2.20.2): the external metrics API it owns, the ports the control plane
calls, the operator's Google identity, and the ScaledObjects its webhook admits and its scaler reads."""

from __future__ import annotations

import re
from typing import Any, Optional

from ...components.keda import CHART_VERSION, METRICS_SERVER_PORT, OPERATOR_SA, WEBHOOK_PORT
from ...components.model.config_rules.scaling import wake_needed
from ...components.model.k8s_objects import MODEL_LABEL
from ...components.standby import PROGRAM
from ..plan import Plan
from .base import Contract, _docs, _exported, _vllm_deployments


def _keda_release(plan: Plan) -> Optional[dict[str, Any]]:
    return next((r.props for r in plan.resources
                 if r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "keda"), None)


def _queried_metrics(query: str) -> set[str]:
    return set(re.findall(r"(vllm[_:][a-z0-9_:]+)\{", query))


def _standby_metrics() -> set[str]:
    """The series the standby program exports (components/scripts/standby.py)."""

    return set(re.findall(r"# TYPE (\w+) (?:counter|gauge)", PROGRAM.read_text()))


def keda_owns_external_metrics(plan: Plan) -> list[str]:
    out = []
    if _keda_release(plan) is None:
        out.append("no KEDA release: nothing serves the external metrics the ScaledObjects' HPAs read")
    for a in _docs(plan, "APIService"):
        if a["spec"].get("group") == "external.metrics.k8s.io":
            out.append(f"APIService {a['metadata']['name']} would be a second owner of KEDA's external metrics API")
    return out


def keda_ports_open_on_private_clusters(plan: Plan) -> list[str]:
    if not plan.config.cluster.private_nodes:
        return []
    rules = [r.props for r in plan.of_type("gcp:compute/firewall:Firewall")
             if plan.config.cluster.master_cidr in (r.props.get("sourceRanges") or [])]
    ports = {p for r in rules for a in r.get("allows") or [] for p in a.get("ports") or []}
    missing = {str(METRICS_SERVER_PORT), str(WEBHOOK_PORT)} - ports
    return [f"no firewall rule lets the control plane reach tcp:{', '.join(sorted(missing))}"] if missing else []


def keda_operator_identity(plan: Plan) -> list[str]:
    out = []
    release_ = _keda_release(plan)
    values = (release_ or {}).get("values") or {}
    if ((values.get("serviceAccount") or {}).get("operator") or {}).get("name") != OPERATOR_SA:
        out.append(f"the chart's operator service account is not {OPERATOR_SA}")
    if not ((values.get("podIdentity") or {}).get("gcp") or {}).get("enabled"):
        out.append("podIdentity.gcp is off: the operator would call Managed Prometheus without a Google identity")
    members = [r.props.get("member", "") for r in plan.of_type("gcp:serviceaccount/iAMMember:IAMMember")]
    if not any(m.endswith(f"[keda/{OPERATOR_SA}]") for m in members):
        out.append(f"no Workload Identity binding for keda/{OPERATOR_SA}")
    if not any(r.name.endswith("keda-monitoring-viewer") and r.props.get("role") == "roles/monitoring.viewer"
               for r in plan.of_type("gcp:projects/iAMMember:IAMMember")):
        out.append("KEDA's Google service account may not read Managed Prometheus (roles/monitoring.viewer)")
    for pool in plan.of_type("gcp:container/nodePool:NodePool"):
        mode = ((pool.props.get("nodeConfig") or {}).get("workloadMetadataConfig") or {}).get("mode")
        if mode != "GKE_METADATA":
            out.append(f"node pool {pool.props.get('name')} runs no GKE metadata server: the operator's nodeSelector "
                       "iam.gke.io/gke-metadata-server-enabled would not match it")
    return out


def keda_queries_one_series_of_exported_metrics(plan: Plan) -> list[str]:
    out = []
    exported = _exported(plan) | _standby_metrics()
    for so in _docs(plan, "ScaledObject"):
        for t in so["spec"]["triggers"]:
            query = t["metadata"]["query"]
            if not re.match(r"^(clamp_max\(\(?)?sum\(", query):
                out.append(f"ScaledObject {so['metadata']['name']}: query {query!r} may return several series")
            if missing := _queried_metrics(query) - exported:
                out.append(f"ScaledObject {so['metadata']['name']}: neither vLLM {plan.config.vllm_version} nor the "
                           f"standby exports {', '.join(sorted(missing))}")
            if t.get("authenticationRef", {}).get("kind") != "ClusterTriggerAuthentication":
                out.append(f"ScaledObject {so['metadata']['name']}: a trigger without the GMP authentication")
    return out


def keda_scales_every_pool(plan: Plan) -> list[str]:
    scaled = {(so["metadata"]["namespace"], so["spec"]["scaleTargetRef"]["name"]) for so in _docs(plan, "ScaledObject")}
    out = [f"Deployment {d['metadata']['namespace']}/{d['metadata']['name']} has no ScaledObject"
           for d in _vllm_deployments(plan) if (d["metadata"]["namespace"], d["metadata"]["name"]) not in scaled]
    out += [f"HorizontalPodAutoscaler {h['metadata']['name']}: KEDA's webhook refuses a ScaledObject beside it"
            for h in _docs(plan, "HorizontalPodAutoscaler")
            if (h["metadata"].get("annotations") or {}).get("validations.keda.sh/hpa-ownership") != "false"]
    return out


def keda_names_fit(plan: Plan) -> list[str]:
    return [f"ScaledObject {so['metadata']['name']}: its HPA keda-hpa-<name> would exceed 63 characters"
            for so in _docs(plan, "ScaledObject") if len("keda-hpa-" + so["metadata"]["name"]) > 63]


def keda_cooldown_only_for_zero(plan: Plan) -> list[str]:
    return [f"ScaledObject {so['metadata']['name']}: {key} with minReplicaCount > 0 (KEDA warns, ignores it)"
            for so in _docs(plan, "ScaledObject") for key in ("cooldownPeriod", "pollingInterval")
            if key in so["spec"] and so["spec"].get("minReplicaCount", 0) > 0]


def keda_cooldown_outlasts_the_wake(plan: Plan) -> list[str]:

    need = wake_needed(plan.config)
    return [f"ScaledObject {so['metadata']['name']}: cooldownPeriod {so['spec']['cooldownPeriod']} s is under the "
            f"{need[model]} s a replica takes to wake: KEDA would scale it back to zero while it loads"
            for so in _docs(plan, "ScaledObject") if so["spec"].get("minReplicaCount", 1) == 0
            and (model := so["metadata"]["labels"][MODEL_LABEL]) in need
            and so["spec"]["cooldownPeriod"] < need[model]]


def keda_admits_the_scaled_objects(plan: Plan) -> list[str]:
    return keda_names_fit(plan) + keda_cooldown_only_for_zero(plan)


ROWS: tuple[Contract, ...] = (
    Contract("KEDA chart", CHART_VERSION,
             "registers APIService v1beta1.external.metrics.k8s.io for its metrics server (on whenever "
             "metricsServer.enabled, the default); only one server may own it",
             "kedacore/charts@v2.20.2:keda/templates/metrics-server/apiservice.yaml:1-31",
             "KEDA is installed in every stack and the plan declares no external-metrics APIService of its own",
             keda_owns_external_metrics),
    Contract("KEDA chart", CHART_VERSION,
             f"the metrics server listens on pod port {METRICS_SERVER_PORT} (service.portHttpsTarget) and the "
             f"admission webhook on {WEBHOOK_PORT}; the control plane calls both",
             "kedacore/charts@v2.20.2:keda/templates/metrics-server/deployment.yaml:131,151; "
             "kedacore/keda@v2.20.2:cmd/webhooks/main.go:72",
             "on a private cluster a firewall rule opens exactly these ports from the control plane's range",
             keda_ports_open_on_private_clusters),
    Contract("KEDA chart", CHART_VERSION,
             "podIdentity.gcp annotates only the operator's service account (serviceAccount.operator.name) and "
             "adds nodeSelector iam.gke.io/gke-metadata-server-enabled to the operator",
             "kedacore/charts@v2.20.2:keda/templates/manager/serviceaccount.yaml:39; "
             "keda/templates/manager/deployment.yaml:244",
             "Workload Identity binding for keda/keda-operator; every node pool runs the GKE metadata server",
             keda_operator_identity),
    Contract("KEDA", CHART_VERSION,
             "the prometheus scaler with podIdentity gcp calls with a monitoring.read token; a query returning "
             "more than one series is an error",
             "kedacore/keda@v2.20.2:pkg/scalers/prometheus_scaler.go:124,274; pkg/scalers/gcp/gcp_common.go:17",
             "every trigger sums to one series of a metric the pinned vLLM exports, authenticated by the "
             "ClusterTriggerAuthentication",
             keda_queries_one_series_of_exported_metrics),
    Contract("KEDA", CHART_VERSION,
             "the operator scales a target below minReplicaCount up to it, while no trigger is active and none "
             "errors (a failing query leaves it where it is); its webhook refuses a ScaledObject "
             "for a workload another HPA scales unless that HPA says validations.keda.sh/hpa-ownership: \"false\"",
             "kedacore/keda@v2.20.2:pkg/scaling/executor/scale_scaledobjects.go:93-109; "
             "apis/keda/v1alpha1/scaledobject_webhook.go:274",
             "every vLLM Deployment has a ScaledObject and no other HPA",
             keda_scales_every_pool),
    Contract("KEDA", CHART_VERSION,
             "the webhook refuses a ScaledObject whose name (a label value, and keda-hpa-<name>) is over 63 "
             "characters; it warns that pollingInterval and cooldownPeriod are irrelevant unless minReplicaCount is 0",
             "kedacore/keda@v2.20.2:apis/keda/v1alpha1/scaledobject_webhook.go:58,204-215,336-356",
             "ScaledObject names fit; pollingInterval and cooldownPeriod only on pools that may go to zero",
             keda_admits_the_scaled_objects),
    Contract("KEDA", CHART_VERSION,
             "a scale-up from zero records the last active time, which afterwards moves only while a trigger is "
             "active and none errors; the target goes to zero once last active + cooldownPeriod has passed",
             "kedacore/keda@v2.20.2:pkg/scaling/executor/scale_scaledobjects.go:63-81,205-235,285-286",
             "a pool at zero has a cooldown no shorter than a node plus its cold start (refused otherwise), so a "
             "waking replica serves before KEDA may take it back",
             keda_cooldown_outlasts_the_wake),
)
