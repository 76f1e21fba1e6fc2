"""`vllm-gke report` on the Cloud Run models (infra/cloud_run_usage.py): recorded series as the Managed
Prometheus sidecar writes the guard's tenant counters (cluster="__run__", namespace=<service>) and as
Cloud Run's billable_instance_time reads in PromQL, backfilled into a real Prometheus TSDB and queried
through its HTTP API as the report queries Managed Prometheus."""

from __future__ import annotations

import os
import shutil
from typing import Any, Iterator

import pytest

from tests.recorded_series import RecordedPrometheus, _labels  # pyright: ignore[reportPrivateUsage]
from tests.test_guard import guard
from vllm_gke.components.model.cloud_run_capacity import instance_usd_per_second
from vllm_gke.components.model.cloud_run_monitoring import promql_name
from vllm_gke.infra.cloud_run_usage import BILLABLE_INSTANCE_TIME, run_queries
from vllm_gke.infra.usage_report import prometheus, usage_report

SERVICE, REGION, MODEL = "vllm-qwen-1-5b", "us-central1", "qwen-1-5b"
START, SCRAPE, SCRAPES = 1_800_000_000, 60, 180  # three hours of samples, the report's period 2h
PERIOD = "2h"
# What the sidecar puts on every series (run-gmp-sidecar@1.7.0 confgenerator/config.go:329-344 and
# the targetLabels.metadata the RunMonitoring asks: instanceId, revision_name, service_name), and the
# resource labels Managed Prometheus adds (project_id, location).
SIDECAR = {"cluster": "__run__", "namespace": SERVICE, "job": "vllm", "instance": "00f1a2:8000",
           "instanceId": "00f1a2", "revision_name": f"{SERVICE}-00003-abc", "service_name": SERVICE,
           "project_id": "acme-llm-staging", "location": REGION}
# Per scrape: tokens and requests of each tenant (support calls qwen-1-5b in staging; a stranger's
# counters are not the stack's), and the instance billed 60 s a minute.
PER_SCRAPE = {("support", "prompt"): 400.0, ("support", "generation"): 100.0, ("stranger", "generation"): 7.0}
REQUESTS = {("support", "ok"): 5.0, ("support", "refused"): 1.0}


def _counter(name: str, labels: dict[str, str], per_scrape: float, kind: str = "counter") -> str:
    """A family's samples, one a scrape (a counter's named <name>_total, as prometheus_client exports it)."""
    sample = f"{name}_total" if kind == "counter" else name
    return f"# TYPE {name} {kind}\n" + "".join(
        f"{sample}{{{_labels(labels)}}} {per_scrape * i:g} {START + SCRAPE * i}\n" for i in range(SCRAPES))


def recording(billed_per_scrape: float = 60.0, tokens: bool = True) -> str:
    """The OpenMetrics text. billable_instance_time is DELTA in Cloud Monitoring, read in PromQL by its
    mapped name (no _total): its increase is the sum of its points, which a running sum of the same
    points (an untyped family, so the name stays) reproduces here."""
    families: dict[str, list[str]] = {}
    for (tenant, kind), n in PER_SCRAPE.items() if tokens else []:
        families.setdefault(f"vllm_gke_tenant_{kind}_tokens", []).append(
            _counter(f"vllm_gke_tenant_{kind}_tokens", {**SIDECAR, "tenant": tenant, "model": MODEL}, n))
    for (tenant, outcome), n in REQUESTS.items():
        families.setdefault("vllm_gke_tenant_requests", []).append(
            _counter("vllm_gke_tenant_requests", {**SIDECAR, "tenant": tenant, "model": MODEL, "outcome": outcome}, n))
    run = {"monitored_resource": "cloud_run_revision", "project_id": "acme-llm-staging", "location": REGION,
           "service_name": SERVICE, "revision_name": f"{SERVICE}-00003-abc"}
    billed = [_counter(promql_name(BILLABLE_INSTANCE_TIME), run, billed_per_scrape, "unknown"),
              _counter(promql_name(BILLABLE_INSTANCE_TIME), {**run, "location": "europe-west4"}, 60.0, "unknown")]
    families[promql_name(BILLABLE_INSTANCE_TIME)] = billed
    # One TYPE line a family: OpenMetrics wants a family's samples together.
    return "".join(parts[0] + "".join(p.split("\n", 1)[1] for p in parts[1:]) for parts in families.values())


@pytest.fixture(scope="module")
def tools() -> tuple[str, str]:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom is None or tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the usage report on a real Prometheus: missing prometheus or promtool")
        pytest.skip("missing prometheus or promtool")
    return prom, tool


def served(tools: tuple[str, str], text: str) -> Iterator[RecordedPrometheus]:
    prom = RecordedPrometheus(*tools)
    try:
        prom.backfill(text)
        prom.start()
        yield prom
    finally:
        prom.close()


@pytest.fixture(scope="module")
def recorded(tools) -> Iterator[RecordedPrometheus]:
    yield from served(tools, recording())


AT = START + SCRAPE * (SCRAPES - 1)


def test_the_queries_select_the_sidecars_series_and_cloud_runs_billing(plans):
    q = run_queries(plans["staging"].config, PERIOD)
    for kind, counter in (("run_prompt", guard.metrics.PROMPT_TOKENS), ("run_generation", guard.metrics.GENERATION_TOKENS),
                          ("run_requests", guard.metrics.TENANT_REQUESTS)):
        assert f'{counter._name}_total{{cluster="__run__",namespace=~"{SERVICE}"}}' in q[kind]
    assert 'run_googleapis_com:container_billable_instance_time{monitored_resource="cloud_run_revision",' \
           f'service_name=~"{SERVICE}"}}' in q["run_billed"]


def test_the_report_counts_cloud_run_tenants_tokens_requests_and_billed_cost(plans, recorded):
    plan = plans["staging"]
    report = usage_report(plan, prometheus(recorded.url, at=AT), PERIOD, prompt_weight=0.25)
    support = report.tenants["support"]
    minutes = 120  # the period's increase: 120 scrapes of each counter
    assert support.prompt_tokens == pytest.approx(400 * minutes, rel=0.02)
    assert support.generation_tokens == pytest.approx(100 * minutes, rel=0.02)
    assert support.requests == pytest.approx({"ok": 5 * minutes, "refused": minutes}, rel=0.02)
    # The only tenant with tokens on the service: its whole billed time (2 h of one instance, one GPU).
    (model,) = plan.config.cloud_run_models
    assert support.gpu_hours == pytest.approx(2.0, rel=0.02)
    assert support.dollars == pytest.approx(7200 * instance_usd_per_second(model), rel=0.02)
    assert "stranger" not in report.tenants and report.tenants["search"].dollars == 0
    # A service of that name in another region (another stack's, in the same project) is named, not priced.
    assert report.unknown_pods == [f"cloud-run/europe-west4/{SERVICE}"]


def test_a_service_that_served_no_tokens_is_unallocated(plans, tools):
    plan = plans["staging"]
    for prom in served(tools, recording(billed_per_scrape=30.0, tokens=False)):
        report = usage_report(plan, prometheus(prom.url, at=AT), PERIOD)
        (model,) = plan.config.cloud_run_models
        assert report.tenants["(unallocated)"].dollars == pytest.approx(3600 * instance_usd_per_second(model), rel=0.02)
        assert report.tenants["support"].dollars == 0 and report.tenants["support"].requests["ok"] > 0


def test_stacks_without_cloud_run_ask_nothing_more(plans):
    asked: list[str] = []

    def query(promql: str) -> list[dict[str, Any]]:
        asked.append(promql)
        return []

    usage_report(plans["dev"], query, PERIOD)
    assert not any("__run__" in q or "billable_instance_time" in q for q in asked)
