"""What the platform relies on in the third-party workloads the stacks run, and a check of each.

One row per behaviour: the component and version the plan pins, what it does at run time, where
upstream says so (repository@tag:path:lines, read at that tag, or the vendor's page for what is
GKE-managed and published nowhere else), and a check that the plan honours it. `vllm-gke plan`
runs every check; the tests run them on every stack and break each one; docs/contracts.md is
generated from this table (`python -m vllm_gke.infra.contracts`).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..components.hyperdisk_weights import CPU_REQUEST_ANNOTATION, TRANSFER_COMPUTE_CLASS
from ..components.hyperdisk_weights import MIN_GKE as POPULATOR_MIN_GKE
from ..components.inference_pool import EPP_UID, EPP_VERSION, EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT
from ..components.k8s_meta import COMPUTE_CLASS_LABEL
from ..components.keda import CHART_VERSION, METRICS_SERVER_PORT, OPERATOR_SA, WEBHOOK_PORT
from ..components.serving_api import PICKER_PATHS, REFUSED_AT_THE_PICKER, SIDECAR_PEER
from ..components.specs import gke_version
from ..components.vllm_argv import load_snapshot
from ..components.vllm_versions import release
from ..components.weights_layout import LOADER_PROGRAM
from .plan import Plan, manifest

Check = Callable[[Plan], list[str]]



@dataclass(frozen=True)
class Contract:
    component: str
    version: str
    # What the component does that the platform depends on.
    behaviour: str
    # Where upstream establishes it, at that version.
    source: str
    # What the plan does about it.
    honoured_by: str
    check: Check


# --- plan helpers ---------------------------------------------------------------------------

def _docs(plan: Plan, kind: str) -> list[dict[str, Any]]:
    return [manifest(r) for r in plan.kubernetes() if r.props.get("kind") == kind]


def _vllm_deployments(plan: Plan) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, "Deployment")
            if (d["spec"]["template"]["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "vllm"]


def _vllm_containers(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in _vllm_deployments(plan):
        (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        yield f"{d['metadata']['namespace']}/{d['metadata']['name']}", c


def _flag(args: list[Any], flag: str) -> Optional[str]:
    items = [str(a) for a in args]
    return items[items.index(flag) + 1] if flag in items and items.index(flag) + 1 < len(items) else None


def _pickers(plan: Plan) -> list[dict[str, Any]]:
    return [d for d in _docs(plan, "Deployment") if (d["spec"]["template"]["metadata"].get("labels") or {})
            .get("app.kubernetes.io/name") == "vllm-gke-epp"]


def _picker_container(d: dict[str, Any]) -> dict[str, Any]:
    (c,) = d["spec"]["template"]["spec"]["containers"]
    return c


def _keda_release(plan: Plan) -> Optional[dict[str, Any]]:
    return next((r.props for r in plan.resources
                 if r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "keda"), None)


def _exported(plan: Plan) -> set[str]:
    return {m["name"] for m in load_snapshot(plan.config.vllm_version)["metrics"]}


def _queried_metrics(query: str) -> set[str]:
    return set(re.findall(r"(vllm[_:][a-z0-9_:]+)\{", query))


def _standby_metrics() -> set[str]:
    """The counters the standby program exports (components/scripts/standby.py)."""
    from ..components.standby import PROGRAM

    return set(re.findall(r"# TYPE (\w+) counter", PROGRAM.read_text()))


# --- KEDA chart 2.20.2 ------------------------------------------------------------------------

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
    if not any(r.name == "keda-monitoring-viewer" and r.props.get("role") == "roles/monitoring.viewer"
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
            if not re.match(r"^(clamp_max\()?sum\(", query):
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
    return [f"ScaledObject {so['metadata']['name']}: cooldownPeriod with minReplicaCount > 0 (KEDA warns, ignores it)"
            for so in _docs(plan, "ScaledObject")
            if "cooldownPeriod" in so["spec"] and so["spec"].get("minReplicaCount", 0) > 0]


def keda_admits_the_scaled_objects(plan: Plan) -> list[str]:
    return keda_names_fit(plan) + keda_cooldown_only_for_zero(plan)


# --- Endpoint picker v1.2.0 --------------------------------------------------------------------

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
    from ..policies.route_match import reach, sample_request

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


# --- vLLM ---------------------------------------------------------------------------------------

def vllm_exports_what_monitoring_reads(plan: Plan) -> list[str]:
    obs = plan.platform.observability
    if obs is None:
        return []
    text = json.dumps([obs.dashboard_definition, obs.alert_definitions])
    read = set(re.findall(r"(vllm:[a-z0-9_:]+)", text))
    exported = _exported(plan)
    # prometheus_client exposes a counter `x` as `x_total`, a histogram as `x_bucket`/`_sum`/`_count`.
    base = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in read}
    return [f"the dashboard or an alert reads {m}, which vLLM {plan.config.vllm_version} does not export"
            for m in sorted(base - exported)]


def vllm_drains_on_stop(plan: Plan) -> list[str]:
    rel = release(plan.config.vllm_version)
    if not rel.shutdown_timeout_flag:
        return []
    timeout = plan.config.gateway.request_timeout_seconds
    out = []
    for name, c in _vllm_containers(plan):
        value = _flag(c["args"], rel.shutdown_timeout_flag)
        if value is None or int(value) < timeout:
            out.append(f"{name}: {rel.shutdown_timeout_flag} {value or 0}: vLLM aborts what it is generating on SIGTERM")
    return out


def vllm_health_and_guard(plan: Plan) -> list[str]:
    out = []
    for name, c in _vllm_containers(plan):
        if _flag(c["args"], "--middleware") != "vllm_gke_guard.GuardMiddleware":
            out.append(f"{name}: the guard is not loaded as vLLM middleware")
        for probe in ("readinessProbe", "livenessProbe"):
            if (c.get(probe) or {}).get("httpGet", {}).get("path") != "/health":
                out.append(f"{name}: {probe} is not vLLM's /health")
    return out


def vllm_writes_only_to_volumes(plan: Plan) -> list[str]:
    out = []
    for name, c in _vllm_containers(plan):
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        mounts = {m["mountPath"] for m in c.get("volumeMounts") or [] if not m.get("readOnly")}
        if not (c.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            continue
        home = env.get("HOME")
        if home not in mounts or "/tmp" not in mounts:
            out.append(f"{name}: HOME ({home}) and /tmp must be writable volumes: vLLM caches under ~/.cache/vllm")
    return out


# --- Istio sidecar (managed Cloud Service Mesh) ---------------------------------------------------

ISTIO = "1.24.6 / 1.30.3"


def _guard_configs(plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, c in _vllm_containers(plan):
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        yield name, json.loads(env.get("GKE_LLM_GUARD_CONFIG") or "{}")


def istio_peer_and_claim_header(plan: Plan) -> list[str]:
    out = []
    headers = {rule.get("header") for ra in _docs(plan, "RequestAuthentication")
               for jwt in ra["spec"].get("jwtRules") or [] for rule in jwt.get("outputClaimToHeaders") or []
               if rule.get("claim") == "iss"}
    for name, cfg in _guard_configs(plan):
        if cfg.get("trustedPeers") != [SIDECAR_PEER]:
            out.append(f"{name}: the guard trusts {cfg.get('trustedPeers')}, not the sidecar's {SIDECAR_PEER}")
        if cfg.get("issuerHeader") not in headers:
            out.append(f"{name}: no RequestAuthentication writes the issuer into {cfg.get('issuerHeader')}")
    for d in _vllm_deployments(plan):
        if (d["spec"]["template"]["metadata"].get("labels") or {}).get("sidecar.istio.io/inject") == "false":
            out.append(f"{d['metadata']['name']}: no sidecar, so no JWT check and no 127.0.0.6 peer")
    return out


def istio_sidecar_outlives_vllm(plan: Plan) -> list[str]:
    out = []
    for d in _vllm_deployments(plan):
        ann = d["spec"]["template"]["metadata"].get("annotations") or {}
        proxy = json.loads(ann.get("proxy.istio.io/config") or "{}")
        if ann.get("sidecar.istio.io/nativeSidecar") != "true" or \
                (proxy.get("proxyMetadata") or {}).get("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") != "true":
            out.append(f"{d['metadata']['name']}: the sidecar may exit before vLLM has finished what it accepted")
    return out


# --- Cloud Storage FUSE CSI driver ------------------------------------------------------------------

def gcsfuse_sidecar_with_the_mesh(plan: Plan) -> list[str]:
    out = []
    for d in _vllm_deployments(plan):
        pod = d["spec"]["template"]
        if not any((v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io" for v in pod["spec"]["volumes"]):
            continue
        ann = pod["metadata"].get("annotations") or {}
        proxy = json.loads(ann.get("proxy.istio.io/config") or "{}")
        if ann.get("gke-gcsfuse/volumes") != "true":
            out.append(f"{d['metadata']['name']}: no gke-gcsfuse/volumes annotation: no sidecar mounts the bucket")
        if "169.254.169.254/32" not in ann.get("traffic.sidecar.istio.io/excludeOutboundIPRanges", ""):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar's metadata-server calls go through Envoy")
        if not proxy.get("holdApplicationUntilProxyStarts"):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar may start before the proxy")
        if not any(v["name"] == "gke-gcsfuse-cache" and "emptyDir" in v for v in pod["spec"]["volumes"]):
            out.append(f"{d['metadata']['name']}: no gke-gcsfuse-cache volume: the file cache lands in the driver's default")
    return out


FUSE_SIDECAR, PROXY, ISTIO_INIT = "gke-gcsfuse-sidecar", "istio-proxy", "istio-init"


def injected_init_order(init: list[str], native_proxy: bool, fuse_first: bool) -> list[str]:
    """The init containers after both webhooks, in either order: the FUSE driver puts its (native)
    sidecar right after an istio-proxy init container, else first; Istio's reorderPod puts
    istio-init and a native istio-proxy first, or, with a classic proxy, istio-init last."""
    def fuse(names: list[str]) -> list[str]:
        at = names.index(PROXY) + 1 if PROXY in names else 0
        return [*names[:at], FUSE_SIDECAR, *names[at:]]

    def istio(names: list[str]) -> list[str]:
        rest = [n for n in names if n not in (ISTIO_INIT, PROXY)]
        return [ISTIO_INIT, PROXY, *rest] if native_proxy else [*rest, ISTIO_INIT]
    return istio(fuse(init)) if fuse_first else fuse(istio(init))


def fuse_pods_start_under_any_sidecar_mode(plan: Plan) -> list[str]:
    """An init container reading a bucket mount needs the FUSE sidecar's network before the pod's
    Envoy runs whenever the proxy is classic (Istio CNI captures traffic from the sandbox's start;
    managed Cloud Service Mesh lists no nativeSidecar annotation): the pod would never start."""
    out = []
    for d in _docs(plan, "Deployment"):
        pod = d["spec"]["template"]
        fuse_volumes = {v["name"] for v in pod["spec"].get("volumes") or []
                        if (v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io"}
        if not fuse_volumes or (pod["metadata"].get("annotations") or {}).get("sidecar.istio.io/inject") == "false":
            continue
        if "443" not in (pod["metadata"].get("annotations") or {}).get(
                "traffic.sidecar.istio.io/excludeOutboundPorts", "").split(","):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar's HTTPS to Cloud Storage goes through a proxy "
                       "that a classic sidecar starts only after it (gcsfuse gives up retrying in minutes)")
        init = [c["name"] for c in pod["spec"].get("initContainers") or []]
        readers = {c["name"] for c in pod["spec"].get("initContainers") or []
                   if fuse_volumes & {m["name"] for m in c.get("volumeMounts") or []}}
        for native in (True, False):
            for fuse_first in (True, False):
                order = injected_init_order(init, native, fuse_first)
                proxy_up = order.index(PROXY) if native else len(order)  # a classic proxy: after every init
                if native and order.index(FUSE_SIDECAR) < proxy_up:
                    out.append(f"{d['metadata']['name']}: the FUSE sidecar would start before the proxy")
                for r in readers:
                    if order.index(r) < proxy_up:
                        out.append(f"{d['metadata']['name']}: init container {r} reads the bucket before the "
                                   f"mesh proxy serves ({'native' if native else 'classic'} sidecar)")
    return sorted(set(out))


# --- Redis ------------------------------------------------------------------------------------------

def redis_writes_nothing_and_scripts_obey_the_acl(plan: Plan) -> list[str]:
    out = []
    for cm in _docs(plan, "ConfigMap"):
        conf = (cm.get("data") or {}).get("redis.conf")
        if conf is None:
            continue
        lines = {line.strip() for line in conf.splitlines()}
        if 'save ""' not in lines or "appendonly no" not in lines:
            out.append("redis.conf keeps persistence on: Redis would write to its read-only root filesystem")
        users = [line for line in lines if line.startswith("user ")]
        if not users or any("~rl:*" not in u or "+evalsha" not in u or "allkeys" in u or "~*" in u for u in users):
            out.append("redis.conf's ACL does not confine the script to rl: keys")
    return out


# --- kubectl (mesh readiness) -------------------------------------------------------------------------

def kubectl_cache_is_writable(plan: Plan) -> list[str]:
    out = []
    for job in _docs(plan, "Job"):
        spec = job["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if c.get("command") != ["kubectl"]:
                continue
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            mounts = {m["mountPath"] for m in c.get("volumeMounts") or [] if not m.get("readOnly")}
            if env.get("KUBECACHEDIR") not in mounts:
                out.append(f"{job['metadata']['name']}/{c['name']}: kubectl's discovery cache is not on a writable volume")
    return out


# --- vLLM weight loading -----------------------------------------------------------------------------

def _loaders(plan: Plan) -> Iterator[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """Each weights-loader container: (its Job, the container, its argv as strings)."""
    for job in _docs(plan, "Job"):
        for c in job["spec"]["template"]["spec"].get("containers", []):
            argv = [str(a) for a in c.get("command") or []]
            if any(a.endswith("/" + LOADER_PROGRAM.name) for a in argv):
                yield job, c, argv


def loader_copies_what_vllm_opens(plan: Plan) -> list[str]:
    """Each loader Job selects by the pinned release's rule (models) or vLLM's adapter rule."""
    out, rule = [], release(plan.config.vllm_version).weights_rule
    for job, _c, argv in _loaders(plan):
        wanted = "adapter" if ".adapters[" in (_flag(argv, "--size-key") or "") else rule
        if _flag(argv, "--reads") != wanted:
            out.append(f"{job['metadata']['name']}: loads by rule {_flag(argv, '--reads')}, "
                       f"but vLLM {plan.config.vllm_version} opens by {wanted}")
    return out


def loader_writes_only_to_volumes(plan: Plan) -> list[str]:
    """huggingface_hub and gcloud write under HOME (HF_HOME, hf_xet's logs, CLOUDSDK_CONFIG) and
    TMPDIR besides the weights: on a read-only root filesystem those must be writable mounts."""
    out = []
    for job, c, _argv in _loaders(plan):
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        writable = {m["mountPath"] for m in c.get("volumeMounts") or [] if not m.get("readOnly")}
        if not (c.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            out.append(f"{job['metadata']['name']}: the loader's root filesystem is writable")
        for var in ("HOME", "TMPDIR"):
            if env.get(var) not in writable:
                out.append(f"{job['metadata']['name']}: {var} is not a writable volume: the Hub client and "
                           "gcloud write there")
        if env.get("HF_XET_CHUNK_CACHE_SIZE_BYTES") != "0":
            out.append(f"{job['metadata']['name']}: hf_xet's 10 GB chunk cache would fill the loader's home")
    return out


# --- GKE Volume Populator -----------------------------------------------------------------------------

def populator_inputs(plan: Plan) -> list[str]:
    out = []
    sources = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in _docs(plan, "GCPDataSource")}
    for claim in _docs(plan, "PersistentVolumeClaim"):
        ref = claim["spec"].get("dataSourceRef") or {}
        if ref.get("kind") != "GCPDataSource":
            continue
        name = claim["metadata"]["name"]
        source = sources.get((claim["metadata"]["namespace"], ref.get("name")))
        if source is None:
            out.append(f"claim {name}: its GCPDataSource is not in the claim's namespace")
            continue
        storage = source["spec"].get("cloudStorage") or {}
        if not str(storage.get("uri", "")).endswith("/") or not storage.get("serviceAccountName"):
            out.append(f"claim {name}: the data source needs a gs:// folder (trailing /) and a service account")
        if CPU_REQUEST_ANNOTATION not in (claim["metadata"].get("annotations") or {}):
            out.append(f"claim {name}: no {CPU_REQUEST_ANNOTATION}: the transfer sizes itself for the default node")
    if sources:
        pools = [r.props for r in plan.of_type("gcp:container/nodePool:NodePool")]
        if not any(((p.get("nodeConfig") or {}).get("labels") or {}).get(COMPUTE_CLASS_LABEL) == TRANSFER_COMPUTE_CLASS
                   for p in pools):
            out.append(f"no node pool labelled {COMPUTE_CLASS_LABEL}={TRANSFER_COMPUTE_CLASS} for the transfer Jobs")
        version = plan.config.cluster.min_master_version
        if version is None or (gke_version(version) or (0,)) < (gke_version(POPULATOR_MIN_GKE) or (0,)):
            out.append(f"cluster.minMasterVersion {version}: Volume Populator needs {POPULATOR_MIN_GKE} or later")
    return out


CONTRACTS: tuple[Contract, ...] = (
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
             "the operator scales a target below minReplicaCount up to it; its webhook refuses a ScaledObject "
             "for a workload another HPA scales unless that HPA says validations.keda.sh/hpa-ownership: \"false\"",
             "kedacore/keda@v2.20.2:pkg/scaling/executor/scale_scaledobjects.go:102-109; "
             "apis/keda/v1alpha1/scaledobject_webhook.go:274",
             "every vLLM Deployment has a ScaledObject and no other HPA",
             keda_scales_every_pool),
    Contract("KEDA", CHART_VERSION,
             "the webhook refuses a ScaledObject whose name (a label value, and keda-hpa-<name>) is over 63 "
             "characters; cooldownPeriod applies only with minReplicaCount 0",
             "kedacore/keda@v2.20.2:apis/keda/v1alpha1/scaledobject_webhook.go:58,204-215,348-352",
             "ScaledObject names fit; cooldownPeriod only on pools that may go to zero",
             keda_admits_the_scaled_objects),
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
    Contract("vLLM", "0.34.0",
             "exports vllm:num_requests_running/waiting, vllm:kv_cache_usage_perc, vllm:time_to_first_token_seconds "
             "and the other series the dashboard and alerts read (names in the release's snapshot)",
             "vllm-project/vllm@v0.34.0:vllm/v1/metrics/loggers.py:499-975 (images/vllm-versions/0.34.0.json)",
             "every vllm: series the dashboard and the alert policies query is one the release exports",
             vllm_exports_what_monitoring_reads),
    Contract("vLLM", "0.34.0",
             "--shutdown-timeout defaults to 0: on SIGTERM the engine aborts unfinished requests; > 0 drains",
             "vllm-project/vllm@v0.34.0:vllm/engine/arg_utils.py:1971-1976; vllm/v1/engine/core.py:1886-1905",
             "--shutdown-timeout = the gateway's request timeout (grace period and LB draining cover it)",
             vllm_drains_on_stop),
    Contract("vLLM", "0.34.0",
             "--middleware classes wrap the app; /health answers 200, or 503 once the engine is dead",
             "vllm-project/vllm@v0.34.0:vllm/entrypoints/serve/middleware/register.py:65-69; "
             "vllm/entrypoints/serve/instrumentator/health.py:22-35",
             "the guard is loaded as middleware; readiness and liveness probe /health",
             vllm_health_and_guard),
    Contract("vLLM", "0.34.0",
             "caches under ~/.cache/vllm (VLLM_CACHE_ROOT, or XDG_CACHE_HOME) and torch/Triton compile caches "
             "under HOME and /tmp",
             "vllm-project/vllm@v0.34.0:vllm/envs.py:361-366,756-762",
             "HOME and /tmp are writable emptyDirs under a read-only root filesystem",
             vllm_writes_only_to_volumes),
    Contract("Istio sidecar", ISTIO,
             "inbound traffic reaches the app from the passthrough address 127.0.0.6 (mesh inboundTrafficPolicy "
             "PASSTHROUGH, the default, with REDIRECT capture; LOCALHOST mode would deliver from 127.0.0.1, TPROXY "
             "from the client: both refused); outputClaimToHeaders writes the verified claim and strips a client's "
             "copy of that header",
             "istio/istio@1.24.6:pilot/pkg/networking/core/listener_address.go:35-37 (the address), "
             "pkg/config/mesh/mesh.go:84 and pilot/pkg/networking/core/cluster.go:512-515 (PASSTHROUGH by default), "
             "pilot/pkg/networking/core/cluster_builder.go:441-451 (1.30.3: 671-681, the inbound cluster's source); "
             "pilot/pkg/security/authn/policy_applier.go:174-179 (1.30.3: 175-180, claim_to_headers; the strip of a "
             "client's copy is Envoy's jwt_authn, istio/istio#53212)",
             "the guard trusts only 127.0.0.6 and reads the issuer header the RequestAuthentications write; each "
             "ALLOW rule also requires that header to be its token's issuer, so a data plane leaving a client's copy "
             "in place cannot pass one tenant as another; every vLLM pod is meshed", istio_peer_and_claim_header),
    Contract("Istio sidecar", ISTIO,
             "sidecar.istio.io/nativeSidecar makes istio-proxy an init container that drains from its preStop and "
             "stops after the app; a classic sidecar exits 5 s after SIGTERM (terminationDrainDuration) unless "
             "EXIT_ON_ZERO_ACTIVE_CONNECTIONS (proxyMetadata) makes it wait for its last connection",
             "istio/api@1.24.6:annotation/annotations.yaml:251 (1.30.3: 273); istio/istio@1.24.6,1.30.3:"
             "pkg/envoy/agent.go:140-230; pkg/config/mesh/mesh.go:45",
             "vLLM pods carry both, so the sidecar serves until vLLM has drained", istio_sidecar_outlives_vllm),
    Contract("Cloud Storage FUSE CSI driver", "GKE-managed (v1.24.4 read)",
             "gke-gcsfuse/volumes injects gke-gcsfuse-sidecar after istio-proxy; with Istio the app must wait for "
             "the proxy and the metadata server be excluded from capture; a pod volume named gke-gcsfuse-cache "
             "holds the file cache",
             "GoogleCloudPlatform/gcs-fuse-csi-driver@v1.24.4:pkg/webhook/mutatingwebhook.go:245-259; "
             "pkg/webhook/injection.go:35-41; docs/istio.md:24-61",
             "bucket-backed pods carry the annotations and their own sized cache volume", gcsfuse_sidecar_with_the_mesh),
    Contract("Cloud Storage FUSE CSI driver + Istio injector", "v1.24.4 / 1.24.6, 1.30.3",
             "the FUSE webhook inserts its native sidecar right after an istio-proxy init container, else first; "
             "Istio orders istio-init and a native proxy first, a classic proxy's istio-init last; with Istio CNI "
             "an init container's traffic is captured before any proxy runs",
             "GoogleCloudPlatform/gcs-fuse-csi-driver@v1.24.4:pkg/webhook/injection.go:123,187-193; "
             "istio/istio@1.24.6:pkg/kube/inject/webhook.go:772-815 (1.30.3: 781-824); "
             "https://istio.io/latest/docs/setup/additional-setup/cni/#compatibility-with-application-init-containers",
             "no init container of a meshed pod reads a bucket mount (the entrypoint waits for bucket-backed "
             "weights after the proxy) and the FUSE sidecar's HTTPS bypasses Envoy (excludeOutboundPorts 443), so "
             "pods start with a native or a classic sidecar",
             fuse_pods_start_under_any_sidecar_mode),
    Contract("Redis", "7.4.2",
             "with save \"\" and appendonly no it writes no file, on shutdown either; commands a script calls are "
             "checked against the caller's ACL and key patterns",
             "redis/redis@7.4.1 (7.4.2 changes none of it):src/server.c:4474-4485; src/config.c:2705-2713; "
             "src/script.c:575-602; src/acl.c:1673",
             "no persistence under a read-only root filesystem; one ACL user confined to ~rl:* and the script's "
             "commands", redis_writes_nothing_and_scripts_obey_the_acl),
    Contract("kubectl", "v1.33.5",
             "caches discovery in $KUBECACHEDIR, else $HOME/.kube/cache (HOME unset: a relative path); an "
             "unwritable cache is only logged at -v1 and nothing is cached for the Job's retries",
             "kubernetes/cli-runtime@v0.33.5:pkg/genericclioptions/config_flags.go:303-309; "
             "kubernetes/client-go@v0.33.5:util/homedir/homedir.go:91",
             "KUBECACHEDIR on an emptyDir shared by the mesh-readiness Job's containers", kubectl_cache_is_writable),
    Contract("vLLM", "0.34.0",
             "with load_format auto a model folder holding top-level consolidated*.safetensors loads those "
             "(filtered by consolidated.safetensors.index.json), else the first of *.safetensors, *.bin, *.pt "
             "(safetensors filtered by model.safetensors.index.json); a LoRA adapter opens the first of "
             "adapter_model.safetensors, .bin, .pt",
             "vllm-project/vllm@v0.34.0:vllm/model_executor/model_loader/default_loader.py:170-258; "
             "vllm/lora/lora_model.py:243-245",
             "each loader Job copies the config and tokenizer files and only the weights that rule opens "
             "(--reads, VllmRelease.weights_rule), so a disk sized for them holds them",
             loader_copies_what_vllm_opens),
    Contract("huggingface_hub / hf_xet", ">=2.0 (vLLM 0.34's floor); xet-runtime 1.5.2",
             "downloads into local_dir write their metadata under <local_dir>/.cache/huggingface; the client "
             "keeps HF_HOME (XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface) and hf_xet logs under "
             "HF_XET_CACHE/logs (HF_HOME/xet) with a 10 GB chunk cache there unless "
             "HF_XET_CHUNK_CACHE_SIZE_BYTES says otherwise",
             "huggingface/huggingface_hub@v2.4.0:src/huggingface_hub/constants.py:159-170,341-342; "
             "huggingface/xet-core@xet-runtime-v1.5.2:xet_runtime/src/config/groups/log.rs:6-16, chunk_cache.rs:1-10",
             "loader containers run on a read-only root filesystem with HOME and TMPDIR on emptyDirs, the "
             "chunk cache off; the weights' own metadata lands in the weights folder and the loader prunes it",
             loader_writes_only_to_volumes),
    Contract("GKE Volume Populator", "GKE-managed",
             "a GCPDataSource (cloudStorage uri of a folder, serviceAccountName) beside its claim; transfer Jobs "
             "on nodes of compute class gcs-to-hdml-compute-class, sized by volume-populator.datalayer.gke.io/"
             f"cpu-request; GKE {POPULATOR_MIN_GKE} or later",
             "https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/volume-populator-hdml",
             "each claim's data source, annotation, the transfer pool's label and the version floor",
             populator_inputs),
)


def problems(plan: Plan) -> list[tuple[Contract, str]]:
    """Every row the plan breaks, with what breaks it."""
    return [(c, p) for c in CONTRACTS for p in c.check(plan)]


def markdown() -> str:
    rows = ["# Component contracts", "",
            "Generated from `infra/contracts.py` (`python -m vllm_gke.infra.contracts`): what the platform relies on",
            "in each third-party workload it runs, where upstream says so at the pinned version, and what the",
            "plan does about it. `vllm-gke plan` checks every row; the tests check every stack and break each row.",
            "", "| component | version | behaviour | upstream source | honoured by |", "|---|---|---|---|---|"]
    for c in CONTRACTS:
        rows.append(f"| {c.component} | {c.version} | {c.behaviour} | {c.source} | {c.honoured_by} |")
    return "\n".join(rows) + "\n"


DOC = Path(__file__).resolve().parent.parent / "docs" / "contracts.md"


def main(argv: Optional[list[str]] = None) -> int:
    target = Path((argv or sys.argv[1:] or [str(DOC)])[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markdown())
    print(f"wrote {target}: {len(CONTRACTS)} contracts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
