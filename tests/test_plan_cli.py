"""The offline plan command: runs the real program, prints, writes manifests and dashboards."""

from __future__ import annotations

import copy
import io
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import REPO_ROOT
from vllm_gke.infra.cli import app
from vllm_gke.infra.contracts import CONTRACTS
from vllm_gke.infra.plan_report import plan_report, render_json, vllm_argv_problems
from vllm_gke.infra.plan_text import render_text

runner = CliRunner()


def test_plan_dev_writes_outputs(tmp_path):
    result = runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "stack dev:" in result.output
    assert "Kubernetes manifests pass schema validation" in result.output
    assert "dashboard and alert policies parse as Cloud Monitoring API messages" in result.output
    root = tmp_path / "dev"
    docs = list(yaml.safe_load_all((root / "manifests" / "all.yaml").read_text()))
    assert {d["kind"] for d in docs} >= {"Deployment", "HTTPRoute", "AuthorizationPolicy", "PersistentVolume"}
    assert (root / "manifests" / "vllm" / "deployment-qwen-7b-short.yaml").exists()
    dashboard = json.loads((root / "dashboard.json").read_text())
    assert dashboard["displayName"].startswith("vLLM on GKE - vllm-dev")
    # the six threshold alerts, and qwen-7b's (it keeps a replica floor) when none of its replicas reports
    assert len(json.loads((root / "alert-policies.json").read_text())) == 7
    inventory = json.loads((root / "resources.json").read_text())
    provider = next(r for r in inventory if r["type"] == "pulumi:providers:kubernetes")
    assert provider["props"]["kubeconfig"] == "[secret]"
    job = next(r for r in inventory if r["name"] == "mesh-job")
    assert "gke-k8s" in job["dependsOn"]  # what the engine waits for, by name


def test_plan_detail_lists_components():
    result = runner.invoke(app, ["plan", "--stack", "prod", "--no-write", "--detail"])
    assert result.exit_code == 0, result.output
    assert "VllmService/llama-70b-long" in result.output
    assert "TenantAuth/tenant-analytics" in result.output


def test_unknown_stack_exits_2():
    result = runner.invoke(app, ["plan", "--stack", "qa", "--no-write"])
    assert result.exit_code == 2
    assert "no stack 'qa'" in result.output and "dev, frontier, prod, staging" in result.output


def test_stacks_command():
    result = runner.invoke(app, ["stacks"])
    assert result.output.split() == ["dev", "frontier", "prod", "staging", "tuned"]


def test_plan_prints_verdicts_capacity_and_cost(tmp_path):
    result = runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "gpu-node-pools-tainted" in out and "max-tokens-cap" in out
    assert "capacity per serving pool" in out and "48,130" in out and "accelerator options per model" in out
    assert "per million tokens" in out and "list prices as of" in out
    verdicts = json.loads((tmp_path / "dev" / "verdicts.json").read_text())
    assert all(p["violations"] == [] for p in verdicts["policies"])
    assert [c["fits"] for c in verdicts["capacity"]] == [True, True]
    assert verdicts["cost"]["baselineMonth"] > 0


def _untainted_plan(real_run_plan):
    def run(stack, stacks_dir):
        plan = real_run_plan(stack, stacks_dir)
        for r in plan.resources:
            if r.type == "gcp:container/nodePool:NodePool" and "guestAccelerators" in r.props["nodeConfig"]:
                r.props["nodeConfig"]["taints"] = []
        return plan
    return run


def test_mandatory_violation_exits_1(monkeypatch):
    from vllm_gke.infra import cli as infra_cli

    monkeypatch.setattr(infra_cli, "run_plan", _untainted_plan(infra_cli.run_plan))
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write"])
    assert result.exit_code == 1
    assert "mandatory gpu-node-pools-tainted" in " ".join(result.output.split())


def test_policy_config_can_demote_to_advisory(monkeypatch, tmp_path):
    from vllm_gke.infra import cli as infra_cli

    monkeypatch.setattr(infra_cli, "run_plan", _untainted_plan(infra_cli.run_plan))
    config = tmp_path / "levels.json"
    config.write_text(json.dumps({"gpu-node-pools-tainted": "advisory"}))
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--policy-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "advisory gpu-node-pools-tainted" in " ".join(result.output.split())


def test_bad_policy_config_exits_2(tmp_path):
    config = tmp_path / "levels.json"
    config.write_text(json.dumps({"no-such-policy": "mandatory"}))
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--policy-config", str(config)])
    assert result.exit_code == 2
    assert "unknown policies in policy config: no-such-policy" in " ".join(result.output.split())


def test_plan_without_upstream_crds_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_GKE_CRDS_DIR", str(tmp_path / "absent"))
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write"])
    assert result.exit_code == 0, result.output
    assert "custom resources not checked: no upstream CRDs" in result.output


def test_plan_with_a_crd_folder_that_is_not_one(tmp_path):
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--crds", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "--crds" in result.output and "Traceback" not in result.output


def test_plan_checks_every_vllm_command_line(plans):
    assert vllm_argv_problems(plans["dev"]) == []
    docs = copy.deepcopy(plans["dev"].manifests())
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "qwen-7b-short")
    deployment["spec"]["template"]["spec"]["containers"][0]["args"].append("--no-such-flag")
    tampered = SimpleNamespace(config=plans["dev"].config, manifests=lambda: docs)
    ((what, err),) = vllm_argv_problems(tampered)
    assert what == "Deployment vllm/qwen-7b-short" and "--no-such-flag" in err


def test_plan_output_holds_only_this_plans_manifests_in_a_stable_order(tmp_path):
    stale = tmp_path / "dev" / "manifests" / "vllm" / "persistentvolumeclaim-model-weights-000000.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("kind: PersistentVolumeClaim\n")
    assert runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path)]).exit_code == 0
    assert not stale.exists()
    first = (tmp_path / "dev" / "manifests" / "all.yaml").read_text()
    inventory = (tmp_path / "dev" / "resources.json").read_text()
    assert runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path)]).exit_code == 0
    assert (tmp_path / "dev" / "manifests" / "all.yaml").read_text() == first
    assert (tmp_path / "dev" / "resources.json").read_text() == inventory


def test_schema_command_writes_the_package_schema_without_the_pulumi_cli(tmp_path):
    import vllm_gke.infra.manifests  # noqa: F401  (the plan's checks loaded first, as in `vllm-gke`)
    from tests.test_package import package_schema

    result = runner.invoke(app, ["schema", "--out", str(tmp_path / "schema.json")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "schema.json").read_text())
    assert written == package_schema() and "vllm-gke:index:VllmService" in written["resources"]


def test_bracketed_keys_print_as_written(tmp_path):
    """The console reads [..] as markup: a key like tenants[dev-team] must reach the terminal whole."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text().replace("      maxTokens: 1024", "      maxToken: 1024")
    (stacks / "Pulumi.dev.yaml").write_text(text)
    result = runner.invoke(app, ["plan", "--stack", "dev", "--stacks-dir", str(stacks), "--no-write"])
    assert result.exit_code == 2 and ("vllm-gke:tenants[dev-team].maxToken: is not a known setting; did you mean "
                                      "maxTokens?") in " ".join(result.output.split())
    # A value echoed back keeps what looks like markup.
    (stacks / "Pulumi.dev.yaml").write_text(text.replace("zones: [us-central1-a]", "zones: ['[red]a']"))
    result = runner.invoke(app, ["plan", "--stack", "dev", "--stacks-dir", str(stacks), "--no-write"])
    assert result.exit_code == 2 and "'[red]a'" in result.output


def test_plan_output_json_is_one_document_for_machines(tmp_path):
    result = runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path), "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc == {**json.loads((tmp_path / "dev" / "verdicts.json").read_text()), "checks": doc["checks"],
                   "written": doc["written"]}
    assert doc["checks"]["manifests"] == [] and doc["checks"]["contracts"] == [] and doc["checks"]["vllmArgs"] == []
    # One spelling for machines: camelCase as in the stack config, and each pool says if its peak is capped.
    (pool,) = doc["cost"]["pools"]
    assert {"machineType", "baselineNodes", "peakNodes", "wantedPeakNodes", "capped", "peakMonth"} <= set(pool)
    assert not [k for row in [pool, *doc["capacity"], *doc["acceleratorOptions"]] for k in row if "_" in k]
    # The model's options across GPUs and TPUs, each with what it serves and costs.
    options = doc["acceleratorOptions"]
    assert {o["model"] for o in options} == {"qwen-7b"}
    assert {"tpu-v6e-slice", "nvidia-l4"} <= {o["accelerator"] for o in options}
    assert all(o["tokensPerSecond"] > 0 and o["usdPerMillionTokens"] > 0 for o in options)
    assert doc["cost"]["throughputSource"] == "roofline" and doc["cost"]["baselineTokensPerSecond"] > 0
    assert runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--output", "yaml"]).exit_code == 2


def test_plan_text_puts_decisions_first_and_resource_counts_last():
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write"])
    text = result.output
    assert text.index("capacity per serving pool") < text.index("monthly cost") < text.index("warning:") \
        < text.index("tenant URLs") < text.index("policies") < text.index("stack dev:")


def _rendered(report) -> tuple[str, dict]:
    out = io.StringIO()
    render_text(report, Console(file=out, width=1000), detail=False)
    return " ".join(out.getvalue().split()), json.loads(render_json(report))


def test_text_and_json_render_the_same_report(plans, tmp_path):
    """One PlanReport, two renderings: whatever the report holds, both say (a finding of each kind
    added here, so that every list has something in it)."""
    report = plan_report(plans["dev"], {}, None, tmp_path)
    report.verdicts.warnings.append("a warning [in brackets] only this test gives")
    report = replace(report, manifest_problems=[("Deployment vllm/x", ["spec.replicas: not an integer"])],
                     broken_contracts=[(CONTRACTS[0], "a contract this test breaks")],
                     vllm_args=[("Deployment vllm/y", "unrecognized arguments: --no-such-flag")],
                     monitoring=["a dashboard the API would reject"])
    text, doc = _rendered(report)
    assert report.verdicts.warnings and doc["warnings"] == report.verdicts.warnings
    assert all(" ".join(w.split()) in text for w in report.verdicts.warnings)
    assert doc["checks"]["manifests"] == [{"resource": "Deployment vllm/x", "errors": ["spec.replicas: not an integer"]}]
    assert "Deployment vllm/x: spec.replicas: not an integer" in text
    assert doc["checks"]["contracts"][0]["problem"] == "a contract this test breaks" and "a contract this test breaks" in text
    assert doc["checks"]["vllmArgs"][0]["error"].endswith("--no-such-flag") and "--no-such-flag" in text
    assert doc["checks"]["monitoring"] == ["a dashboard the API would reject"] and "a dashboard the API would reject" in text
    assert all(p["name"] in text for p in doc["policies"])
    assert all(u["url"] in text for u in doc["tenantUrls"])
    assert doc["written"] == [str(f) for f in report.written] and f"wrote {len(report.written)} files" in text
    assert report.unsafe


def test_a_clean_report_is_safe_and_its_checks_empty(plans):
    report = plan_report(plans["dev"], {}, None, None)
    text, doc = _rendered(report)
    assert not report.unsafe and report.written == [] and doc["written"] == []
    assert doc["checks"]["customResourcesChecked"] == report.custom_resources_checked
    assert f"all {report.manifests} Kubernetes manifests pass schema validation" in text and "wrote" not in text


def test_the_detailed_resource_list_is_in_a_stable_order(plans):
    """Resources register in whatever order the program's outputs resolve: the list sorts them, so
    two plans of one stack print the same lines (and a diff of two commits shows only changes)."""
    from vllm_gke.infra.plan_text import resource_table

    plan = plans["prod"]
    table = resource_table(plan, detail=True)
    rows = list(zip(*(c.cells for c in table.columns)))
    assert rows == sorted(rows) and len(rows) == sum(r.custom for r in plan.resources)
    shuffled = replace(plan, resources=list(reversed(plan.resources)))
    assert list(zip(*(c.cells for c in resource_table(shuffled, detail=True).columns))) == rows


def test_two_runs_of_a_plan_write_the_same_resources(tmp_path):
    """The mocks' ids are the same in every run (Python's str hash is not): a plan is reproducible."""
    import os
    import subprocess
    import sys

    written = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        cli = [sys.executable, "-c", "from vllm_gke.infra.entry import main; main()"]
        subprocess.run([*cli, "plan", "--stack", "dev", "--out", str(out)], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, cwd=REPO_ROOT)
        written.append((out / "dev" / "resources.json").read_text())
    assert written[0] == written[1] and "notificationChannels/" in written[0]


def test_the_options_tables_stack_row_is_the_cost_reports_replica(plans):
    """The replica the stack runs is a row of its own, priced as the cost report prices it: dev's MIG
    slice of a spot a2-highgpu-1g (half the node's spot price), at the capacity table's tokens/s."""
    from vllm_gke.infra.pricing import MACHINE_PRICES
    from vllm_gke.infra.report import verdicts

    v = verdicts(plans["dev"])
    (row,) = [o for o in v.options if o.this_stack]
    assert (row.model, row.machine_type, row.spot) == ("qwen-7b", "a2-highgpu-1g 3g.20gb", True)
    assert row.usd_per_hour == pytest.approx(MACHINE_PRICES["a2-highgpu-1g"].spot_hour / 2)
    short = next(r for r in v.capacity if r.model == "qwen-7b" and r.pool == "short")
    assert row.tokens_per_second == short.decode_tokens_s
    replicas = v.cost.replicas
    assert v.cost.baseline_tokens_per_second == sum(r.tokens_per_second * r.min_replicas for r in replicas)
    doc = json.loads(runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--output", "json"]).stdout)
    assert [o["machineType"] for o in doc["acceleratorOptions"] if o["thisStack"]] == ["a2-highgpu-1g 3g.20gb"]


def test_no_option_prices_a_share_of_a_machine_a_smaller_one_replaces(plans):
    """A 1-GPU replica is an a2-highgpu-1g, not a sixteenth of an a2-megagpu-16g nobody rents by the GPU."""
    from vllm_gke.components.model.catalog import MACHINE_TYPES
    from vllm_gke.infra.report import verdicts

    for stack in ("dev", "prod", "frontier"):
        for o in verdicts(plans[stack]).options:
            if o.cloud_run:  # a Cloud Run instance: one GPU billed by the second, no machine's share
                continue
            machine = MACHINE_TYPES[o.machine_type.split()[0]]
            if o.this_stack or machine.is_tpu or o.hosts > 1:
                continue
            smaller = [m.name for m in MACHINE_TYPES.values() if m.accelerator is machine.accelerator
                       and o.devices <= m.gpus < machine.gpus and m.gpus % o.devices == 0]
            assert smaller == [], (stack, o.model, o.machine_type, smaller)


def test_a_tenant_ceiling_is_bounded_by_what_the_stack_makes(plans):
    """dev-team's rate limit allows more tokens than dev makes at peak: the ceiling says capacity bounds
    it and never costs more than the stack at peak."""
    from vllm_gke.infra.report import verdicts

    v = verdicts(plans["dev"])
    (c,) = v.ceilings
    peak_tokens = v.cost.peak_tokens_per_second * v.cost.utilization * 3600 * v.cost.hours_per_month
    assert c.bound_by == "capacity" and c.limit_tokens_month > peak_tokens
    assert c.tokens_month == pytest.approx(peak_tokens) and c.dollars_month <= v.cost.peak_month
    text = runner.invoke(app, ["plan", "--stack", "dev", "--no-write"]).output
    assert "Ceilings, not forecasts" in " ".join(text.split())


def test_a_tenant_ceiling_counts_only_the_replicas_it_can_reach(plans):
    """prod's analytics calls only its own copy of qwen-7b: its ceiling is those replicas at peak, priced
    as they are, not the whole stack's; frontier's research, on the 405B's H100s, costs what they cost."""
    from vllm_gke.infra.report import verdicts

    v = verdicts(plans["prod"])
    c = next(c for c in v.ceilings if c.tenant == "analytics")
    own = [r for r in v.cost.replicas if r.tenant == "analytics"]
    assert own and {r.model for r in own} == {"qwen-7b"}
    peak = sum(r.tokens_per_second * r.max_replicas for r in own) * v.cost.utilization * 3600 * v.cost.hours_per_month
    assert c.tokens_month == pytest.approx(peak) and c.bound_by == "capacity"
    assert c.dollars_month == pytest.approx(sum(r.usd_per_hour * r.max_replicas for r in own) * v.cost.hours_per_month)
    frontier = verdicts(plans["frontier"])
    research = next(c for c in frontier.ceilings if c.tenant == "research")
    assert research.dollars_month > 10 * research.tokens_month / 1e6 * frontier.cost.usd_per_million_tokens


@pytest.mark.parametrize("columns", ["80", "200"])
def test_output_fits_the_terminal_and_never_cuts_a_name(columns, plans):
    """At the terminal's width: no value cut to `llama-…`; each tenant URL whole on its own line."""
    narrow = CliRunner(env={"COLUMNS": columns})
    result = narrow.invoke(app, ["plan", "--stack", "prod", "--no-write"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines if line.startswith(("┃", "│", "┏", "└"))) <= int(columns)
    # Rich crops a table wider than the console silently: each table keeps its right border.
    borders = [line.rstrip() for line in lines if line.lstrip().startswith(("┏", "└"))]
    assert len(borders) >= 8 and all(line.endswith(("┓", "┘")) for line in borders), borders
    # and every figure of the cost table is there (the total's baseline and peak, whole).
    from vllm_gke.infra.report import verdicts

    cost = verdicts(plans["prod"]).cost
    flat = "".join(line.strip("│┃ ") for line in lines)
    assert f"{cost.baseline_month:,.0f}" in flat and f"{cost.peak_month:,.0f}" in flat
    urls = [u for u in json.loads(runner.invoke(app, ["plan", "--stack", "prod", "--no-write", "--output",
                                                       "json"]).stdout)["tenantUrls"]]
    joined = "".join(lines)  # a terminal wraps a long line; the URL's characters stay in one run
    assert all(u["url"] in joined for u in urls)


def _without_shared_folder(monkeypatch, tmp_path):
    """The CLI as a user's machine runs it: no ../shared/upstream-crds, no network, a cache of its own."""
    from functools import partial

    from vllm_gke.infra import cli, crd_cache

    def no_network(url: str) -> bytes:
        raise OSError(f"no network here ({url})")

    monkeypatch.delenv("VLLM_GKE_CRDS_DIR", raising=False)
    monkeypatch.delenv(crd_cache.OFFLINE_ENV, raising=False)
    monkeypatch.setenv(crd_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "crd_folder", partial(crd_cache.crd_folder, shared=tmp_path / "absent", opener=no_network))
    return crd_cache.cache_folder({crd_cache.CACHE_ENV: str(tmp_path / "cache")})


def test_plan_validates_custom_resources_from_the_users_cache(tmp_path, monkeypatch, crd_catalog):
    """A cache the pinned files filled (their bytes: the shared folder's) is where the plan checks
    custom resources when there is no shared folder, without the network."""
    import shutil

    from vllm_gke.infra.crd_sources import FETCHED, HELM_RENDERED

    folder = _without_shared_folder(monkeypatch, tmp_path)
    folder.mkdir(parents=True)
    for pin in FETCHED + HELM_RENDERED:
        shutil.copyfile(REPO_ROOT.parent / "shared" / "upstream-crds" / pin.name, folder / pin.name)
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--output", "json"])
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["checks"]
    assert checks["customResourcesChecked"] and str(folder) in checks["customResourceDefinitions"]


def test_plan_offline_without_crds_says_how_to_get_them(tmp_path, monkeypatch):
    _without_shared_folder(monkeypatch, tmp_path)
    result = runner.invoke(app, ["plan", "--stack", "dev", "--no-write", "--offline"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "custom resources not checked: no upstream CRDs" in text and "--crds DIR" in text


def test_a_ceiling_prices_the_burst_onto_an_on_demand_twin_on_demand(plans):
    """prod's spot pools burst onto their on-demand twins: a replica above the floor there costs the
    on-demand price, as the cost report's peak prices it, so "at most" stays an upper bound."""
    from vllm_gke.infra.pricing import MACHINE_PRICES
    from vllm_gke.infra.report import _reachable, verdicts

    v = verdicts(plans["prod"])
    cfg = plans["prod"].config
    twins = [r for r in v.cost.replicas if cfg.pool(r.node_pool).has_fallback_pool]
    assert twins
    for r in twins:
        pool = cfg.pool(r.node_pool)
        assert r.burst_usd_per_hour == pytest.approx(
            MACHINE_PRICES[pool.machine_type].on_demand_hour * r.devices / pool.slices_per_node)
    support = next(t for t in cfg.tenants if t.name == "support")
    ceiling = next(c for c in v.ceilings if c.tenant == "support")
    reach = _reachable(cfg, support, v.cost)
    assert any(cfg.pool(r.node_pool).has_fallback_pool for r, _ in reach)
    peak = sum(r.tokens_per_second * r.max_replicas * h for r, h in reach) * v.cost.utilization * 3600 * v.cost.hours_per_month
    dollars = sum(r.peak_usd_per_hour * h for r, h in reach) * v.cost.hours_per_month
    assert ceiling.dollars_month == pytest.approx(min(ceiling.tokens_month / peak * dollars, v.cost.peak_month))
