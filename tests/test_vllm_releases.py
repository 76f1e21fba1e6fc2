"""Upgrades are a config change: each supported release's facts match its real snapshot, and the
stack program runs against each one."""

from __future__ import annotations

import copy
import json
import re

import pytest

from tests.conftest import REPO_ROOT, vllm_deployments
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot, snapshot_versions
from vllm_gke.components.model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES, TPU_RELEASES


def newest(versions):
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def test_the_newest_supported_release_is_the_default():
    assert DEFAULT_VLLM_VERSION == newest(RELEASES) == "0.34.0"
    dockerfile = (REPO_ROOT / "images" / "Dockerfile").read_text()
    assert f"ARG VLLM_VERSION=v{DEFAULT_VLLM_VERSION}" in dockerfile
    assert f"_VLLM_VERSION: v{DEFAULT_VLLM_VERSION}" in (REPO_ROOT / "images" / "cloudbuild.yaml").read_text()


ALL_RELEASES = {**{r.snapshot: r for r in RELEASES.values()}, **{r.snapshot: r for r in TPU_RELEASES.values()}}


@pytest.mark.parametrize("name", sorted(ALL_RELEASES))
def test_each_release_matches_its_real_snapshot(name):
    """The CUDA releases and the TPU build alike."""
    rel = ALL_RELEASES[name]
    version, snap = rel.version, load_snapshot(rel.snapshot)
    assert snap["version"] == version and rel.snapshot in snapshot_versions()
    assert snap.get("build", "cuda") == rel.platform
    assert rel.image_tag == f"v{version}"
    flags = snap["flags"]
    for flag in (rel.disable_prefix_caching, rel.disable_chunked_prefill, "--enable-prefix-caching",
                 "--enable-chunked-prefill", "--middleware"):
        assert flags[flag]["kind"] == "switch" or flag == "--middleware", flag
    metrics = {m["name"] for m in snap["metrics"]}
    assert {rel.kv_cache_metric, rel.queue_metric, rel.running_metric, rel.lora_info_metric,
            rel.cache_info_metric} <= metrics
    if rel.shutdown_timeout_flag:
        assert flags[rel.shutdown_timeout_flag]["kind"] != "switch"
    else:
        assert "--shutdown-timeout" not in flags
    assert {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"} <= {r["path"] for r in snap["routes"]}


def test_the_tpu_build_runs_the_tpu_models_of_the_frontier_stack(plans):
    """Its server command lines parse with its parser, its guard config follows its max_tokens rule,
    and only the VLLM_* variables it reads are set."""
    cfg = plans["frontier"].config
    rel = TPU_RELEASES[cfg.tpu_vllm_version]
    snap = load_snapshot(rel.snapshot)
    tpu = [d for d in vllm_deployments(plans["frontier"])
           if "cloud.google.com/gke-tpu-accelerator" in d["spec"]["template"]["spec"]["nodeSelector"]]
    assert tpu
    for dep in tpu:
        (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        assert check_argv(container["args"], snap) == [], dep["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert json.loads(env["GKE_LLM_GUARD_CONFIG"])["maxTokensRule"] == rel.max_tokens_rule
        assert {n for n in env if n.startswith("VLLM_")} <= set(snap["environment"])


def test_gpu_cache_usage_is_gone_from_the_default_release():
    assert "vllm:gpu_cache_usage_perc" not in {m["name"] for m in load_snapshot(DEFAULT_VLLM_VERSION)["metrics"]}


def for_release(values, version):
    values = copy.deepcopy(values)
    values["vllm-gke:vllmVersion"] = version
    if "tag" in values["vllm-gke:serverImage"]:
        values["vllm-gke:serverImage"]["tag"] = f"{RELEASES[version].image_tag}-gke.1"
    traces = (values.get("vllm-gke:monitoring") or {}).get("traces")
    if traces and not RELEASES[version].ships_opentelemetry:
        traces["enabled"] = False  # refused on a release without OpenTelemetry (config_rules/monitoring.py)
    return values


@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_stack_program_runs_against_each_release(stack_values, stack, version):
    from vllm_gke.infra.plan import run_program

    plan = run_program(stack, for_release(stack_values[stack], version))
    snap, rel = load_snapshot(version), RELEASES[version]
    for dep in vllm_deployments(plan):
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert check_argv(container["args"], snap) == [], dep["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert json.loads(env["GKE_LLM_GUARD_CONFIG"])["maxTokensRule"] == rel.max_tokens_rule
        # vLLM validates VLLM_* names as its own: only ones this release reads.
        assert {n for n in env if n.startswith("VLLM_")} <= set(snap["environment"])


def test_chunked_prefill_off_uses_the_releases_switch(stack_values):
    from vllm_gke.infra.plan import run_program

    for version in RELEASES:
        values = for_release(stack_values["dev"], version)
        model = values["vllm-gke:models"][0]
        model["enableChunkedPrefill"] = False
        model["long"]["maxNumBatchedTokens"] = 8192
        plan = run_program("dev", values)
        args = vllm_deployments(plan)[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert RELEASES[version].disable_chunked_prefill in args and "--enable-chunked-prefill" not in args
        assert check_argv(args, load_snapshot(version)) == []


def test_image_environment_uses_only_known_vllm_variables():
    text = (REPO_ROOT / "images" / "Dockerfile").read_text()
    env_block = re.search(r"^ENV (.+?)(?=^\S|\Z)", text, re.M | re.S).group(1)
    names = set(re.findall(r"\b(VLLM_[A-Z_]+)=", env_block))
    assert names == {"VLLM_NO_USAGE_STATS"}
    for version in RELEASES:
        assert names <= set(load_snapshot(version)["environment"]), version
