"""The CrossGuard pack speaks the analyzer protocol `pulumi preview --policy-pack policies` uses."""

from __future__ import annotations

import copy
import subprocess
import sys

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from vllm_gke.infra.plan import REPO_ROOT
from vllm_gke.policies.rules import POLICY_NAMES


@pytest.fixture(scope="module")
def analyzer():
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "policies" / "__main__.py")],
                            cwd=REPO_ROOT / "policies", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().decode().strip())  # the pack prints its port, as for the engine
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        channel.close()
        proc.kill()
        proc.wait()


def analyzer_resources(plan, mutate=lambda rs: None):
    rs = [copy.deepcopy(r) for r in plan.resources if r.custom]
    mutate(rs)
    out = []
    for r in rs:
        props = struct_pb2.Struct()
        props.update(r.props)
        out.append(analyzer_pb2.AnalyzerResource(type=r.type, properties=props, urn=r.urn, name=r.name))
    return out


def test_pack_reports_its_policies(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "vllm-gke"
    assert sorted(p.name for p in info.policies) == sorted(POLICY_NAMES)


def test_pack_passes_the_dev_plan(analyzer, plans):
    response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=analyzer_resources(plans["dev"])))
    assert list(response.diagnostics) == []


def test_pack_flags_an_untainted_gpu_pool(analyzer, plans):
    def untaint(rs):
        for r in rs:
            if r.type == "gcp:container/nodePool:NodePool" and r.props["name"] == "a100-mig":
                r.props["nodeConfig"]["taints"] = []
                target.append(r.urn)

    target: list[str] = []
    response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(
        resources=analyzer_resources(plans["dev"], untaint)))
    (diag,) = response.diagnostics
    assert diag.policyName == "gpu-node-pools-tainted"
    assert diag.enforcementLevel == analyzer_pb2.MANDATORY
    assert diag.urn == target[0]
    assert "nvidia.com/gpu" in diag.message


def test_pack_files():
    doc = yaml.safe_load((REPO_ROOT / "policies" / "PulumiPolicy.yaml").read_text())
    assert doc["runtime"]["name"] == "python"
    assert (REPO_ROOT / "policies" / doc["runtime"]["options"]["virtualenv"]).resolve() == REPO_ROOT / ".venv"


def test_pack_runs_the_rollout_policies(analyzer, plans):
    """Under CrossGuard (numbers as the engine's doubles): frontier's pools that roll in place in prod,
    a prod Canary rolled back only after more failed checks than it passes before promotion, and one
    whose TTFT gate's MetricTemplate reads a lower percentile than the SLO's, each an advisory
    diagnostic on its resource."""
    response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=analyzer_resources(plans["frontier"])))
    gated = [d for d in response.diagnostics if d.policyName == "prod-rollouts-gated"]
    assert len(gated) == 4 and {d.enforcementLevel for d in gated} == {analyzer_pb2.ADVISORY}
    assert any("llama-405b-short-group" in d.urn and "a replica spans hosts" in d.message for d in gated)

    def loosen(rs):
        for r in rs:
            if r.props.get("kind") == "Canary" and r.props["metadata"]["name"] == "llama-8b-short":
                r.props["spec"]["analysis"]["threshold"] = 9
                target.append(r.urn)

    def median(rs):
        for r in rs:
            if r.props.get("kind") == "MetricTemplate" and r.props["metadata"]["name"] == "vllm-ttft-p95-seconds":
                r.props["spec"]["query"] = r.props["spec"]["query"].replace("(0.95,", "(0.5,")
            if r.props.get("kind") == "Canary" and r.props["metadata"]["name"] == "llama-8b-short":
                target.append(r.urn)

    for mutate, words in ((loosen, "after 9 failed checks but promoted after 5 passed ones"),
                          (median, "gate vllm-ttft-p95-seconds lets a canary's p50 time to first token reach 2s")):
        target: list[str] = []
        response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=analyzer_resources(plans["prod"], mutate)))
        diags = [d for d in response.diagnostics if d.policyName.startswith(("prod-rollouts", "rollout-"))]
        (diag,) = [d for d in diags if d.urn == target[0]]
        assert (diag.policyName, diag.enforcementLevel) == ("rollout-gates-hold-slos", analyzer_pb2.ADVISORY)
        assert words in diag.message
