"""Every `vllm serve` argv the stacks generate parses with the real parser of the pinned vLLM.

The parser is snapshotted by images/vllm_snapshot.py from the installed vllm package (the
real ArgumentParser of `vllm serve`); these tests need only the snapshot.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO_ROOT, STACKS, vllm_deployments
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot, normalise, snapshot_versions


def pinned_version() -> str:
    dockerfile = (REPO_ROOT / "images" / "Dockerfile").read_text()
    return re.search(r"ARG VLLM_VERSION=v?([\d.]+)", dockerfile).group(1)


def test_the_pinned_version_has_a_snapshot_from_the_real_parser():
    snap = load_snapshot(pinned_version())
    assert snap["generated_by"] == "images/vllm_snapshot.py"
    assert len(snap["flags"]) > 150 and "--middleware" in snap["flags"]
    assert {"0.11.0", "0.34.0"} <= set(snapshot_versions())


@pytest.mark.parametrize("stack", STACKS)
def test_every_generated_argv_parses(plans, stack):
    snap = load_snapshot(pinned_version())
    deployments = vllm_deployments(plans[stack])
    assert deployments
    for dep in deployments:
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert check_argv(container["args"], snap) == [], dep["metadata"]["name"]


def test_the_checker_rejects_what_vllm_rejects():
    snap = load_snapshot("0.11.0")
    assert check_argv(["/m", "--max-model-len", "4k", "--enforce-eager"], snap) == []
    assert check_argv(["/m", "--max_model_len=4096"], snap) == []  # vLLM's own normalisation
    assert check_argv(["/m", "--max-modle-len", "1"], snap)[0] == "--max-modle-len: not an option of vLLM 0.11.0"
    assert check_argv(["/m", "--kv-cache-dtype", "int4"], snap)[0].startswith("--kv-cache-dtype: 'int4' is not one of")
    assert check_argv(["/m", "--tensor-parallel-size", "two"], snap) == [
        "--tensor-parallel-size: 'two' is not a valid int"]
    assert check_argv(["/m", "--max-num-seqs"], snap) == ["--max-num-seqs: expects a value"]
    assert check_argv(["/m", "--enforce-eager=1"], snap) == ["--enforce-eager: is a switch and takes no value"]


def test_switch_off_flags_differ_between_releases():
    """Why the snapshot matters: 0.34 turns features off with --disable-*, 0.11 with --no-enable-*."""
    old, new = load_snapshot("0.11.0")["flags"], load_snapshot("0.34.0")["flags"]
    assert "--no-enable-prefix-caching" in old and "--no-enable-prefix-caching" not in new
    assert "--disable-prefix-caching" in new and "--disable-chunked-prefill" in new


def test_normalise():
    assert normalise("--max_num_seqs=8") == ("--max-num-seqs", "8")
    assert normalise("--enforce-eager") == ("--enforce-eager", None)
