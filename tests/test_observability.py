"""Observability: dashboard JSON accepted by the Cloud Monitoring API schema, alert policies."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.conftest import props_of

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from google.cloud import monitoring_dashboard_v1, monitoring_v3


def dashboard(plan) -> dict:
    (d,) = props_of(plan, "gcp:monitoring/dashboard:Dashboard")
    return json.loads(d["dashboardJson"])


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_dashboard_parses_as_the_api_message(plans, stack):
    parsed = monitoring_dashboard_v1.Dashboard.from_json(json.dumps(dashboard(plans[stack])))
    assert len(parsed.mosaic_layout.tiles) == 11


def test_dashboard_rejects_unknown_fields(plans):
    from infra.manifests import validate_dashboard

    good = plans["dev"].platform.observability.dashboard_definition
    assert validate_dashboard(good) == []
    bad = json.loads(json.dumps(good))
    bad["mosaicLayout"]["tiles"][0]["widget"]["xyChart"]["dataSet"] = []
    (err,) = validate_dashboard(bad)
    assert "no field named \"dataSet\"" in err


def test_dashboard_panels(plans):
    tiles = dashboard(plans["dev"])["mosaicLayout"]["tiles"]
    queries = {t["widget"]["title"]: t["widget"]["xyChart"]["dataSets"][0]["timeSeriesQuery"]["prometheusQuery"]
               for t in tiles}
    assert "DCGM_FI_DEV_GPU_UTIL" in queries["GPU utilisation (DCGM)"]
    assert "vllm:request_queue_time_seconds_bucket" in queries["Queue time p95 (s)"]
    assert "vllm:time_to_first_token_seconds_bucket" in queries["Time to first token p95 (s)"]
    assert "vllm:generation_tokens_total" in queries["Generation tokens/s"]
    kv = queries["KV-cache usage"]
    assert "vllm:kv_cache_usage_perc" in kv and "vllm:gpu_cache_usage_perc" in kv
    assert all('cluster="vllm-dev"' in q for q in queries.values())
    # tiles do not overlap
    cells = {(t["xPos"], t["yPos"]) for t in tiles}
    assert len(cells) == len(tiles)


def test_alert_policies(plans):
    alerts = {a["displayName"]: a for a in props_of(plans["prod"], "gcp:monitoring/alertPolicy:AlertPolicy")}
    assert set(alerts) == {"vLLM container restarts (GPU OOM or crash)", "GPU memory nearly exhausted",
                           "Queue latency SLO breached", "Time-to-first-token SLO breached", "KV cache nearly full"}
    queue = alerts["Queue latency SLO breached"]["conditions"][0]["conditionPrometheusQueryLanguage"]
    assert queue["query"].endswith("> 1") and queue["duration"] == "300s"
    for alert in alerts.values():
        assert len(alert["notificationChannels"]) == 2
        # round-trips through the API proto: field names and enums are real
        monitoring_v3.AlertPolicy.from_json(json.dumps({
            k: v for k, v in alert.items() if k in ("displayName", "combiner", "conditions", "severity")}))
    channels = props_of(plans["prod"], "gcp:monitoring/notificationChannel:NotificationChannel")
    assert sorted(c["labels"]["email_address"] for c in channels) == ["ml-platform-oncall@acme.example", "sre@acme.example"]
