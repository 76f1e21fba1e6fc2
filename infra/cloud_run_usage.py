"""The Cloud Run models' part of `vllm-gke report` (infra/usage_report.py calls it where the stack has any).

What it reads (PromQL, from Managed Prometheus's query API):
  - the guard's per-tenant counters as the Managed Prometheus sidecar writes them for each service
    (cluster="__run__", namespace=<the Cloud Run service's name>: components/model/cloud_run_monitoring.py);
  - Cloud Run's run.googleapis.com/container/billable_instance_time (seconds an instance was billed, summed
    over the revision's instances; a DELTA metric, whose increase over the period is their sum), per
    service and region.
Each service's billed seconds are priced at components/model/cloud_run_capacity.py's per-second price of one
instance (its GPU, vCPUs and memory: the service bills per instance, CPU always allocated) and split among
the tenants it served by their weighted tokens there, as a shared GKE pod's hours are; a service that served
no tokens in the period is `(unallocated)`. One instance holds one GPU: its billed hours are GPU-hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..components.model.cloud_run import service_name
from ..components.model.cloud_run_capacity import instance_usd_per_second
from ..components.model.cloud_run_monitoring import RUN_CLUSTER, RUN_RESOURCE, promql_name
from .config import StackConfig

BILLABLE_INSTANCE_TIME = "run.googleapis.com/container/billable_instance_time"

Number = Callable[[Mapping[str, Any]], float]
Vector = list[dict[str, Any]]


def run_queries(cfg: StackConfig, period: str) -> dict[str, str]:
    """The PromQL for the stack's Cloud Run services, each an instant vector at the period's end."""
    services = "|".join(service_name(m) for m in cfg.cloud_run_models)
    sel = f'cluster="{RUN_CLUSTER}",namespace=~"{services}"'
    billed = f'{promql_name(BILLABLE_INSTANCE_TIME)}{{monitored_resource="{RUN_RESOURCE}",service_name=~"{services}"}}'
    return {
        "run_prompt": f"sum by (tenant, model, namespace) (increase(vllm_gke_tenant_prompt_tokens_total{{{sel}}}[{period}]))",
        "run_generation": f"sum by (tenant, model, namespace) "
                          f"(increase(vllm_gke_tenant_generation_tokens_total{{{sel}}}[{period}]))",
        "run_requests": f"sum by (tenant, model, outcome) (increase(vllm_gke_tenant_requests_total{{{sel}}}[{period}]))",
        "run_billed": f"sum by (service_name, location) (increase({billed}[{period}]))",
    }


@dataclass
class RunUsage:
    """One tenant's use of the Cloud Run services (infra/usage_report.py adds it to its TenantUsage)."""

    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: dict[str, float] = field(default_factory=dict[str, float])
    gpu_hours: float = 0.0
    dollars: float = 0.0


def cloud_run_usage(cfg: StackConfig, query: Callable[[str], Vector], period: str, prompt_weight: float,
                    number: Number, unallocated: str) -> tuple[dict[str, RunUsage], list[str]]:
    """Per tenant (and `unallocated`), its Cloud Run use; and the billed services the config does not
    declare (another stack's, or a renamed one's): not priced."""
    q, known = run_queries(cfg, period), {t.name for t in cfg.tenants}
    out: dict[str, RunUsage] = {}
    weighted: dict[str, dict[str, float]] = {}  # service -> tenant -> weighted tokens
    for kind in ("run_prompt", "run_generation"):
        for row in query(q[kind]):
            labels, value = row["metric"], number(row)
            if (tenant := labels.get("tenant", "")) not in known:
                continue  # the counters' tenants are the config's
            usage = out.setdefault(tenant, RunUsage())
            if kind == "run_prompt":
                usage.prompt_tokens += value
            else:
                usage.generation_tokens += value
            share = weighted.setdefault(labels.get("namespace", ""), {})
            share[tenant] = share.get(tenant, 0.0) + value * (prompt_weight if kind == "run_prompt" else 1.0)
    for row in query(q["run_requests"]):
        if (tenant := row["metric"].get("tenant", "")) in known:
            requests = out.setdefault(tenant, RunUsage()).requests
            outcome = row["metric"].get("outcome", "")
            requests[outcome] = requests.get(outcome, 0.0) + number(row)
    unknown = _price(cfg, query(q["run_billed"]), weighted, number, unallocated, out)
    return out, unknown


def _price(cfg: StackConfig, billed: Vector, weighted: Mapping[str, Mapping[str, float]], number: Number,
           unallocated: str, out: dict[str, RunUsage]) -> list[str]:
    """Each service's billed seconds at its instance's price, split by the weighted tokens it served."""
    models = {(service_name(m), cfg.cloud_run_region(m)): m for m in cfg.cloud_run_models}
    unknown: list[str] = []
    for row in billed:
        service, region = row["metric"].get("service_name", ""), row["metric"].get("location", "")
        if (model := models.get((service, region))) is None:
            unknown.append(f"cloud-run/{region}/{service}")
            continue
        seconds, shares = number(row), weighted.get(service, {})
        total = sum(shares.values())
        for tenant, part in (shares.items() if total else [(unallocated, 1.0)]):
            usage, fraction = out.setdefault(tenant, RunUsage()), part / total if total else 1.0
            usage.gpu_hours += seconds / 3600 * fraction
            usage.dollars += seconds * instance_usd_per_second(model) * fraction
    return unknown
