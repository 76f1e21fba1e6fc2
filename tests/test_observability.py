"""Observability: dashboard JSON accepted by the Cloud Monitoring API schema, alert policies."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.conftest import manifests_of, props_of

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from google.cloud import monitoring_dashboard_v1, monitoring_v3


def dashboard(plan) -> dict:
    """The platform's dashboard (the tenants' own is beside it)."""
    (d,) = [r.props for r in plan.of_type("gcp:monitoring/dashboard:Dashboard")
            if not r.name.endswith(("tenant-dashboard", "run-dashboard"))]
    return json.loads(d["dashboardJson"])


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_dashboard_parses_as_the_api_message(plans, stack):
    parsed = monitoring_dashboard_v1.Dashboard.from_json(json.dumps(dashboard(plans[stack])))
    # one more where limits are shared across replicas (prod): the limit store's fallbacks; three
    # of tenants' requests and tokens; one error budget per SLO (the gateway's among them)
    cfg = plans[stack].config
    slos = 2 * len(cfg.models) + len(cfg.tenants) + 1
    assert len(parsed.mosaic_layout.tiles) == (13 if cfg.global_limits.enabled else 12) + 3 + slos


def test_dashboard_rejects_unknown_fields(plans):
    from vllm_gke.infra.manifests import validate_dashboard

    good = plans["dev"].platform.observability.dashboard_definition
    assert validate_dashboard(good) == []
    bad = json.loads(json.dumps(good))
    bad["mosaicLayout"]["tiles"][0]["widget"]["xyChart"]["dataSet"] = []
    (err,) = validate_dashboard(bad)
    assert "no field named \"dataSet\"" in err


def test_dashboard_panels(plans):
    tiles = dashboard(plans["dev"])["mosaicLayout"]["tiles"]
    queries = {t["widget"]["title"]: q["prometheusQuery"] for t in tiles
               if "prometheusQuery" in (q := t["widget"]["xyChart"]["dataSets"][0]["timeSeriesQuery"])}
    # Per MIG instance: DCGM_FI_DEV_GPU_UTIL is not reported for MIG slices.
    gpu = queries["GPU utilisation per GPU or MIG slice (DCGM engine active)"]
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in gpu and "GPU_I_ID" in gpu
    assert not any("DCGM_FI_DEV_GPU_UTIL" in q for q in queries.values())
    assert "vllm:request_queue_time_seconds_bucket" in queries["Queue time p95 (s)"]
    assert "vllm:time_to_first_token_seconds_bucket" in queries["Time to first token p95 (s)"]
    assert "vllm:generation_tokens_total" in queries["Generation tokens/s"]
    assert "vllm_gke_guard_untrusted_peer_requests_total" in queries[
        "Tenant requests refused: not from the mesh sidecar (/s)"]
    kv = queries["KV-cache usage"]
    assert "vllm:kv_cache_usage_perc" in kv and "vllm:gpu_cache_usage_perc" not in kv
    assert all('cluster="vllm-dev"' in q for q in queries.values())
    # tiles do not overlap
    cells = {(t["xPos"], t["yPos"]) for t in tiles}
    assert len(cells) == len(tiles)


def test_alert_policies(plans):
    alerts = {a["displayName"]: a for a in props_of(plans["prod"], "gcp:monitoring/alertPolicy:AlertPolicy")
              if not a["displayName"].startswith("SLO ")}  # the burn-rate alerts: tests/test_service_levels.py
    assert set(alerts) == {"Shared limit store unreachable", "Tenant requests bypass or miss the mesh sidecar",
                           "vLLM container restarts (GPU OOM or crash)",
                           "GPU memory nearly exhausted",
                           "Queue latency SLO breached", "Time-to-first-token SLO breached", "KV cache nearly full",
                           # Every prod model keeps a replica floor: paged when none of its replicas reports.
                           *(f"No replica of {m.name} reports" for m in plans["prod"].config.models),
                           # prod has a tenant of negative priority: a ticket while it is shed
                           "Tenants shed for overload",
                           # prod rolls out by canary: paged when Flagger rolls one back (components/flagger.py)
                           "Canary rolled back"}
    gone = alerts["No replica of llama-70b reports"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert gone["query"] == 'absent(vllm:num_requests_running{cluster="vllm-prod", model_name="llama-70b"})'
    assert alerts["No replica of llama-70b reports"]["severity"] == "CRITICAL"
    peers = alerts["Tenant requests bypass or miss the mesh sidecar"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert "vllm_gke_guard_untrusted_peer_requests_total" in peers["query"] and peers["duration"] == "300s"
    queue = alerts["Queue latency SLO breached"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert queue["query"].endswith("> 1") and queue["duration"] == "300s"
    for alert in alerts.values():
        assert len(alert["notificationChannels"]) == 2
        # round-trips through the API proto: field names and enums are real
        monitoring_v3.AlertPolicy.from_json(json.dumps({
            k: v for k, v in alert.items() if k in ("displayName", "combiner", "conditions", "severity")}))
    channels = props_of(plans["prod"], "gcp:monitoring/notificationChannel:NotificationChannel")
    assert sorted(c["labels"]["email_address"] for c in channels) == ["ml-platform-oncall@acme.example", "sre@acme.example"]


def test_a_model_that_scales_to_zero_is_not_paged_for_having_no_replica(plan_variant):
    def to_zero(values):
        for w in ("short", "long"):
            values["vllm-gke:models"][0][w]["minReplicas"] = 0
        values["vllm-gke:nodePools"][0]["minNodes"] = 0

    plan = plan_variant("dev", to_zero)
    (model,) = plan.config.models
    paged = [a["displayName"] for a in props_of(plan, "gcp:monitoring/alertPolicy:AlertPolicy")
             if a["displayName"].startswith("No replica of ")]
    assert paged == [] and model.short.min_replicas == model.long.min_replicas == 0
    assert [a["displayName"] for a in props_of(plan_variant("dev"), "gcp:monitoring/alertPolicy:AlertPolicy")
            if a["displayName"].startswith("No replica of ")] == [f"No replica of {model.name} reports"]


def exposed(snapshot) -> set[str]:
    """Series names a release's metrics appear under in Prometheus (counters _total, histograms _bucket...)."""
    names = set()
    for m in snapshot["metrics"]:
        name, kind = m["name"], m["kind"]
        if kind == "counter":
            names |= {name, name.removesuffix("_total") + "_total"}
        elif kind == "histogram":
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(name)
    return names


@pytest.mark.parametrize("version", ["0.34.0", "0.11.0"])
def test_every_vllm_metric_used_exists_in_the_release(plan_variant, version):
    import re

    from vllm_gke.components.model.vllm_argv import load_snapshot

    def on(values):
        values["vllm-gke:vllmVersion"] = version
        if version != "0.34.0":  # traces need a release that ships OpenTelemetry
            values["vllm-gke:monitoring"]["traces"]["enabled"] = False

    plan = plan_variant("prod", on)
    obs = plan.platform.observability
    texts = [json.dumps(obs.dashboard_definition), json.dumps(obs.alert_definitions)]
    texts += [json.dumps(h["spec"]["metrics"]) for h in manifests_of(plan, "HorizontalPodAutoscaler")]
    used = {m for t in texts for m in re.findall(r"vllm:[a-z0-9_:]+", t)}
    assert used and "vllm:num_requests_waiting" in used
    missing = used - exposed(load_snapshot(version))
    assert not missing, f"vLLM {version} exports no {sorted(missing)}"


def test_alert_policies_parse_as_api_messages_and_a_typo_does_not(plans):
    from vllm_gke.infra.manifests import validate_alert_policy

    policies = plans["prod"].platform.observability.alert_definitions
    assert policies and all(validate_alert_policy(p) == [] for p in policies)
    bad = json.loads(json.dumps(policies[0]))
    bad["conditions"][0]["condition_prometheus_query_language"]["evaluation_intervall"] = "60s"
    (err,) = validate_alert_policy(bad)
    assert "evaluationIntervall" in err


def test_each_tenant_has_its_row_on_the_tenant_dashboard(plans):
    """Requests by outcome, tokens as vLLM counted them, and the error budget left, per tenant:
    a message the Cloud Monitoring API parses, the resource built from the same definition."""
    import json

    from vllm_gke.infra.manifests import validate_dashboard

    plan = plans["prod"]
    obs = plan.platform.observability
    board = obs.tenant_dashboard_definition
    assert validate_dashboard(board) == []
    titles = [t["widget"]["title"] for t in board["mosaicLayout"]["tiles"]]
    for tenant in plan.config.tenants:
        mine = [t for t in titles if t.startswith(f"{tenant.name}:") or t.startswith(
            f"Error budget remaining: tenant {tenant.name}:")]
        assert len(mine) == 3, (tenant.name, titles)
    queries = json.dumps(board)
    assert 'tenant=\\"search\\"' in queries and "vllm_gke_tenant_generation_tokens_total" in queries
    (resource,) = [r for r in plan.of_type("gcp:monitoring/dashboard:Dashboard") if r.name.endswith("tenant-dashboard")]
    deployed = json.loads(resource.props["dashboardJson"])
    assert [t["widget"]["title"] for t in deployed["mosaicLayout"]["tiles"]] == titles
    assert '\\"projects/acme-llm-prod/services/vllm-vllm-prod-tenant-search/' in resource.props["dashboardJson"]


def test_the_waiting_running_tile_shows_both_gauges():
    """PromQL's `a or b` keeps b's series only where a has none with the same labels: both sides
    summed by model_name alone, running never showed. Each side carries its own `state`."""
    import re

    from vllm_gke.components.model.monitoring import dashboard_panels

    (query,) = [q for title, q in dashboard_panels("c") if title == "Requests waiting / running"]
    sides = query.split(" or ")
    labels = []
    for side, metric in zip(sides, ("vllm:num_requests_waiting", "vllm:num_requests_running")):
        assert metric in side
        grouped = set(re.search(r"sum by \(([^)]*)\)", side).group(1).replace(" ", "").split(","))
        added = re.findall(r'label_replace\(.*, "(\w+)", "(\w+)", "", ""\)', side)
        labels.append(frozenset(grouped | {f"{k}={v}" for k, v in added}))
    assert len(sides) == 2 and labels[0] != labels[1]
