"""The endpoint picker (gateway-api-inference-extension v1.2.0): the metrics it scrapes, pprof, leader
election, its ports, what it parses, and the objectives it reads."""

from __future__ import annotations

from typing import Any, Iterator

from ...components.model.picker import EPP_UID, EPP_VERSION, EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT, SHUTDOWN_S
from ...components.model.serving_api import PICKER_PATHS, REFUSED_AT_THE_PICKER
from ...policies.route_match import reach, sample_request
from ..plan import Plan
from .base import Contract, _docs, _exported, _flag


def _pickers(plan: Plan) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, "Deployment") if (d["spec"]["template"]["metadata"].get("labels") or {})
            .get("app.kubernetes.io/name") == "vllm-gke-epp"]


def _picker_container(d: dict[str, Any]) -> dict[str, Any]:
    (c,) = d["spec"]["template"]["spec"]["containers"]
    return c


def picker_reads_exported_metrics(plan: Plan) -> list[str]:
    out = []
    exported = _exported(plan)
    for d in _pickers(plan):
        args = _picker_container(d)["args"]
        for flag in ("--total-queued-requests-metric", "--kv-cache-usage-percentage-metric", "--lora-info-metric",
                     "--cache-info-metric"):
            value = _flag(args, flag)
            if value is None:
                out.append(f"{d['metadata']['name']}: {flag} unset (v1.2.0's default may not be exported)")
            elif value not in exported:
                out.append(f"{d['metadata']['name']}: {flag} {value} is not exported by vLLM {plan.config.vllm_version}")
    return out


def picker_without_pprof(plan: Plan) -> list[str]:
    return [f"{d['metadata']['name']}: pprof on (served without auth on :{METRICS_PORT})" for d in _pickers(plan)
            if "--enable-pprof=false" not in _picker_container(d)["args"]]


def picker_highly_available(plan: Plan) -> list[str]:
    out = []
    leases = any("leases" in rule.get("resources", []) and "update" in rule.get("verbs", [])
                 for role in _docs(plan, "Role") for rule in role.get("rules") or [])
    for d in _pickers(plan):
        c = _picker_container(d)
        name = d["metadata"]["name"]
        if d["spec"].get("replicas", 1) < 2 or "--ha-enable-leader-election" not in c["args"]:
            out.append(f"{name}: one replica without leader election: every restart is an outage")
        if (c.get("readinessProbe") or {}).get("grpc", {}).get("service") != "readiness":
            out.append(f"{name}: readiness is not the leader-only 'readiness' service")
        if not leases:
            out.append(f"{name}: no Role lets it take a lease")
    return out


def picker_rolls_and_drains_with_one_ready_pod(plan: Plan) -> list[str]:
    """Only the leader is Ready: the rollout may take it (maxUnavailable 100%), no budget holds its
    node's drain (one counting a single Ready pod allows no eviction), and the two never share a node."""
    out = []
    budgets = _docs(plan, "PodDisruptionBudget")
    for d in _pickers(plan):
        name, spec = d["metadata"]["name"], d["spec"]
        labels = spec["template"]["metadata"]["labels"]
        if (spec.get("strategy") or {}).get("rollingUpdate", {}).get("maxUnavailable") != "100%":
            out.append(f"{name}: a rollout could not scale down the old leader, its one available pod")
        mine = [b for b in budgets if b["metadata"].get("namespace") == d["metadata"].get("namespace")
                and (b["spec"].get("selector") or {}).get("matchLabels", {}).items() <= labels.items()]
        if mine:
            out.append(f"{name}: a PodDisruptionBudget counts its one Ready pod, the leader, and allows no "
                       "eviction of it: its node's drain would wait for GKE's hour")
        spread = [c for c in spec["template"]["spec"].get("topologySpreadConstraints") or []
                  if c.get("topologyKey") == "kubernetes.io/hostname" and c.get("whenUnsatisfiable") == "DoNotSchedule"]
        if not spread:
            out.append(f"{name}: its replicas may share a node, which one drain or failure takes whole")
    return out


def picker_stops_within_its_grace(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        grace = d["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        if not SHUTDOWN_S < grace <= SHUTDOWN_S + 30:
            out.append(f"{d['metadata']['name']}: terminationGracePeriodSeconds {grace}; the picker stops within "
                       f"{SHUTDOWN_S} s and then releases its lease: give it a little more, not more than it uses")
    return out


def picker_ports(plan: Plan) -> list[str]:
    out = []
    for d in _pickers(plan):
        ports = {p["containerPort"] for p in _picker_container(d).get("ports") or []}
        if ports != {EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT}:
            out.append(f"{d['metadata']['name']}: ports {sorted(ports)} are not the picker's defaults")
        if d["spec"]["template"]["spec"].get("securityContext", {}).get("runAsUser") != EPP_UID:
            out.append(f"{d['metadata']['name']}: not the image's nonroot user {EPP_UID}")
    for pool in _docs(plan, "InferencePool"):
        if pool["spec"]["endpointPickerRef"]["port"]["number"] != EXT_PROC_PORT:
            out.append(f"InferencePool {pool['metadata']['name']} calls the picker on another port")
    return out


def _pool_rules(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    for route in _docs(plan, "HTTPRoute"):
        for rule in route["spec"]["rules"]:
            if any(b.get("kind") == "InferencePool" for b in rule.get("backendRefs") or []):
                yield route["metadata"]["name"], rule


def picker_gets_what_it_parses(plan: Plan) -> list[str]:
    out = []
    for name, rule in _pool_rules(plan):
        for m in rule.get("matches") or [{}]:
            path = (m.get("path") or {})
            if path.get("type") != "Exact" or not any(path.get("value", "").endswith(p) for p in PICKER_PATHS):
                out.append(f"HTTPRoute {name}: {path.get('type')} {path.get('value')} reaches the picker, which parses "
                           "only chat completions, single-prompt completions and GET /v1/models")
            length = [h for h in m.get("headers") or [] if h.get("name", "").lower() == "content-length"]
            if not path.get("value", "").endswith("/v1/models") and not length:
                out.append(f"HTTPRoute {name}: a body of any size (or chunked) reaches the picker, which buffers it whole")
    return out


def picker_objective_is_the_tenants(plan: Plan) -> list[str]:

    out = []
    routes = _docs(plan, "HTTPRoute")
    for name, rule in _pool_rules(plan):
        for m in rule.get("matches") or [{}]:
            if not any(h.get("name") == "x-gateway-inference-objective" and h.get("type", "Exact") == "Exact"
                       for h in m.get("headers") or []):
                out.append(f"HTTPRoute {name}: the picker would read a client-chosen objective")
                continue
            for header in REFUSED_AT_THE_PICKER:
                reached = reach(routes, sample_request(m, {header: "x"}))
                if reached and any(b.get("kind") == "InferencePool" for b in reached.backends):
                    out.append(f"HTTPRoute {name}: a client's {header} reaches the picker")
    for objective in _docs(plan, "InferenceObjective"):
        if objective["spec"].get("priority", 0) > 0:
            out.append(f"InferenceObjective {objective['metadata']['name']}: a positive priority the picker ignores")
    return out


def picker_finds_the_objectives(plan: Plan) -> list[str]:
    out = []
    pools = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in _docs(plan, "InferencePool")}
    routed = {(route["metadata"]["namespace"], h["value"]) for _name, rule in _pool_rules(plan)
              for route in _docs(plan, "HTTPRoute") if rule in route["spec"]["rules"]
              for m in rule.get("matches") or [] for h in m.get("headers") or []
              if h.get("name") == "x-gateway-inference-objective"}
    objectives = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in _docs(plan, "InferenceObjective")}
    for (ns, name), o in objectives.items():
        ref = o["spec"].get("poolRef") or {}
        if (ns, ref.get("name")) not in pools or ref.get("group", "inference.networking.k8s.io") != \
                "inference.networking.k8s.io":
            out.append(f"InferenceObjective {ns}/{name}: its poolRef names no InferencePool of its namespace")
    for ns, value in routed:
        if (ns, value) not in objectives:
            out.append(f"routes require objective {value}, but no InferenceObjective of that name is in {ns}")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("endpoint picker", EPP_VERSION,
             "scrapes vllm:gpu_cache_usage_perc by default for KV-cache usage (vLLM 0.34 exports "
             "vllm:kv_cache_usage_perc; a missing gauge reads as 0); names set by flags",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:pkg/epp/server/runserver.go:81; "
             "cmd/epp/runner/runner.go:128-133",
             "every metric-name flag set to a gauge the pinned vLLM exports (VllmRelease.picker_metrics)",
             picker_reads_exported_metrics),
    Contract("endpoint picker", EPP_VERSION,
             "--enable-pprof defaults to true, on the metrics server (:9090), behind the same (here disabled) auth",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:cmd/epp/runner/runner.go:115",
             "--enable-pprof=false", picker_without_pprof),
    Contract("endpoint picker", EPP_VERSION,
             "--ha-enable-leader-election (default off) runs the controllers on the leader only; the 'readiness' "
             "gRPC health service passes on the leader only",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:cmd/epp/runner/runner.go:147; "
             "cmd/epp/runner/health.go:65-67",
             "two replicas with the flag, readiness on 'readiness', a Role for leases",
             picker_highly_available),
    Contract("endpoint picker", EPP_VERSION,
             "with leader election one replica is Ready (the leader) and a new one turns Ready only after the old "
             "leader releases the lease: a PodDisruptionBudget counts that one Ready pod (minAvailable 1 or "
             "maxUnavailable 1 alike allow no eviction of the leader), and a rolling update with maxUnavailable "
             "under 100% never scales the old leader down (the chart uses Recreate for that reason)",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:cmd/epp/runner/health.go:65-67; "
             "cmd/epp/runner/runner.go:288-294; config/charts/inferencepool/templates/epp-deployment.yaml:10-17",
             "maxSurge and maxUnavailable 100%; one replica per node (topology spread on hostname, DoNotSchedule), "
             "so no single drain or node failure takes both; no budget (it would hold the leader's node drain for "
             "GKE's hour, then be forced with the same handover)",
             picker_rolls_and_drains_with_one_ready_pod),
    Contract("endpoint picker", EPP_VERSION,
             f"on SIGTERM it stops its gRPC servers gracefully (open ext_proc streams finish) within "
             f"controller-runtime's default {SHUTDOWN_S} s (it sets no GracefulShutdownTimeout), then releases the "
             "lease (ReleaseOnCancel); a killed leader's lease is taken 15 s after its last renewal",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:pkg/epp/server/controller_manager.go:94-101; "
             "internal/runnable/grpc.go:50-56; kubernetes-sigs/controller-runtime@v0.22.4:pkg/manager/"
             "internal.go:52-55,497,530-538",
             f"terminationGracePeriodSeconds a little over {SHUTDOWN_S} s (the chart's 130 s buys nothing)",
             picker_stops_within_its_grace),
    Contract("endpoint picker", EPP_VERSION,
             f"serves ext_proc on {EXT_PROC_PORT}, gRPC health on {HEALTH_PORT}, metrics on {METRICS_PORT}; "
             f"the image is distroless nonroot ({EPP_UID})",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:cmd/epp/runner/runner.go:111-113; Dockerfile:4",
             "the Deployment's ports, the InferencePool's endpointPickerRef and runAsUser",
             picker_ports),
    Contract("endpoint picker", EPP_VERSION,
             "buffers the whole body with no limit, requires a string model and parses only a string prompt "
             "or a messages list (400 otherwise); reads no path",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:pkg/epp/handlers/server.go:205; "
             "pkg/epp/requestcontrol/director.go:119; pkg/epp/util/request/body.go:27-58",
             "routes to a pool match only the picker's paths exactly, and bodies only with a bounded Content-Length",
             picker_gets_what_it_parses),
    Contract("endpoint picker", EPP_VERSION,
             "reads x-gateway-inference-objective and x-gateway-model-name-rewrite as the client sent them (the "
             "fairness id too, used by flow control only) and sets x-gateway-destination-endpoint; only priority "
             "< 0 has an effect (shed while saturated)",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:pkg/epp/handlers/request.go:57-81; "
             "pkg/epp/util/request/sheddable.go:21",
             "routes require the tenant's own objective, refuse the rewrite header (and llm-d's objective), "
             "never match on or strip the picker's own header; no positive priority",
             picker_objective_is_the_tenants),
    Contract("endpoint picker", EPP_VERSION,
             "finds an objective by metadata.name among those in the pool's namespace whose poolRef names the "
             "pool and its group; an unknown one is priority 0",
             "kubernetes-sigs/gateway-api-inference-extension@v1.2.0:pkg/epp/datastore/datastore.go:174-189; "
             "pkg/epp/controller/inferenceobjective_reconciler.go:57,86; pkg/epp/requestcontrol/director.go:97-111",
             "each required objective exists beside its pool, poolRef name and group spelt out",
             picker_finds_the_objectives),
)
