"""The system pool against what runs on it for good, and the largest pod that comes and goes.

Every pod that asks for no GPU or TPU lands on the system pool (the accelerator pools are tainted):
the platform's Deployments (picker, limit store, trace collector, standbys) and what Helm charts and
release manifests run (KEDA, the LeaderWorkerSet controller) stay; Jobs (a loader per weight set,
the readiness checks, a load test) and a rollout's surge pod come and go. Pods that come and go
queue behind each other - a loader waits for the one before it - but one that cannot fit beside
what stays never starts, and `pulumi up` waits on it until its timeout (a loader re-run on staging
found no CPU). So the plan refuses a pool whose most nodes cannot hold what stays plus the largest
pod that comes, or whose one node cannot hold that pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..components.model.flagger_install import CHART_PODS as FLAGGER_PODS
from ..components.model.node_shapes import node_free, system_pool_free
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
    # Runs for good (a Deployment's replicas, a chart's pods), else comes and goes (a Job, a surge pod).
    steady: bool = True


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


def _surge_pods(doc: dict[str, Any]) -> int:
    """The pods a rolling Deployment adds before it takes old ones: maxSurge, a share of the
    replicas rounded up (Kubernetes' rule), default 25%."""
    spec = doc.get("spec") or {}
    surge = ((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxSurge", "25%")
    replicas = spec.get("replicas", 1)
    if isinstance(surge, str) and surge.endswith("%"):
        return -(-replicas * int(surge[:-1]) // 100)
    return int(surge)


def _proxy(template: dict[str, Any], meshed: bool) -> tuple[int, int]:
    meta = template.get("metadata") or {}
    notes = meta.get("annotations") or {}
    opted_out = "false" in (notes.get("sidecar.istio.io/inject"), (meta.get("labels") or {}).get("sidecar.istio.io/inject"))
    if not meshed or opted_out:
        return 0, 0
    return (_quantity_m(notes.get("sidecar.istio.io/proxyCPU", f"{PROXY_CPU_M}m")),
            _quantity_mi(notes.get("sidecar.istio.io/proxyMemory", f"{PROXY_MEMORY_MI}Mi")))


def system_demand(manifests: list[dict[str, Any]]) -> list[Demand]:
    """What may run on the system pool at once: every workload without an accelerator."""
    out: list[Demand] = []
    meshed = {d["metadata"]["name"] for d in manifests if d.get("kind") == "Namespace"
              and ((d["metadata"].get("labels") or {}).get("istio-injection") == "enabled")}
    for doc in manifests:
        kind, spec, meta = doc.get("kind"), doc.get("spec") or {}, doc["metadata"]
        if kind == "Job":
            template, pods, surge = spec["template"], max(1, spec.get("parallelism", 1)), 0
        elif kind == "CronJob":
            template, pods, surge = spec["jobTemplate"]["spec"]["template"], 1, 0
        elif kind in ("Deployment", "StatefulSet"):
            template, pods, surge = spec["template"], spec.get("replicas", 1), _surge_pods(doc)
        else:
            continue
        cpu, mem, accel = pod_requests(template["spec"])
        proxy_cpu, proxy_mem = _proxy(template, meta.get("namespace") in meshed)
        if accel:
            continue
        what = f"{kind} {meta.get('namespace', '')}/{meta['name']}"
        steady = kind not in ("Job", "CronJob")
        if pods:
            out.append(Demand(what, pods, cpu + proxy_cpu, mem + proxy_mem, steady))
        if surge:
            out.append(Demand(f"{what} (surge)", surge, cpu + proxy_cpu, mem + proxy_mem, False))
    uses_lws = any(doc.get("kind") == "LeaderWorkerSet" for doc in manifests)
    uses_flagger = any(doc.get("kind") == "Canary" for doc in manifests)
    charts = KEDA_PODS + (LWS_PODS if uses_lws else ()) + (FLAGGER_PODS if uses_flagger else ())
    return out + [Demand(what, pods, cpu, mem) for what, pods, cpu, mem in charts]


def check_system_pool(machine_type: str, max_nodes: int, manifests: list[dict[str, Any]]) -> list[Demand]:
    """The demand rows; raises ConfigError naming cluster.systemMaxNodes (or systemMachineType)
    where what stays and the largest pod that comes do not fit."""
    rows = system_demand(manifests)
    steady = [r for r in rows if r.steady]
    # A surge of several pods (the picker's 100%) comes all at once; Jobs queue one pod at a time.
    # The largest by CPU and by memory apart: they need not be the same pod.
    coming = [r for r in rows if not r.steady]
    largest = max(coming, key=lambda r: (r.pods * r.cpu_m, r.pods * r.memory_mi), default=None)
    cpu = sum(r.pods * r.cpu_m for r in steady) + max((r.pods * r.cpu_m for r in coming), default=0)
    mem = sum(r.pods * r.memory_mi for r in steady) + max((r.pods * r.memory_mi for r in coming), default=0)
    free_cpu, free_mem = system_pool_free(machine_type, 100, max_nodes)
    node_cpu, node_mem = node_free(machine_type, 100)
    problems = []
    if largest and (largest.cpu_m > node_cpu or largest.memory_mi > node_mem):
        problems.append(ConfigIssue("vllm-gke:cluster.systemMachineType", (
            f"{largest.what} asks {largest.cpu_m}m CPU and {largest.memory_mi} MiB, more than one {machine_type} "
            f"offers after GKE's reservations and its own pods ({node_cpu}m, {node_mem} MiB): it would never "
            "start; choose a larger cluster.systemMachineType")))
    elif cpu > free_cpu or mem > free_mem:
        top = ", ".join(f"{r.what} {r.pods * r.cpu_m}m" for r in sorted(steady, key=lambda r: -r.pods * r.cpu_m)[:3])
        problems.append(ConfigIssue("vllm-gke:cluster.systemMaxNodes", (
            f"the system pool ({max_nodes} x {machine_type}) offers {free_cpu}m CPU and {free_mem} MiB after GKE's "
            f"reservations and its own pods, but what runs there for good ({top}, KEDA and controllers) and "
            f"the largest pod that comes and goes ({largest.what if largest else '-'}) ask {cpu}m CPU and "
            f"{mem} MiB: that pod would never start; raise cluster.systemMaxNodes or choose a larger "
            "cluster.systemMachineType")))
    if problems:
        raise ConfigError(problems, "system pool")
    return rows
