"""Every Google Cloud resource the plan records, against pulumi_gcp's SDK input types (infra/provider_schema.py):
each stack passes, and each kind of departure from the schema is caught."""

from __future__ import annotations

import copy
import inspect
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import STACKS
from vllm_gke.infra import provider_schema as ps
from vllm_gke.infra.cli import app
from vllm_gke.infra.mocks import PlannedResource
from vllm_gke.infra.plan import Plan, run_program_file
from vllm_gke.infra.plan_report import plan_report, render_json
from vllm_gke.infra.plan_text import render_text


def _one(plan: Plan, type_: str) -> PlannedResource:
    """A private copy of the plan's first resource of this type, to break."""
    return copy.deepcopy(plan.of_type(type_)[0])


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_matches_the_providers_schema(plans, stack):
    plan = plans[stack]
    gcp = [r for r in plan.resources if r.custom and r.type.startswith("gcp:")]
    assert gcp and all(ps.in_scope(r) for r in gcp)
    assert ps.problems(plan.resources) == []
    assert ps.checked(plan.resources) >= len(gcp) + 1  # and the gcp provider, or the kubernetes ones


def test_an_unknown_top_level_key_is_caught(plans):
    bucket = _one(plans["staging"], "gcp:storage/bucket:Bucket")
    bucket.props["uniformBucketLevelAccesss"] = True
    assert ps.check_resource(bucket) == [
        "uniformBucketLevelAccesss: unknown key (BucketArgs has no 'uniformBucketLevelAccesss'; "
        "did you mean 'uniformBucketLevelAccess'?)"]


def test_a_bad_nested_key_is_caught_with_its_path(plans):
    """A snake_case key in a nested object: the engine sends a plain dict's unknown keys as written."""
    pool = _one(plans["dev"], "gcp:container/nodePool:NodePool")
    pool.props["nodeConfig"]["machine_type"] = pool.props["nodeConfig"].pop("machineType")
    errors = ps.check_resource(pool)
    assert errors == ["nodeConfig.machine_type: unknown key (NodePoolNodeConfigArgs has no 'machine_type'; "
                      "did you mean 'machineType'?)"]


def test_a_missing_required_key_is_caught(plans):
    pool = _one(plans["dev"], "gcp:container/nodePool:NodePool")
    del pool.props["cluster"]
    assert ps.check_resource(pool) == ["cluster: required by NodePoolArgs, missing"]
    nat = _one(plans["dev"], "gcp:compute/routerNat:RouterNat")
    nat.props["logConfig"] = {"enable": True}
    assert ps.check_resource(nat) == ["logConfig.filter: required by RouterNatLogConfigArgs, missing"]


@pytest.mark.parametrize(("key", "value", "takes"), [
    ("initialNodeCount", "1", "integer"), ("initialNodeCount", 1.5, "integer"), ("initialNodeCount", True, "integer"),
    ("nodeLocations", "us-central1-a", "list of string"), ("nodeConfig", ["x"], "object (NodePoolNodeConfigArgs)"),
])
def test_a_wrong_type_is_caught(plans, key, value, takes):
    pool = _one(plans["dev"], "gcp:container/nodePool:NodePool")
    pool.props[key] = value
    errors = ps.check_resource(pool)
    assert len(errors) == 1 and errors[0].startswith(f"{key}: ") and errors[0].endswith(f"where the SDK takes {takes}")


def test_wrong_types_deep_in_lists_and_maps(plans):
    policy = _one(plans["dev"], "gcp:monitoring/alertPolicy:AlertPolicy")
    policy.props["conditions"][0]["displayName"] = 7.0
    policy.props["userLabels"] = {"team": ["a"]}
    assert ps.check_resource(policy) == ['conditions[0].displayName: number 7.0 where the SDK takes string',
                                         'userLabels.team: list ["a"] where the SDK takes string']


def test_a_value_outside_the_documented_ones_is_caught(plans):
    policy = _one(plans["dev"], "gcp:monitoring/alertPolicy:AlertPolicy")
    policy.props["severity"] = "critical"
    assert ps.check_resource(policy) == [
        "severity: 'critical' is not one of the documented values: CRITICAL, ERROR, WARNING"]
    filestore = _one(plans["dev"], "gcp:filestore/instance:Instance")
    filestore.props["networks"][0]["modes"] = ["IPV4"]
    assert ps.check_resource(filestore) == [
        "networks[0].modes[0]: 'IPV4' is not one of the documented values: ADDRESS_MODE_UNSPECIFIED, MODE_IPV4, MODE_IPV6"]


def test_documented_values_are_read_only_where_the_docstring_states_one_list():
    service = ps.properties(ps.args_class("gcp:cloudrunv2/service:Service"))
    assert service["ingress"].values == ("INGRESS_TRAFFIC_ALL", "INGRESS_TRAFFIC_INTERNAL_ONLY",
                                         "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER")
    assert service["location"].values == () and service["location"].required
    assert service["labels"].values == () and not service["labels"].required
    # "Possible values are `IPV4` and `IPV4_IPV6`." is prose, not the generator's list: nothing is guessed from it.
    from pulumi_gcp.container import ClusterIpAllocationPolicyArgs

    assert ps.properties(ClusterIpAllocationPolicyArgs)["stackType"].values == ()


def test_required_keys_are_the_sdk_constructors_own(plans):
    """What the reader calls required is what each input type's constructor cannot do without, for
    every input type the staging plan's resources reach."""
    seen: set[type] = set()
    todo = [ps.args_class(r.type) for r in plans["staging"].resources if ps.in_scope(r)]
    while todo:
        cls = todo.pop()
        if cls is None or cls in seen:
            continue
        seen.add(cls)
        wire = {n: a.fget._pulumi_name for b in cls.__mro__ for n, a in vars(b).items()
                if isinstance(a, property) and hasattr(a.fget, "_pulumi_name")}
        params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name not in ("self", "__self__")]
        assert {wire[p.name] for p in params if p.default is inspect.Parameter.empty} == \
            {k for k, p in ps.properties(cls).items() if p.required}, cls
        todo += [m for p in ps.properties(cls).values() for m in _input_types(p.hint)]
    assert len(seen) > 100


def _input_types(hint):
    from typing import get_args

    for m in ps.members(hint):
        if isinstance(m, type) and getattr(m, "_pulumi_input_type", False):
            yield m
        else:
            for arg in get_args(m):
                yield from _input_types(arg)


def test_a_type_the_sdk_lacks_is_caught():
    fake = PlannedResource(type="gcp:compute/noSuchThing:NoSuchThing", name="x", urn="urn:x", parent=None, custom=True)
    assert ps.check_resource(fake) == [f"pulumi_gcp {ps.sdk_version()} has no resource gcp:compute/noSuchThing:NoSuchThing"]


PROGRAM = '''
import pulumi_gcp as gcp

gcp.Provider("gcp", project="p", batching={"enable_batching": True})
gcp.cloudrunv2.Service("svc", location="us-central1", ingress="INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER",
                       template={"containers": [{"image": "x", "startup_probe": {"initial_delay_seconds": 3,
                                                                                 "periodSecond": 10}}],
                                 "gpu_zonal_redundancy_disabled": "true"})
'''


def test_a_programs_plain_dicts_are_checked_as_the_engine_receives_them(tmp_path: Path):
    """The SDK translates a plain dict's snake_case keys it knows and passes the rest through, and
    sends a provider's non-string inputs as JSON text without translating their keys at all."""
    (tmp_path / "__main__.py").write_text(PROGRAM)
    found = dict(ps.problems(run_program_file(tmp_path / "__main__.py", {})))
    assert found == {
        "pulumi:providers:gcp gcp": ["batching.enable_batching: unknown key (ProviderBatchingArgs has no 'enable_batching'; "
                                    "did you mean 'enableBatching'?)"],
        "gcp:cloudrunv2/service:Service svc": [
            "template.containers[0].startupProbe.periodSecond: unknown key (ServiceTemplateContainerStartupProbeArgs "
            "has no 'periodSecond'; did you mean 'periodSeconds'?)",
            'template.gpuZonalRedundancyDisabled: string "true" where the SDK takes boolean']}


def test_a_finding_makes_the_plan_unsafe_in_text_and_json(plans):
    plan = plans["dev"]
    clean = plan_report(plan, {}, None, None)
    assert not clean.provider_problems and clean.provider_resources == ps.checked(plan.resources)
    assert f"all {clean.provider_resources} Google Cloud resources, providers and Helm releases match their provider's " \
        f"input types (pulumi_gcp {ps.sdk_version()}'s: keys, required keys, types, enums; no cross-field rules)" in _text(clean)
    network = _one(plan, "gcp:compute/network:Network")
    network.props["autoCreateSubnetworks"] = "false"
    report = plan_report(replace(plan, resources=[*plan.resources, network]), {}, None, None)
    assert report.unsafe and report.provider_problems == [
        (f"gcp:compute/network:Network {network.name}", ['autoCreateSubnetworks: string "false" where the SDK takes boolean'])]
    assert json.loads(render_json(report))["checks"]["providerSchema"] == [
        {"resource": f"gcp:compute/network:Network {network.name}",
         "errors": ['autoCreateSubnetworks: string "false" where the SDK takes boolean']}]
    assert f"not in its provider's schema: gcp:compute/network:Network {network.name}: autoCreateSubnetworks: string \"false\"" \
        in _text(report)


def _text(report) -> str:
    out = io.StringIO()
    render_text(report, Console(file=out, width=1000), detail=False)
    return " ".join(out.getvalue().split())


def test_the_plan_command_reports_and_fails_on_a_finding(monkeypatch):
    from vllm_gke.infra import cli as infra_cli

    real = infra_cli.run_plan

    def broken(stack, stacks_dir):
        plan = real(stack, stacks_dir)
        next(r for r in plan.resources if r.type == "gcp:container/cluster:Cluster").props["deletionProtection"] = "no"
        return plan

    monkeypatch.setattr(infra_cli, "run_plan", broken)
    result = CliRunner().invoke(app, ["plan", "--stack", "dev", "--no-write"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "not in its provider's schema: gcp:container/cluster:Cluster gke-gke: deletionProtection: string \"no\"" in text


def test_previews_resources_beside_a_platform_are_checked_too(tmp_path: Path):
    """`vllm-gke preview` of a program of its own resources: a bucket with a misspelt nested key fails it."""
    folder = tmp_path / "team-llm"
    folder.mkdir()
    (folder / "Pulumi.yaml").write_text("name: team-llm\nruntime:\n  name: python\n")
    (folder / "__main__.py").write_text('import pulumi_gcp as gcp\n'
                                        'gcp.storage.Bucket("b", location="US", versioning={"enable": True})\n')
    result = CliRunner().invoke(app, ["preview", str(folder), "--no-write", "--output", "json"])
    assert result.exit_code == 1, result.output
    found = json.loads(result.stdout)["otherResources"]["providerSchema"]
    assert found == [{"resource": "gcp:storage/bucket:Bucket b", "errors": [
        "versioning.enable: unknown key (BucketVersioningArgs has no 'enable'; did you mean 'enabled'?)",
        "versioning.enabled: required by BucketVersioningArgs, missing"]}]
    text = CliRunner().invoke(app, ["preview", str(folder), "--no-write"]).output
    assert "not in its provider's schema: gcp:storage/bucket:Bucket b: versioning.enable: unknown key" in " ".join(text.split())
