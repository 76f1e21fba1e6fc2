"""The weights loader copies only what the pinned vLLM reads, knows the size before it downloads,
and stops the Job at once, naming the key to raise, where the files cannot fit: a Hyperdisk ML
disk filled from its folder, or the share's free space. Runs the plan's own loader command
against repository listings of real models (tests/fixtures/hub/repos.json)."""

from __future__ import annotations

import glob
import importlib
import inspect
import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, manifests_of
from tests.fixtures.fake_gcs import FakeGcs
from tests.test_first_up import HUB, hub_calls, run_loader
from tests.test_hyperdisk_weights import hyperdisk_values
from vllm_gke.components.hyperdisk_weights import claim_name, disk_size_gib, usable_gib
from vllm_gke.components.weights_layout import LOADER_EXIT_UNLOADABLE, WeightCopy
from vllm_gke.infra.plan import run_program

sys.path.insert(0, str(REPO_ROOT / "components" / "scripts"))
load_weights = importlib.import_module("load_weights")
REPOS = json.loads((HUB / "repos.json").read_text())
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
GIB = 1024 ** 3


def loader(plan, key: str) -> dict:
    job = next(j for j in manifests_of(plan, "Job", "vllm-gke-system") if j["metadata"]["name"] == f"load-{key}")
    return job


def container(plan, key: str) -> dict:
    return loader(plan, key)["spec"]["template"]["spec"]["containers"][0]


def folder(plan, key: str, tmp_path: Path) -> Path:
    """Where the plan's loader for `key` writes, as run_loader maps the pod's /models."""
    command = container(plan, key)["command"]
    return tmp_path / (command[5] if command[2] == "hf" else command[4]).removeprefix("/")


def arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def with_token(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir(parents=True, exist_ok=True)
    (tmp_path / "secrets" / "token").write_text("hf_x\n")


def loaded(dest: Path) -> set[str]:
    return {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} - {load_weights.MARKER}


@pytest.fixture(scope="module")
def hyperdisk_plan():
    return run_program("staging", hyperdisk_values(extra=True))


def mistral_at(dtype: str | None = None, disk_gb: float | None = None):
    values = hyperdisk_values()
    mistral = next(m for m in values["vllm-gke:models"] if m["name"] == "mistral-7b")
    if dtype:
        mistral["dtype"] = dtype
    if disk_gb:
        mistral["diskGb"] = disk_gb
    return run_program("staging", values)


NON_WEIGHTS = {f for f in REPOS[MISTRAL] if not load_weights.is_weight(f)}


def test_mistral_loads_one_copy_of_its_weights_and_fits_its_disk(hyperdisk_plan, tmp_path):
    """The defect: the whole repository (consolidated.safetensors and the three HF shards, 27 GiB)
    went into the folder an 18 GiB disk is filled from, and the populator retried forever."""
    with_token(tmp_path)
    command = container(hyperdisk_plan, "mistral-7b")["command"]
    assert arg(command, "--reads") == "mistral-first" and "--prune" in command
    whole = sum(REPOS[MISTRAL].values()) / GIB
    assert whole > float(arg(command, "--max-gib"))  # what the old loader copied could never fit
    result = run_loader(container(hyperdisk_plan, "mistral-7b"), tmp_path)
    assert result.returncode == 0, result.stderr
    dest = folder(hyperdisk_plan, "mistral-7b", tmp_path)
    # vLLM 0.34 loads consolidated*.safetensors where a repository has them (load_format auto).
    assert loaded(dest) == NON_WEIGHTS | {"consolidated.safetensors"}
    marker = json.loads((dest / load_weights.MARKER).read_text())
    assert marker["bytes"] == sum(REPOS[MISTRAL][f] for f in loaded(dest))
    assert marker["bytes"] / GIB <= float(arg(command, "--max-gib"))


def test_the_0_11_release_loads_the_hf_shards_the_index_names(tmp_path):
    values = hyperdisk_values()
    values["vllm-gke:vllmVersion"] = "0.11.0"
    values["vllm-gke:serverImage"]["tag"] = "v0.11.0-gke.1"
    plan = run_program("staging", values)
    with_token(tmp_path)
    assert arg(container(plan, "mistral-7b")["command"], "--reads") == "hf"
    assert run_loader(container(plan, "mistral-7b"), tmp_path).returncode == 0
    shards = {f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}
    assert loaded(folder(plan, "mistral-7b", tmp_path)) == NON_WEIGHTS | shards


def test_llama_leaves_the_original_checkpoint(hyperdisk_plan, tmp_path):
    with_token(tmp_path)
    assert run_loader(container(hyperdisk_plan, "llama-8b"), tmp_path).returncode == 0
    files = loaded(folder(hyperdisk_plan, "llama-8b", tmp_path))
    assert not any(f.startswith("original/") for f in files)
    assert {f for f in files if f.endswith(".safetensors")} == {f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}


def test_an_adapter_loads_its_adapter_weights_only(hyperdisk_plan, tmp_path):
    with_token(tmp_path)
    command = container(hyperdisk_plan, "mistral-7b-lora-tickets")["command"]
    assert arg(command, "--reads") == "adapter"
    assert arg(command, "--size-key") == "models[mistral-7b].adapters[tickets].diskGb"
    assert run_loader(container(hyperdisk_plan, "mistral-7b-lora-tickets"), tmp_path).returncode == 0
    files = loaded(folder(hyperdisk_plan, "mistral-7b-lora-tickets", tmp_path))
    # Not the training state, not the intermediate checkpoint.
    assert files == {"README.md", "adapter_config.json", "adapter_model.safetensors"}


def test_files_that_cannot_fit_fail_the_job_at_once_naming_the_key(tmp_path):
    """Declared fp8, the disk is sized for 7 GB; the repository's bf16 weights are 13.5 GiB."""
    plan = mistral_at(dtype="fp8")
    with_token(tmp_path)
    result = run_loader(container(plan, "mistral-7b"), tmp_path)
    assert result.returncode == LOADER_EXIT_UNLOADABLE, result.stderr
    assert "Set models[mistral-7b].diskGb to 14" in result.stderr
    # Known from the listing: nothing was downloaded but the index the selection reads.
    assert [c["call"] for c in hub_calls(tmp_path)] == ["model_info"]
    assert not (folder(plan, "mistral-7b", tmp_path) / load_weights.MARKER).exists()
    # The Job fails on that exit code instead of retrying, and shows the message.
    job = loader(plan, "mistral-7b")["spec"]
    assert job["podFailurePolicy"]["rules"] == [{"action": "FailJob", "onExitCodes": {
        "containerName": "loader", "operator": "In", "values": [LOADER_EXIT_UNLOADABLE]}}]
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    assert container(plan, "mistral-7b")["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # Doing what the message says makes a disk the files fit.
    fixed = mistral_at(dtype="fp8", disk_gb=14)
    assert run_loader(container(fixed, "mistral-7b"), tmp_path).returncode == 0


def test_a_loaded_folder_that_outgrew_a_smaller_disk_fails_too(tmp_path):
    """Loaded once for a 14 GB disk, then the config shrinks it again: the marker alone must not pass
    a folder the new disk cannot hold (Volume Populator would retry for hours)."""
    with_token(tmp_path)
    assert run_loader(container(mistral_at(dtype="fp8", disk_gb=14), "mistral-7b"), tmp_path).returncode == 0
    (tmp_path / "hub.log").unlink()
    result = run_loader(container(mistral_at(dtype="fp8"), "mistral-7b"), tmp_path)
    assert result.returncode == LOADER_EXIT_UNLOADABLE and "Set models[mistral-7b].diskGb to 14" in result.stderr
    assert hub_calls(tmp_path) == []  # decided from the marker, before any call to the Hub


def test_a_raised_size_or_other_selection_is_a_new_claim():
    """An unbound claim's spec is immutable: a bigger disk must be another claim."""
    ws = WeightCopy("m", "m", "hf://a/b", "main", "/models/m/main", 14.5)
    bigger = WeightCopy("m", "m", "hf://a/b", "main", "/models/m/main", 20.0)
    assert claim_name(ws, "sc", "hf") != claim_name(bigger, "sc", "hf") != claim_name(ws, "sc", "mistral-first")
    # A diskGb set to the loaded size always fits, whatever the size.
    for gb in (0.5, 1.0, 7.3, 13.5, 140.0, 1300.0):
        assert usable_gib(gb) >= gb and disk_size_gib(gb) >= gb


def test_every_hyperdisk_loader_is_bounded_by_its_claim(hyperdisk_plan):
    jobs = {j["metadata"]["name"].removeprefix("load-"): j for j in manifests_of(hyperdisk_plan, "Job", "vllm-gke-system")}
    sizes = {int(c["spec"]["resources"]["requests"]["storage"].removesuffix("Gi"))
             for c in manifests_of(hyperdisk_plan, "PersistentVolumeClaim") if "dataSourceRef" in c["spec"]}
    for key, job in jobs.items():
        max_gib = float(arg(job["spec"]["template"]["spec"]["containers"][0]["command"], "--max-gib"))
        assert any(max_gib <= size * 0.93 - 1 + 0.01 for size in sizes), key


def test_an_older_full_copy_is_pruned_before_the_disk_is_filled(hyperdisk_plan, tmp_path):
    """A folder an earlier loader filled with the whole repository (marker without a selection)."""
    with_token(tmp_path)
    dest = folder(hyperdisk_plan, "mistral-7b", tmp_path)
    dest.mkdir(parents=True)
    for name in REPOS[MISTRAL]:
        (dest / name).write_text("old")
    (dest / load_weights.MARKER).write_text(json.dumps({"source": f"hf://{MISTRAL}", "revision": "main"}))
    assert run_loader(container(hyperdisk_plan, "mistral-7b"), tmp_path).returncode == 0
    assert loaded(dest) == NON_WEIGHTS | {"consolidated.safetensors"}
    assert json.loads((dest / load_weights.MARKER).read_text())["pruned"] is True


def test_filestore_loads_refuse_what_the_share_has_no_room_for(plans, tmp_path):
    with_token(tmp_path)
    plan = plans["staging"]
    command = container(plan, "mistral-7b")["command"]
    assert "--max-gib" not in command and "--prune" not in command  # the share is sized as a whole
    result = run_loader(container(plan, "mistral-7b"), tmp_path, extra_env={"FAKE_FREE_GIB": "10"})
    assert result.returncode == LOADER_EXIT_UNLOADABLE
    assert "Raise weights.capacityGb" in result.stderr


def test_bucket_sources_are_listed_then_synced_without_what_vllm_skips(plan_variant, tmp_path):
    def to_gcs(values):
        values["vllm-gke:models"][1]["source"] = "gs://acme-models/mistral-7b"
    plan = plan_variant("staging", to_gcs)
    command = container(plan, "mistral-7b")["command"]
    assert command[2:4] == ["gcs", "gs://acme-models/mistral-7b"]
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.parent.mkdir()
    gcloud.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$FAKE_GCLOUD_LOG"\n')
    gcloud.chmod(0o755)
    with FakeGcs() as gcs:
        env = {"PATH": f"{gcloud.parent}:{os.environ['PATH']}", "FAKE_GCLOUD_LOG": str(tmp_path / "gcloud.log"),
               **gcs.env}
        result = run_loader(container(plan, "mistral-7b"), tmp_path, extra_env=env)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "gcloud.log").read_text().splitlines()
    # Into the weights bucket's own folder, server-side: not through the FUSE mount (whose sidecar
    # stages out-of-order writes, as gcloud's sliced downloads are, whole on the node's disk).
    assert argv[:3] == ["storage", "rsync", "--recursive"] and argv[-2:] == [
        "gs://acme-models/mistral-7b",
        f"gs://acme-llm-staging-vllm-staging-weights/{folder(plan, 'mistral-7b', tmp_path).relative_to(tmp_path / 'models')}"]
    exclude = re.compile(arg(argv, "--exclude"))
    copied = {f for f in REPOS[MISTRAL] if not exclude.search(f)}
    assert copied == NON_WEIGHTS | {"consolidated.safetensors"}
    marker = json.loads((folder(plan, "mistral-7b", tmp_path) / load_weights.MARKER).read_text())
    assert marker["source"] == "gs://acme-models/mistral-7b" and marker["files"] == len(copied)


def test_the_fake_hub_has_the_real_libraries_signatures():
    """The loader calls huggingface_hub as the 0.34 image ships it (>= 2.0)."""
    real = importlib.import_module("huggingface_hub")
    assert not real.__file__.startswith(str(HUB))
    assert {"files_metadata", "revision", "token"} <= set(inspect.signature(real.HfApi.model_info).parameters)
    assert {"allow_patterns", "local_dir", "revision", "token"} <= set(
        inspect.signature(real.snapshot_download).parameters)
    assert {"local_dir", "revision", "token"} <= set(inspect.signature(real.hf_hub_download).parameters)
    assert {"rfilename", "size"} <= set(inspect.signature(real.hf_api.RepoSibling).parameters)
    from huggingface_hub.utils import filter_repo_objects

    names = ["model-00001-of-00002.safetensors", "odd[1].json", "star*.json", "original/params.json", "a.json"]
    wanted = ["odd[1].json", "star*.json", "model-00001-of-00002.safetensors"]
    assert sorted(filter_repo_objects(names, allow_patterns=[glob.escape(n) for n in wanted])) == sorted(wanted)


def test_the_loader_writes_only_to_its_writable_volumes(plans, hyperdisk_plan, tmp_path):
    """Under each backend's pod (read-only root filesystem), the loader writes nothing outside its
    writable mounts: run_loader fails any other write, as EROFS would."""
    for n, (plan, key) in enumerate([(plans["dev"], "qwen-7b"), (plans["staging"], "llama-8b"),
                                     (hyperdisk_plan, "mistral-7b")]):
        with_token(tmp_path / str(n))
        result = run_loader(container(plan, key), tmp_path / str(n))
        assert result.returncode == 0 and "read-only:" not in result.stderr, result.stderr
    # The check is live: a read-only weights mount fails the first write into it.
    frozen = json.loads(json.dumps(container(plans["dev"], "qwen-7b")))
    for m in frozen["volumeMounts"]:
        m["readOnly"] = True
    with_token(tmp_path / "frozen")
    result = run_loader(frozen, tmp_path / "frozen")
    assert result.returncode != 0 and "read-only:" in result.stderr


class Files:
    """A source held in memory: what load() lists, reads and fetches."""

    def __init__(self, description: str, contents: dict[str, bytes]):
        self.description, self.contents = description, contents

    def files(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.contents.items()}

    def read(self, path: str) -> bytes:
        return self.contents[path]

    def fetch(self, paths, everything, dest: Path) -> None:
        for p in paths:
            (dest / p).write_bytes(self.contents[p])


def test_a_marker_of_another_source_is_not_this_copy(tmp_path):
    """The defect: the marker keyed on the folder alone, so a changed source at the same revision
    found the old marker and the servers kept the old weights."""
    dest = tmp_path / "m"
    old = Files("gs://a/m", {"config.json": b"{}", "model.safetensors": b"old"})
    new = Files("gs://b/m", {"config.json": b"{}", "model.safetensors": b"new weights"})
    assert load_weights.load(old, dest, "hf", None, "k", False, {"source": "gs://a/m"}) == 0
    assert load_weights.load(new, dest, "hf", None, "k", False, {"source": "gs://b/m"}) == 0
    assert (dest / "model.safetensors").read_bytes() == b"new weights"
    assert json.loads((dest / load_weights.MARKER).read_text())["source"] == "gs://b/m"
    # The same source again: nothing to load.
    assert load_weights.done(dest, "gs://b/m", "hf", False) == 0


def test_a_complete_copy_removes_the_folders_no_pool_reads(plans, tmp_path):
    """After a new revision or source has loaded, the earlier folders of the model go (the share is
    sized for one copy of each, plus headroom for the roll); the canary's folder stays, and a load
    that fails removes nothing."""
    with_token(tmp_path)
    plan = plans["prod"]  # llama-8b with a canary revision beside it
    main_dest, canary_dest = folder(plan, "llama-8b", tmp_path), folder(plan, "llama-8b-canary", tmp_path)
    assert main_dest.parent == canary_dest.parent and main_dest != canary_dest
    command = container(plan, "llama-8b")["command"]
    assert "--prune-siblings" in command and arg(command, "--keep") == canary_dest.name
    earlier = [main_dest.parent / "main", main_dest.parent / "main-0badf00d", canary_dest]
    for old in earlier:
        old.mkdir(parents=True)
        (old / load_weights.MARKER).write_text("{}")
    failed = run_loader(container(plan, "llama-8b"), tmp_path, extra_env={"FAKE_FREE_GIB": "1"})
    assert failed.returncode == LOADER_EXIT_UNLOADABLE and all(p.exists() for p in earlier)
    assert run_loader(container(plan, "llama-8b"), tmp_path).returncode == 0
    assert sorted(p.name for p in main_dest.parent.iterdir()) == sorted([main_dest.name, canary_dest.name])
    # The canary's loader keeps the current revision's folder in turn.
    assert arg(container(plan, "llama-8b-canary")["command"], "--keep") == main_dest.name
