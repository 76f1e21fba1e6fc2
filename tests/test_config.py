"""Stack config: every shipped stack parses; bad input gets a message naming the key and the fix."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import STACKS
from vllm_gke.components.model.catalog import MACHINE_TYPES
from vllm_gke.components.model.specs import NodePoolSpec
from vllm_gke.infra.config import ConfigError, parse


def issues(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


def one_issue(values: dict[str, Any]) -> str:
    found = issues(values)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_parse(stack_values, stack):
    cfg = parse(stack_values[stack])
    # frontier is a prod environment of its own (the large-model and TPU stack), tuned a staging one
    # (the serving features beside the plain model).
    assert cfg.environment == {"frontier": "prod", "tuned": "staging"}.get(stack, stack)
    assert cfg.node_pools and cfg.models


def test_unknown_machine_type_names_key_and_choices(dev_values):
    dev_values["vllm-gke:nodePools"][0]["machineType"] = "a2-highgpu-3g"
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:nodePools[a100-mig].machineType:")
    assert "'a2-highgpu-3g'" in msg and "a2-highgpu-1g" in msg and "a3-highgpu-8g" in msg


def test_mig_profile_of_other_gpu_is_rejected(dev_values):
    # 1g.10gb is an A100 80GB profile; a2-highgpu-1g carries an A100 40GB.
    dev_values["vllm-gke:nodePools"][0]["gpuPartitionSize"] = "1g.10gb"
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:nodePools[a100-mig].gpuPartitionSize:")
    assert "nvidia-tesla-a100" in msg and "3g.20gb" in msg


def test_mig_on_gpu_without_mig_is_rejected(dev_values):
    dev_values["vllm-gke:nodePools"][0].update(machineType="g2-standard-8", gpuPartitionSize="1g.5gb")
    assert "this GPU has no MIG; remove gpuPartitionSize" in one_issue(dev_values)


def test_model_that_does_not_fit_its_mig_slice(dev_values):
    dev_values["vllm-gke:nodePools"][0]["gpuPartitionSize"] = "2g.10gb"
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:models[qwen-7b]:")
    assert "weights need 15.2 GB per GPU" in msg and "2g.10gb" in msg and "only 9.5 GB of 10 GB" in msg
    assert "larger MIG slice" in msg and "fp8" in msg


def test_quantised_model_fits_where_bf16_does_not(dev_values):
    dev_values["vllm-gke:nodePools"][0]["gpuPartitionSize"] = "2g.10gb"
    dev_values["vllm-gke:models"][0]["dtype"] = "awq"
    # awq weights are 3.8 GB: fits, but two pools of min 1 need 2 of the 3 slices: still fine.
    assert parse(dev_values).models[0].weights_gb == pytest.approx(3.81)


def test_tensor_parallel_on_mig_is_rejected(dev_values):
    dev_values["vllm-gke:models"][0]["tensorParallelSize"] = 2
    assert any(i.startswith("vllm-gke:models[qwen-7b].tensorParallelSize:") and "MIG slices cannot be joined" in i
               for i in issues(dev_values))


def test_tensor_parallel_must_divide_gpus(stack_values):
    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:models"][0]["tensorParallelSize"] = 3
    assert any(i.startswith("vllm-gke:models[llama-70b].tensorParallelSize:") and "divisor" in i
               for i in issues(values))


def test_unknown_node_pool_and_model_references(dev_values):
    dev_values["vllm-gke:models"][0]["nodePool"] = "h100"
    dev_values["vllm-gke:tenants"][0]["models"] = ["qwen-7b", "gpt-5"]
    found = issues(dev_values)
    assert any(i.startswith("vllm-gke:models[qwen-7b].nodePool:") and "'h100'" in i and "a100-mig" in i for i in found)
    assert any(i.startswith("vllm-gke:tenants[dev-team].models:") and "'gpt-5'" in i for i in found)


def test_missing_and_unknown_keys(dev_values):
    del dev_values["vllm-gke:serverImage"]
    dev_values["vllm-gke:modles"] = []
    dev_values["vllm-gke:cluster"]["zone"] = "us-central1-a"
    found = issues(dev_values)
    assert "vllm-gke:serverImage: is required but not set; add it to the stack config" in found
    assert any(i.startswith("vllm-gke:modles: is not a known setting") for i in found)
    assert any(i.startswith("vllm-gke:cluster.zone: is not a known setting") for i in found)


def test_gcp_keys_keep_their_namespace(dev_values):
    del dev_values["gcp:project"]
    assert one_issue(dev_values).startswith("gcp:project: is required")


@pytest.mark.parametrize("image", [
    {"repository": "vllm/vllm-openai"},
    {"repository": "vllm/vllm-openai", "tag": "latest"},
    {"repository": "vllm/vllm-openai", "digest": "sha256:abc"},
])
def test_unpinned_image_is_rejected(dev_values, image):
    dev_values["vllm-gke:serverImage"] = image
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:serverImage:")
    assert "pinned" in msg or "sha256" in msg


def test_replica_bounds_and_duplicates(dev_values):
    dev_values["vllm-gke:models"][0]["short"].update(minReplicas=3, maxReplicas=2)
    found = issues(dev_values)
    assert any(i.startswith("vllm-gke:models[qwen-7b].short.maxReplicas:") and "raise maxReplicas" in i for i in found)


def test_duplicate_tenant_names(dev_values):
    twin = copy.deepcopy(dev_values["vllm-gke:tenants"][0])
    twin["jwt"]["issuer"] = "https://auth.example/twin"
    dev_values["vllm-gke:tenants"].append(twin)
    assert "name 'dev-team' is used 2 times" in one_issue(dev_values)


def test_pool_too_small_for_min_replicas(dev_values):
    dev_values["vllm-gke:models"][0]["short"].update(minReplicas=2, maxReplicas=2)
    msg = one_issue(dev_values)
    assert msg.startswith("vllm-gke:nodePools[a100-mig].maxNodes:")
    assert "offers at most 2 GPU slot(s)" in msg and "need 3" in msg


def test_external_gateway_without_tenants(dev_values):
    dev_values["vllm-gke:tenants"] = []
    dev_values["vllm-gke:gateway"] = {"className": "gke-l7-regional-external-managed", "hostname": "a.example",
                                      "managedCertificate": True}
    assert one_issue(dev_values).startswith("vllm-gke:tenants: an external Gateway needs at least one tenant")


def test_external_gateway_without_tls_is_rejected(dev_values):
    dev_values["vllm-gke:gateway"] = {"className": "gke-l7-regional-external-managed", "hostname": "a.example"}
    issue = one_issue(dev_values)
    assert issue.startswith("vllm-gke:gateway: an external gateway") and "managedCertificate" in issue


def test_managed_certificate_needs_a_hostname(dev_values):
    dev_values["vllm-gke:gateway"] = {"className": "gke-l7-global-external-managed", "managedCertificate": True}
    assert "managedCertificate needs a hostname" in one_issue(dev_values)


def test_dedicated_model_must_be_one_of_the_tenants(stack_values):
    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:tenants"][2]["dedicated"]["models"] = ["llama-8b"]
    assert "'llama-8b' must also be listed in tenants[analytics].models" in one_issue(values)


@pytest.mark.parametrize("machine", [m for m, t in MACHINE_TYPES.items() if t.is_gpu])
def test_every_mig_profile_is_accepted_only_on_its_gpu(machine):
    acc = MACHINE_TYPES[machine].accelerator
    all_profiles = {p for t in MACHINE_TYPES.values() if t.accelerator for p in t.accelerator.mig_profiles}
    for profile in sorted(all_profiles):
        if profile in acc.mig_profiles:
            pool = NodePoolSpec(name="p", machine_type=machine, gpu_partition_size=profile)
            assert pool.slices_per_node == MACHINE_TYPES[machine].gpus * acc.mig_profiles[profile]
        else:
            with pytest.raises(ValueError, match="not a MIG profile"):
                NodePoolSpec(name="p", machine_type=machine, gpu_partition_size=profile)


# --- fuzzing: any mutation of a valid config either parses or fails as a ConfigError -------

LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                   st.text(max_size=12), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _set(node: Any, path: tuple, value: Any, delete: bool) -> None:
    for part in path[:-1]:
        node = node[part]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_config_never_raises_anything_but_config_error(stack_values, data):
    values = copy.deepcopy(stack_values[data.draw(st.sampled_from(STACKS))])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(values)
        path = data.draw(st.sampled_from(paths))
        _set(values, path, data.draw(LEAVES), delete=data.draw(st.booleans()))
    try:
        parse(values)
    except ConfigError as exc:
        assert exc.issues
        for issue in exc.issues:
            assert issue.key.startswith(("vllm-gke:", "gcp:")), issue
            assert issue.problem


def test_cli_reports_config_errors_without_traceback(tmp_path, stack_values):
    import yaml

    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:nodePools"][0]["gpuPartitionSize"] = "1g.10gb"
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    proc = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "dev",
                           "--stacks-dir", str(tmp_path), "--no-write"], capture_output=True, text=True)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "vllm-gke:nodePools[a100-mig].gpuPartitionSize" in out and "3g.20gb" in out
    assert "Traceback" not in out


def test_a_tier_chosen_by_size_is_refused_with_the_fix(dev_values):
    dev_values["vllm-gke:weights"]["tier"] = "auto"
    message = one_issue(dev_values)
    assert "weights.tier" in message and "BASIC_HDD" in message and "ZONAL" in message and "re-created" in message


def test_an_unknown_key_gets_the_known_one_it_resembles(dev_values):
    dev_values["vllm-gke:gateway"]["classname"] = dev_values["vllm-gke:gateway"].pop("className")
    dev_values["vllm-gke:tenants"][0]["maxToken"] = dev_values["vllm-gke:tenants"][0].pop("maxTokens")
    found = issues(dev_values)
    assert "vllm-gke:gateway.classname: is not a known setting; did you mean className?" in found
    assert "vllm-gke:tenants[dev-team].maxToken: is not a known setting; did you mean maxTokens?" in found
    dev_values["vllm-gke:gateway"]["zzz"] = 1
    assert any(f.startswith("vllm-gke:gateway.zzz: is not a known setting; remove it") for f in issues(dev_values))


def test_config_keys_can_name_list_items_by_name():
    from vllm_gke.components.model.config_errors import key_path

    data = {"tenants": [{"name": "dev-team"}], "nodePools": [{}], "models": [{"name": "a"}, {"name": "a"}]}
    for head in (lambda k: f"vllm-gke:{k}", lambda k: f"config.{k}"):  # a stack file's keys, a program's
        prefix = head("")
        assert key_path(("tenants", 0, "maxTokens"), data, head) == f"{prefix}tenants[dev-team].maxTokens"
        assert key_path(("nodePools", 0, "machineType"), data, head) == f"{prefix}nodePools[0].machineType"
        assert key_path(("models", 1, "shape"), data, head) == f"{prefix}models[1].shape"  # a repeated name


def test_messages_name_list_items_by_name_and_keep_the_index_where_there_is_none(stack_values):
    """A key reads as the stack file does: the second model is models[qwen-7b], whether pydantic or
    a check across fields finds the problem; a list whose items have no name keeps the index."""
    values = copy.deepcopy(stack_values["prod"])
    assert values["vllm-gke:models"][1]["name"] == "qwen-7b"
    values["vllm-gke:models"][1]["dtype"] = "bf17"
    (issue,) = issues(values)
    assert issue.startswith("vllm-gke:models[qwen-7b].dtype: 'bf17' is not one of: 'bfloat16'"), issue

    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:nodePools"][1]["gpuPartitionSize"] = "2g.10gb"  # qwen-7b's pool, a100-mig
    found = issues(values)
    assert any(i.startswith("vllm-gke:models[qwen-7b]: model 'qwen-7b' on one 2g.10gb MIG slice") for i in found), found
    assert any(i.startswith("vllm-gke:tenants[analytics].dedicated.nodePool: models[qwen-7b]: model 'qwen-7b'")
               for i in found), found
    assert not any("models[1]" in i or "tenants[2]" in i for i in found), found

    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:cluster"]["zones"] = [values["vllm-gke:cluster"]["zones"][0], 7]
    assert one_issue(values).startswith("vllm-gke:cluster.zones[1]: must be text, not")
    # An item whose name is missing, not a string, or repeated keeps its index too.
    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:models"][1]["name"] = 5
    assert one_issue(values).startswith("vllm-gke:models[1].name: must be text, not")
    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:models"][1].update(name="llama-8b", dtype="bf17")
    assert one_issue(values).startswith("vllm-gke:models[1].dtype: ")


def test_messages_say_what_a_value_must_be_not_pydantics_words(dev_values):
    """`must be a whole number, not 'abc'`, not `Input should be a valid integer, unable to parse ...`."""
    model = dev_values["vllm-gke:models"][0]
    model["short"]["maxNumSeqs"] = "abc"
    model["gpuMemoryUtilization"] = 2
    model["extraArgs"] = "--x"
    dev_values["vllm-gke:nodePools"][0]["minNodes"] = -1
    found = issues(dev_values)
    assert "vllm-gke:models[qwen-7b].short.maxNumSeqs: must be a whole number, not 'abc'" in found
    assert "vllm-gke:models[qwen-7b].gpuMemoryUtilization: must be at most 0.98, not 2" in found
    assert "vllm-gke:models[qwen-7b].extraArgs: must be a list, not '--x'" in found
    assert "vllm-gke:nodePools[a100-mig].minNodes: must be at least 0, not -1" in found
    assert not any("Input should" in i or "pydantic" in i for i in found), found
