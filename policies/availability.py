"""Serving pools that stay up: scaled by KEDA with a PodDisruptionBudget, answered at zero by a
standby or held in an endpoint picker's queue, and failing replicas taken out of the load balancer's
rotation."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from .base import (
    SERVING_KINDS,
    Finding,
    Resource,
    kube,
    meta,
    namespace_of,
    route_backends,
    selects,
    template_labels,
    vllm_servers,
    where,
)


def vllm_autoscaled(resources: Sequence[Resource]) -> Iterator[Finding]:
    """Every vLLM Deployment is scaled by a KEDA ScaledObject (with KEDA's chart in the plan to
    act on it) and covered by a PodDisruptionBudget. An HPA on a custom metric needs a custom
    metrics API the platform no longer runs (KEDA's metrics server is the external one)."""
    scaled = {(namespace_of(h), (h.props.get("spec") or {}).get("scaleTargetRef", {}).get("name"))
              for h in kube(resources, "ScaledObject")}
    pdbs = [(namespace_of(p), ((p.props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})
            for p in kube(resources, "PodDisruptionBudget")]
    keda = any(r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "keda" for r in resources)
    custom_api = any((a.props.get("spec") or {}).get("group") == "custom.metrics.k8s.io"
                     for a in kube(resources, "APIService"))
    for h in kube(resources, "HorizontalPodAutoscaler"):
        metrics = (h.props.get("spec") or {}).get("metrics") or []
        if not custom_api and any(m.get("type") in ("Pods", "Object") for m in metrics):
            yield h, (f"{where(h)} scales on a custom metric but the plan serves no custom.metrics.k8s.io "
                      "API, so it would never scale")
    if scaled and not keda:
        yield next(iter(kube(resources, "ScaledObject"))), \
            "ScaledObjects are declared but no KEDA chart is installed to act on them"
    seen = set()
    for r, _pod, _c in vllm_servers(resources):
        if r.props.get("kind") not in SERVING_KINDS or r.urn in seen:
            continue
        seen.add(r.urn)
        ns, name = namespace_of(r), meta(r).get("name")
        if (ns, name) not in scaled:
            yield r, f"{where(r)} has no KEDA ScaledObject: fixed replicas idle GPUs or drop load"
        labels = template_labels(r)
        if not any(pns == ns and selects(sel, labels) for pns, sel in pdbs):
            yield r, f"{where(r)} has no PodDisruptionBudget: node upgrades could take every replica at once"


STANDBY_LABEL = "vllm-gke.io/standby"
# llm-d-router v0.10.0's flow-control queue (components/model/keda_scaling.py): what wakes a pool
# at zero behind a picker that queues.
PICKER_QUEUE_METRIC = "llm_d_epp_flow_control_queue_size"


def scale_to_zero_answered(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A pool that KEDA may take to zero replicas needs something to hold or answer its requests
    there and wake it: its standby behind its Service with a trigger on the standby's requests, or,
    behind an endpoint picker that queues, an InferencePool that selects its pods but no standby (the
    picker would send the standby the requests instead of queueing them) with a trigger on the
    picker's queue for that pool. Without either, requests at zero get a bare 503 and nothing
    counts them, so the pool never wakes."""
    deployments = {(namespace_of(d), meta(d).get("name")): d
                   for kind in SERVING_KINDS for d in kube(resources, kind)}
    standbys = [(namespace_of(d), template_labels(d)) for d in deployments.values()
                if template_labels(d).get(STANDBY_LABEL) == "true"]
    services = kube(resources, "Service")
    for so in kube(resources, "ScaledObject"):
        spec = so.props.get("spec") or {}
        if spec.get("minReplicaCount", 0) != 0:
            continue
        ns = namespace_of(so)
        target = deployments.get((ns, (spec.get("scaleTargetRef") or {}).get("name")))
        if target is None:
            continue
        labels = template_labels(target)
        queries = " ".join(str((t.get("metadata") or {}).get("query", "")) for t in spec.get("triggers") or [])
        pools = [p for p in kube(resources, "InferencePool") if namespace_of(p) == ns
                 and selects(_pool_selector(p), labels) and f'inference_pool="{meta(p).get("name")}"' in queries]
        if pools and PICKER_QUEUE_METRIC in queries:
            for p in pools:
                if any(sns == ns and selects(_pool_selector(p), sl) for sns, sl in standbys):
                    yield p, (f"{where(p)} selects a standby, and {where(target)} wakes on its picker's queue: at zero "
                              "the picker sends the standby the requests (503) instead of queueing them")
            continue
        fronts = [s for s in services if namespace_of(s) == ns and (s.props.get("spec") or {}).get("clusterIP") != "None"
                  and selects((s.props.get("spec") or {}).get("selector") or {}, labels)]
        answered = any(selects((f.props.get("spec") or {}).get("selector") or {}, sl)
                       for f in fronts for sns, sl in standbys if sns == ns)
        if not answered:
            yield so, f"{where(so)} may scale {where(target)} to zero but no standby sits behind its Service"
        if "vllm_gke_standby_requests_total" not in queries:
            yield so, f"{where(so)} has no trigger on the standby's requests: at zero nothing wakes the pool"


def _pool_selector(pool: Resource) -> Mapping[str, Any]:
    return ((pool.props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}


def vllm_backends_resilient(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A failing vLLM replica must leave the load balancer's rotation: a HealthCheckPolicy on every
    Service the Gateway sends to (else GKE probes '/', which vLLM answers 404); a stopping one must
    keep its connections as long as a request may run (connection draining >= the timeout). The load balancer
    and the endpoint picker call the pods from outside the mesh, so a DestinationRule (outlier
    detection, connection limits) would apply to no caller: it is no substitute."""
    pods = [(namespace_of(r), template_labels(r))
            for r, _pod, _c in vllm_servers(resources) if r.props.get("kind") in SERVING_KINDS]
    checked = {(namespace_of(h), ((h.props.get("spec") or {}).get("targetRef") or {}).get("name"))
               for h in kube(resources, "HealthCheckPolicy")}
    routed = {(b.get("namespace") or namespace_of(route), b.get("name"))
              for route in kube(resources, "HTTPRoute") for b in route_backends(route)
              if b.get("kind", "Service") == "Service"}
    for svc in kube(resources, "Service"):
        ns, name = namespace_of(svc), meta(svc).get("name")
        selector = (svc.props.get("spec") or {}).get("selector") or {}
        if (ns, name) not in routed or not any(pns == ns and selects(selector, labels) for pns, labels in pods):
            continue
        if (ns, name) not in checked:
            yield svc, (f"{where(svc)} is a Gateway backend without a HealthCheckPolicy: the load balancer probes "
                        "'/' (404 on vLLM) and never takes a failing replica out")
    for policy in kube(resources, "GCPBackendPolicy"):
        default = (policy.props.get("spec") or {}).get("default") or {}
        # Numbers reach the pack as doubles from the engine.
        timeout = int(default.get("timeoutSec") or 30)
        draining = int((default.get("connectionDraining") or {}).get("drainingTimeoutSec") or 0)
        if draining < min(3600, timeout):
            yield policy, (f"{where(policy)} drains a detached endpoint for {draining} s but lets a request run "
                           f"{timeout} s: a scale-down or drain cuts the requests a stopping replica still serves")
