"""Stacks differ only in config; the program composes the same components for each."""

from __future__ import annotations

from collections import Counter

import yaml

from tests.conftest import STACKS
from vllm_gke.infra.plan import REPO_ROOT


def test_stack_files_hold_only_config():
    for stack in STACKS:
        doc = yaml.safe_load((REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
        assert set(doc) == {"config"}
        assert all(k.startswith(("vllm-gke:", "gcp:")) for k in doc["config"])


def test_program_has_no_stack_specific_code():
    """What is composed never branches on the stack or environment name."""
    # components/model/stack_config.py names the environments a stack may label itself with; it composes nothing.
    composing = [REPO_ROOT / "infra" / "program.py", REPO_ROOT / "infra" / "__main__.py",
                 *(p for p in (REPO_ROOT / "components").glob("*.py") if p.name != "stack_config.py")]
    for path in composing:
        text = path.read_text()
        assert "get_stack" not in text, path
        for stack in STACKS:
            assert f'"{stack}"' not in text, (path, stack)


def test_pulumi_project_file():
    doc = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert doc["name"] == "vllm-gke" and doc["main"] == "infra/" and doc["stackConfigDir"] == "stacks"
    assert doc["runtime"]["name"] == "python"
    assert (REPO_ROOT / "infra" / "__main__.py").exists()


def test_component_counts(plans):
    def components(stack):
        return Counter(r.type for r in plans[stack].resources if r.type.startswith("vllm-gke:"))

    assert components("dev") == {"vllm-gke:index:Platform": 1, "vllm-gke:index:ProjectApis": 1, "vllm-gke:index:MeshReadiness": 1,
                                 "vllm-gke:index:GpuCluster": 1, "vllm-gke:index:ModelStore": 1,
                                 "vllm-gke:index:MeshNamespace": 2, "vllm-gke:index:TenantAuth": 1,
                                 "vllm-gke:index:VllmService": 2, "vllm-gke:index:Gateway": 1,
                                 "vllm-gke:index:Observability": 1, "vllm-gke:index:ServiceLevels": 1,
                                 "vllm-gke:index:SloMetrics": 1, "vllm-gke:index:Keda": 1,
                                 "vllm-gke:index:WeightsPrune": 1}
    prod = components("prod")
    # 3 shared models and 1 dedicated copy, two pools each (a Flagger canary is the pool's own Deployment).
    assert prod["vllm-gke:index:VllmService"] == 8
    assert prod["vllm-gke:index:TenantAuth"] == 3
    assert prod["vllm-gke:index:MeshNamespace"] == 4


def test_every_component_child_is_parented(plans):
    """One Platform holds everything; what stacks declared at the top level before it existed is
    its child now, aliased to the stack root, so an existing stack keeps those resources."""
    plan = plans["prod"]
    components = {r.urn for r in plan.resources if not r.custom}
    (platform,) = [r for r in plan.resources if r.type == "vllm-gke:index:Platform"]
    before = {"apis", "gke", "mesh", "serving", "weights", "gateway", "observability", "keda", "limits"} | {
        f"tenant-{t}" for t in ("search", "support", "analytics")} | {
        f"{m}-{p}" for m in ("llama-70b", "qwen-7b", "llama-8b", "analytics-qwen-7b")
        for p in ("short", "long")}
    for r in plan.resources:
        if r is platform:
            continue
        assert r.parent in components, (r.type, r.name)
    top = {r.name: r for r in plan.resources if r.parent == platform.urn}
    assert before <= set(top)
    for r in top.values():
        assert r.alias_parents == ("",) or r.alias_urns, (r.name, r.alias_parents)


def test_config_from_the_pulumi_environment(stack_values, monkeypatch):
    """Under `pulumi up` the engine may hand config over only as PULUMI_CONFIG (JSON text values)."""
    import json

    from vllm_gke.infra.plan import _as_pulumi_config, run_program

    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(_as_pulumi_config(stack_values["staging"])))
    plan = run_program("staging", {})
    assert plan.config.cluster.name == "vllm-staging"
    assert len(plan.manifests()) > 50


def test_the_readmes_serving_features_table_is_what_the_plan_prints(plans):
    """The README's tuned-stack rows (each 70B variant beside the plain one) are the options table's
    'this stack' rows: a stale figure fails, and so does a feature that stops changing its row."""
    import re

    from vllm_gke.infra.accelerator_options import stack_options
    from vllm_gke.infra.report import verdicts

    plan = plans["tuned"]
    cfg = plan.config
    options = {o.model: o for o in stack_options(cfg, verdicts(plan).cost.replicas)}
    rows = re.findall(r"^\| (llama-70b\S*) \| .+? \| (\d+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      (REPO_ROOT / "README.md").read_text(), re.M)
    assert {r[0] for r in rows} == {"llama-70b", "llama-70b-spec", "llama-70b-offload", "llama-70b-pd"}
    for name, gpus, tps, usd_h, usd_m in rows:
        o, model = options[name], cfg.model(name)
        pd = model.disaggregation
        # A disaggregated replica's GPUs: its own and its share of the prefill pool at both floors.
        share = pd.prefill.min_replicas / model.short.min_replicas if pd else 0
        assert int(gpus) == o.devices * (1 + share), name
        assert f"{o.tokens_per_second:,.0f}" == tps and f"{o.usd_per_hour:.2f}" == usd_h, name
        assert f"{o.usd_per_million_tokens(cfg.cost.target_utilization):.2f}" == usd_m, name
    by = {r[0]: r for r in rows}
    assert float(by["llama-70b-spec"][4]) < float(by["llama-70b"][4]) < float(by["llama-70b-pd"][4])
