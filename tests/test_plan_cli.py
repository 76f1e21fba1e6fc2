"""The offline plan command: runs the real program, prints, writes manifests and dashboards."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from infra.cli import app

runner = CliRunner()


def test_plan_dev_writes_outputs(tmp_path):
    result = runner.invoke(app, ["plan", "--stack", "dev", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "stack dev:" in result.output
    assert "Kubernetes manifests pass schema validation" in result.output
    root = tmp_path / "dev"
    docs = list(yaml.safe_load_all((root / "manifests" / "all.yaml").read_text()))
    assert {d["kind"] for d in docs} >= {"Deployment", "HTTPRoute", "AuthorizationPolicy", "PersistentVolume"}
    assert (root / "manifests" / "vllm" / "deployment-qwen-7b-short.yaml").exists()
    dashboard = json.loads((root / "dashboard.json").read_text())
    assert dashboard["displayName"].startswith("vLLM on GKE - vllm-dev")
    assert len(json.loads((root / "alert-policies.json").read_text())) == 5
    inventory = json.loads((root / "resources.json").read_text())
    provider = next(r for r in inventory if r["type"] == "pulumi:providers:kubernetes")
    assert provider["props"]["kubeconfig"] == "[secret]"


def test_plan_detail_lists_components():
    result = runner.invoke(app, ["plan", "--stack", "prod", "--no-write", "--detail"])
    assert result.exit_code == 0, result.output
    assert "VllmService/llama-70b-long" in result.output
    assert "TenantAuth/tenant-analytics" in result.output


def test_unknown_stack_exits_2():
    result = runner.invoke(app, ["plan", "--stack", "qa", "--no-write"])
    assert result.exit_code == 2
    assert "no stack 'qa'" in result.output and "dev, prod, staging" in result.output


def test_stacks_command():
    result = runner.invoke(app, ["stacks"])
    assert result.output.split() == ["dev", "prod", "staging"]
