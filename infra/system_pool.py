"""The system pool against everything that may run on it at once.

Every pod that asks for no GPU or TPU lands on the system pool (the accelerator pools are tainted):
the platform's Deployments (picker, limit store, trace collector, standbys), its Jobs (a loader per
weight set, the readiness checks, a load test) and what Helm charts and release manifests run (KEDA,
the LeaderWorkerSet controller), beside GKE's own pods. A loader re-run or a rollout's surge pod
that finds no CPU stays Pending, and `pulumi up` waits on it until its timeout. So the plan adds the
requests of all of them, each Deployment with one surge pod and every Job at once, and refuses a
pool that cannot hold them at its most nodes (the cluster autoscaler adds nodes up to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..components.node_shapes import system_pool_free
from .config import ConfigError, ConfigIssue

# Pods a Helm chart or a release manifest runs, not in the plan's manifests: (what, pods, CPU m,
# memory MiB) from their pinned sources.
KEDA_PODS = (  # kedacore/charts@v2.20.2 keda/values.yaml:546-570 (operator, metrics server, webhooks)
    ("KEDA operator", 1, 100, 100), ("KEDA metrics server", 1, 100, 100), ("KEDA webhooks", 1, 100, 100))
LWS_PODS = (  # kubernetes-sigs/lws@v0.10.0 config/manager/manager.yaml:31,95-98
    ("LeaderWorkerSet controller", 2, 1000, 1024),)
# The sidecar the mesh injects into every pod of a namespace labelled istio-injection=enabled,
# at Istio's default requests (global.proxy.resources; istio 1.24/1.30
# manifests/charts/istio-control/istio-discovery/values.yaml) unless the pod's annotations set them.
PROXY_CPU_M, PROXY_MEMORY_MI = 100, 128


@dataclass(frozen=True)
class Demand:
    what: str
    pods: int
    cpu_m: int
    memory_mi: int


def _quantity_m(value: Any) -> int:
    text = str(value)
    return int(float(text[:-1])) if text.endswith("m") else int(float(text) * 1000)


def _quantity_mi(value: Any) -> int:
    text = str(value)
    for suffix, mi in (("Gi", 1024), ("Mi", 1), ("G", 1000 ** 3 / 1024 ** 2), ("M", 1000 ** 2 / 1024 ** 2)):
        if text.endswith(suffix):
            return round(float(text[: -len(suffix)]) * mi)
    return round(int(text) / 1024 ** 2)


def pod_requests(spec: dict[str, Any]) -> tuple[int, int, bool]:
    """(CPU m, memory MiB, whether it takes an accelerator) a pod asks the scheduler for: its
    containers' sum, or its largest init container where that is more (Kubernetes' rule; native
    sidecars, init containers that keep running, add to both)."""
    def of(c: dict[str, Any]) -> tuple[int, int]:
        req = (c.get("resources") or {}).get("requests") or {}
        return _quantity_m(req.get("cpu", 0)), _quantity_mi(req.get("memory", 0))

    sidecars = [of(c) for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    inits = [of(c) for c in spec.get("initContainers") or [] if c.get("restartPolicy") != "Always"]
    main = [of(c) for c in spec.get("containers") or []] + sidecars
    cpu, mem = sum(c for c, _ in main), sum(m for _, m in main)
    accel = any(k in ((c.get("resources") or {}).get("limits") or {}) for c in spec.get("containers") or []
                for k in ("nvidia.com/gpu", "google.com/tpu"))
    return max([cpu, *(c for c, _ in inits)]), max([mem, *(m for _, m in inits)]), accel


def _replicas(doc: dict[str, Any]) -> int:
    spec = doc.get("spec") or {}
    count = spec.get("replicas", 1)
    # A rolling Deployment adds a surge pod before it takes an old one.
    surge = ((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxSurge", 1)
    return count + (1 if surge not in (0, "0", "0%") else 0)


def _proxy(template: dict[str, Any], meshed: bool) -> tuple[int, int]:
    notes = (template.get("metadata") or {}).get("annotations") or {}
    if not meshed or notes.get("sidecar.istio.io/inject") == "false":
        return 0, 0
    return (_quantity_m(notes.get("sidecar.istio.io/proxyCPU", f"{PROXY_CPU_M}m")),
            _quantity_mi(notes.get("sidecar.istio.io/proxyMemory", f"{PROXY_MEMORY_MI}Mi")))


def system_demand(manifests: list[dict[str, Any]]) -> list[Demand]:
    """What may run on the system pool at once: every workload without an accelerator."""
    out: list[Demand] = []
    meshed = {d["metadata"]["name"] for d in manifests if d.get("kind") == "Namespace"
              and ((d["metadata"].get("labels") or {}).get("istio-injection") == "enabled")}
    for doc in manifests:
        kind = doc.get("kind")
        if kind == "Job":
            template, pods = doc["spec"]["template"], max(1, doc["spec"].get("parallelism", 1))
        elif kind == "CronJob":
            template, pods = doc["spec"]["jobTemplate"]["spec"]["template"], 1
        elif kind in ("Deployment", "StatefulSet"):
            template, pods = doc["spec"]["template"], _replicas(doc)
        else:
            continue
        cpu, mem, accel = pod_requests(template["spec"])
        meta = doc["metadata"]
        proxy_cpu, proxy_mem = _proxy(template, meta.get("namespace") in meshed)
        if not accel and pods:
            out.append(Demand(f"{kind} {meta.get('namespace', '')}/{meta['name']}", pods, cpu + proxy_cpu,
                              mem + proxy_mem))
    uses_lws = any(doc.get("kind") == "LeaderWorkerSet" for doc in manifests)
    charts = KEDA_PODS + (LWS_PODS if uses_lws else ())
    return out + [Demand(what, pods, cpu, mem) for what, pods, cpu, mem in charts]


def check_system_pool(machine_type: str, max_nodes: int, manifests: list[dict[str, Any]]) -> list[Demand]:
    """The demand rows; raises ConfigError naming cluster.systemMaxNodes where they do not fit."""
    rows = system_demand(manifests)
    cpu = sum(r.pods * r.cpu_m for r in rows)
    mem = sum(r.pods * r.memory_mi for r in rows)
    free_cpu, free_mem = system_pool_free(machine_type, 100, max_nodes)
    if cpu > free_cpu or mem > free_mem:
        top = sorted(rows, key=lambda r: -r.pods * r.cpu_m)[:4]
        biggest = ", ".join(f"{r.what} {r.pods * r.cpu_m}m" for r in top)
        raise ConfigError([ConfigIssue(
            "vllm-gke:cluster.systemMaxNodes",
            f"the system pool ({max_nodes} x {machine_type}) offers {free_cpu}m CPU and {free_mem} MiB after "
            f"GKE's reservations and its own pods, but what may run there at once (every Deployment with a "
            f"surge pod, every loader and readiness Job, KEDA and controllers) asks {cpu}m CPU and {mem} MiB "
            f"(largest: {biggest}); raise cluster.systemMaxNodes or choose a larger cluster.systemMachineType")],
            "system pool")
    return rows
