"""`vllm-gke report`: each tenant's tokens, requests, GPU-hours and dollars from the stack's metrics,
against a real HTTP query API answering as Prometheus does."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from tests.test_guard import guard
from vllm_gke.infra.cli import app
from vllm_gke.infra.pricing import MACHINE_PRICES
from vllm_gke.infra.usage_report import STEP_S, prometheus, queries, usage_report, workloads

HOURS = 10  # each pod up this long in the answers below
STEPS = HOURS * 3600 // STEP_S


SHORT8, LONG8 = "llama-8b-short-7d9f8c6b5-abcde", "llama-8b-long-6c8d9f7b5-zyxwv"


def answers(plan):
    """What the query API holds for prod: llama-8b's short pod used 3:1 by search and support
    (weighted tokens), its long pod by search alone; qwen-7b's shared pool by support alone,
    analytics' own qwen-7b replicas, llama-70b by nobody; one pod of another stack."""
    q = queries(plan.config.cluster.name, "30d")

    def row(value, **labels):
        return {"metric": labels, "value": [1_700_000_000, str(value)]}

    def on(pod, ns="vllm"):
        return {"namespace": ns, "pod": pod}

    return {
        q["prompt"]: [row(400_000, tenant="search", model="llama-8b", **on(SHORT8)),
                      row(0, tenant="support", model="llama-8b", **on(SHORT8)),
                      row(1000, tenant="support", model="qwen-7b", **on("qwen-7b-short-5c6d7f8b9-fghij")),
                      row(5, tenant="stranger", model="llama-8b", **on(SHORT8))],
        q["generation"]: [row(200_000, tenant="search", model="llama-8b", **on(SHORT8)),
                          row(100_000, tenant="support", model="llama-8b", **on(SHORT8)),
                          row(50_000, tenant="search", model="llama-8b", **on(LONG8)),
                          row(500, tenant="support", model="qwen-7b", **on("qwen-7b-short-5c6d7f8b9-fghij")),
                          row(700, tenant="analytics", model="qwen-7b",
                              **on("qwen-7b-short-6b7c8d9f5-klmno", "tenant-analytics"))],
        q["requests"]: [row(90, tenant="search", model="llama-8b", outcome="ok"),
                        row(3, tenant="support", model="llama-8b", outcome="shed")],
        q["pod_steps"]: [row(STEPS, **on(SHORT8)), row(STEPS, **on(LONG8)),
                         row(STEPS, **on("qwen-7b-short-5c6d7f8b9-fghij")),
                         row(STEPS, **on("qwen-7b-short-6b7c8d9f5-klmno", "tenant-analytics")),
                         row(STEPS, **on("llama-70b-long-7f8c9d6b5-pqrst")),
                         row(STEPS, **on("vllm-x-7f8c9d6b5-uvwxy", "other"))],
    }


@pytest.fixture
def query_api(plans):
    """A Prometheus-style /api/v1/query over HTTP, answering from `answers` and noting each query."""
    held, asked = answers(plans["prod"]), []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            promql = params["query"][0]
            asked.append((promql, self.headers.get("Authorization")))
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": held.get(promql, [])}})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()


def test_the_queries_read_the_counters_the_guard_exports():
    q = queries("c", "7d")
    for kind, counter in (("prompt", guard.metrics.PROMPT_TOKENS), ("generation", guard.metrics.GENERATION_TOKENS),
                          ("requests", guard.metrics.TENANT_REQUESTS)):
        assert f"{counter._name}_total{{" in q[kind]  # prometheus_client adds _total to a counter's name
        by = [*counter._labelnames, *(("namespace", "pod") if kind != "requests" else ())]
        assert f"sum by ({', '.join(by)})" in q[kind]


def test_each_pod_is_priced_as_its_deployment_asks(plans):
    plan = plans["prod"]
    work = workloads(plan)
    pools = {p.name: p for p in plan.config.node_pools}
    big = work[("vllm", "llama-70b-long")]
    assert big.devices == 8 and big.tenant is None
    a100 = MACHINE_PRICES[pools["a100-tp8"].machine_type]
    assert big.dollars_per_hour == pytest.approx(a100.spot_hour if pools["a100-tp8"].spot else a100.on_demand_hour)
    mig = work[("vllm", "qwen-7b-short")]
    assert mig.devices == pytest.approx(pools["a100-mig"].machine.gpus / pools["a100-mig"].slices_per_node)
    assert work[("tenant-analytics", "qwen-7b-short")].tenant == "analytics"


def test_the_report_splits_each_models_cost_by_weighted_tokens(plans, query_api):
    url, asked = query_api
    plan = plans["prod"]
    report = usage_report(plan, prometheus(url, "tok"), "30d", prompt_weight=0.25)
    work = workloads(plan)
    cost = {k: w.dollars_per_hour * HOURS for k, w in work.items()}
    t = report.tenants
    # llama-8b's short pod: search 400k*0.25 + 200k = 300k, support 100k: 3:1; its long pod, search's
    short8, long8 = cost[("vllm", "llama-8b-short")], cost[("vllm", "llama-8b-long")]
    qwen = cost[("vllm", "qwen-7b-short")]
    own = cost[("tenant-analytics", "qwen-7b-short")]
    assert t["search"].dollars == pytest.approx(0.75 * short8 + long8)
    assert t["support"].dollars == pytest.approx(0.25 * short8 + qwen)  # nothing of a pod it never used
    assert t["analytics"].dollars == pytest.approx(own)  # its own replicas, whatever it sent elsewhere
    assert t["(unallocated)"].dollars == pytest.approx(cost[("vllm", "llama-70b-long")])  # nobody's tokens
    assert t["search"].gpu_hours == pytest.approx(0.75 * HOURS * work[("vllm", "llama-8b-short")].devices
                                                  + HOURS * work[("vllm", "llama-8b-long")].devices)
    assert t["support"].requests == {"shed": 3.0} and t["search"].prompt_tokens == 400_000
    assert "stranger" not in t and report.unknown_pods == ["other/vllm-x-7f8c9d6b5-uvwxy"]
    assert all(auth == "Bearer tok" for _, auth in asked) and len(asked) == 4


def test_the_command_prints_json_and_replays_what_it_saved(query_api, tmp_path):
    url, _ = query_api
    token = tmp_path / "token"
    token.write_text("tok\n")
    saved = tmp_path / "answers.json"
    runner = CliRunner()
    live = runner.invoke(app, ["report", "--stack", "prod", "--prometheus", url, "--token-file", str(token),
                               "--save", str(saved), "--output", "json"])
    assert live.exit_code == 0, live.output
    doc = json.loads(live.output)
    assert set(doc["tenants"]) == {"search", "support", "analytics", "(unallocated)"}
    assert sum(t["share"] for t in doc["tenants"].values()) == pytest.approx(1.0)
    replay = runner.invoke(app, ["report", "--stack", "prod", "--metrics", str(saved), "--output", "json"])
    assert replay.exit_code == 0 and json.loads(replay.output) == doc
    text = runner.invoke(app, ["report", "--stack", "prod", "--metrics", str(saved)])
    assert text.exit_code == 0 and "GPU-hours" in text.output and "TPU chip-hours" in text.output
    assert "no vLLM Deployment" in text.output


@pytest.mark.parametrize("args,says", [
    (["--period", "a month"], "--period a month"),
    (["--period", "0d", "--metrics", "x"], "--period 0d: use 5m or more"),
    (["--period", "60s", "--metrics", "x"], "--period 60s: use 5m or more"),
    ([], "one of --prometheus URL or --metrics FILE"),
    (["--metrics", "/nonexistent/answers.json"], "/nonexistent/answers.json"),
])
def test_bad_input_exits_2_naming_the_option(args, says):
    result = CliRunner().invoke(app, ["report", "--stack", "prod", *args])
    assert result.exit_code == 2 and says in " ".join(result.output.split()) and "Traceback" not in result.output


def test_the_plan_gives_each_tenants_most_at_its_limits(plans):
    from vllm_gke.infra.cost import cost_report
    from vllm_gke.infra.report import tenant_ceilings, verdicts

    plan = plans["prod"]
    store = plan.platform.store
    cost = cost_report(plan.config, store.tier, store.capacity_gb)
    ceilings = {c.tenant: c for c in tenant_ceilings(plan.config, cost)}
    support = next(t for t in plan.config.tenants if t.name == "support")
    minutes = cost.hours_per_month * 60
    # tokensPerMinute where set; else requests x maxTokens: what the limit allows
    assert ceilings["support"].limit_tokens_month == support.rate_limit.tokens_per_minute * minutes
    analytics = next(t for t in plan.config.tenants if t.name == "analytics")
    assert ceilings["analytics"].limit_tokens_month == \
        analytics.rate_limit.requests_per_minute * analytics.max_tokens * minutes
    # support's limit binds before the replicas it calls run out: its tokens, at their price
    assert ceilings["support"].bound_by == "rate limit"
    assert ceilings["support"].tokens_month == ceilings["support"].limit_tokens_month
    # analytics calls only its own replicas: at most they, all at maxReplicas (6 + 3 pods of a MIG
    # slice), far under its rate limit's tokens at the shared $ per million
    pool = plan.config.pool(analytics.dedicated.node_pool)
    slot_hour = MACHINE_PRICES[pool.machine_type].on_demand_hour / pool.slices_per_node
    qwen = plan.config.model("qwen-7b")
    assert ceilings["analytics"].bound_by == "capacity"
    assert ceilings["analytics"].dollars_month == pytest.approx(
        (qwen.short.max_replicas + qwen.long.max_replicas) * slot_hour * cost.hours_per_month)
    assert ceilings["analytics"].dollars_month < ceilings["analytics"].limit_tokens_month / 1e6 * cost.usd_per_million_tokens
    doc = verdicts(plan).to_json()
    assert {c["tenant"] for c in doc["tenantCeilings"]} == {"search", "support", "analytics"}
    assert "capacityShare" in doc["tenantCeilings"][0]


def test_a_query_error_is_told_as_the_api_says_it(plans, tmp_path):
    """Prometheus answers a bad query 400/422 with {"errorType", "error"}: that is what the user sees."""
    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"status": "error", "errorType": "bad_data", "error": "invalid parameter"}).encode()
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = CliRunner().invoke(app, ["report", "--stack", "prod", "--prometheus",
                                          f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "HTTP 400 (bad_data: invalid parameter)" in said and "Traceback" not in said


@pytest.mark.parametrize("value", [None, "NaN", "-1"])
def test_a_malformed_answer_exits_2(plans, tmp_path, value):
    q = answers(plans["prod"])
    first = next(iter(q))
    q[first] = [{"metric": {"tenant": "search"}, **({"value": [0, value]} if value else {})}]
    saved = tmp_path / "answers.json"
    saved.write_text(json.dumps(q))
    result = CliRunner().invoke(app, ["report", "--stack", "prod", "--metrics", str(saved)])
    assert result.exit_code == 2 and "Traceback" not in result.output and "query answer row" in result.output


def test_tpu_chips_and_whole_groups_are_priced(plans):
    """frontier: the 8B on single TPU chips (google.com/tpu), the 70B as a four-host v6e group, the 405B
    as a two-host H100 group. A group's hours are its leader's, priced for every host of it and split
    by the leader's tokens; a worker exports nothing and a stranger's pod is not priced."""
    plan = plans["frontier"]
    pools = {p.name: p for p in plan.config.node_pools}
    work = workloads(plan)

    def node_hour(pool):
        price = MACHINE_PRICES[pool.machine_type]
        return price.spot_hour if pool.spot else price.on_demand_hour

    chip = work[("vllm", "llama-8b-tpu-short")]
    assert (chip.resource, chip.devices, chip.hosts) == ("google.com/tpu", 1, 1)
    assert chip.dollars_per_hour == pytest.approx(node_hour(pools["v6e-single"]))
    slice70 = work[("vllm", "llama-70b-tpu-short-group")]
    assert (slice70.resource, slice70.devices, slice70.hosts) == ("google.com/tpu", 16, 4)
    assert slice70.dollars_per_hour == pytest.approx(4 * node_hour(pools["v6e-4x4"]))
    h100 = work[("vllm", "llama-405b-short-group")]
    assert (h100.resource, h100.devices, h100.hosts) == ("nvidia.com/gpu", 16, 2)
    assert h100.dollars_per_hour == pytest.approx(2 * node_hour(pools["h100-hosts"]))

    q = queries(plan.config.cluster.name, "30d")

    def row(value, pod, **labels):
        return {"metric": {"namespace": "vllm", "pod": pod, **labels}, "value": [1_700_000_000, str(value)]}

    chip_pod, leader = "llama-8b-tpu-short-5c6d7f8b9-fghij", "llama-70b-tpu-short-group-0"
    held = {
        q["prompt"]: [],
        q["generation"]: [row(300, chip_pod, tenant="research", model="llama-8b-tpu"),
                          row(100, chip_pod, tenant="assistant", model="llama-8b-tpu"),
                          row(1000, leader, tenant="research", model="llama-70b-tpu")],
        q["requests"]: [],
        q["pod_steps"]: [row(STEPS, chip_pod), row(STEPS, leader), row(STEPS, "llama-405b-short-group-0"),
                         row(STEPS, "llama-70b-tpu-short-group-7-1")],
    }
    t = usage_report(plan, held.__getitem__, "30d").tenants
    assert t["research"].dollars == pytest.approx(HOURS * (0.75 * chip.dollars_per_hour + slice70.dollars_per_hour))
    # Chip-hours and GPU-hours apart, never summed: the 405B's H100 group is the only GPU time.
    assert t["research"].tpu_chip_hours == pytest.approx(HOURS * (0.75 * 1 + 16)) and t["research"].gpu_hours == 0
    assert t["(unallocated)"].gpu_hours == pytest.approx(HOURS * 16) and t["(unallocated)"].tpu_chip_hours == 0
    doc = usage_report(plan, held.__getitem__, "30d").to_json()["tenants"]["research"]
    assert (doc["gpuHours"], doc["tpuChipHours"]) == (0, pytest.approx(HOURS * 16.75))
    assert t["assistant"].dollars == pytest.approx(HOURS * 0.25 * chip.dollars_per_hour)
    assert t["(unallocated)"].dollars == pytest.approx(HOURS * h100.dollars_per_hour)
    assert usage_report(plan, held.__getitem__, "30d").unknown_pods == ["vllm/llama-70b-tpu-short-group-7-1"]
