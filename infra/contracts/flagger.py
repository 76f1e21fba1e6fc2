"""Flagger (chart and operator 1.44.0): what it rewrites and owns for a Canary, what it queries, whom
it calls, and the metrics the rollback alert reads. Every check passes where the plan declares no
Canary; where one is, Flagger must be installed as components/flagger.py installs it."""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

from ...components.model.config_rules.scaling import wake_needed
from ...components.model.flagger_install import (
    CANARY_STATUS,
    FLAGGER_POD_LABELS,
    LOADTESTER,
)
from ...components.model.k8s_objects import MODEL_LABEL
from ...components.model.rollouts import FLAGGER_NAMESPACE, FLAGGER_VERSION, WORKLOAD_LABEL
from ..plan import Plan, manifest
from .base import Contract, _docs

FLAGGER = "fluxcd/flagger@v1.44.0"


def _canaries(plan: Plan) -> list[dict[str, Any]]:
    return _docs(plan, "Canary")


def _release(plan: Plan) -> Optional[dict[str, Any]]:
    return next((r.props for r in plan.resources
                 if r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "flagger"), None)


def _values(plan: Plan) -> dict[str, Any]:
    return (_release(plan) or {}).get("values") or {}


def _by_name(plan: Plan, kind: str, declared_only: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """The plan's objects of a kind by namespace and name (`declared_only`: without the Services and
    HTTPRoute base._docs derives for Flagger's pools)."""
    docs = [manifest(r) for r in plan.kubernetes() if r.props.get("kind") == kind] if declared_only else _docs(plan, kind)
    return {(d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def _target(plan: Plan, canary: dict[str, Any]) -> Optional[dict[str, Any]]:
    ns = canary["metadata"]["namespace"]
    return _by_name(plan, "Deployment").get((ns, canary["spec"]["targetRef"]["name"]))


def _where(canary: dict[str, Any]) -> str:
    return f"Canary {canary['metadata']['namespace']}/{canary['metadata']['name']}"


def _installed(plan: Plan) -> list[str]:
    """Where a Canary is declared, Flagger must be: else nothing acts on it."""
    if _canaries(plan) and _release(plan) is None:
        return ["Canaries are declared but no Flagger release is: nothing would roll them out"]
    return []


def flagger_rewrites_only_the_workload_label(plan: Plan) -> list[str]:
    if not _canaries(plan):
        return []
    out = _installed(plan)
    if _release(plan) is not None and _values(plan).get("selectorLabels") != WORKLOAD_LABEL:
        out.append(f"the chart's selectorLabels is {_values(plan).get('selectorLabels')!r}, not {WORKLOAD_LABEL} alone: "
                   "Flagger would rewrite the first default label a selector holds (app.kubernetes.io/name) on the primary")
    deployments = _by_name(plan, "Deployment")
    for c in _canaries(plan):
        target = _target(plan, c)
        if target is None:
            out.append(f"{_where(c)}: its target Deployment {c['spec']['targetRef']['name']} is not in the plan")
            continue
        name, ns = target["metadata"]["name"], target["metadata"]["namespace"]
        selector = target["spec"]["selector"]["matchLabels"]
        pod_labels = target["spec"]["template"]["metadata"].get("labels") or {}
        if selector.get(WORKLOAD_LABEL) != name or pod_labels.get(WORKLOAD_LABEL) != name:
            out.append(f"Deployment {ns}/{name}: {WORKLOAD_LABEL}={name} is not in its selector and on its pods: "
                       "Flagger cannot tell its primary's pods from the canary's")
        if (ns, f"{name}-primary") in deployments:
            out.append(f"Deployment {ns}/{name}-primary is declared: Flagger makes the primary under that name")
    return out


def flagger_owns_the_services_and_the_route(plan: Plan) -> list[str]:
    out = []
    services, routes = _by_name(plan, "Service", declared_only=True), _by_name(plan, "HTTPRoute", declared_only=True)
    for c in _canaries(plan):
        ns, apex = c["metadata"]["namespace"], (c["spec"].get("service") or {}).get("name") or c["spec"]["targetRef"]["name"]
        out += [f"Service {ns}/{s} is declared: Flagger owns it for {_where(c)} and would fight Pulumi over it"
                for s in (apex, f"{apex}-primary", f"{apex}-canary") if (ns, s) in services]
        if (ns, apex) in routes:
            out.append(f"HTTPRoute {ns}/{apex} is declared: Flagger's gatewayapi router owns that route for {_where(c)}")
    return out


def _service_at(plan: Plan, address: str) -> bool:
    """`address` is http://<service>.<namespace>.svc.cluster.local[:<port>] of a planned Service."""
    url = urlsplit(address)
    host = (url.hostname or "").split(".")
    if url.scheme != "http" or len(host) < 2 or host[2:] != ["svc", "cluster", "local"]:
        return False
    svc = _by_name(plan, "Service", declared_only=True).get((host[1], host[0]))
    return svc is not None and any(p["port"] == (url.port or 80) for p in svc["spec"]["ports"])


def flagger_queries_the_frontend(plan: Plan) -> list[str]:
    if not _canaries(plan):
        return []
    out = _installed(plan)
    values = _values(plan)
    templates = _by_name(plan, "MetricTemplate")
    for c in _canaries(plan):
        for m in c["spec"]["analysis"].get("metrics") or []:
            ref = m.get("templateRef") or {}
            ns = ref.get("namespace") or c["metadata"]["namespace"]
            t = templates.get((ns, ref.get("name", "")))
            if t is None:
                out.append(f"{_where(c)}: metric {m['name']} names MetricTemplate {ns}/{ref.get('name')}, not in the plan")
                continue
            provider = t["spec"]["provider"]
            if provider.get("type") != "prometheus" or not _service_at(plan, provider.get("address", "")):
                out.append(f"MetricTemplate {ns}/{ref['name']}: provider {provider} is not the PromQL frontend's Service")
            if provider.get("secretRef"):
                out.append(f"MetricTemplate {ns}/{ref['name']}: a secretRef's static token would expire (GMP wants "
                           "an access token): the frontend authenticates instead")
            if ns != c["metadata"]["namespace"] and values.get("noCrossNamespaceRefs"):
                out.append(f"{_where(c)}: noCrossNamespaceRefs is on: Flagger would not read {ns}'s templates")
    if _release(plan) is not None and not _service_at(plan, values.get("metricsServer", "")):
        out.append(f"the chart's metricsServer {values.get('metricsServer')!r} is not the PromQL frontend's Service")
    return out


def flagger_scales_the_primary_by_named_triggers(plan: Plan) -> list[str]:
    out = []
    scaled = _by_name(plan, "ScaledObject")
    for c in _canaries(plan):
        ref, target = c["spec"].get("autoscalerRef"), c["spec"]["targetRef"]["name"]
        if ref is None:
            continue
        so = scaled.get((c["metadata"]["namespace"], ref["name"]))
        if so is None or so["spec"]["scaleTargetRef"]["name"] != target:
            out.append(f"{_where(c)}: autoscalerRef {ref['name']} is not a planned ScaledObject of {target}")
            continue
        names = [t.get("name") for t in so["spec"]["triggers"]]
        queries = ref.get("primaryScalerQueries") or {}
        if None in names or set(names) != set(queries):
            out.append(f"{_where(c)}: primaryScalerQueries {sorted(queries)} are not the ScaledObject's trigger names "
                       f"{names}: an unnamed or unlisted trigger keeps scaling the primary on the canary's series")
        out += [f"{_where(c)}: the primary's query for {k} does not read {target}-primary's pods: {q}"
                for k, q in queries.items() if f"{target}-primary" not in q]
    return out


def flagger_deadline_outlasts_the_wake(plan: Plan) -> list[str]:
    out = []
    need = wake_needed(plan.config)
    for c in _canaries(plan):
        target = _target(plan, c)
        model = ((target or {}).get("metadata", {}).get("labels") or {}).get(MODEL_LABEL, "")
        if target is None or model not in need:
            continue
        canary_s = c["spec"].get("progressDeadlineSeconds", 600)
        own_s = target["spec"].get("progressDeadlineSeconds", 600)
        if canary_s <= need[model]:
            out.append(f"{_where(c)}: progressDeadlineSeconds {canary_s} s is within the {need[model]} s a replica of "
                       f"{model} takes to wake (a node, then its cold start): Flagger would roll a waking canary back")
        if own_s <= need[model]:
            out.append(f"Deployment {target['metadata']['name']}: progressDeadlineSeconds {own_s} s is within its "
                       f"{need[model]} s wake: its ProgressDeadlineExceeded rolls the canary back (the primary copies it)")
    return out


def _webhooks(plan: Plan) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for c in _canaries(plan):
        for w in c["spec"]["analysis"].get("webhooks") or []:
            yield c, w


def _loadtester_args(plan: Plan) -> list[str]:
    d = _by_name(plan, "Deployment").get((FLAGGER_NAMESPACE, LOADTESTER))
    return [str(a) for a in d["spec"]["template"]["spec"]["containers"][0]["command"]] if d else []


def flagger_webhooks_reach_the_loadtester(plan: Plan) -> list[str]:
    out = []
    args = _loadtester_args(plan)
    regexp = next((a.split("=", 1)[1] for a in args if a.startswith("-namespace-regexp=")), "")
    for c, w in _webhooks(plan):
        url = urlsplit(w["url"])
        host = (url.hostname or "").split(".")
        if not args or host[:2] != [LOADTESTER, FLAGGER_NAMESPACE] or not _service_at(plan, w["url"]):
            out.append(f"{_where(c)}: webhook {w['name']} calls {w['url']}, not the planned loadtester")
        elif not regexp or not re.fullmatch(regexp, c["metadata"]["namespace"]):
            out.append(f"{_where(c)}: the loadtester's -namespace-regexp {regexp!r} refuses its namespace's tasks")
        if (w.get("metadata") or {}).get("type") != "bash":
            out.append(f"{_where(c)}: webhook {w['name']} is not a bash task: a kubectl task runs without a shell")
    return out


_STARTS = re.compile(r"kubectl -n (\S+) create job (\S+) --from=cronjob/(\S+)")


def _grants(plan: Plan, namespace: str, cron: str, job: str) -> bool:
    """A Role bound to the loadtester in `namespace` grants what the command does."""
    bound = {b["roleRef"]["name"] for b in _docs(plan, "RoleBinding") if b["metadata"].get("namespace") == namespace
             and {"kind": "ServiceAccount", "name": LOADTESTER, "namespace": FLAGGER_NAMESPACE} in b.get("subjects", [])}
    rules = [r for role in _docs(plan, "Role") if role["metadata"].get("namespace") == namespace
             and role["metadata"]["name"] in bound for r in role.get("rules") or []]

    def allows(resource: str, verb: str, name: Optional[str]) -> bool:
        return any(resource in r["resources"] and verb in r["verbs"] and "batch" in r["apiGroups"]
                   and (name is None or not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)

    return (allows("cronjobs", "get", cron) and allows("jobs", "create", None)
            and allows("jobs", "get", job) and allows("jobs", "delete", job))


def flagger_webhooks_start_the_load_test(plan: Plan) -> list[str]:
    out = []
    crons = _by_name(plan, "CronJob")
    for c, w in _webhooks(plan):
        m = _STARTS.search((w.get("metadata") or {}).get("cmd", ""))
        if m is None:
            out.append(f"{_where(c)}: webhook {w['name']} starts no load test's CronJob")
            continue
        ns, job, cron = m.groups()
        if (ns, cron) not in crons:
            out.append(f"{_where(c)}: webhook {w['name']} starts CronJob {ns}/{cron}, which the plan does not declare")
        elif not _grants(plan, ns, cron, job):
            out.append(f"{_where(c)}: no Role in {ns} lets the loadtester get {cron} and create, get and delete Job {job}")
    return out


def flagger_tracks_no_config(plan: Plan) -> list[str]:
    if not _canaries(plan):
        return []
    out = _installed(plan)
    if _release(plan) is not None and (_values(plan).get("configTracking") or {}).get("enabled") is not False:
        out.append("config tracking is on (the chart's default): Flagger would point primaries at copies of their "
                   "ConfigMaps and Secrets that Pulumi does not manage")
    for c in _canaries(plan):
        target = _target(plan, c)
        spec = (target or {}).get("spec", {}).get("template", {}).get("spec", {})
        refs = _config_refs(spec)
        if refs:
            out.append(f"{_where(c)}: its pods read {', '.join(refs)}: with tracking off a change to them reaches the "
                       "primary at once, unanalysed; put the configuration in the pod template")
    return out


def _config_refs(spec: dict[str, Any]) -> list[str]:
    """The ConfigMaps and Secrets a pod spec reads (config_tracker.go's scan: volumes, projected
    sources, env valueFrom, envFrom)."""
    out: list[str] = []
    for v in spec.get("volumes") or []:
        sources = [v, *((v.get("projected") or {}).get("sources") or [])]
        out += [f"configmap/{s['configMap']['name']}" for s in sources if "configMap" in s]
        out += [f"secret/{s['secret'].get('secretName') or s['secret'].get('name')}" for s in sources if "secret" in s]
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for e in c.get("env") or []:
            source = e.get("valueFrom") or {}
            out += [f"configmap/{source['configMapKeyRef']['name']}"] if "configMapKeyRef" in source else []
            out += [f"secret/{source['secretKeyRef']['name']}"] if "secretKeyRef" in source else []
        for e in c.get("envFrom") or []:
            out += [f"configmap/{e['configMapRef']['name']}"] if "configMapRef" in e else []
            out += [f"secret/{e['secretRef']['name']}"] if "secretRef" in e else []
    return out


def flagger_alert_reads_its_metrics(plan: Plan) -> list[str]:
    if not _canaries(plan):
        return []
    out = _installed(plan)
    scraped = [p for p in _docs(plan, "PodMonitoring") if p["metadata"].get("namespace") == FLAGGER_NAMESPACE
               and p["spec"]["selector"].get("matchLabels") == FLAGGER_POD_LABELS
               and any(e.get("port") == "http" for e in p["spec"]["endpoints"])]
    if not scraped:
        out.append("no PodMonitoring scrapes Flagger's pod on its port http: the rollback alert reads nothing")
    queries = [c["conditionPrometheusQueryLanguage"]["query"] for a in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")
               for c in a.props.get("conditions") or [] if CANARY_STATUS in str(c.get("conditionPrometheusQueryLanguage"))]
    if not queries:
        out.append(f"no alert policy reads {CANARY_STATUS}: a rollback pages no one")
    for q in queries:
        if "exported_namespace" not in q or f'namespace="{FLAGGER_NAMESPACE}"' not in q:
            out.append(f"the rollback alert {q!r} reads the Canary's namespace from `namespace`, which is Flagger's "
                       "pod's (flagger-system): the Canary's is exported_namespace")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Flagger", FLAGGER_VERSION,
             "with -selector-labels (the chart's selectorLabels) Flagger takes the first listed label in the target's "
             "spec.selector.matchLabels, gives the primary <name>-primary a selector of that label alone valued "
             "<value>-primary and the target's pod labels with that one rewritten; its Services select that label alone",
             f"{FLAGGER}:pkg/canary/deployment_controller.go:246-250,273-300,321-333; pkg/canary/util.go:128-141; "
             "pkg/router/kubernetes_default.go:49-76,106; charts/flagger/templates/deployment.yaml:102-104",
             f"selectorLabels is {WORKLOAD_LABEL} alone; every target has {WORKLOAD_LABEL}=<its name> in its selector and "
             "on its pods, and no <name>-primary Deployment is declared",
             flagger_rewrites_only_the_workload_label),
    Contract("Flagger", FLAGGER_VERSION,
             "the Canary's Services <svc>, <svc>-primary and <svc>-canary (Kubernetes router) and the HTTPRoute <svc> "
             "(gatewayapi:v1 router) in the Canary's namespace are created and overwritten by Flagger, <svc> being "
             "service.name or the target's name",
             f"{FLAGGER}:pkg/apis/flagger/v1beta1/canary.go:608-616; pkg/router/kubernetes_default.go:49-76; "
             "pkg/router/gateway_api.go:65-254",
             "the plan declares none of those Services nor an HTTPRoute of that name for a Flagger pool",
             flagger_owns_the_services_and_the_route),
    Contract("Flagger", FLAGGER_VERSION,
             "a metric's templateRef may name another namespace unless -no-cross-namespace-refs; the prometheus "
             "provider GETs <address>/api/v1/query with a static bearer token or basic auth at most, and a query error "
             "or an empty result fails the check",
             f"{FLAGGER}:pkg/controller/scheduler_metrics.go:271-325; pkg/metrics/providers/prometheus.go:61-175; "
             "cmd/flagger/main.go:125",
             "every gate's MetricTemplate is planned in flagger-system, of type prometheus at the PromQL frontend's "
             "Service (which authenticates to Managed Prometheus with Workload Identity), as is the chart's metricsServer",
             flagger_queries_the_frontend),
    Contract("Flagger", FLAGGER_VERSION,
             "autoscalerRef: Flagger copies the named ScaledObject to <name>-primary scaling the primary, replacing the "
             "query of each trigger whose name is a primaryScalerQueries key (the others keep the target's query)",
             f"{FLAGGER}:pkg/canary/scaled_object_reconciler.go:40-77,183-212",
             "the autoscalerRef is the target's planned ScaledObject, its triggers all named and exactly the "
             "primaryScalerQueries keys, each query reading <target>-primary's pods",
             flagger_scales_the_primary_by_named_triggers),
    Contract("Flagger", FLAGGER_VERSION,
             "a canary or primary Deployment is rolled back as stuck once unavailable for the Canary's "
             "progressDeadlineSeconds (default 600) or when its own Deployment reports ProgressDeadlineExceeded; the "
             "primary takes the target's progressDeadlineSeconds",
             f"{FLAGGER}:pkg/canary/deployment_ready.go:74-109; pkg/canary/deployment_controller.go:96,288; "
             "pkg/apis/flagger/v1beta1/canary.go:618-625",
             "the Canary's and the target Deployment's deadlines both exceed the pool's wake (a node, then the "
             "replica's cold start, as the plan estimates them)",
             flagger_deadline_outlasts_the_wake),
    Contract("Flagger", FLAGGER_VERSION,
             "webhooks are POSTed to their URL (pre-rollout before the first step, rollout at every step; a failure "
             "counts as a failed check); the loadtester runs a bash task with bash -c, blocking, refuses tasks of "
             "Canaries outside -namespace-regexp, and runs a kubectl task without a shell",
             f"{FLAGGER}:pkg/controller/webhook.go:52-116; pkg/controller/scheduler.go:449-467,752-763; "
             "pkg/loadtester/server.go:290-336; pkg/loadtester/authorizer.go:35-37; pkg/loadtester/kubectl.go:22-27",
             "every webhook is a bash task to the planned loadtester Service, whose -namespace-regexp admits the "
             "Canary's namespace",
             flagger_webhooks_reach_the_loadtester),
    Contract("Flagger loadtester", "0.38.0",
             "a task's kubectl runs as the loadtester's service account: `create job --from=cronjob/X` gets the CronJob "
             "and creates the Job (an ownerReference without blockOwnerDeletion)",
             f"{FLAGGER}:Dockerfile.loadtester:13-15 (kubectl v1.36.2); "
             "kubernetes/kubectl@v0.36.2:pkg/cmd/create/create_job.go:180-217,254-287",
             "each webhook starts a planned load test's CronJob, and a Role bound to the loadtester in its namespace "
             "grants get on it, create on Jobs and get and delete on the one Job the command keeps",
             flagger_webhooks_start_the_load_test),
    Contract("Flagger", FLAGGER_VERSION,
             "config tracking (-enable-config-tracking, on by default) copies every ConfigMap and Secret the target's "
             "pods read (volumes, projected sources, env, envFrom) to <name>-primary and points the primary at the copies",
             f"{FLAGGER}:pkg/canary/config_tracker.go:123-237,294-350; cmd/flagger/main.go:121; "
             "charts/flagger/templates/deployment.yaml:105-107",
             "tracking is off, and the targets' pods read no ConfigMap or Secret: their configuration is in the pod "
             "template, so any change to it is a canary",
             flagger_tracks_no_config),
    Contract("Flagger", FLAGGER_VERSION,
             "Flagger exports flagger_canary_status{name,namespace} (2: failed) on its pod's /metrics; Managed "
             "Prometheus sets the target's namespace label and keeps a scraped one it shadows as exported_namespace",
             f"{FLAGGER}:pkg/metrics/recorder.go:86-91,159-171; charts/flagger/templates/deployment.yaml:88-90; "
             "GoogleCloudPlatform/prometheus-engine@v0.17.2:pkg/operator/apis/monitoring/v1/pod_config.go:180-185, "
             "common_types.go:143-156 (no honor_labels); prometheus/prometheus@v2.53.5:scrape/scrape.go:582-605",
             "a PodMonitoring scrapes Flagger's pod on port http; the rollback alert reads flagger_canary_status in "
             "flagger-system by exported_namespace",
             flagger_alert_reads_its_metrics),
)
