"""Flagger v1.44.0's canary controller for one Deployment target on the Gateway API provider,
emulated from its source (github.com/fluxcd/flagger at tag v1.44.0; file:line below) so a test can
drive its decisions: it reads the Canary and its MetricTemplates from the API server, renders each
template's query, runs it against a Prometheus query API, and writes what Flagger writes - the
Services, the `-primary` Deployment and ScaledObject, the HTTPRoute's weights, the target's
replicas, the paused-replicas annotation and the Canary's status - through the API server.

`Flagger.advance(name, namespace)` is one tick of pkg/controller/scheduler.go advanceCanary
(:158-506), step for step. What the emulation does not implement raises NotEmulated instead of
guessing: other providers and target kinds, A/B and blue/green, mirroring, session affinity,
skipAnalysis, config tracking of ConfigMaps and Secrets, webhooks but rollout/pre-rollout/
post-rollout, template actions but Flagger's model functions, providers but prometheus.

Where it differs from Flagger by construction (and why it does not change a decision):
- the tick is called by the test, once per analysis interval of a virtual clock, after the
  cluster's controllers have settled (Flagger's ticker fires every interval in real time);
- ComputeHash (pkg/canary/spec.go:54) is a sha256 of the template's JSON, not fnv32a of its spew
  dump: only equality of two hashes is ever used;
- times it writes (lastTransitionTime) are the virtual clock's;
- the Canary's Initializing phase, which the informer's handler sets before the first tick
  (pkg/controller/controller.go), is left "": every check treats both alike;
- Kubernetes events and alerts are appended to `events`; the Prometheus gauges Flagger exports
  (pkg/metrics/recorder.go) are kept with the virtual time of each change in `recorder`.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import posixpath
import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from tests.kube_api import ApiError, KubeApi

FLAGGER_TAG = "v1.44.0"
GATEWAY_PROVIDER = "gatewayapi:v1"
PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"  # pkg/apis/keda/v1alpha1/scaledobject.go:230
TOOLKIT_MARKER = "toolkit.fluxcd.io"  # pkg/canary/util.go:72
METRIC_INTERVAL = "1m"  # pkg/apis/flagger/v1beta1/canary.go:36
# Phases (pkg/apis/flagger/v1beta1/status.go:40-68).
INITIALIZING, INITIALIZED, WAITING, PROGRESSING = "Initializing", "Initialized", "Waiting", "Progressing"
WAITING_PROMOTION, PROMOTING, FINALISING = "WaitingPromotion", "Promoting", "Finalising"
SUCCEEDED, FAILED = "Succeeded", "Failed"
# Webhook types this emulation calls (pkg/apis/flagger/v1beta1/canary.go:416-430); the others refuse.
HOOKS = {"", "rollout", "pre-rollout", "post-rollout"}


class NotEmulated(Exception):
    """The Canary or a template uses what this emulation does not implement."""


class ErrNoValuesFound(Exception):
    """pkg/metrics/providers/errors: the query returned no value, or NaN."""


class ErrMultipleValuesReturned(Exception):
    """pkg/metrics/providers/errors: the query returned a range (matrix)."""


def gov(x: float) -> str:
    """Go's %v of a float64, as Flagger's messages print thresholds."""
    return str(int(x)) if x == int(x) and abs(x) < 1e21 else repr(x)


# --- pkg/metrics/observers/render.go RenderQuery -----------------------------------------------

_MODEL_FUNCS = ("name", "namespace", "target", "service", "ingress", "route", "interval")
_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)


def render_query(template: str, model: dict[str, str]) -> str:
    """Go text/template with the model's functions (pkg/apis/flagger/v1beta1/metric.go:101-112),
    executed on nil data (render.go:29-36): `{{ target }}`-style calls, with `{{-`/`-}}` trims.
    Any other action (a field, a pipeline, `variables`, a comment) is not emulated."""
    out, pos = [], 0
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        out.append(text.rstrip() if m.group(1) else text)
        if m.group(2) not in _MODEL_FUNCS:
            raise NotEmulated(f"template action {{{{ {m.group(2)} }}}}: only {', '.join(_MODEL_FUNCS)} are emulated")
        out.append(model[m.group(2)])
        pos = m.end()
        if m.group(3):
            while pos < len(template) and template[pos].isspace():
                pos += 1
    rest = template[pos:]
    if "{{" in rest:
        raise ValueError("template parsing failed: unclosed action")
    return "".join(out) + rest


def metric_model(cd: dict[str, Any], interval: str) -> dict[str, str]:
    """scheduler_metrics.go:355-378 toMetricModel (variables are not emulated)."""
    spec, target = cd["spec"], cd["spec"]["targetRef"]["name"]
    return {"name": cd["metadata"]["name"], "namespace": cd["metadata"]["namespace"], "target": target,
            "service": (spec.get("service") or {}).get("name") or target,
            "ingress": (spec.get("ingressRef") or {}).get("name") or target,
            "route": (spec.get("routeRef") or {}).get("name") or target, "interval": interval}


# --- pkg/metrics/providers/prometheus.go ---------------------------------------------------------

HttpGet = Callable[[str, dict[str, str]], tuple[int, bytes]]


def query_url(address: str, query: str) -> str:
    """prometheus.go:106-114: the query's whitespace runs made one space, QueryEscape'd, and
    ./api/v1/query joined onto the address' path; no `time` parameter."""
    escaped = urllib.parse.quote_plus(re.sub(r"\s+", " ", query), safe="")
    base = urllib.parse.urlsplit(address)
    joined = posixpath.normpath(posixpath.join(base.path, "./api/v1/query"))  # Go's path.Join cleans
    return urllib.parse.urljoin(address, f"{joined}?query={escaped}")


@dataclass
class PrometheusProvider:
    address: str
    headers: dict[str, str]
    get: HttpGet

    def run_query(self, query: str) -> float:
        """prometheus.go:106-175: the last vector sample's value; none or NaN is ErrNoValuesFound."""
        status, body = self.get(query_url(self.address, query), self.headers)
        if status >= 400:
            raise RuntimeError(f"error response: Status {status}: {body.decode(errors='replace')}")
        result = json.loads(body).get("data", {}).get("result", [])
        if not isinstance(result, list) or any(not isinstance(v, dict) for v in result):
            raise RuntimeError(f"error unmarshaling result: {body[:200]!r}")
        value: Optional[float] = None
        for v in result:
            if "values" in v:
                raise ErrMultipleValuesReturned()
            if isinstance(v.get("value", [None, None])[1], str):
                value = float(v["value"][1])
        if value is None or math.isnan(value):
            raise ErrNoValuesFound("no values found")
        return value

    def is_online(self) -> bool:
        """prometheus.go:178-189."""
        return self.run_query("vector(1)") == 1.0


def provider_for(template: dict[str, Any], secret: Optional[dict[str, str]], get: HttpGet) -> PrometheusProvider:
    """providers/factory.go and NewPrometheusProvider (prometheus.go:64-103): headers, then a token
    or basic credentials from the secret."""
    p = template["spec"].get("provider") or {}
    if p.get("type") != "prometheus":
        raise NotEmulated(f"metric provider {p.get('type')!r}: only prometheus is emulated")
    if not p.get("address"):
        raise ValueError(f"{p.get('type')} address {p.get('address')} is not a valid URL")
    headers = {k: ",".join(v) for k, v in (p.get("headers") or {}).items()}
    if p.get("secretRef"):
        data = secret or {}
        if "token" in data:
            headers["Authorization"] = "Bearer " + data["token"]
        else:
            raise NotEmulated("basic credentials for a metric provider are not emulated")
    return PrometheusProvider(p["address"], headers, get)


# --- pkg/metrics/recorder.go ----------------------------------------------------------------------

@dataclass
class Recorder:
    """The gauges and counters Flagger exports (subsystem "flagger"), each change with its time."""

    clock: Callable[[], float]
    changes: list[tuple[float, str, dict[str, str], float]] = field(default_factory=list)
    _counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def _set(self, name: str, labels: dict[str, str], value: float) -> None:
        self.changes.append((self.clock(), name, labels, value))

    def set_status(self, cd: dict[str, Any], phase: str) -> None:
        """recorder.go:159-171: 0 running (Progressing), 2 failed, 1 anything else."""
        value = 0 if phase == PROGRESSING else 2 if phase == FAILED else 1
        self._set("flagger_canary_status", _name_ns(cd), value)

    def set_weight(self, cd: dict[str, Any], primary: int, canary: int) -> None:
        """recorder.go:173-177."""
        target, ns = cd["spec"]["targetRef"]["name"], cd["metadata"]["namespace"]
        self._set("flagger_canary_weight", {"workload": f"{target}-primary", "namespace": ns}, primary)
        self._set("flagger_canary_weight", {"workload": target, "namespace": ns}, canary)

    def set_analysis(self, cd: dict[str, Any], metric: str, value: float) -> None:
        self._set("flagger_canary_metric_analysis", {**_name_ns(cd), "metric": metric}, value)

    def inc(self, name: str, cd: dict[str, Any]) -> None:
        """canary_successes_total / canary_failures_total (strategy canary, analysis completed)."""
        labels = {**_name_ns(cd), "deployment_strategy": "canary", "analysis_status": "completed"}
        key = (name, tuple(sorted(labels.items())))
        self._counts[key] = self._counts.get(key, 0) + 1
        self._set(name, labels, self._counts[key])

    def samples(self, name: str, start: int, end: int, every: int) -> list[tuple[dict[str, str], int, float]]:
        """What a scrape every `every` seconds from `start` to `end` reads: each series' last value."""
        out: list[tuple[dict[str, str], int, float]] = []
        series = {tuple(sorted(lab.items())) for _, n, lab, _ in self.changes if n == name}
        for key in sorted(series):
            changes = [(t, v) for t, n, lab, v in self.changes if n == name and tuple(sorted(lab.items())) == key]
            for at in range(start, end + 1, every):
                seen = [v for t, v in changes if t <= at]
                if seen:
                    out.append((dict(key), at, seen[-1]))
        return out


def _name_ns(cd: dict[str, Any]) -> dict[str, str]:
    return {"name": cd["spec"]["targetRef"]["name"], "namespace": cd["metadata"]["namespace"]}


# --- the objects Flagger makes (pkg/canary/util.go, spec.go) ------------------------------------

def compute_hash(template: dict[str, Any]) -> str:
    """Stands for pkg/canary/spec.go:54 ComputeHash: equal templates, equal hashes."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def filter_metadata(meta: Optional[dict[str, str]]) -> dict[str, str]:
    """util.go:100-109."""
    return {k: v for k, v in (meta or {}).items() if TOOLKIT_MARKER not in k}


def include_labels_by_prefix(labels: Optional[dict[str, str]], prefixes: tuple[str, ...]) -> dict[str, str]:
    """util.go:111-126."""
    return {k: v for k, v in (labels or {}).items() if TOOLKIT_MARKER not in k
            and any(p == "*" or (p and k.startswith(p)) for p in prefixes)}


def make_primary_labels(labels: Optional[dict[str, str]], value: str, label: str) -> dict[str, str]:
    """util.go:128-141: the selector label set to the primary's value, the rest copied."""
    return {**{k: v for k, v in (labels or {}).items() if TOOLKIT_MARKER not in k and k != label}, label: value}


def make_annotations(annotations: Optional[dict[str, str]]) -> dict[str, str]:
    """util.go:75-98: a fresh flagger-id, so the primary's pods roll."""
    kept = {k: v for k, v in (annotations or {}).items() if TOOLKIT_MARKER not in k and k != "flagger-id"}
    return {**kept, "flagger-id": str(uuid.uuid4())}


def owner_ref(cd: dict[str, Any]) -> dict[str, Any]:
    """metav1.NewControllerRef(cd, flagger.app/v1beta1 Canary)."""
    return {"apiVersion": "flagger.app/v1beta1", "kind": "Canary", "name": cd["metadata"]["name"],
            "uid": cd["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def config_refs(pod_spec: dict[str, Any]) -> list[str]:
    """The ConfigMaps and Secrets pkg/canary/config_tracker.go:125-237 would track."""
    refs: list[str] = []
    for v in pod_spec.get("volumes") or []:
        refs += [f"configmap/{v['configMap']['name']}"] if "configMap" in v else []
        refs += [f"secret/{v['secret']['secretName']}"] if "secret" in v else []
        for s in (v.get("projected") or {}).get("sources") or []:
            refs += [f"{k.lower()}/{s[k]['name']}" for k in ("configMap", "secret") if k in s]
    for c in (pod_spec.get("containers") or []) + (pod_spec.get("initContainers") or []):
        for e in c.get("env") or []:
            refs += [f"{k}/{e['valueFrom'][k]['name']}" for k in ("configMapKeyRef", "secretKeyRef")
                     if k in (e.get("valueFrom") or {})]
        for e in c.get("envFrom") or []:
            refs += [f"{k}/{e[k]['name']}" for k in ("configMapRef", "secretRef") if k in e]
    return refs


def append_primary_suffix(selector: Optional[dict[str, Any]], labels: tuple[str, ...], target: str) -> None:
    """deployment_controller.go:413-434, on a copy of the pod spec."""
    if not selector:
        return
    for expr in selector.get("matchExpressions") or []:
        if expr["key"] in labels and target in (expr.get("values") or []):
            expr["values"][expr["values"].index(target)] += "-primary"
    for k, v in (selector.get("matchLabels") or {}).items():
        if k in labels and v == target:
            selector["matchLabels"][k] = v + "-primary"


def primary_pod_spec(target: dict[str, Any], labels: tuple[str, ...]) -> dict[str, Any]:
    """deployment_controller.go:389-411 getPrimaryDeploymentTemplateSpec, with nothing tracked."""
    spec = copy.deepcopy(target["spec"]["template"]["spec"])
    name = target["metadata"]["name"]
    for tsc in spec.get("topologySpreadConstraints") or []:
        append_primary_suffix(tsc.get("labelSelector"), labels, name)
    anti = (spec.get("affinity") or {}).get("podAntiAffinity") or {}
    for term in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        append_primary_suffix(term["podAffinityTerm"].get("labelSelector"), labels, name)
    for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        append_primary_suffix(term.get("labelSelector"), labels, name)
    return spec


def is_deployment_ready(dep: dict[str, Any], deadline: int, threshold: int, now: float) -> tuple[bool, Optional[str]]:
    """pkg/canary/deployment_ready.go:74-109: (retriable, why not ready)."""
    st, retriable = dep.get("status") or {}, True
    if dep["metadata"]["generation"] > st.get("observedGeneration", 0):
        return True, "waiting for rollout to finish: observed deployment generation less than desired generation"
    conds = {c["type"]: c for c in st.get("conditions") or []}
    progress, available = conds.get("Progressing"), conds.get("Available")
    if progress is not None and available is not None and available["status"] == "False" \
            and available.get("reason") == "MinimumReplicasUnavailable":
        updated = datetime.fromisoformat(available["lastUpdateTime"].replace("Z", "+00:00")).timestamp()
        retriable = not updated + deadline < now
    ready_updated = int(st.get("updatedReplicas", 0) * threshold / 100)
    replicas = dep["spec"].get("replicas")
    if progress is not None and progress.get("reason") == "ProgressDeadlineExceeded":
        return False, f'deployment "{dep["metadata"]["name"]}" exceeded its progress deadline'
    if replicas is not None and st.get("updatedReplicas", 0) < replicas:
        return retriable, (f"waiting for rollout to finish: {st.get('updatedReplicas', 0)} out of {replicas} new "
                           "replicas have been updated")
    if st.get("replicas", 0) > st.get("updatedReplicas", 0):
        return retriable, "waiting for rollout to finish: old replicas are pending termination"
    if st.get("availableReplicas", 0) < ready_updated:
        return retriable, (f"waiting for rollout to finish: {st.get('availableReplicas', 0)} of {ready_updated} "
                           "updated replicas are available")
    return True, None


# --- pkg/router/gateway_api.go ------------------------------------------------------------------

def route_matches(requests: Optional[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """gateway_api.go:624-700 mapRouteMatches (Istio's HTTPMatchRequest to HTTPRouteMatch)."""
    out: list[dict[str, Any]] = []
    for rm in requests or []:
        m: dict[str, Any] = {}
        uri = rm.get("uri")
        if uri is not None:
            kind = next((k for k in ("regex", "exact", "prefix") if uri.get(k)), None)
            if kind is None:
                raise ValueError(f"Gateway API doesn't support the specified path matching selector: {uri}")
            m["path"] = {"type": {"regex": "RegularExpression", "exact": "Exact", "prefix": "PathPrefix"}[kind],
                         "value": uri[kind]}
        if rm.get("method") is not None:
            if not rm["method"].get("exact"):
                raise ValueError("Gateway API doesn't support the specified method matching selector")
            m["method"] = rm["method"]["exact"]
        for key, what in (("headers", "headers"), ("queryParams", "queryParams")):
            for name, val in (rm.get(key) or {}).items():  # a Go map: any order (one entry each here)
                kind = next((k for k in ("exact", "regex") if val.get(k)), None)
                if kind is None:
                    raise ValueError(f"Gateway API doesn't support the specified {key} matching selector")
                m.setdefault(what, []).append({"name": name, "type": "Exact" if kind == "exact" else "RegularExpression",
                                               "value": val[kind]})
        if m:
            out.append(m)
    return out


def route_filters(service: dict[str, Any]) -> list[dict[str, Any]]:
    """gateway_api.go:764-866 makeFilters: header modifiers (add and set sorted, as sortFiltersV1)."""
    for unsupported in ("rewrite", "mirror", "corsPolicy"):
        if service.get(unsupported):
            raise NotEmulated(f"service.{unsupported} is not emulated")
    filters: list[dict[str, Any]] = []
    for side, kind in (("request", "RequestHeaderModifier"), ("response", "ResponseHeaderModifier")):
        h = (service.get("headers") or {}).get(side)
        if h is None:
            continue
        mod = {op: sorted(({"name": k, "value": v} for k, v in (h.get(op) or {}).items()),
                          key=lambda x: (x["name"], x["value"])) for op in ("add", "set")}
        mod["remove"] = list(h.get("remove") or [])
        key = kind[0].lower() + kind[1:]
        filters.append({"type": kind, key: {k: v for k, v in mod.items() if v}})
    return filters


def backend_ref(name: str, weight: int, port: int) -> dict[str, Any]:
    """gateway_api.go:715-725 makeBackendRef."""
    return {"group": "", "kind": "Service", "name": name, "port": port, "weight": weight}


def route_spec(cd: dict[str, Any], primary_weight: int, canary_weight: int) -> dict[str, Any]:
    """The HTTPRoute spec Reconcile (gateway_api.go:65-113) and SetRoutes (:335-407) build: one
    rule, the service's matches (or / by prefix), its filters, the two Services at the weights."""
    svc, analysis = cd["spec"]["service"], cd["spec"].get("analysis") or {}
    for unsupported in ("match", "sessionAffinity", "mirror"):
        if analysis.get(unsupported):
            raise NotEmulated(f"analysis.{unsupported} is not emulated")
    apex = svc.get("name") or cd["spec"]["targetRef"]["name"]
    matches = route_matches(svc.get("match")) or [{"path": {"type": "PathPrefix", "value": "/"}}]
    rule: dict[str, Any] = {"matches": matches, "filters": route_filters(svc),
                            "backendRefs": [backend_ref(f"{apex}-primary", primary_weight, svc["port"]),
                                            backend_ref(f"{apex}-canary", canary_weight, svc["port"])]}
    if svc.get("timeout") or svc.get("backendTimeout"):
        rule["timeouts"] = {k: svc[f] for k, f in (("request", "timeout"), ("backendRequest", "backendTimeout")) if svc.get(f)}
    parents = [{k: ref[k] for k in ("group", "kind", "namespace", "name", "sectionName", "port") if k in ref}
               for ref in svc["gatewayRefs"]]  # toV1ParentRefs (:936-950)
    return {"parentRefs": parents, "hostnames": list(svc.get("hosts") or []), "rules": [rule]}


def _comparable(value: Any, drop_weight: bool = True) -> Any:
    """What cmp.Diff with IgnoreFields(BackendRef, Weight) and EquateEmpty compares (:184-187)."""
    if isinstance(value, dict):
        out = {k: _comparable(v, drop_weight) for k, v in value.items() if not (drop_weight and k == "weight")}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_comparable(v, drop_weight) for v in value]
    return value


# --- pkg/canary/status.go -------------------------------------------------------------------------

_CONDITIONS = {
    INITIALIZING: ("Unknown", "New {kind} detected, starting initialization."),
    INITIALIZED: ("True", "{kind} initialization completed."),
    WAITING: ("Unknown", "Waiting for approval."), WAITING_PROMOTION: ("Unknown", "Waiting for approval."),
    PROGRESSING: ("Unknown", "New revision detected, progressing canary analysis."),
    PROMOTING: ("Unknown", "Canary analysis completed, starting primary rolling update."),
    FINALISING: ("Unknown", "Canary analysis completed, routing all traffic to primary."),
    SUCCEEDED: ("True", "Canary analysis completed successfully, promotion finished."),
    FAILED: ("False", "Canary analysis failed, {kind} scaled to zero."),
}


def make_conditions(cd: dict[str, Any], phase: str, now: str) -> Optional[list[dict[str, Any]]]:
    """status.go:200-256 MakeStatusConditions: the Promoted condition, None where it is unchanged."""
    kind = cd["spec"]["targetRef"]["kind"]
    status, message = _CONDITIONS.get(phase, ("Unknown", "New {kind} detected, starting initialization."))
    current = next((c for c in (cd.get("status") or {}).get("conditions") or [] if c["type"] == "Promoted"), None)
    new = {"type": "Promoted", "status": status, "lastUpdateTime": now, "lastTransitionTime": now,
           "message": message.format(kind=kind), "reason": phase}
    if current is not None and current["status"] == status and current.get("reason") == phase:
        return None
    if current is not None and current["status"] == status:
        new["lastTransitionTime"] = current.get("lastTransitionTime", now)
    return [new]


def phase_of(cd: dict[str, Any]) -> str:
    return (cd.get("status") or {}).get("phase", "")


def skip_analysis(cd: dict[str, Any]) -> bool:
    """canary.go:685-690."""
    return cd["spec"].get("analysis") is None or bool(cd["spec"].get("skipAnalysis"))


def threshold_of(cd: dict[str, Any]) -> int:
    """canary.go:655-660 GetAnalysisThreshold (default 1)."""
    return cd["spec"]["analysis"].get("threshold") or 1


@dataclass(frozen=True)
class FlaggerFlags:
    """The controller's flags this emulation reads (cmd/flagger/main.go:110-121 defaults)."""

    selector_labels: tuple[str, ...] = ("app", "name", "app.kubernetes.io/name")
    include_label_prefix: tuple[str, ...] = ("",)
    mesh_provider: str = "istio"
    config_tracking: bool = True


class _Halt(Exception):
    """An error Flagger records as the Canary's warning event before it ends the tick."""


Webhook = Callable[[str, dict[str, Any]], int]


class Flagger:
    """Flagger's controller for Canaries of Deployments on the Gateway API: `advance` is one tick."""

    def __init__(self, api: KubeApi, flags: FlaggerFlags, clock: Callable[[], float], http_get: HttpGet,
                 webhook: Optional[Webhook] = None):
        self.api, self.flags, self.clock, self.http_get, self.webhook = api, flags, clock, http_get, webhook
        self.recorder = Recorder(clock)
        # (virtual time, "namespace/name", Normal|Warning|Error|Alert, message)
        self.events: list[tuple[float, str, str, str]] = []

    def _now(self) -> str:
        return datetime.fromtimestamp(self.clock(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _event(self, cd: dict[str, Any], kind: str, message: str) -> None:
        meta = cd["metadata"]
        self.events.append((self.clock(), f"{meta['namespace']}/{meta['name']}", kind, message))

    @staticmethod
    def _id(cd: dict[str, Any]) -> str:
        return f"{cd['metadata']['name']}.{cd['metadata']['namespace']}"

    @staticmethod
    def _target_id(cd: dict[str, Any]) -> str:
        return f"{cd['spec']['targetRef']['name']}.{cd['metadata']['namespace']}"

    # --- the Canary's status (pkg/canary/status.go) ----------------------------------------------

    def _update_status(self, cd: dict[str, Any], mutate: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
        """retry.RetryOnConflict(DefaultBackoff) around updateStatusWithUpgrade (status.go:262-277):
        the first try from the tick's Canary, each retry from a fresh GET."""
        current = cd
        for attempt in range(4):
            if attempt:
                fresh = self.api.get("Canary", cd["metadata"]["namespace"], cd["metadata"]["name"])
                if fresh is None:
                    raise _Halt(f"canary {self._id(cd)} get query failed: not found")
                current = fresh
            copied = copy.deepcopy(current)
            copied.setdefault("status", {})
            mutate(copied, current)
            try:
                self.api.replace("Canary", copied, "status")
                return
            except ApiError as e:
                if e.status != 409:
                    raise _Halt(f"updating canary {self._id(cd)} status failed: {e}") from None
        raise _Halt("failed after retries: conflict")

    def _sync_status(self, cd: dict[str, Any], status: dict[str, Any]) -> None:
        """deployment_status.go:29-43 SyncStatus and status.go:32-70 syncCanaryStatus."""
        dep = self._target(cd)
        applied = compute_hash(dep["spec"]["template"])
        self._tracked(dep)

        def mutate(c: dict[str, Any], base: dict[str, Any]) -> None:
            st = c["status"]
            st.update(phase=status["phase"], canaryWeight=status.get("canaryWeight", 0),
                      failedChecks=status.get("failedChecks", 0), iterations=status.get("iterations", 0),
                      lastAppliedSpec=applied, lastTransitionTime=self._now(), trackedConfigs={})
            if status["phase"] == INITIALIZED:
                st["lastPromotedSpec"] = applied
            conditions = make_conditions(base, status["phase"], self._now())
            if conditions is not None:
                st["conditions"] = conditions
        self._update_status(cd, mutate)

    def _set_status_field(self, cd: dict[str, Any], key: str, value: int) -> None:
        """status.go:72-144 setStatusFailedChecks / setStatusWeight / setStatusIterations."""
        def mutate(c: dict[str, Any], _base: dict[str, Any]) -> None:
            c["status"].update({key: value, "lastTransitionTime": self._now()})
        self._update_status(cd, mutate)

    def _set_phase(self, cd: dict[str, Any], phase: str) -> None:
        """status.go:146-186 setStatusPhase."""
        def mutate(c: dict[str, Any], base: dict[str, Any]) -> None:
            st = c["status"]
            st.update(phase=phase, lastTransitionTime=self._now())
            if phase not in (PROGRESSING, WAITING, PROMOTING):
                st.update(canaryWeight=0, iterations=0)
                if phase == WAITING_PROMOTION:
                    st["iterations"] = cd["spec"]["analysis"].get("iterations", 0) - 1
            if phase in (INITIALIZED, SUCCEEDED):
                st["lastPromotedSpec"] = (base.get("status") or {}).get("lastAppliedSpec", "")
            conditions = make_conditions(c, phase, self._now())
            if conditions is not None:
                st["conditions"] = conditions
        self._update_status(cd, mutate)

    # --- the target and its primary (pkg/canary/deployment_controller.go) -----------------------

    def _target(self, cd: dict[str, Any]) -> dict[str, Any]:
        name, ns = cd["spec"]["targetRef"]["name"], cd["metadata"]["namespace"]
        dep = self.api.get("Deployment", ns, name)
        if dep is None:
            raise _Halt(f"deployment {name}.{ns} get query error: not found")
        return dep

    def _tracked(self, dep: dict[str, Any]) -> None:
        """The config tracker (config_tracker.go) with nothing to track; anything to track is not emulated."""
        refs = config_refs(dep["spec"]["template"]["spec"])
        if self.flags.config_tracking and refs:
            raise NotEmulated(f"config tracking of {', '.join(refs)} is not emulated")

    def _selector_label(self, dep: dict[str, Any]) -> tuple[str, str]:
        """deployment_controller.go:322-333 getSelectorLabel: the first of the -selector-labels flag's
        labels in the target's selector."""
        match = dep["spec"]["selector"].get("matchLabels") or {}
        for label in self.flags.selector_labels:
            if label in match:
                return label, match[label]
        raise _Halt(f"getSelectorLabel failed: deployment {dep['metadata']['name']}.{dep['metadata']['namespace']} "
                    f"spec.selector.matchLabels must contain one of {list(self.flags.selector_labels)}")

    def _create_primary(self, cd: dict[str, Any]) -> None:
        """deployment_controller.go:234-319 createPrimaryDeployment."""
        target = self._target(cd)
        label, value = self._selector_label(target)
        ns, name = cd["metadata"]["namespace"], f"{cd['spec']['targetRef']['name']}-primary"
        if self.api.get("Deployment", ns, name) is not None:
            return
        self._tracked(target)
        tspec, tmpl = target["spec"], target["spec"]["template"]
        spec: dict[str, Any] = {k: tspec[k] for k in ("progressDeadlineSeconds", "minReadySeconds", "revisionHistoryLimit",
                                                      "strategy") if tspec.get(k)}
        tmpl_labels = make_primary_labels(tmpl["metadata"].get("labels"), f"{value}-primary", label)
        spec.update(replicas=tspec.get("replicas") or 1, selector={"matchLabels": {label: f"{value}-primary"}},
                    template={"metadata": {"labels": tmpl_labels,
                                           "annotations": make_annotations(tmpl["metadata"].get("annotations"))},
                              "spec": primary_pod_spec(target, self.flags.selector_labels)})
        labels = include_labels_by_prefix(target["metadata"].get("labels"), self.flags.include_label_prefix)
        self.api.create("Deployment", ns, {
            "metadata": {"name": name, "namespace": ns, "labels": make_primary_labels(labels, f"{value}-primary", label),
                         "annotations": filter_metadata(target["metadata"].get("annotations")),
                         "ownerReferences": [owner_ref(cd)]},
            "spec": spec})

    def _initialize(self, cd: dict[str, Any]) -> tuple[bool, Optional[str]]:
        """deployment_controller.go:48-62 Initialize."""
        try:
            self._create_primary(cd)
        except (_Halt, ApiError) as e:
            return True, f"createPrimaryDeployment failed: {e}"
        if phase_of(cd) in ("", INITIALIZING) and not skip_analysis(cd):
            return self._is_ready(cd, primary=True)
        return True, None

    def _is_ready(self, cd: dict[str, Any], primary: bool) -> tuple[bool, Optional[str]]:
        """deployment_ready.go:33-70 IsPrimaryReady / IsCanaryReady (readyThreshold 100 by default).
        IsPrimaryReady's `primary.Spec.Replicas == int32p(0)` compares two pointers, so never holds."""
        target, ns = cd["spec"]["targetRef"]["name"], cd["metadata"]["namespace"]
        name = f"{target}-primary" if primary else target
        dep = self.api.get("Deployment", ns, name)
        if dep is None:
            return True, f"deployment {name}.{ns} get query error: not found"
        analysis = cd["spec"]["analysis"]
        threshold = analysis.get("primaryReadyThreshold" if primary else "canaryReadyThreshold", 100)
        deadline = cd["spec"].get("progressDeadlineSeconds", 600)
        # The Deployment's conditions carry the controller's real times.
        retriable, why = is_deployment_ready(dep, deadline, threshold, time.time())
        if why is None:
            return True, None
        return retriable, (f"{name}.{ns} not ready: {why}" if primary else f"canary deployment {name}.{ns} not ready: {why}")

    def _promote(self, cd: dict[str, Any]) -> None:
        """deployment_controller.go:65-137 Promote: the target's pod spec and template metadata onto the primary."""
        ns, target_name = cd["metadata"]["namespace"], cd["spec"]["targetRef"]["name"]
        for _ in range(5):  # retry.DefaultRetry
            target = self._target(cd)
            label, value = self._selector_label(target)
            primary = self.api.get("Deployment", ns, f"{target_name}-primary")
            if primary is None:
                raise _Halt(f"deployment {target_name}-primary.{ns} get query error: not found")
            self._tracked(target)
            spec, tspec = primary["spec"], target["spec"]
            for k in ("progressDeadlineSeconds", "minReadySeconds", "revisionHistoryLimit", "strategy"):
                spec.pop(k, None)
                spec.update({k: tspec[k]} if tspec.get(k) else {})
            if cd["spec"].get("autoscalerRef") is None:
                spec["replicas"] = tspec.get("replicas")
            tmpl = target["spec"]["template"]["metadata"]
            spec["template"] = {"metadata": {"annotations": make_annotations(tmpl.get("annotations")),
                                             "labels": make_primary_labels(tmpl.get("labels"), f"{value}-primary", label)},
                                "spec": primary_pod_spec(target, self.flags.selector_labels)}
            prefixes = self.flags.include_label_prefix
            primary["metadata"]["annotations"] = include_labels_by_prefix(target["metadata"].get("annotations"), prefixes)
            primary["metadata"]["labels"] = make_primary_labels(
                include_labels_by_prefix(target["metadata"].get("labels"), prefixes), f"{value}-primary", label)
            try:
                self.api.replace("Deployment", primary)
                return
            except ApiError as e:
                if e.status != 409:
                    raise _Halt(f"updating deployment {target_name}-primary.{ns} template spec failed: {e}") from None
        raise _Halt(f"updating deployment {target_name}-primary.{ns} template spec failed: conflict")

    def _scale(self, cd: dict[str, Any], replicas: int) -> None:
        """ScaleToZero / ScaleFromZero's merge patch on the target (deployment_controller.go:151-211)."""
        self._target(cd)
        self.api.merge_patch("Deployment", cd["metadata"]["namespace"], cd["spec"]["targetRef"]["name"],
                             {"spec": {"replicas": replicas}})

    def _scale_from_zero(self, cd: dict[str, Any]) -> None:
        """deployment_controller.go:166-211: the target's own replicas, else the ScaledObject's floor above one, else one."""
        dep, ns, auto = self._target(cd), cd["metadata"]["namespace"], cd["spec"].get("autoscalerRef")
        replicas = 1
        if (dep["spec"].get("replicas") or 0) > 0:
            replicas = dep["spec"]["replicas"]
        elif auto is None:
            primary = self.api.get("Deployment", ns, f"{cd['spec']['targetRef']['name']}-primary") or {"spec": {}}
            replicas = primary["spec"].get("replicas") or 1
        else:
            so = self.api.get("ScaledObject", ns, auto["name"])
            if so is not None and (so["spec"].get("minReplicaCount") or 0) > 1:
                replicas = so["spec"]["minReplicaCount"]
        self._scale(cd, replicas)

    def _has_target_changed(self, cd: dict[str, Any]) -> bool:
        """deployment_controller.go:140-148 and spec.go:32-49 hasSpecChanged."""
        st = cd.get("status") or {}
        if not st.get("lastAppliedSpec"):
            return True
        new = compute_hash(self._target(cd)["spec"]["template"])
        if st.get("lastPromotedSpec") == new:
            return False
        return st["lastAppliedSpec"] != new

    def _dependencies_changed(self, cd: dict[str, Any]) -> bool:
        """config_tracker.go:263-292 HasConfigChanged with nothing tracked."""
        self._tracked(self._target(cd))
        return False

    # --- the Services (pkg/router/kubernetes_default.go) ----------------------------------------

    def _reconcile_service(self, cd: dict[str, Any], name: str, selector: tuple[str, str],
                           metadata: Optional[dict[str, Any]]) -> None:
        """kubernetes_default.go:88-270 reconcileService: a ClusterIP Service selecting one revision's pods."""
        svc, ns = cd["spec"]["service"], cd["metadata"]["namespace"]
        port: dict[str, Any] = {"name": svc.get("portName") or "http", "protocol": "TCP", "port": svc["port"],
                                "targetPort": svc.get("targetPort") or svc["port"]}
        if svc.get("appProtocol"):
            port["appProtocol"] = svc["appProtocol"]
        spec: dict[str, Any] = {"type": "ClusterIP", "selector": {selector[0]: selector[1]}, "ports": [port]}
        if svc.get("headless"):
            spec["clusterIP"] = "None"
        if svc.get("trafficDistribution"):
            spec["trafficDistribution"] = svc["trafficDistribution"]
        labels = {**((metadata or {}).get("labels") or {}), selector[0]: name}
        annotations = filter_metadata((metadata or {}).get("annotations"))
        existing = self.api.get("Service", ns, name)
        if existing is None:
            self.api.create("Service", ns, {"metadata": {"name": name, "namespace": ns, "labels": labels,
                                                         "annotations": annotations, "ownerReferences": [owner_ref(cd)]},
                                            "spec": spec})
            return
        old = existing["spec"]
        ports = sorted(({k: v for k, v in p.items() if k != "nodePort"} for p in old.get("ports", [])), key=lambda p: p["port"])
        changed = ports != spec["ports"] or old.get("selector") != spec["selector"]
        if changed:
            old.update(ports=spec["ports"], selector=spec["selector"])
        owned = any(o.get("uid") == cd["metadata"]["uid"] for o in existing["metadata"].get("ownerReferences", []))
        if owned and (existing["metadata"].get("labels") or {}) != labels:
            existing["metadata"]["labels"], changed = labels, True
        if owned and (existing["metadata"].get("annotations") or {}) != annotations:
            existing["metadata"]["annotations"], changed = annotations, True
        if changed:
            self.api.replace("Service", existing)

    def _services(self, cd: dict[str, Any], label: str, value: str, apex: bool) -> None:
        """kubernetes_default.go:49-78: Initialize (the -canary and -primary Services) or Reconcile (the apex,
        selecting the primary)."""
        svc = cd["spec"]["service"]
        name = svc.get("name") or cd["spec"]["targetRef"]["name"]
        if apex:
            self._reconcile_service(cd, name, (label, f"{value}-primary"), svc.get("apex"))
            return
        self._reconcile_service(cd, f"{name}-canary", (label, value), svc.get("canary"))
        self._reconcile_service(cd, f"{name}-primary", (label, f"{value}-primary"), svc.get("primary"))

    # --- the HTTPRoute (pkg/router/gateway_api.go) ----------------------------------------------

    def _apex(self, cd: dict[str, Any]) -> str:
        return cd["spec"]["service"].get("name") or cd["spec"]["targetRef"]["name"]

    def _route_reconcile(self, cd: dict[str, Any]) -> None:
        """gateway_api.go:65-255 Reconcile: create the route at 100/0, or rewrite it where its spec (weights
        aside), labels or annotations differ from what the Canary says."""
        svc, ns, name = cd["spec"]["service"], cd["metadata"]["namespace"], self._apex(cd)
        if not svc.get("gatewayRefs"):
            raise _Halt("GatewayRefs must be specified when using Gateway API as a provider.")
        desired = route_spec(cd, 100, 0)
        apex = svc.get("apex") or {}
        labels, annotations = dict(apex.get("labels") or {}), filter_metadata(apex.get("annotations"))
        route = self.api.get("HTTPRoute", ns, name)
        if route is None:
            self.api.create("HTTPRoute", ns, {"metadata": {"name": name, "namespace": ns, "labels": labels,
                                                           "annotations": annotations, "ownerReferences": [owner_ref(cd)]},
                                              "spec": desired})
            return
        meta = route["metadata"]
        merged = {**(meta.get("annotations") or {}), **annotations}
        spec_diff = _comparable(route["spec"]) != _comparable(desired)
        if spec_diff or labels != (meta.get("labels") or {}) or merged != (meta.get("annotations") or {}):
            route["spec"], meta["annotations"], meta["labels"] = desired, merged, labels
            self.api.replace("HTTPRoute", route)
            self._event(cd, "Log", f"HTTPRoute {name}.{ns} updated")

    def _get_routes(self, cd: dict[str, Any]) -> tuple[int, int, bool]:
        """gateway_api.go:257-333 GetRoutes: the two backends' weights (an unaccepted route is an error)."""
        ns, apex = cd["metadata"]["namespace"], self._apex(cd)
        route = self.api.get("HTTPRoute", ns, apex)
        if route is None:
            raise _Halt(f"HTTPRoute {apex}.{ns} get error: not found")
        generation = route["metadata"].get("generation", 0)
        for parent in (route.get("status") or {}).get("parents") or []:
            if parent.get("parentRef") not in route["spec"].get("parentRefs", []):
                continue
            for c in parent.get("conditions") or []:
                if c["type"] == "Accepted" and (c["status"] != "True" or c.get("observedGeneration", 0) < generation):
                    raise _Halt(f"HTTPRoute {apex}.{ns} parent {parent['parentRef']['name']} is not ready")
        primary = canary = 0
        mirrored = False
        for rule in route["spec"].get("rules") or []:
            if len(rule.get("backendRefs") or []) == 2:
                for b in rule["backendRefs"]:
                    primary = b.get("weight", 1) if b["name"] == f"{apex}-primary" else primary
                    canary = b.get("weight", 1) if b["name"] == f"{apex}-canary" else canary
            mirrored = mirrored or any(f.get("type") == "RequestMirror" and f["requestMirror"]["backendRef"]["name"]
                                       == f"{apex}-canary" for f in rule.get("filters") or [])
        return primary, canary, mirrored

    def _set_routes(self, cd: dict[str, Any], primary: int, canary: int) -> None:
        """gateway_api.go:335-444 SetRoutes: the route's spec rebuilt at these weights."""
        ns, apex = cd["metadata"]["namespace"], self._apex(cd)
        route = self.api.get("HTTPRoute", ns, apex)
        if route is None:
            raise _Halt(f"HTTPRoute {apex}.{ns} get error: not found")
        route["spec"] = route_spec(cd, primary, canary)
        try:
            self.api.replace("HTTPRoute", route)
        except ApiError as e:
            raise _Halt(f"HTTPRoute {apex}.{ns} update error: {e} while setting weights") from None

    # --- KEDA (pkg/canary/scaled_object_reconciler.go) ------------------------------------------

    def _primary_scaler_spec(self, cd: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
        """scaled_object_reconciler.go:47-77: the target's ScaledObject for the primary, its named
        triggers' queries from primaryScalerQueries, its bounds from primaryScalerReplicas."""
        auto, so = cd["spec"]["autoscalerRef"], copy.deepcopy(target["spec"])
        queries = auto.get("primaryScalerQueries")
        if queries is None:
            raise NotEmulated("rewriting trigger queries without primaryScalerQueries is not emulated")
        for trigger in so.get("triggers") or []:
            if trigger.get("name") in queries:
                trigger["metadata"]["query"] = queries[trigger["name"]]
        hpa = so.setdefault("advanced", {}).setdefault("horizontalPodAutoscalerConfig", {})
        if hpa.get("name"):
            hpa["name"] += "-primary"
        ref = so["scaleTargetRef"]
        keep = ("kind", "apiVersion", "envSourceContainerName")
        spec: dict[str, Any] = {"scaleTargetRef": {"name": f"{cd['spec']['targetRef']['name']}-primary",
                                                   **{k: ref[k] for k in keep if ref.get(k)}}}
        spec.update({k: so[k] for k in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount", "advanced",
                                        "triggers", "fallback", "idleReplicaCount") if so.get(k) is not None})
        bounds = auto.get("primaryScalerReplicas") or {}
        spec.update({f"{k}ReplicaCount": bounds[f"{k}Replicas"] for k in ("min", "max")
                     if bounds.get(f"{k}Replicas") is not None})
        return spec

    def _reconcile_primary_scaler(self, cd: dict[str, Any], init: bool) -> None:
        """scaled_object_reconciler.go:40-124 reconcilePrimaryScaler."""
        auto, ns = cd["spec"]["autoscalerRef"], cd["metadata"]["namespace"]
        target = self.api.get("ScaledObject", ns, auto["name"])
        if target is None:
            raise _Halt(f"Keda ScaledObject {auto['name']}.{ns} get query error: not found")
        spec, name = self._primary_scaler_spec(cd, target), f"{auto['name']}-primary"
        primary = self.api.get("ScaledObject", ns, name)
        if primary is None:
            self.api.create("ScaledObject", ns, {"metadata": {
                "name": name, "namespace": ns, "labels": filter_metadata(target["metadata"].get("labels")),
                "annotations": filter_metadata(target["metadata"].get("annotations")), "ownerReferences": [owner_ref(cd)]},
                "spec": spec})
        elif not init and _comparable(spec, False) != _comparable(primary["spec"], False):
            prefixes = self.flags.include_label_prefix
            primary["spec"] = spec
            primary["metadata"]["annotations"] = include_labels_by_prefix(primary["metadata"].get("annotations"), prefixes)
            primary["metadata"]["labels"] = include_labels_by_prefix(primary["metadata"].get("labels"), prefixes)
            self.api.replace("ScaledObject", primary)

    def _pause_target_scaler(self, cd: dict[str, Any], pause: bool) -> None:
        """scaled_object_reconciler.go:126-167 Pause/ResumeTargetScaler: KEDA's paused-replicas "0" on the
        target's ScaledObject, or taken off."""
        auto, ns = cd["spec"]["autoscalerRef"], cd["metadata"]["namespace"]
        so = self.api.get("ScaledObject", ns, auto["name"])
        if so is None:
            raise _Halt(f"Keda ScaledObject {auto['name']}.{ns} get query error: not found")
        annotations = so["metadata"].setdefault("annotations", {})
        if pause:
            annotations[PAUSED_REPLICAS] = "0"
        else:
            annotations.pop(PAUSED_REPLICAS, None)
        self.api.replace("ScaledObject", so)

    # --- webhooks (pkg/controller/webhook.go, scheduler_hooks.go) -------------------------------

    def _hooks(self, cd: dict[str, Any], types: tuple[str, ...], phase: str) -> Optional[str]:
        """Each webhook of these types POSTed its payload (webhook.go:99-116); the first that answers
        above 202 is the failure returned."""
        for hook in cd["spec"]["analysis"].get("webhooks") or []:
            if hook.get("type", "") not in types:
                continue
            if self.webhook is None:
                raise NotEmulated(f"webhook {hook['name']}: no webhook receiver given")
            payload = {"name": cd["metadata"]["name"], "namespace": cd["metadata"]["namespace"], "phase": phase,
                       "checksum": compute_hash(cd["spec"]), "metadata": hook.get("metadata") or {}}
            try:
                status = self.webhook(hook["url"], payload)
            except OSError as e:  # callWebhook's request error
                return f"{hook['name']} failed {e}"
            if status > 202:
                return f"{hook['name']} failed {status}"
        return None

    # --- the metric checks (pkg/controller/scheduler_metrics.go) --------------------------------

    def _provider(self, template: dict[str, Any]) -> PrometheusProvider:
        ns, ref = template["metadata"]["namespace"], template["spec"].get("provider", {}).get("secretRef")
        secret = None
        if ref:
            s = self.api.get("Secret", ns, ref["name"])
            if s is None:
                raise _Halt(f"metric template {template['metadata']['name']}.{ns} secret {ref['name']} error: not found")
            secret = {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
        return provider_for(template, secret, self.http_get)

    def _template(self, cd: dict[str, Any], metric: dict[str, Any]) -> Optional[dict[str, Any]]:
        """scheduler_metrics.go:272-278: the templateRef's namespace, else the Canary's."""
        ref, ns = metric["templateRef"], cd["metadata"]["namespace"]
        ns = ref["namespace"] if ref.get("namespace") and ref["namespace"] != ns else ns
        template = self.api.get("MetricTemplate", ns, ref["name"])
        if template is None:
            self._event(cd, "Error", f"Metric template {ref['name']}.{ns} error: not found")
        return template

    def _check_providers(self, cd: dict[str, Any]) -> None:
        """scheduler_metrics.go:39-92 checkMetricProviderAvailability (at initialization; errors are events)."""
        try:
            for metric in cd["spec"]["analysis"].get("metrics") or []:
                template = self._template(cd, metric) if metric.get("templateRef") else None
                if template is not None and not self._provider(template).is_online():
                    raise RuntimeError(f"{template['spec']['provider']['type']} not available")
            self._event(cd, "Normal", "all the metrics providers are available!")
        except (RuntimeError, OSError, ErrNoValuesFound, _Halt) as e:
            self._event(cd, "Error", f"Error checking metric providers: {e}")

    def _metric_check(self, cd: dict[str, Any], metric: dict[str, Any]) -> bool:
        """One templateRef metric of scheduler_metrics.go:271-345 runMetricChecks."""
        template = self._template(cd, metric)
        if template is None:
            return False
        name = metric["name"]
        try:
            provider = self._provider(template)
            query = render_query(template["spec"].get("query", ""), metric_model(cd, metric.get("interval", "")))
            value = provider.run_query(query)
        except ErrNoValuesFound as e:
            self._event(cd, "Warning", f"Halt advancement no values found for custom metric: {name}: {e}")
            return False
        except (RuntimeError, ValueError, OSError, ErrMultipleValuesReturned, _Halt) as e:
            self._event(cd, "Error", f"Metric query failed for {name}: {e}")
            return False
        self.recorder.set_analysis(cd, name, value)
        tr, who = metric.get("thresholdRange"), f"{self._id(cd)} advancement {name} {value:.2f}"
        if tr is not None and tr.get("min") is not None and value < tr["min"]:
            self._event(cd, "Warning", f"Halt {who} < {gov(tr['min'])}")
            return False
        if tr is not None and tr.get("max") is not None and value > tr["max"]:
            self._event(cd, "Warning", f"Halt {who} > {gov(tr['max'])}")
            return False
        if tr is None and value > metric.get("threshold", 0):
            self._event(cd, "Warning", f"Halt {who} > {gov(metric.get('threshold', 0))}")
            return False
        return True

    def _run_analysis(self, cd: dict[str, Any]) -> bool:
        """scheduler.go:752-776 runAnalysis: rollout webhooks, builtin checks (none here), metric templates."""
        failure = self._hooks(cd, ("", "rollout"), PROGRESSING)
        if failure is not None:
            self._event(cd, "Warning", f"Halt {self._id(cd)} advancement external check {failure}")
            return False
        for metric in cd["spec"]["analysis"].get("metrics") or []:
            if metric["name"] in ("request-success-rate", "request-duration") or metric.get("query"):
                raise NotEmulated(f"builtin or inline metric {metric['name']} is not emulated")
            if metric.get("templateRef") is None:
                self._event(cd, "Error", "Metric query failed for no usable metrics template and query were configured")
                return False
            if not self._metric_check(cd, metric):
                return False
        return True

    # --- the scheduler (pkg/controller/scheduler.go) --------------------------------------------

    def advance(self, name: str, namespace: str) -> None:
        """One tick of advanceCanary (scheduler.go:158-506)."""
        cd = self.api.get("Canary", namespace, name)
        if cd is None:
            self.events.append((self.clock(), f"{namespace}/{name}", "Error", f"Canary {name}.{namespace} not found"))
            return
        try:
            self._tick(cd)
        except (_Halt, ApiError) as e:
            self._event(cd, "Warning", str(e))

    def _refuse_unemulated(self, cd: dict[str, Any]) -> None:
        spec = cd["spec"]
        if (spec.get("provider") or self.flags.mesh_provider) != GATEWAY_PROVIDER:
            raise NotEmulated(f"provider {spec.get('provider') or self.flags.mesh_provider}: only {GATEWAY_PROVIDER}")
        if spec["targetRef"].get("kind") != "Deployment":
            raise NotEmulated(f"targetRef kind {spec['targetRef'].get('kind')}: only Deployment is emulated")
        auto = spec.get("autoscalerRef")
        if auto is not None and auto.get("kind") != "ScaledObject":
            raise NotEmulated(f"autoscalerRef kind {auto.get('kind')}: only ScaledObject is emulated")
        analysis = spec.get("analysis") or {}
        if analysis.get("stepWeights") or analysis.get("iterations") or spec["service"].get("portDiscovery"):
            raise NotEmulated("stepWeights, iterations (A/B, blue/green) and portDiscovery are not emulated")
        for hook in analysis.get("webhooks") or []:
            if hook.get("type", "") not in HOOKS:
                raise NotEmulated(f"webhook type {hook.get('type')}: only {sorted(HOOKS)} are emulated")

    def _tick(self, cd: dict[str, Any]) -> None:
        """scheduler.go:168-278: the objects Flagger owns reconciled, then the analysis' step."""
        if cd["spec"].get("suspend"):
            self._event(cd, "Normal", "skipping canary run as object is suspended")
            return
        self._refuse_unemulated(cd)
        label, value = self._selector_label(self._target(cd))  # GetMetadata (deployment_controller.go:214)
        auto = cd["spec"].get("autoscalerRef") is not None
        self._services(cd, label, value, apex=False)  # kubeRouter.Initialize :200
        initializing = phase_of(cd) in ("", INITIALIZING)
        if initializing and not skip_analysis(cd):
            self._check_providers(cd)  # :206
        retriable, err = self._initialize(cd)  # :225
        if err is not None:
            self._event(cd, "Warning", err)
            if not retriable:
                self._rollback(cd)
            return
        if auto:  # :234-247
            self._reconcile_primary_scaler(cd, init=True)
            if initializing:
                self._pause_target_scaler(cd, pause=True)
        self._services(cd, label, value, apex=True)  # kubeRouter.Reconcile :250
        if initializing:  # :256-263
            self._event(cd, "Normal", f"Scaling down Deployment {cd['spec']['targetRef']['name']}.{cd['metadata']['namespace']}")
            self._scale(cd, 0)
        self._route_reconcile(cd)  # meshRouter.Reconcile :268
        self._set_phase_initialized(cd)  # :275
        self._step(cd)

    def _set_phase_initialized(self, cd: dict[str, Any]) -> None:
        """scheduler.go:1037-1059 (the tick's Canary takes the phase and the applied spec)."""
        if phase_of(cd) not in ("", INITIALIZING):
            return
        cd.setdefault("status", {})["phase"] = INITIALIZED
        self._sync_status(cd, {"phase": INITIALIZED})
        fresh = self.api.get("Canary", cd["metadata"]["namespace"], cd["metadata"]["name"]) or {}
        cd["status"]["lastAppliedSpec"] = (fresh.get("status") or {}).get("lastAppliedSpec", "")
        cd["status"]["trackedConfigs"] = (fresh.get("status") or {}).get("trackedConfigs")
        self.recorder.set_status(cd, INITIALIZED)
        self._event(cd, "Normal", f"Initialization done! {self._id(cd)}")

    def _should_advance(self, cd: dict[str, Any]) -> bool:
        """scheduler.go:852-884."""
        phase = phase_of(cd)
        if phase in (PROGRESSING, WAITING, WAITING_PROMOTION, PROMOTING, FINALISING):
            return True
        if phase == FAILED:
            self._sync_status(cd, dict(cd["status"]))
        return self._has_target_changed(cd) or self._dependencies_changed(cd)

    def _step(self, cd: dict[str, Any]) -> None:
        """scheduler.go:281-361."""
        should = self._should_advance(cd)
        if not should:
            self.recorder.set_status(cd, phase_of(cd))
            return
        if not skip_analysis(cd):
            retriable, err = self._is_ready(cd, primary=True)  # :296
            if err is not None:
                self._event(cd, "Warning", err)
                if not retriable and phase_of(cd) in (PROMOTING, FINALISING):
                    raise NotEmulated("handleFailedPromotion (a primary that fails while promoting)")
                if not retriable:
                    self._rollback(cd)
                return
        primary, canary, mirrored = self._get_routes(cd)  # :314
        self.recorder.set_weight(cd, primary, canary)
        if not self._check_canary_status(cd, should):  # :323
            return
        if phase_of(cd) in (PROGRESSING, WAITING_PROMOTION) and (
                self._has_target_changed(cd) or self._dependencies_changed(cd)):  # :328 hasCanaryRevisionChanged
            self._event(cd, "Normal", f"New revision detected! Restarting analysis for {cd['spec']['targetRef']['name']}."
                                      f"{cd['metadata']['namespace']}")
            self._set_routes(cd, 100, 0)
            self._sync_status(cd, {"phase": PROGRESSING})
            return
        retriable, err = self._is_ready(cd, primary=False)  # :354
        if err is not None:
            self._event(cd, "Warning", err)
            if not retriable:
                self._rollback(cd)
            return
        self._judge(cd, primary, canary, mirrored)

    def _check_canary_status(self, cd: dict[str, Any], should: bool) -> bool:
        """scheduler.go:886-933: a new revision scales the canary up and starts Progressing."""
        self.recorder.set_status(cd, phase_of(cd))
        if phase_of(cd) in (PROGRESSING, WAITING_PROMOTION, PROMOTING, FINALISING):
            return True
        fresh = self.api.get("Canary", cd["metadata"]["namespace"], cd["metadata"]["name"])
        if fresh is None or not should:
            return False
        self._event(fresh, "Normal", f"New revision detected! Scaling up {fresh['spec']['targetRef']['name']}."
                                     f"{fresh['metadata']['namespace']}")
        self._event(fresh, "Alert", "New revision detected, progressing canary analysis.")
        if fresh["spec"].get("autoscalerRef") is not None:
            self._pause_target_scaler(fresh, pause=False)
        self._scale_from_zero(fresh)
        self._sync_status(fresh, {"phase": PROGRESSING})
        self.recorder.set_status(fresh, PROGRESSING)
        return False

    def _judge(self, cd: dict[str, Any], primary: int, canary: int, mirrored: bool) -> None:
        """scheduler.go:363-505: promote, finalise, roll back at the threshold, or check and step."""
        phase, status = phase_of(cd), cd["status"]
        if skip_analysis(cd):
            raise NotEmulated("skipAnalysis (shouldSkipAnalysis)")
        if phase == PROMOTING:  # :381-390
            if cd["spec"].get("autoscalerRef") is not None:
                self._reconcile_primary_scaler(cd, init=False)
            self._promotion_traffic_shift(cd, canary, primary)
            return
        if phase == FINALISING:  # :393-427
            self._finalise(cd)
            return
        if phase in (PROGRESSING, WAITING_PROMOTION) and status.get("failedChecks", 0) >= threshold_of(cd):  # :430
            self._rollback(cd)
            return
        if canary == 0 and status.get("iterations", 0) == 0 and not mirrored:  # :449-459
            self._event(cd, "Normal", f"Starting canary analysis for {self._target_id(cd)}")
            failure = self._hooks(cd, ("pre-rollout",), PROGRESSING)
            if failure is not None:
                self._event(cd, "Warning", f"Halt {self._id(cd)} advancement pre-rollout check {failure}")
                self._set_status_field(cd, "failedChecks", status.get("failedChecks", 0) + 1)
                return
        elif not self._run_analysis(cd):  # :461-466
            self._set_status_field(cd, "failedChecks", status.get("failedChecks", 0) + 1)
            return
        if self._next_step_weight(cd) > 0:  # :493-504 (no confirm-traffic-increase hook: refused above)
            self._run_canary(cd, canary, primary, self._max_weight(cd))

    def _max_weight(self, cd: dict[str, Any]) -> int:
        """scheduler.go:41-51 (stepWeights refused)."""
        return cd["spec"]["analysis"].get("maxWeight") or 100

    def _next_step_weight(self, cd: dict[str, Any]) -> int:
        """scheduler.go:58-62 with stepWeight."""
        return cd["spec"]["analysis"].get("stepWeight", 0)

    def _run_canary(self, cd: dict[str, Any], canary: int, primary: int, max_weight: int) -> None:
        """scheduler.go:565-637 runCanary: one step up, or promotion at maxWeight."""
        if canary < max_weight:
            step = self._next_step_weight(cd)
            primary, canary = max(0, primary - step), min(100, canary + step)
            self._set_routes(cd, primary, canary)
            self._set_status_field(cd, "canaryWeight", canary)
            self.recorder.set_weight(cd, primary, canary)
            self._event(cd, "Normal", f"Advance {self._id(cd)} canary weight {canary}")
            return
        target, ns = cd["spec"]["targetRef"]["name"], cd["metadata"]["namespace"]
        self._event(cd, "Normal", f"Copying {target}.{ns} template spec to {target}-primary.{ns}")
        self._promote(cd)
        self._set_phase(cd, PROMOTING)

    def _promotion_traffic_shift(self, cd: dict[str, Any], canary: int, primary: int) -> None:
        """scheduler.go:508-563 (stepWeightPromotion 0: all traffic to the primary at once)."""
        step = cd["spec"]["analysis"].get("stepWeightPromotion", 0)
        if step == 0:
            self._event(cd, "Normal", "Routing all traffic to primary")
            self._set_routes(cd, 100, 0)
            self.recorder.set_weight(cd, 100, 0)
            self._set_phase(cd, FINALISING)
            return
        if canary > 0:
            primary, canary = min(100, primary + step), max(0, canary - step)
            self._set_routes(cd, primary, canary)
            self.recorder.set_weight(cd, primary, canary)
            if primary == 100:
                self._set_phase(cd, FINALISING)
            else:
                self._set_status_field(cd, "canaryWeight", canary)

    def _finalise(self, cd: dict[str, Any]) -> None:
        """scheduler.go:393-427: the target paused and scaled to zero, Succeeded."""
        if cd["spec"].get("autoscalerRef") is not None:
            self._pause_target_scaler(cd, pause=True)
        self._scale(cd, 0)
        self._set_phase(cd, SUCCEEDED)
        self.recorder.set_status(cd, SUCCEEDED)
        self.recorder.inc("flagger_canary_successes_total", cd)
        self._hooks(cd, ("post-rollout",), SUCCEEDED)
        self._event(cd, "Normal", f"Promotion completed! Scaling down {self._target_id(cd)}")
        self._event(cd, "Alert", "Canary analysis completed successfully, promotion finished.")

    def _rollback(self, cd: dict[str, Any]) -> None:
        """scheduler.go:948-998: all traffic to the primary, the target paused and scaled to zero, Failed."""
        failed = (cd.get("status") or {}).get("failedChecks", 0)
        if failed >= threshold_of(cd):
            self._event(cd, "Warning", f"Rolling back {self._id(cd)} failed checks threshold reached {failed}")
            self._event(cd, "Alert", f"Failed checks threshold reached {failed}")
        self._set_routes(cd, 100, 0)
        self._event(cd, "Warning", f"Canary failed! Scaling down {self._id(cd)}")
        self.recorder.set_weight(cd, 100, 0)
        if cd["spec"].get("autoscalerRef") is not None:
            self._pause_target_scaler(cd, pause=True)
        self._scale(cd, 0)
        self._sync_status(cd, {"phase": FAILED, "canaryWeight": 0})
        self.recorder.set_status(cd, FAILED)
        self.recorder.inc("flagger_canary_failures_total", cd)
        self._hooks(cd, ("post-rollout",), FAILED)
