"""The Cloud Run models' monitoring (components/model/cloud_run_monitoring.py, components/cloud_run_monitoring.py,
the Observability hook): the metrics sidecar and its config, the SLOs and their burn-rate alerts, the dashboard."""

from __future__ import annotations

import json
from typing import Any

from vllm_gke.components.cloud_run_monitoring import RunMetricsSidecar, RunMetricsSidecarArgs
from vllm_gke.components.model.cloud_run_monitoring import (
    CONFIG_DIR,
    CONFIG_FILE,
    GUARD_REFUSALS_METRIC,
    RUN_CLUSTER,
    SIDECAR_IMAGE,
    CloudRunTarget,
    config_volume,
    gmp_sidecar,
    promql_name,
    run_dashboard_json,
    run_monitoring,
    run_monitoring_text,
    run_objectives,
    run_panels,
)
from vllm_gke.components.model.service_levels import TTFT_METRIC
from vllm_gke.components.model.specs import MonitoringSpec
from vllm_gke.components.model.vllm_server import PORT
from vllm_gke.components.observability import Observability, ObservabilityArgs
from vllm_gke.components.slo_metrics import prometheus_metrics
from vllm_gke.infra.manifests import validate_alert_policy, validate_dashboard, validate_slo
from vllm_gke.infra.plan import _under_mocks  # pyright: ignore[reportPrivateUsage]

TARGET = CloudRunTarget("qwen-1-5b", "vllm-qwen-1-5b", "us-central1")
SPEC = MonitoringSpec.model_validate({"notificationEmails": ["oncall@acme.example"]})


def test_the_sidecar_scrapes_the_servers_port_from_its_own_config():
    config = run_monitoring(PORT)
    # What the sidecar validates (confgenerator/config.go Validate) and reads.
    assert (config["apiVersion"], config["kind"]) == ("monitoring.googleapis.com/v1beta", "RunMonitoring")
    (endpoint,) = config["spec"]["endpoints"]
    assert endpoint == {"port": str(PORT), "path": "/metrics", "interval": "15s"}
    assert json.loads(run_monitoring_text(PORT)) == config
    sidecar = gmp_sidecar("vllm")
    assert sidecar["depends_ons"] == ["vllm"]
    assert sidecar["volume_mounts"] == [{"name": "rungmp-config", "mount_path": CONFIG_DIR}]
    volume = config_volume("the-secret", "3")
    assert volume["name"] == "rungmp-config"
    assert volume["secret"]["items"] == [{"version": "3", "path": CONFIG_FILE}]
    # Pinned to a release, not a moving tag: the one whose files the contract rows cite.
    from vllm_gke.infra.contracts.cloud_run_monitoring import ROWS, SIDECAR_AT

    tag = SIDECAR_IMAGE.rsplit(":", 1)[1]
    assert tag.count(".") == 2 and SIDECAR_AT.endswith(f"@{tag}")
    assert {r.version for r in ROWS if "sidecar" in r.component} == {tag}


def sidecar_resources() -> tuple[RunMetricsSidecar, list[Any]]:
    out: dict[str, RunMetricsSidecar] = {}

    def body() -> None:
        out["s"] = RunMetricsSidecar("m", RunMetricsSidecarArgs(
            "proj", "vllm-qwen-1-5b", "vllm", "serviceAccount:run@proj.iam.gserviceaccount.com"))

    recorded = _under_mocks("p", "dev", {}, body)
    return out["s"], recorded


def test_the_config_reaches_secret_manager_write_only_and_the_account_reads_it():
    sidecar, recorded = sidecar_resources()
    (version,) = [r for r in recorded if r.type == "gcp:secretmanager/secretVersion:SecretVersion"]
    # Write-only: no secretData (no-secret-literals refuses it in state; the write-only field Pulumi keeps
    # only as an encrypted input), and a changed text is a new version.
    assert "secretData" not in version.props
    assert version.props["secretDataWo"] == sidecar.config_text
    assert version.props["secretDataWoVersion"]
    grants = {(r.type.split(":")[-1], r.props["role"]) for r in recorded if "role" in r.props}
    assert grants == {("SecretIamMember", "roles/secretmanager.secretAccessor"),
                      ("IAMMember", "roles/monitoring.metricWriter")}
    assert all(r.props["member"] == "serviceAccount:run@proj.iam.gserviceaccount.com"
               for r in recorded if "role" in r.props)


def test_slos_select_the_service_cloud_run_names_and_the_sidecars_series():
    availability, ttft = run_objectives("vllm-staging", SPEC, [TARGET])
    assert availability.service == ttft.service == "vllm-vllm-staging-run-qwen-1-5b"
    ratio = availability.sli["good_total_ratio"]
    for flt in ratio.values():
        assert 'metric.type="run.googleapis.com/request_count" resource.type="cloud_run_revision"' in flt
        assert 'resource.label."service_name"="vllm-qwen-1-5b" resource.label."location"="us-central1"' in flt
    assert ratio["bad_service_filter"].endswith('"5xx"')
    cut = ttft.sli["distribution_cut"]
    assert f'resource.label."cluster"="{RUN_CLUSTER}" resource.label."namespace"="vllm-qwen-1-5b"' in \
        cut["distribution_filter"]
    assert cut["range"]["max"] <= SPEC.ttft_slo_seconds
    for o in (availability, ttft):
        assert validate_slo(o.slo_args(SPEC.slos.window_days)) == []
    # The seeding Job makes the TTFT histogram known before the SLO (Cloud Run's own metric needs none).
    assert list(prometheus_metrics([availability.sli, ttft.sli])) == [TTFT_METRIC]


def test_the_dashboard_charts_cloud_runs_metrics_by_service_and_parses():
    board = run_dashboard_json("t", [TARGET], [("qwen-1-5b (Cloud Run): x", "<slo>")])
    assert validate_dashboard(board) == []
    queries = [q for _, q in run_panels([TARGET])]
    # By response code: Cloud Run's own 429 (no instance free) and the guard's are one response class.
    assert any(q.startswith("sum by (service_name, response_code) (rate(run_googleapis_com:request_count") for q in queries)
    assert not any("response_code_class" in q for q in queries)
    assert any("run_googleapis_com:container_instance_count" in q for q in queries)
    assert all('service_name=~"vllm-qwen-1-5b"' in q or 'namespace=~"vllm-qwen-1-5b"' in q for q in queries)
    assert len(board["mosaicLayout"]["tiles"]) == len(queries) + 1
    assert promql_name("run.googleapis.com/container/instance_count") == "run_googleapis_com:container_instance_count"


def observe(cloud_run: list[CloudRunTarget]) -> tuple[Observability, list[Any]]:
    out: dict[str, Observability] = {}

    def body() -> None:
        out["o"] = Observability("obs", ObservabilityArgs(
            project="proj", cluster_name="vllm-staging", spec=SPEC, title="vLLM", models=["llama-8b"],
            tenants=["search"], cloud_run=cloud_run))

    recorded = _under_mocks("p", "dev", {}, body)
    return out["o"], recorded


def test_observability_keeps_cloud_run_slos_with_burn_rate_alerts_on_a_dashboard_of_their_own():
    obs, recorded = observe([TARGET])
    levels = obs.service_levels
    assert levels is not None
    run = [o for o in levels.objectives if o.service.endswith("-run-qwen-1-5b")]
    assert [o.slo_id for o in run] == ["availability", "ttft"]
    burns = [p for p in levels.alert_definitions if "(Cloud Run)" in p["display_name"]]
    assert len(burns) == 2 * 3 and all(validate_alert_policy(p) == [] for p in burns)
    assert {p["severity"] for p in burns} == {"CRITICAL", "ERROR", "WARNING"}
    board = obs.run_dashboard_definition
    assert board is not None and validate_dashboard(board) == []
    titles = [t["widget"]["title"] for t in board["mosaicLayout"]["tiles"]]
    assert sum(t.startswith("Error budget remaining: qwen-1-5b (Cloud Run)") for t in titles) == 2
    # The GKE dashboard keeps its own budgets only.
    main = [t["widget"]["title"] for t in obs.dashboard_definition["mosaicLayout"]["tiles"]]
    assert not any("(Cloud Run)" in t for t in main)
    dashboards = [r.name for r in recorded if r.type == "gcp:monitoring/dashboard:Dashboard"]
    assert "obs-run-dashboard" in dashboards
    # Its threshold alerts, after the GKE ones (whose resource names stay).
    names = [p["display_name"] for p in obs.alert_definitions]
    assert names[-1] == "Cloud Run refuses requests: no instance free" and names.count(names[-1]) == 1


def test_no_cloud_run_models_no_cloud_run_dashboard_or_slos():
    obs, recorded = observe([])
    assert obs.run_dashboard is None
    assert obs.service_levels is not None
    assert not any("(Cloud Run)" in o.display_name for o in obs.service_levels.objectives)
    assert "obs-run-dashboard" not in [r.name for r in recorded]
    assert not any("Cloud Run" in p["display_name"] for p in obs.alert_definitions)


def test_the_platform_gives_staging_s_cloud_run_model_its_slos_and_dashboard(plans):
    """The Platform hands its Cloud Run models to Observability: their SLOs, burn-rate alerts and dashboard."""
    plan = plans["staging"]
    slos = [r.name for r in plan.of_type("gcp:monitoring/slo:Slo") if "-run-qwen-1-5b-" in r.name]
    assert sorted(s.rsplit("-", 1)[1] for s in slos) == ["availability", "ttft"]
    assert sum("-run-qwen-1-5b-" in r.name for r in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")) == 6
    assert "observability-run-dashboard" in [r.name for r in plan.of_type("gcp:monitoring/dashboard:Dashboard")]
    # Its threshold alerts (staging's limits are global; its model keeps no instance up, so no absence alert).
    names = [r.props["displayName"] for r in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")]
    assert [n for n in names if "Cloud Run" in n and "SLO" not in n] == ["Shared limit store unreachable from Cloud Run",
                                                                        "Cloud Run refuses requests: no instance free"]


def test_the_plan_parses_the_cloud_run_dashboard_as_it_does_the_gke_ones(plans):
    """A Cloud Run dashboard the API would reject fails the plan, as the stack's own dashboard does."""
    import copy

    from vllm_gke.infra.plan_report import monitoring_problems

    obs = copy.copy(plans["staging"].platform.observability)
    assert obs.run_dashboard_definition is not None and monitoring_problems(obs) == []
    bad = copy.deepcopy(obs.run_dashboard_definition)
    bad["mosaicLayout"]["tiles"][0]["widget"]["xyChart"]["dataSet"] = []
    obs.run_dashboard_definition = bad
    (err,) = monitoring_problems(obs)
    assert 'no field named "dataSet"' in err


def test_the_cloud_run_ttft_slo_cuts_at_one_of_its_servers_buckets(plans):
    """The SLO cuts vLLM's histogram at ttftSloSeconds (exact, as on GKE): the Cloud Run server must have that
    bound among its TTFT buckets (--custom-histogram-buckets), else Cloud Monitoring cuts at a default bound."""
    from vllm_gke.components.model.vllm_versions import TTFT_BUCKETS

    plan = plans["staging"]
    (slo,) = [r for r in plan.of_type("gcp:monitoring/slo:Slo") if r.name.endswith("-run-qwen-1-5b-ttft")]
    bound = slo.props["requestBasedSli"]["distributionCut"]["range"]["max"]
    (service,) = plan.of_type("gcp:cloudrunv2/service:Service")
    args = service.props["template"]["containers"][0]["args"]
    flag = "--custom-histogram-buckets"
    buckets = json.loads(args[args.index(flag) + 1])["time_to_first_token"] if flag in args else list(TTFT_BUCKETS)
    assert bound not in TTFT_BUCKETS and bound in buckets, (bound, buckets)


GUARDED = (GUARD_REFUSALS_METRIC, "vllm_gke_tenant_requests_total")


def _guard_exported() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The guard's counters as its /metrics text exports them (prometheus_client's registry)."""
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())
            for s in f.samples if s.name in GUARDED}


def rate_limited_probe() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The real guard: a tenant at 2 requests a minute sends 4; what its /metrics gained."""
    from tests.test_guard import Clock, Recorder, call, config, guard, status

    before = _guard_exported()
    mw = guard.GuardMiddleware(Recorder(), config(rpm=2, model="refusals-probe"), Clock())
    assert [status(call(mw, {"prompt": "x"})) for _ in range(4)] == [200, 200, 429, 429]
    gained = {k: v - before.get(k, 0.0) for k, v in _guard_exported().items()}
    return {k: v for k, v in gained.items() if v and dict(k[1]).get("model", "refusals-probe") == "refusals-probe"}


def _refusals_recording(probe: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> str:
    """Per scrape (a minute): Cloud Run's 429s on four services, and the probe's guard series (scaled) on three.
    vllm-a: its guards answered the probe's 2 429s, Cloud Run 5 (3 its own); vllm-b: 2, all the guard's;
    vllm-c: 5 and no guard reporting (no instance up); vllm-d: 40 from Cloud Run, 39 from its guards (the
    sources' windows differ by a sample: within the alert's margin)."""
    from tests.recorded_series import _labels  # pyright: ignore[reportPrivateUsage]
    from tests.test_cloud_run_usage import SCRAPE, SCRAPES, START, _counter  # pyright: ignore[reportPrivateUsage]

    run = {"monitored_resource": "cloud_run_revision", "location": "us-central1", "response_code": "429"}
    run429 = [_counter(promql_name("run.googleapis.com/request_count"), {**run, "service_name": s}, n, "unknown")
              for s, n in (("vllm-a", 5.0), ("vllm-b", 2.0), ("vllm-c", 5.0), ("vllm-d", 40.0))]
    families = {name: f"# TYPE {name.removesuffix('_total')} counter\n" for name in GUARDED}
    for service, scale in (("vllm-a", 1.0), ("vllm-b", 1.0), ("vllm-d", 19.5)):
        for (name, labels), n in probe.items():
            sidecar = {**dict(labels), "cluster": RUN_CLUSTER, "job": "vllm", "namespace": service}
            families[name] += "".join(f"{name}{{{_labels(sidecar)}}} {n * scale * i:g} {START + SCRAPE * i}\n"
                                      for i in range(SCRAPES))
    return run429[0] + "".join(p.split("\n", 1)[1] for p in run429[1:]) + "".join(families.values())


def test_the_guard_counts_its_rate_limit_429s_that_no_tenant_meter_counts():
    """The guard answers a rate limit before any meter exists: its refusals counter has each 429."""
    probe = rate_limited_probe()
    by = {(name, dict(labels).get("code") or dict(labels).get("outcome")): n for (name, labels), n in probe.items()}
    assert by == {(GUARD_REFUSALS_METRIC, "429"): 2.0, ("vllm_gke_tenant_requests_total", "ok"): 2.0}


def test_cloud_runs_own_429s_are_told_from_the_guards_on_a_real_prometheus():
    """The dashboard's and the alert's query, on the real guard's series: what Cloud Run answered 429 beyond
    its guards' 429s, rate limits included; the alert beyond a margin."""
    import shutil

    import pytest

    from tests.test_cloud_run_usage import SCRAPE, SCRAPES, START, served
    from vllm_gke.components.model.cloud_run_monitoring import run_alert_policies, run_refusals

    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom is None or tool is None:
        pytest.skip("missing prometheus or promtool")
    targets = [CloudRunTarget(s[-1], s, "us-central1") for s in ("vllm-a", "vllm-b", "vllm-c", "vllm-d")]
    (refused,) = [p for p in run_alert_policies(targets) if p["display_name"].startswith("Cloud Run refuses")]
    alert = refused["conditions"][0]["condition_prometheus_query_language"]["query"]
    at = START + SCRAPE * (SCRAPES - 1)
    for recorded in served((prom, tool), _refusals_recording(rate_limited_probe())):
        per_s = {r["metric"]["service_name"]: float(r["value"][1]) for r in recorded.query(run_refusals(targets), at)}
        assert per_s == pytest.approx({"vllm-a": 3 / 60, "vllm-b": 0.0, "vllm-c": 5 / 60, "vllm-d": 1 / 60}, abs=1e-3)
        assert sorted(r["metric"]["service_name"] for r in recorded.query(alert, at)) == ["vllm-a", "vllm-c"]


def test_cloud_run_alerts_see_the_sidecars_series_and_parse():
    from vllm_gke.components.model.cloud_run_monitoring import run_alert_policies

    always_on = CloudRunTarget("qwen-1-5b", "vllm-qwen-1-5b", "us-central1", always_on=True)
    policies = run_alert_policies([always_on, CloudRunTarget("b", "vllm-b", "us-central1")], limit_store=True)
    assert [p["display_name"] for p in policies] == [
        "Shared limit store unreachable from Cloud Run", "Cloud Run refuses requests: no instance free",
        "No Cloud Run instance of qwen-1-5b reports"]
    assert all(validate_alert_policy(p) == [] for p in policies)
    queries = [p["conditions"][0]["condition_prometheus_query_language"]["query"] for p in policies]
    assert 'vllm_gke_guard_limit_store_fallbacks_total{cluster="__run__",namespace=~"vllm-qwen-1-5b|vllm-b"}' in queries[0]
    assert queries[2] == 'absent(vllm:num_requests_running{cluster="__run__",namespace="vllm-qwen-1-5b"})'
    assert run_alert_policies([]) == [] and len(run_alert_policies([always_on])) == 2


def test_the_guide_names_the_pinned_sidecar_and_what_write_only_keeps():
    from pathlib import Path

    guide = " ".join((Path(__file__).parent.parent / "docs" / "guides" / "cloud-run.md").read_text().split())
    assert f"`cloud-run-gmp-sidecar:{SIDECAR_IMAGE.rsplit(':', 1)[1]}`" in guide
    assert "not in Pulumi state" not in guide and "keeps in the state's inputs as an encrypted secret" in guide
