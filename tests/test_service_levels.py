"""SLOs as code (components/service_levels.py): the services, objectives and burn-rate alerts each
stack declares, read from the signals the guard and vLLM actually export."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import manifests_of, props_of, vllm_deployments
from tests.test_guard import guard
from vllm_gke.components.model.service_levels import (
    BURN_WINDOWS,
    GMP,
    REQUESTS_METRIC,
    TTFT_BUCKETS,
    TTFT_METRIC,
    burn_rate_policy,
    objectives,
    ttft_bound,
    ttft_buckets,
)
from vllm_gke.components.model.specs import MonitoringSpec
from vllm_gke.infra.manifests import validate_alert_policy, validate_slo


def test_the_burn_rates_are_the_sre_workbooks_within_a_day():
    # Table 5-8 of "The Site Reliability Workbook" (a 30-day window): page at 14.4 over 1 h and 6
    # over 6 h; its ticket (10% in 3 days: a burn rate of 1) over the longest lookback Cloud
    # Monitoring evaluates, a day (a lookback over 24 h never alerts); each long window with a
    # short one a twelfth its length.
    assert [w.rate(30) for w in BURN_WINDOWS] == [14.4, 6.0, 1.0]
    assert [(w.long_s, w.short_s) for w in BURN_WINDOWS] == [(3600, 300), (21600, 1800), (86400, 7200)]
    assert max(w.long_s for w in BURN_WINDOWS) <= 86400
    assert [w.rate(28) for w in BURN_WINDOWS] == [13.44, 5.6, 1.0]
    # Never under 1 (a burn the budget affords is no alert): a week's window.
    assert [w.rate(7) for w in BURN_WINDOWS] == [3.36, 1.4, 1.0]


def fires(policy, steady_burn):
    """Whether a burn-rate policy fires on a burn that has held at `steady_burn` for longer than
    its longest window (every window then reads that rate)."""
    conditions = [c["condition_threshold"] for c in policy["conditions"]]
    assert policy["combiner"] == "AND" and all(c["comparison"] == "COMPARISON_GT" for c in conditions)
    return all(steady_burn > c["threshold_value"] for c in conditions)


@pytest.mark.parametrize("window_days", [7, 28, 30, 90])
def test_a_steady_burn_at_twice_the_affordable_rate_opens_a_ticket(window_days):
    """A budget burnt at 2x is gone in half the window: the workbook tickets it (rate 1); a
    ticket at 10% a day (rate 2.8 for 28 days) never fired on it. A burn the budget affords is
    no alert."""
    objective = objectives("c", MonitoringSpec(), ["m"], [])[0]
    policies = {w.name: burn_rate_policy(objective, "slo", w, window_days) for w in BURN_WINDOWS}
    assert fires(policies["slow burn"], 2.0) and policies["slow burn"]["severity"] == "WARNING"
    assert not any(fires(p, 1.0) for p in policies.values())
    assert all(fires(p, 50.0) for p in policies.values())


def test_each_model_and_tenant_has_its_objectives(plans):
    plan = plans["prod"]
    cfg = plan.config
    services = {s["serviceId"] for s in props_of(plan, "gcp:monitoring/customService:CustomService")}
    gateway = f"vllm-{cfg.cluster.name}-gateway-lb"
    assert services == {f"vllm-{cfg.cluster.name}-model-{m.name}" for m in cfg.models} | \
        {f"vllm-{cfg.cluster.name}-tenant-{t.name}" for t in cfg.tenants} | {gateway}
    slos = props_of(plan, "gcp:monitoring/slo:Slo")
    assert len(slos) == 2 * len(cfg.models) + len(cfg.tenants) + 1
    for slo in slos:
        if slo["service"] == gateway:
            continue  # test_the_gateway_slo_counts_what_the_load_balancer_sees
        assert slo["rollingPeriodDays"] == cfg.monitoring.slos.window_days
        sli = slo["requestBasedSli"]
        if slo["sloId"] == "availability":
            assert slo["goal"] == cfg.monitoring.slos.availability
            ratio = sli["goodTotalRatio"]
            assert f'metric.type="{REQUESTS_METRIC}"' in ratio["totalServiceFilter"]
            assert 'metric.label."outcome"=one_of("error")' in ratio["badServiceFilter"]
            assert 'metric.label."outcome"=one_of("ok","error")' in ratio["totalServiceFilter"]
            assert f'resource.label."cluster"="{cfg.cluster.name}"' in ratio["totalServiceFilter"]
        else:
            assert slo["goal"] == cfg.monitoring.slos.ttft
            cut = sli["distributionCut"]
            assert f'metric.type="{TTFT_METRIC}"' in cut["distributionFilter"]
            # ttftSloSeconds 2 in prod: not a default bound of vLLM's, so the servers add it
            # (--custom-histogram-buckets) and the cut is at 2 itself
            assert cut["range"] == {"min": 0, "max": 2.0}


def test_the_availability_slo_reads_the_counter_the_guard_exports():
    """The SLI's metric and outcomes are the guard's own: a rename on either side fails here."""
    exported = guard.usage.TenantMeters.__init__.__globals__["TENANT_REQUESTS"]
    assert REQUESTS_METRIC == f"{GMP}/{exported._name}_total/counter"  # prometheus_client drops _total, adds it back
    assert set(guard.usage.TenantMeters.__slots__) >= {"ok", "refused", "error", "shed"}
    assert exported._labelnames == ("tenant", "model", "outcome")


def test_the_ttft_cut_lies_on_vllms_bucket_bounds():
    assert ttft_bound(3.0) == 2.5 and ttft_bound(2.5) == 2.5 and ttft_bound(0.0001) == 0.001
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the buckets against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    out = subprocess.run([python, "-c", "from vllm.v1.metrics.buckets import TIME_TO_FIRST_TOKEN_BUCKETS as b;"
                          "import json; print(json.dumps(list(b)))"], capture_output=True, text=True, check=True)
    assert tuple(json.loads(out.stdout)) == TTFT_BUCKETS


def test_the_servers_add_the_ttft_objective_to_vllms_buckets(plans, plan_variant):
    """prod's objective (2 s) is no default bound: each server of prod adds it with vLLM 0.34's
    --custom-histogram-buckets, which the real release accepts and uses for that histogram."""
    plan = plans["prod"]
    (value,) = {c["args"][c["args"].index("--custom-histogram-buckets") + 1]
                for d in vllm_deployments(plan) for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"}
    buckets = json.loads(value)["time_to_first_token"]
    assert plan.config.monitoring.ttft_slo_seconds in buckets and set(TTFT_BUCKETS) < set(buckets)
    assert len(vllm_deployments(plan)) == sum(
        "--custom-histogram-buckets" in c["args"] for d in vllm_deployments(plan)
        for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    # an objective on a default bound: nothing added, the cut is there
    def on_a_bound(values):
        values["vllm-gke:monitoring"] = {**values["vllm-gke:monitoring"], "ttftSloSeconds": 2.5}
    exact = plan_variant("dev", on_a_bound)
    assert not any("--custom-histogram-buckets" in c.get("args", []) for d in vllm_deployments(exact)
                   for c in d["spec"]["template"]["spec"]["containers"])
    assert {s["requestBasedSli"]["distributionCut"]["range"]["max"] for s in props_of(exact, "gcp:monitoring/slo:Slo")
            if s["sloId"] == "ttft"} == {2.5}
    # and the seed serves vLLM's default buckets, as these servers do
    from vllm_gke.infra.contracts.monitoring import seeded_histograms_have_the_servers_buckets

    assert seeded_histograms_have_the_servers_buckets(exact) == []
    python = os.environ.get("VLLM_PYTHON")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the flag against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    program = ("import json, sys; from vllm.config.observability import ObservabilityConfig;"
               "from vllm.v1.metrics.buckets import histogram_buckets;"
               "c = ObservabilityConfig(custom_histogram_buckets=json.loads(sys.argv[1]));"
               "print(json.dumps(histogram_buckets('time_to_first_token', overrides=c.custom_histogram_buckets)))")
    out = subprocess.run([python, "-c", program, value], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == buckets


def test_burn_rate_alerts_page_on_each_slo_over_two_windows(plans):
    plan = plans["prod"]
    slo_names = {f"projects/{plan.config.project}/services/{s['service']}/serviceLevelObjectives/{s['sloId']}"
                 for s in props_of(plan, "gcp:monitoring/slo:Slo")}
    burns = [p for p in props_of(plan, "gcp:monitoring/alertPolicy:AlertPolicy")
             if p["displayName"].startswith("SLO ")]
    assert len(burns) == 3 * len(slo_names)
    named = set()
    for policy in burns:
        assert policy["combiner"] == "AND" and len(policy["conditions"]) == 2
        assert policy["notificationChannels"]  # prod has channels
        filters = [c["conditionThreshold"]["filter"] for c in policy["conditions"]]
        (slo,) = {f.split('"')[1] for f in filters}
        named.add(slo)
        assert all(f.startswith("select_slo_burn_rate(") for f in filters)
    assert named == slo_names


def test_the_slos_and_alerts_parse_as_the_apis_messages(plans):
    levels = plans["prod"].platform.observability.service_levels
    assert levels is not None
    assert all(validate_slo(s) == [] for s in levels.slo_definitions)
    assert all(validate_alert_policy(p) == [] for p in levels.alert_definitions)
    bad = json.loads(json.dumps(levels.slo_definitions[0]))
    bad["request_based_sli"]["good_total_ratio"]["bad_filter"] = "x"
    (err,) = validate_slo(bad)
    assert "badFilter" in err


def test_the_dashboard_shows_each_slos_error_budget(plans):
    plan = plans["prod"]
    (d,) = [r.props for r in plan.of_type("gcp:monitoring/dashboard:Dashboard")
            if not r.name.endswith("tenant-dashboard")]  # the platform's; the tenants' has its own rows
    tiles = json.loads(d["dashboardJson"])["mosaicLayout"]["tiles"]
    budgets = [t["widget"]["xyChart"]["dataSets"][0]["timeSeriesQuery"]["timeSeriesFilter"]["filter"]
               for t in tiles if t["widget"]["title"].startswith("Error budget remaining")]
    assert sorted(budgets) == sorted(f'select_slo_budget_fraction("projects/{plan.config.project}/services/'
                                     f'{s["service"]}/serviceLevelObjectives/{s["sloId"]}")'
                                     for s in props_of(plan, "gcp:monitoring/slo:Slo"))


def test_slos_can_be_turned_off(plan_variant):
    plan = plan_variant("dev", lambda v: v.setdefault("vllm-gke:monitoring", {}).update(slos={"enabled": False}))
    assert props_of(plan, "gcp:monitoring/slo:Slo") == []
    assert plan.platform.observability.service_levels is None


def test_the_plan_warns_of_an_inexact_ttft_cut_only_where_the_release_cannot_add_the_bound(plans):
    from vllm_gke.infra.advice import plan_warnings

    cfg = plans["prod"].config  # ttftSloSeconds 2
    store = plans["prod"].platform.store

    def warned(version):
        c = cfg.model_copy(update={"vllm_version": version})
        return [w for w in plan_warnings(c, store.tier, store.capacity_gb) if "ttftSloSeconds" in w]

    assert warned("0.34.0") == []
    (warning,) = warned("0.11.0")
    assert "within 1s" in warning and "0.11.0" in warning


def test_deliberate_shedding_is_no_page(plans):
    """A 429 to a tenant of negative priority is the priorities working: not a bad event of any
    availability SLO (whose fast burn pages CRITICAL), nor a valid one; a WARNING reports a
    sustained shed instead, where some tenant may be shed."""
    plan = plans["prod"]
    assert any(t.priority < 0 for t in plan.config.tenants)
    for slo in props_of(plan, "gcp:monitoring/slo:Slo"):
        if slo["sloId"] == "availability":
            assert '"shed"' not in json.dumps(slo["requestBasedSli"])
    (shed,) = [p for p in props_of(plan, "gcp:monitoring/alertPolicy:AlertPolicy")
               if p["displayName"] == "Tenants shed for overload"]
    assert shed["severity"] == "WARNING"
    assert 'outcome="shed"' in shed["conditions"][0]["conditionPrometheusQueryLanguage"]["query"]


def test_the_seed_serves_the_slos_metrics_until_cloud_monitoring_knows_them(tmp_path, monkeypatch):
    """The seeding Job's program, run here: it serves each metric at zero in Prometheus' text
    format (as Managed Prometheus would scrape it, named as the SLO filters' types), with every
    label key the filters name, and exits once each descriptor exists (here: once scraped)."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from vllm_gke.components.scripts import seed_slo_metrics as seed
    from vllm_gke.components.slo_metrics import seed_config

    found = objectives("c", MonitoringSpec(), ["m"], ["t"], gateway_class="gke-l7-rilb", region="r")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {**seed_config("p", [o.sli for o in found], {TTFT_METRIC: ttft_buckets(2.0, True)}), "port": port}
    assert {m["type"] for m in config["metrics"]} == {REQUESTS_METRIC, TTFT_METRIC}
    (tmp_path / "seed.json").write_text(json.dumps(config))
    monkeypatch.setattr(seed, "CONFIG", str(tmp_path / "seed.json"))
    monkeypatch.setattr(seed, "POLL_SECONDS", 0.01)
    ingested: dict[str, set[str]] = {}
    polls: list[str] = []

    def descriptor_exists(project, metric_type):
        """Managed Prometheus' part: scrape, and make a descriptor per family (with its labels); a
        histogram with no finite bucket is dropped (prometheus-engine v0.12.0 transform.go:332-335)."""
        assert project == "p"
        polls.append(metric_type)
        assert len(polls) < 50, f"never ingested: {metric_type}"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            if family.type == "histogram" and all(s.labels.get("le") in (None, "+Inf") for s in family.samples):
                continue
            kind = "counter" if family.type == "counter" else family.type
            name = f"{family.name}_total" if kind == "counter" else family.name
            ingested[f"{GMP}/{name}/{kind}"] = {k for s in family.samples for k in s.labels if k != "le"}
        return metric_type in ingested

    monkeypatch.setattr(seed, "descriptor_exists", descriptor_exists)
    assert seed.main() == 0
    assert ingested[REQUESTS_METRIC] == {"tenant", "model", "outcome"}
    assert ingested[TTFT_METRIC] == {"model_name"}
    # the seeded series are zeros under a value no SLO selects
    for o in found:
        assert "vllm-gke-seed" not in json.dumps(o.sli)


@pytest.mark.parametrize("stack, metric, resource", [
    ("dev", "loadbalancing.googleapis.com/https/internal/request_count", "internal_http_lb_rule"),
    ("prod", "loadbalancing.googleapis.com/https/external/regional/request_count", "http_external_regional_lb_rule"),
])
def test_the_gateway_slo_counts_what_the_load_balancer_sees(plans, stack, metric, resource):
    """A replica killed mid-request (OOM, a spot node taken back) never reaches the guard's count:
    the load balancer answers the client 502/503 itself. Its own request count, by response code
    class, is an SLO of its own: 2xx/3xx good, 5xx bad, 4xx (a shed 429 among them) neither."""
    plan = plans[stack]
    scope = f'resource.label."region"="{plan.config.region}"'
    (slo,) = [s for s in props_of(plan, "gcp:monitoring/slo:Slo") if s["service"].endswith("-gateway-lb")]
    ratio = slo["requestBasedSli"]["goodTotalRatio"]
    for flt in (ratio["goodServiceFilter"], ratio["badServiceFilter"]):
        assert f'metric.type="{metric}"' in flt and f'resource.type="{resource}"' in flt and scope in flt
    code = 'metric.label."response_code_class"'
    assert ratio["goodServiceFilter"].endswith(f"{code}>=200 {code}<400")
    assert ratio["badServiceFilter"].endswith(f"{code}>=500")
    assert slo["goal"] == plan.config.monitoring.slos.availability
    burns = [p for p in props_of(plan, "gcp:monitoring/alertPolicy:AlertPolicy")
             if p["displayName"].startswith("SLO ") and "gateway:" in p["displayName"]]
    assert len(burns) == len(BURN_WINDOWS)


def test_every_gateway_class_has_its_load_balancers_count():
    from vllm_gke.components.model.service_levels import LB_REQUESTS, gateway_sli
    from vllm_gke.components.model.specs.gateway import GatewaySpec

    classes = set(GatewaySpec.model_fields["class_name"].annotation.__args__)
    assert set(LB_REQUESTS) == classes
    glob = gateway_sli("gke-l7-global-external-managed", "us-central1")["good_total_ratio"]["bad_service_filter"]
    assert 'resource.type="https_lb_rule"' in glob and "region" not in glob


def _served_les(bounds):
    """The `le` values a vLLM server writes for these bounds: prometheus_client's own exposition."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], buckets=bounds,
              registry=registry).labels("m").observe(0.5)
    return _les(generate_latest(registry).decode())


def _les(text):
    from prometheus_client.parser import text_string_to_metric_families

    return [s.labels["le"] for f in text_string_to_metric_families(text) for s in f.samples if "le" in s.labels]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_seeded_ttft_histogram_has_the_servers_buckets(plans, stack):
    """Managed Prometheus drops a histogram with no finite bucket (no descriptor, the Job would time
    out): the seed serves a bucket per bound each server exports, `le` written as they write it
    (the servers add the objective with --custom-histogram-buckets)."""
    plan = plans[stack]
    (config,) = [json.loads(c["data"]["seed.json"]) for c in manifests_of(plan, "ConfigMap") if "seed.json" in c["data"]]
    (ttft,) = [m["text"] for m in config["metrics"] if m["type"] == TTFT_METRIC]
    seeded = _les(ttft)
    assert [le for le in seeded if le != "+Inf"], "no finite bucket"
    for d in vllm_deployments(plan):
        (args,) = [c["args"] for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        flag = "--custom-histogram-buckets"
        bounds = json.loads(args[args.index(flag) + 1])["time_to_first_token"] if flag in args else TTFT_BUCKETS
        assert seeded == _served_les(bounds)
    # the objective the SLO cuts at is among them (both stacks' objective is no default bound)
    assert _served_les([plan.config.monitoring.ttft_slo_seconds])[0] in seeded


def test_a_histogram_is_never_seeded_without_a_finite_bucket():
    from vllm_gke.components.slo_metrics import exposition, le_value

    with pytest.raises(ValueError, match="finite bucket bounds"):
        exposition(TTFT_METRIC, ["model_name"])
    assert _les(exposition(TTFT_METRIC, ["model_name"], [0.25, 2.0])) == ["0.25", "2.0", "+Inf"]
    # prometheus_client's formatting, Go's exponent form included
    from prometheus_client.utils import floatToGoString

    for b in [*TTFT_BUCKETS, 2.0, 1e7, 123456789.0]:
        assert le_value(b) == floatToGoString(b)


def test_only_managed_prometheus_scrapes_the_seed(plans):
    """GKE's managed collectors run in gke-gmp-system (gmp-system on a self-deployed install), and
    host-network scrapers come from the node subnet: each may reach the metrics port, nothing else."""
    plan = plans["prod"]
    (netpol,) = [n for n in manifests_of(plan, "NetworkPolicy", "vllm-gke-slo-metrics")]
    (rule,) = netpol["spec"]["ingress"]
    namespaces = {f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for f in rule["from"] if "namespaceSelector" in f}
    assert namespaces == {"gke-gmp-system", "gmp-system"}
    assert {f["ipBlock"]["cidr"] for f in rule["from"] if "ipBlock" in f} == {plan.config.cluster.subnet_cidr}
    assert rule["ports"] == [{"port": 9090, "protocol": "TCP"}] and all(rule["from"])


def test_the_guide_says_what_the_load_balancer_slo_counts():
    """A stream cut mid-response was sent with a 200 (the load balancer's log:
    backend_connection_closed_after_partial_response_sent, status set by the backend): it counts
    as good, not as a 502/503; a pool at zero's 503s while it wakes count as bad."""
    from pathlib import Path

    guide = " ".join((Path(__file__).parents[1] / "docs/guides/operating-by-slo.md").read_text().split())
    assert "502s and 503s of a replica lost mid-request" not in guide
    assert "backend_connection_closed_after_partial_response_sent" in guide and "counts it good" in guide
    assert "A pool at `minReplicas: 0` trades availability for cost" in guide
