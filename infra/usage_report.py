"""Each tenant's share of GPU-hours, TPU chip-hours (each apart) and dollars for a period, from the metrics the running stack
exports and the price table (`vllm-gke report`).

What it reads (PromQL, from Managed Prometheus's query API or any Prometheus holding the same
series):
  - the guard's per-tenant counters (images/vllm_gke_guard/metrics.py): the prompt and generated
    tokens vLLM counted for each tenant request, and the requests by outcome, per model;
  - how long each vLLM pod was up: the samples of vllm:num_requests_running each pod exported,
    counted at a fixed step (one series per pod and engine; a pod of the plan's Deployments, or a
    LeaderWorkerSet group's leader: its workers export no vLLM metric).
Each pod's hours are priced as its workload asks (GPUs, MIG slices or TPU chips, on its node pool's
machine at the pool's list price: spot or on-demand; a pod that ran on a spot pool's on-demand twin
is priced at spot, so those hours are understated). A multi-host group's leader carries its whole
group: every host's devices, priced together and attributed by the leader's tokens (the leader
serves the group's every request). Each shared pod's cost is split among the
tenants it served, by their weighted tokens on that pod (a prompt token counts `prompt_weight` of
a generated one: prefill is batched and far cheaper per token); a dedicated tenant's replicas are
that tenant's. A pod that served no tokens in the period is `(unallocated)`.

What it covers is the pods' time on their accelerators, from the first metrics each exported (its weights
loaded) to its last: not the capacity of a node no pod used, not the system pool, the cluster fee
or storage (the plan's cost report has those), so its total is less than the bill.

The Cloud Run models' tenants are counted too: their tokens and requests from the guard's counters as the
metrics sidecar writes them, their cost from each service's billed instance time (infra/cloud_run_usage.py).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..components.model.mesh_identity import tenant_namespace
from ..components.model.specs import NodePoolSpec
from .cloud_run_usage import cloud_run_usage
from .config import StackConfig
from .plan import Plan
from .pricing import MACHINE_PRICES

TPU_RESOURCE = "google.com/tpu"

STEP_S = 300
# A Deployment's pod is <deployment>-<replica set hash>-<5 characters>; a LeaderWorkerSet's leader
# is <set>-<group index> (its leader StatefulSet's pods; workers are <set>-<group>-<worker>).
POD_NAME = re.compile(r"^(?P<deployment>.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$")
LEADER_NAME = re.compile(r"^(?P<group>.+)-[0-9]+$")
# Not a tenant name (those are DNS labels), so never merged into one.
UNALLOCATED = "(unallocated)"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def period_problem(period: str, step_s: int = STEP_S) -> Optional[str]:
    """Why a --period cannot be reported on; None if it can (a PromQL duration of a step or more)."""
    match = re.fullmatch(r"([0-9]+)([smhdwy])", period)
    if match is None:
        return f"--period {period}: use a PromQL duration such as 7d, 30d or 12h"
    if int(match.group(1)) * _UNITS[match.group(2)] < step_s:
        return f"--period {period}: use {step_s // 60}m or more (pods' hours are counted in {step_s // 60}-minute steps)"
    return None


def queries(cluster: str, period: str, step_s: int = STEP_S) -> dict[str, str]:
    """The PromQL the report runs, each an instant vector at the period's end."""
    sel = f'cluster="{cluster}"'
    return {
        # Per pod: each pod's hours are split by the tokens it served.
        "prompt": f"sum by (tenant, model, namespace, pod) "
                  f"(increase(vllm_gke_tenant_prompt_tokens_total{{{sel}}}[{period}]))",
        "generation": f"sum by (tenant, model, namespace, pod) "
                      f"(increase(vllm_gke_tenant_generation_tokens_total{{{sel}}}[{period}]))",
        "requests": f"sum by (tenant, model, outcome) (increase(vllm_gke_tenant_requests_total{{{sel}}}[{period}]))",
        # One step per step the pod reported (max: one series per engine would count a pod twice).
        "pod_steps": f"sum by (namespace, pod) (count_over_time((max by (namespace, pod) "
                     f"(vllm:num_requests_running{{{sel}}}))[{period}:{step_s}s]))",
    }


Vector = list[dict[str, Any]]
Query = Callable[[str], Vector]


def prometheus(url: str, token: Optional[str] = None, at: Optional[float] = None, timeout: float = 120) -> Query:
    """A Prometheus HTTP API's instant query (GMP: https://monitoring.googleapis.com/v1/projects/
    <project>/location/global/prometheus with an OAuth token, or its frontend in the cluster)."""
    def query(promql: str) -> Vector:
        params = {"query": promql, **({"time": str(at)} if at is not None else {})}
        req = urllib.request.Request(f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # the API says why in its body: {"errorType", "error"}
            try:
                why = json.loads(err.read())
                detail = f"{why.get('errorType', '')}: {why.get('error', '')}"
            except ValueError:
                detail = str(err)
            raise ValueError(f"the query API answered HTTP {err.code} ({detail}) to: {promql}") from None
        if doc.get("status") != "success" or doc.get("data", {}).get("resultType") != "vector":
            raise ValueError(f"the query API answered {doc.get('status')}: {doc.get('error', doc)}")
        return doc["data"]["result"]
    return query


@dataclass(frozen=True)
class Workload:
    """One vLLM Deployment or LeaderWorkerSet of the plan, and what an hour of one of its replicas
    (a pod, or a group of `hosts` pods) costs."""

    namespace: str
    name: str
    model: str
    # The tenant whose own replicas these are (a dedicated namespace), else None.
    tenant: Optional[str]
    # Accelerator devices a replica holds: GPUs (a MIG slice is its share of one) or TPU chips.
    devices: float
    dollars_per_hour: float
    # The extended resource it requests (nvidia.com/gpu, google.com/tpu) and the hosts of a replica.
    resource: str = "nvidia.com/gpu"
    hosts: int = 1


def _pod_price(pool: NodePoolSpec, pod: Mapping[str, Any]) -> tuple[float, float]:
    """(devices, dollars an hour) of one pod: its accelerator units of the pool's machine, whatever
    the resource (GPUs, MIG slices, TPU chips), at the pool's list price."""
    assert pool.machine.accelerator is not None
    resource = pool.machine.accelerator.resource
    limits = pod["containers"][0]["resources"]["limits"]
    slots = int(limits.get(resource, 0))
    price = MACHINE_PRICES[pool.machine_type]
    node_hour = price.spot_hour if pool.spot else price.on_demand_hour
    return slots * pool.machine.gpus / pool.slices_per_node, slots * node_hour / pool.slices_per_node


def _pool_of(pod: Mapping[str, Any], pools: Mapping[str, NodePoolSpec]) -> Optional[NodePoolSpec]:
    # A pool with an on-demand twin is chosen through its ComputeClass, named after it.
    selector = pod.get("nodeSelector") or {}
    return pools.get(selector.get("vllm-gke.io/node-pool") or selector.get("cloud.google.com/compute-class") or "")


def _pods(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A replica's pods: a Deployment's one, or a group's leader and its size - 1 workers."""
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    group = doc["spec"]["leaderWorkerTemplate"]
    worker = group["workerTemplate"]["spec"]
    return [group.get("leaderTemplate", group["workerTemplate"])["spec"], *[worker] * (int(group["size"]) - 1)]


def workloads(plan: Plan) -> dict[tuple[str, str], Workload]:
    cfg: StackConfig = plan.config
    pools: dict[str, NodePoolSpec] = {p.name: p for p in cfg.node_pools}
    dedicated = {tenant_namespace(t): t.name for t in cfg.tenants if t.dedicated}
    out: dict[tuple[str, str], Workload] = {}
    for doc in plan.manifests():
        labels = doc["metadata"].get("labels") or {}
        if doc["kind"] not in ("Deployment", "LeaderWorkerSet") or labels.get("app.kubernetes.io/name") != "vllm":
            continue
        pods = _pods(doc)
        pool = _pool_of(pods[0], pools)
        if pool is None or pool.machine.accelerator is None:  # a standby: no accelerator
            continue
        devices, dollars = (sum(x) for x in zip(*(_pod_price(pool, pod) for pod in pods)))
        ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
        out[(ns, name)] = Workload(ns, name, labels["vllm-gke.io/model"], dedicated.get(ns), devices, dollars,
                                   pool.machine.accelerator.resource, len(pods))
    return out


def workload_of(known: Mapping[tuple[str, str], Workload], ns: str, pod: str) -> Optional[Workload]:
    """The workload a pod that exported vLLM metrics belongs to: a group's leader, or a Deployment's pod."""
    if (leader := LEADER_NAME.match(pod)) and (work := known.get((ns, leader.group("group")))) and work.hosts > 1:
        return work
    match = POD_NAME.match(pod)
    return known.get((ns, match.group("deployment"))) if match else None


@dataclass
class TenantUsage:
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: dict[str, float] = field(default_factory=dict[str, float])
    # Device-hours per accelerator type, never added together: GPU-hours (a MIG slice its share of
    # one) and TPU chip-hours.
    gpu_hours: float = 0.0
    tpu_chip_hours: float = 0.0
    dollars: float = 0.0


@dataclass
class UsageReport:
    period: str
    tenants: dict[str, TenantUsage]
    # Pods no Deployment of the plan accounts for (another stack's, or renamed): not priced.
    unknown_pods: list[str]

    @property
    def dollars(self) -> float:
        return sum(t.dollars for t in self.tenants.values())

    def to_json(self) -> dict[str, Any]:
        return {"period": self.period, "dollars": self.dollars, "unknownPods": self.unknown_pods,
                "tenants": {name: {"promptTokens": t.prompt_tokens, "generationTokens": t.generation_tokens,
                                   "requests": t.requests, "gpuHours": t.gpu_hours,
                                   "tpuChipHours": t.tpu_chip_hours, "dollars": t.dollars,
                                   "share": t.dollars / self.dollars if self.dollars else 0.0}
                            for name, t in self.tenants.items()}}


def usage_report(plan: Plan, query: Query, period: str, prompt_weight: float = 0.25,
                 step_s: int = STEP_S) -> UsageReport:
    q = queries(plan.config.cluster.name, period, step_s)
    tenants: dict[str, TenantUsage] = {t.name: TenantUsage() for t in plan.config.tenants}
    weighted: dict[tuple[str, str], dict[str, float]] = {}  # (namespace, pod) -> tenant -> weighted tokens
    for kind in ("prompt", "generation"):
        for row in query(q[kind]):
            labels, value = row["metric"], _number(row)
            tenant = labels.get("tenant", "")
            if tenant not in tenants:
                continue  # the counters' tenants are the config's: another label is not this stack's
            usage = tenants[tenant]
            if kind == "prompt":
                usage.prompt_tokens += value
            else:
                usage.generation_tokens += value
            share = weighted.setdefault((labels.get("namespace", ""), labels.get("pod", "")), {})
            share[tenant] = share.get(tenant, 0.0) + value * (prompt_weight if kind == "prompt" else 1.0)
    for row in query(q["requests"]):
        if (tenant := row["metric"].get("tenant", "")) in tenants:
            outcome = row["metric"].get("outcome", "")
            tenants[tenant].requests[outcome] = tenants[tenant].requests.get(outcome, 0.0) + _number(row)
    known = workloads(plan)
    unknown: list[str] = []
    spent: dict[str, TenantUsage] = {}
    for row in query(q["pod_steps"]):
        ns, pod = row["metric"].get("namespace", ""), row["metric"].get("pod", "")
        work = workload_of(known, ns, pod)
        if work is None:
            unknown.append(f"{ns}/{pod}")
            continue
        hours = _number(row) * step_s / 3600
        # A dedicated tenant's replicas are its own; a shared pod's, of the tenants it served.
        shares = {work.tenant: 1.0} if work.tenant else weighted.get((ns, pod), {})
        total = sum(shares.values())
        for tenant, part in (shares.items() if total else [(UNALLOCATED, 1.0)]):
            usage = tenants[tenant] if tenant in tenants else spent.setdefault(tenant, TenantUsage())
            fraction = part / total if total else 1.0
            if work.resource == TPU_RESOURCE:
                usage.tpu_chip_hours += hours * work.devices * fraction
            else:
                usage.gpu_hours += hours * work.devices * fraction
            usage.dollars += hours * work.dollars_per_hour * fraction
    if plan.config.cloud_run_models:
        unknown += _add_cloud_run(plan.config, query, period, prompt_weight, tenants, spent)
    return UsageReport(period, {**tenants, **spent}, sorted(unknown))


def _add_cloud_run(cfg: StackConfig, query: Query, period: str, prompt_weight: float,
                   tenants: dict[str, TenantUsage], spent: dict[str, TenantUsage]) -> list[str]:
    """The Cloud Run services' tokens, requests and billed time, added to each tenant's (infra/cloud_run_usage.py)."""
    run, unknown = cloud_run_usage(cfg, query, period, prompt_weight, _number, UNALLOCATED)
    for tenant, use in run.items():
        usage = tenants[tenant] if tenant in tenants else spent.setdefault(tenant, TenantUsage())
        usage.prompt_tokens += use.prompt_tokens
        usage.generation_tokens += use.generation_tokens
        for outcome, n in use.requests.items():
            usage.requests[outcome] = usage.requests.get(outcome, 0.0) + n
        usage.gpu_hours += use.gpu_hours
        usage.dollars += use.dollars
    return unknown


def _number(row: Mapping[str, Any]) -> float:
    """A vector row's value: a finite, non-negative number, or the row is refused."""
    try:
        value = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError(f"a query answer row has no [time, value]: {json.dumps(row)[:200]}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a query answer row's value is {value}: {json.dumps(row)[:200]}")
    return value


def read_metrics_file(path: str) -> Query:
    """Recorded answers: {"<promql>": [<vector rows>]} (what `--save` writes), for a report
    without network access or a review of one."""
    with open(path) as f:
        answers: Mapping[str, Vector] = json.load(f)

    def query(promql: str) -> Vector:
        if promql not in answers:
            raise ValueError(f"{path} has no answer for: {promql}")
        return answers[promql]
    return query
