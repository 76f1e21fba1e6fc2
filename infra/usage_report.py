"""Each tenant's share of GPU-hours and dollars for a period, from the metrics the running stack
exports and the price table (`vllm-gke report`).

What it reads (PromQL, from Managed Prometheus's query API or any Prometheus holding the same
series):
  - the guard's per-tenant counters (images/vllm_gke_guard/metrics.py): the prompt and generated
    tokens vLLM counted for each tenant request, and the requests by outcome, per model;
  - how long each vLLM pod was up: the samples of vllm:num_requests_running each pod exported,
    counted at a fixed step (one series per pod and engine; a pod of the plan's Deployments).
Each pod's hours are priced as its Deployment asks (GPUs, or MIG slices, on its node pool's
machine at the pool's list price: spot or on-demand; a pod that ran on a spot pool's on-demand twin
is priced at spot). A model's cost on the shared pools is split among its tenants by their
weighted tokens (a prompt token counts `prompt_weight` of a generated one: prefill is batched
and far cheaper per token); a dedicated tenant's replicas are that tenant's. What no tenant used
(no tokens in the period) is `unallocated`.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..components.specs import NodePoolSpec
from ..components.tenant_auth import tenant_namespace
from .config import StackConfig
from .plan import Plan
from .pricing import MACHINE_PRICES

STEP_S = 300
# A pod is <deployment>-<replica set hash>-<5 characters>.
POD_NAME = re.compile(r"^(?P<deployment>.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$")
UNALLOCATED = "unallocated"


def queries(cluster: str, period: str, step_s: int = STEP_S) -> dict[str, str]:
    """The PromQL the report runs, each an instant vector at the period's end."""
    sel = f'cluster="{cluster}"'
    return {
        "prompt": f"sum by (tenant, model) (increase(vllm_gke_tenant_prompt_tokens_total{{{sel}}}[{period}]))",
        "generation": f"sum by (tenant, model) (increase(vllm_gke_tenant_generation_tokens_total{{{sel}}}[{period}]))",
        "requests": f"sum by (tenant, model, outcome) (increase(vllm_gke_tenant_requests_total{{{sel}}}[{period}]))",
        "pod_steps": f"sum by (namespace, pod) (count_over_time(vllm:num_requests_running{{{sel}}}[{period}:{step_s}s]))",
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
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success" or doc.get("data", {}).get("resultType") != "vector":
            raise ValueError(f"the query API answered {doc.get('status')}: {doc.get('error', doc)}")
        return doc["data"]["result"]
    return query


@dataclass(frozen=True)
class Workload:
    """One vLLM Deployment of the plan, and what an hour of one of its pods costs."""

    namespace: str
    name: str
    model: str
    # The tenant whose own replicas these are (a dedicated namespace), else None.
    tenant: Optional[str]
    gpus: float
    dollars_per_hour: float


def workloads(plan: Plan) -> dict[tuple[str, str], Workload]:
    cfg: StackConfig = plan.config
    pools: dict[str, NodePoolSpec] = {p.name: p for p in cfg.node_pools}
    dedicated = {tenant_namespace(t): t.name for t in cfg.tenants if t.dedicated}
    out: dict[tuple[str, str], Workload] = {}
    for dep in plan.manifests():
        labels = dep["metadata"].get("labels") or {}
        if dep["kind"] != "Deployment" or labels.get("app.kubernetes.io/name") != "vllm":
            continue
        spec = dep["spec"]["template"]["spec"]
        # A pool with an on-demand twin is chosen through its ComputeClass, named after it.
        selector = spec.get("nodeSelector") or {}
        pool_name = selector.get("vllm-gke.io/node-pool") or selector.get("cloud.google.com/compute-class")
        if pool_name not in pools:  # a standby: no GPU
            continue
        pool = pools[pool_name]
        slots = int(spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        price = MACHINE_PRICES[pool.machine_type]
        node_hour = price.spot_hour if pool.spot else price.on_demand_hour
        ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
        out[(ns, name)] = Workload(ns, name, labels["vllm-gke.io/model"], dedicated.get(ns),
                                   slots * pool.machine.gpus / pool.slices_per_node,
                                   slots * node_hour / pool.slices_per_node)
    return out


@dataclass
class TenantUsage:
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: dict[str, float] = field(default_factory=dict[str, float])
    gpu_hours: float = 0.0
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
                                   "requests": t.requests, "gpuHours": t.gpu_hours, "dollars": t.dollars,
                                   "share": t.dollars / self.dollars if self.dollars else 0.0}
                            for name, t in self.tenants.items()}}


def usage_report(plan: Plan, query: Query, period: str, prompt_weight: float = 0.25,
                 step_s: int = STEP_S) -> UsageReport:
    q = queries(plan.config.cluster.name, period, step_s)
    tenants: dict[str, TenantUsage] = {t.name: TenantUsage() for t in plan.config.tenants}
    weighted: dict[str, dict[str, float]] = {}  # model -> tenant -> weighted tokens
    for kind in ("prompt", "generation"):
        for row in query(q[kind]):
            tenant, model, value = row["metric"].get("tenant", ""), row["metric"].get("model", ""), float(row["value"][1])
            if tenant not in tenants:
                continue  # the counters' tenants are the config's: another label is not this stack's
            usage = tenants[tenant]
            if kind == "prompt":
                usage.prompt_tokens += value
            else:
                usage.generation_tokens += value
            share = weighted.setdefault(model, {})
            share[tenant] = share.get(tenant, 0.0) + value * (prompt_weight if kind == "prompt" else 1.0)
    for row in query(q["requests"]):
        if (tenant := row["metric"].get("tenant", "")) in tenants:
            outcome = row["metric"].get("outcome", "")
            tenants[tenant].requests[outcome] = tenants[tenant].requests.get(outcome, 0.0) + float(row["value"][1])
    known = workloads(plan)
    own_models = {t.name: set(t.dedicated.models) for t in plan.config.tenants if t.dedicated}
    unknown: list[str] = []
    spent: dict[str, TenantUsage] = {}
    for row in query(q["pod_steps"]):
        ns, pod = row["metric"].get("namespace", ""), row["metric"].get("pod", "")
        match = POD_NAME.match(pod)
        work = known.get((ns, match.group("deployment"))) if match else None
        if work is None:
            unknown.append(f"{ns}/{pod}")
            continue
        hours = float(row["value"][1]) * step_s / 3600
        # A dedicated tenant's tokens on this model came from its own replicas, not the shared ones.
        shares = {work.tenant: 1.0} if work.tenant else {
            t: v for t, v in weighted.get(work.model, {}).items() if work.model not in own_models.get(t, ())}
        total = sum(shares.values())
        for tenant, part in (shares.items() if total else [(UNALLOCATED, 1.0)]):
            usage = tenants[tenant] if tenant in tenants else spent.setdefault(tenant, TenantUsage())
            fraction = part / total if total else 1.0
            usage.gpu_hours += hours * work.gpus * fraction
            usage.dollars += hours * work.dollars_per_hour * fraction
    return UsageReport(period, {**tenants, **spent}, sorted(unknown))


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
