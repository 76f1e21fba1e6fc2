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
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, manifests_of
from tests.fixtures.fake_gcs import FakeGcs
from tests.test_first_up import HUB, hub_calls, run_loader
from tests.test_hyperdisk_weights import hyperdisk_values
from vllm_gke.components.hyperdisk_weights import claim_name, disk_size_gib, usable_gib
from vllm_gke.components.model.weights_layout import LOADER_EXIT_UNLOADABLE, WeightCopy
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
    # 0.11 serves no /v1/messages, which the picker's routes carry: staging without its picker model.
    values["vllm-gke:models"] = [m for m in values["vllm-gke:models"] if m.get("routing") != "inference-gateway"]
    kept = {m["name"] for m in values["vllm-gke:models"]}
    for tenant in values["vllm-gke:tenants"]:
        tenant["models"] = [m for m in tenant["models"] if m in kept]
    values["vllm-gke:tenants"] = [t for t in values["vllm-gke:tenants"] if t["models"]]
    values.pop("vllm-gke:picker", None)
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
    jobs = {j["metadata"]["name"].removeprefix("load-"): j for j in manifests_of(hyperdisk_plan, "Job", "vllm-gke-system")
            if j["metadata"]["name"].startswith("load-")}
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
    # As an hf:// marker does: which revision of the model this copy is (cold-start.md says so).
    assert marker["revision"] == plan.config.model("mistral-7b").revision


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


def prune_container(plan, model: str) -> dict:
    job = next(j for j in manifests_of(plan, "Job", "vllm-gke-system") if j["metadata"]["name"] == f"prune-{model}")
    return job["spec"]["template"]["spec"]["containers"][0]


def test_the_prune_job_removes_the_folders_no_pool_reads_and_the_loader_none(prod_by_hand, tmp_path):
    """After a new revision or source has loaded and the servers rolled onto it, the earlier
    folders of the model go (the share is sized for one copy of each plus one new copy); the
    canary's and the adapters' folders stay. The loader itself removes nothing beside its folder,
    loaded or failed: the servers still read the current copy until they roll."""
    with_token(tmp_path)
    plan = prod_by_hand  # llama-8b with a canary revision beside it (rollouts off: with Flagger, no prune)
    main_dest, canary_dest = folder(plan, "llama-8b", tmp_path), folder(plan, "llama-8b-canary", tmp_path)
    assert main_dest.parent == canary_dest.parent and main_dest != canary_dest
    earlier = [main_dest.parent / "main-0badf00d", canary_dest]
    for old in earlier:
        old.mkdir(parents=True)
        (old / load_weights.MARKER).write_text("{}")
    failed = run_loader(container(plan, "llama-8b"), tmp_path, extra_env={"FAKE_FREE_GIB": "1"})
    assert failed.returncode == LOADER_EXIT_UNLOADABLE and all(p.exists() for p in earlier)
    assert run_loader(container(plan, "llama-8b"), tmp_path).returncode == 0
    assert all(p.exists() for p in earlier)  # still read by the servers that have not rolled
    # An adapter's earlier revision, and a link the layout before digests left.
    adapter = folder(plan, "llama-8b-lora-support-sql", tmp_path)
    (adapter.parent / "v0-12345678").mkdir(parents=True)
    adapter.mkdir(parents=True)
    (main_dest.parent / "main").symlink_to(main_dest.name)
    pruned = run_loader(prune_container(plan, "llama-8b"), tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in main_dest.parent.iterdir()) == sorted([main_dest.name, canary_dest.name])
    assert [p.name for p in adapter.parent.iterdir()] == [adapter.name]
    # Again (a retried pod, or a second prune that lost the race): nothing left to remove, no failure.
    assert run_loader(prune_container(plan, "llama-8b"), tmp_path).returncode == 0


def test_a_sibling_another_prune_removed_first_is_no_failure(tmp_path, monkeypatch):
    """Two prunes of one model (a retried pod beside a slow one) race: the files one lists, the
    other may have removed."""
    parent = tmp_path / "m"
    keep = parent / "v2-aaaaaaaa"
    keep.mkdir(parents=True)
    for old in ("v0-bbbbbbbb", "v1-cccccccc"):
        (parent / old / "sub").mkdir(parents=True)
        (parent / old / "sub" / "model.safetensors").write_bytes(b"x")
    real_rmtree, real_unlink = shutil.rmtree, os.unlink

    def file_raced(path, *args, **kwargs):  # listed, then removed by the other prune first
        real_unlink(path, *args, **kwargs)
        raise FileNotFoundError(2, "No such file or directory", path)

    def folder_raced(path, *args, **hooks):  # the whole folder removed by the other prune first
        real_rmtree(path)
        return real_rmtree(path, *args, **hooks)
    monkeypatch.setattr(os, "unlink", file_raced)
    load_weights.prune_siblings([keep])
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert [p.name for p in parent.iterdir()] == [keep.name]
    (parent / "v3-eeeeeeee" / "sub").mkdir(parents=True)
    monkeypatch.setattr(load_weights.shutil, "rmtree", folder_raced)
    load_weights.prune_siblings([keep])
    assert [p.name for p in parent.iterdir()] == [keep.name]
    load_weights.prune_siblings([tmp_path / "gone" / "v1-dddddddd"])  # a model folder never made


def legacy_copy(plan, key: str, tmp_path: Path, marker: dict) -> Path:
    """The folder the loader wrote before folders carried a digest, complete."""
    command = container(plan, key)["command"]
    old = tmp_path / arg(command, "--legacy-dest").removeprefix("/")
    old.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (old / name).write_text(name)
    (old / load_weights.MARKER).write_text(json.dumps(marker))
    return old


def test_the_first_run_after_the_rename_moves_the_old_folder_instead_of_loading(plans, tmp_path):
    """The defect: the first `up` after folders took a digest loaded every model again beside its
    old folder (twice the share, hours). A complete copy of the same source, selection and
    revision in the old folder is renamed instead: no download, no space; a link keeps the old
    path readable for the servers until they roll."""
    with_token(tmp_path)
    plan = plans["dev"]
    source = plan.config.model("qwen-7b").source
    old = legacy_copy(plan, "qwen-7b", tmp_path, {"source": source, "reads": "mistral-first", "revision": "main",
                                                   "files": 2, "bytes": 10})
    result = run_loader(container(plan, "qwen-7b"), tmp_path)
    assert result.returncode == 0, result.stderr
    dest = folder(plan, "qwen-7b", tmp_path)
    assert loaded(dest) == {"config.json", "model.safetensors"} and not hub_calls(tmp_path)
    assert old.is_symlink() and old.resolve() == dest.resolve()
    assert (old / load_weights.MARKER).exists()  # an old server still finds its marker
    # An adapter's old folder is found the same way (its layout: .adapters/<model>/<adapter>/<revision>).
    adapter = plans["prod"].config.model("llama-8b").adapters[0]
    command = container(plans["prod"], f"llama-8b-lora-{adapter.name}")["command"]
    assert arg(command, "--legacy-dest") == f"/models/.adapters/llama-8b/{adapter.name}/{adapter.revision}"


def test_an_old_folder_of_another_source_or_selection_is_loaded_anew(plan_variant, tmp_path, monkeypatch):
    def to_gcs(values):
        values["vllm-gke:models"][0]["source"] = "gs://acme-models/qwen2.5-7b"
    plan = plan_variant("dev", to_gcs)
    # Another source at the same revision, and the same source read by another rule.
    for marker in ({"source": "hf://Qwen/Qwen2.5-7B-Instruct", "reads": "mistral-first"},
                   {"source": "gs://acme-models/qwen2.5-7b", "reads": "hf"}):
        old = legacy_copy(plan, "qwen-7b", tmp_path, marker)
        parsed = parsed_args(container(plan, "qwen-7b")["command"], tmp_path, monkeypatch)
        load_weights.adopt_legacy(parsed.dest, parsed.legacy_dest, parsed.source, parsed.reads, parsed.revision)
        assert not parsed.dest.exists() and not old.is_symlink() and (old / load_weights.MARKER).exists()
        shutil.rmtree(old)
    # The same source, selection and revision (a gs:// marker recorded none before): moved.
    old = legacy_copy(plan, "qwen-7b", tmp_path, {"source": "gs://acme-models/qwen2.5-7b", "reads": "mistral-first"})
    parsed = parsed_args(container(plan, "qwen-7b")["command"], tmp_path, monkeypatch)
    load_weights.adopt_legacy(parsed.dest, parsed.legacy_dest, parsed.source, parsed.reads, parsed.revision)
    assert (parsed.dest / "model.safetensors").exists() and old.is_symlink()


def parsed_args(command: list[str], tmp_path: Path, monkeypatch):
    """The loader's own parse of the plan's argv, the pod's /models under tmp_path."""
    seen = []
    monkeypatch.setattr(load_weights, "run", lambda args: seen.append(args) or 0)
    load_weights.main([str(tmp_path) + a if a.startswith("/models") else a for a in command[2:]])
    return seen[0]


def test_a_long_revision_keeps_its_folder_name_within_one_path_segment():
    """A revision may be 255 characters (a branch name): with "-<digest>" its folder name passed
    the 255-byte segment limit and every write into it failed."""
    from vllm_gke.components.model.specs import ModelSpec
    from vllm_gke.components.model.weights_layout import NAME_MAX_BYTES, model_dir

    base = ModelSpec(name="m", source="hf://a/b", shape={"params_billion": 1, "layers": 1, "kv_heads": 1,
                                                          "head_dim": 1}, node_pool="p")
    names = set()
    for revision in ("r" * 255, "r" * 254 + "s", "é" * 127 + "x"):
        name = model_dir(base.model_copy(update={"revision": revision})).rsplit("/", 1)[1]
        assert len(name.encode()) <= NAME_MAX_BYTES and re.fullmatch(r".+-[0-9a-f]{8}", name)
        names.add(name)
    assert len(names) == 3  # cut alike, still apart: the digest is of the whole revision
    assert model_dir(base).endswith("/main-" + model_dir(base)[-8:])  # short ones are unchanged
