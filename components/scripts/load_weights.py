"""The weights loader: put one model (or adapter) onto the shared store once, then mark it complete.

    python3 load_weights.py hf <org/repo> <revision> <dest> --reads RULE [--token-file F] [limits] [--legacy-dest D]
    python3 load_weights.py gcs <gs://bucket/path> <dest> --reads RULE [--revision R] [limits] [--legacy-dest D]
    limits: [--max-gib N --size-key KEY --prune]
    python3 load_weights.py prune <kept folder> ...   (the prune Job, once the servers rolled)

Runs in the loader Job (the server image for hf://, the Cloud SDK image for gs://), mounted from
a ConfigMap. No shell: every value arrives as an argument, never as code.

Only what vLLM reads is loaded: every file that is not a weight file (config, tokenizer,
generation config, index) and the weight files the pinned release's loader picks (RULE, below),
so a repository carrying a second copy of its weights (Mistral's `consolidated.safetensors`
beside the HF shards) is not copied twice. The size of that selection is known before any
download (the Hub's and Cloud Storage's listings carry sizes): where the destination is
bounded (`--max-gib`: a Hyperdisk ML disk is filled from this folder; or the share's free
space) and the files do not fit, the loader stops at once with exit code 3, naming the config
key to raise, and the Job's pod failure policy fails the Job instead of retrying.

Files go straight into <dest>; the completion marker is written last and records what was
loaded, so a half-loaded tree never carries it and a run that finds a marker for the same
selection from the same source does nothing. For a mutable revision (a branch such as main) the
commit is resolved first, downloaded exactly, and recorded. Where <dest> does not exist yet but
`--legacy-dest` (the folder before names carried a digest) holds a complete copy of the same
source and selection, that folder is renamed to <dest> instead of loaded again, and a link at
the old path keeps it readable for the servers that have not rolled yet.

The loader removes nothing beside its folder: the servers still read the current copy until they
roll. `prune` (a Job that runs after every server and load test of the model was updated) removes
the folders beside the kept ones (earlier revisions and sources, the old layout's folders).
Standard library plus what the image ships.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol

MARKER = ".vllm-gke-complete"
# Exit code for what no retry mends (does not fit, nothing vLLM could load): the Job's
# podFailurePolicy fails the Job on it at once.
EXIT_UNLOADABLE = 3
GIB = 1024 ** 3
# Files that hold tensors: only the ones vLLM picks are loaded; every other file is small
# (configs, tokenizers, indexes) and is loaded whatever it is, so nothing vLLM opens is missing.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx",
                   ".onnx_data", ".ot", ".tflite", ".npz", ".pb", ".nemo")
# vLLM's filter_files_not_needed_for_inference (model_loader/weight_utils.py).
TRAINING_FILES = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
# Never needed to serve: the original (non-HF) checkpoint Meta's repositories carry.
SKIPPED_DIRS = ("original/",)
# Which weight files the pinned vLLM release's DefaultModelLoader._prepare_weights opens
# (model_loader/default_loader.py), with load_format auto, as the platform runs it:
#   hf:            the first of *.safetensors, *.bin, *.pt at the top level that matches; safetensors
#                  filtered to model.safetensors.index.json's weight_map when the index exists
#                  (0.11: lines 150-205);
#   mistral-first: as hf, unless consolidated*.safetensors exist, which 0.34 then loads in the
#                  mistral format, filtered by consolidated.safetensors.index.json (0.34: 170-258);
#   adapter:       the first of adapter_model.safetensors/.bin/.pt (lora/lora_model.py:243-245).
RULES = ("hf", "mistral-first", "adapter")


class Unloadable(Exception):
    """The source cannot be served as it is: retrying will not change that."""


def is_weight(path: str) -> bool:
    return path.lower().endswith(WEIGHT_SUFFIXES)


def top_level(files: Mapping[str, int], pattern: str) -> list[str]:
    """vLLM globs os.path.join(folder, pattern): the folder's own files, not its subfolders'."""
    return sorted(f for f in files if "/" not in f and fnmatch.fnmatchcase(f, pattern))


def indexed(candidates: list[str], index: Optional[bytes]) -> list[str]:
    """filter_duplicate_safetensors_files: with an index, only the files its weight_map names."""
    if index is None:
        return candidates
    named = set(json.loads(index)["weight_map"].values())
    missing = named - set(candidates)
    if missing:
        raise Unloadable(f"the index names weight files the source lacks: {sorted(missing)}")
    return [f for f in candidates if f in named]


def weights_vllm_reads(files: Mapping[str, int], rule: str, read: Callable[[str], bytes]) -> list[str]:
    if rule == "adapter":
        return next(([n] for n in ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
                     if n in files), [])
    if rule == "mistral-first" and top_level(files, "consolidated*.safetensors"):
        index = "consolidated.safetensors.index.json"
        return indexed(top_level(files, "consolidated*.safetensors"), read(index) if index in files else None)
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        found = top_level(files, pattern)
        if found and pattern == "*.safetensors":
            index = "model.safetensors.index.json"
            return indexed(found, read(index) if index in files else None)
        if found:
            return [f for f in found if not f.endswith(TRAINING_FILES)]
    return []


def selection(files: Mapping[str, int], rule: str, read: Callable[[str], bytes]) -> list[str]:
    """What the loader copies: every non-weight file and the weights vLLM opens."""
    kept = [f for f in files if not f.startswith(SKIPPED_DIRS)]
    weights = weights_vllm_reads({f: files[f] for f in kept}, rule, read)
    if not weights:
        raise Unloadable("the source has no adapter_model.safetensors, .bin or .pt at its top level" if rule == "adapter"
                         else "the source has no weight files vLLM loads (*.safetensors, *.bin or *.pt at its top level)")
    return sorted({f for f in kept if not is_weight(f)} | set(weights))


class Source(Protocol):
    description: str

    def files(self) -> dict[str, int]: ...
    def read(self, path: str) -> bytes: ...
    def fetch(self, paths: list[str], everything: Mapping[str, int], dest: Path) -> None: ...


class HubSource:
    def __init__(self, repo: str, revision: str, token: Optional[str], dest: Path):
        from huggingface_hub import HfApi

        self.repo, self.revision, self.token, self.dest = repo, revision, token, dest
        info = HfApi().model_info(repo, revision=revision, token=token, files_metadata=True)
        self.commit: Optional[str] = info.sha
        assert info.siblings is not None  # listed: files_metadata
        self._files = {s.rfilename: int(s.size or 0) for s in info.siblings}
        self.description = f"hf://{repo}@{self.commit}"

    def files(self) -> dict[str, int]:
        return dict(self._files)

    def read(self, path: str) -> bytes:
        from huggingface_hub import hf_hub_download

        # Into the destination: an index is loaded anyway, and the image's cache may be read-only.
        return Path(hf_hub_download(self.repo, path, revision=self.commit, token=self.token,
                                    local_dir=str(self.dest))).read_bytes()

    def fetch(self, paths: list[str], everything: Mapping[str, int], dest: Path) -> None:
        from huggingface_hub import snapshot_download

        # Exact names: snapshot_download matches allow_patterns with fnmatch.
        snapshot_download(repo_id=self.repo, revision=self.commit, local_dir=str(dest),
                          allow_patterns=[glob.escape(p) for p in paths], token=self.token)


# The hosts Google's client libraries read from the same variables (emulators, tests).
METADATA_TOKEN = (f"http://{os.environ.get('GCE_METADATA_HOST', 'metadata.google.internal')}"
                  "/computeMetadata/v1/instance/service-accounts/default/token")
STORAGE_API = f"{os.environ.get('STORAGE_EMULATOR_HOST', 'https://storage.googleapis.com')}/storage/v1/b"


class BucketSource:
    """A gs:// folder: listed and read through the Cloud Storage JSON API with the pod's
    Workload Identity token, copied with `gcloud storage rsync` (parallel, resumable)."""

    def __init__(self, source: str, dest_uri: Optional[str] = None):
        self.source = source.rstrip("/")
        # Where the copy goes when the destination folder is itself a bucket's (mounted through
        # Cloud Storage FUSE): bucket to bucket, server-side, nothing through the pod or the FUSE
        # sidecar's staging disk (gcloud's sliced downloads write out of order, which gcsfuse
        # stages whole on local disk).
        self.dest_uri = dest_uri.rstrip("/") if dest_uri else None
        self.bucket, _, prefix = self.source.removeprefix("gs://").partition("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.description = self.source
        self._token: Optional[str] = None

    def _get(self, url: str) -> bytes:
        if self._token is None:
            request = urllib.request.Request(METADATA_TOKEN, headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(request, timeout=30) as response:
                self._token = json.load(response)["access_token"]
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self._token}"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.read()

    def files(self) -> dict[str, int]:
        found: dict[str, int] = {}
        page = ""
        while True:
            query = urllib.parse.urlencode({"prefix": self.prefix, "fields": "items(name,size),nextPageToken",
                                            **({"pageToken": page} if page else {})})
            listing = json.loads(self._get(f"{STORAGE_API}/{self.bucket}/o?{query}"))
            for item in listing.get("items", []):
                name = item["name"].removeprefix(self.prefix)
                if name and not name.endswith("/"):
                    found[name] = int(item["size"])
            page = listing.get("nextPageToken", "")
            if not page:
                return found

    def read(self, path: str) -> bytes:
        name = urllib.parse.quote(self.prefix + path, safe="")
        return self._get(f"{STORAGE_API}/{self.bucket}/o/{name}?alt=media")

    def fetch(self, paths: list[str], everything: Mapping[str, int], dest: Path) -> None:
        unwanted = sorted(set(everything) - set(paths))
        # rsync's --exclude is a Python regex on the path relative to the source.
        exclude = ["--exclude", "^(?:" + "|".join(re.escape(p) for p in unwanted) + ")$"] if unwanted else []
        subprocess.run(["gcloud", "storage", "rsync", "--recursive", *exclude, self.source, self.dest_uri or str(dest)],
                       check=True)


def read_marker(dest: Path) -> Optional[dict]:
    try:
        return json.loads((dest / MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None


def mark(dest: Path, **record: object) -> None:
    record["loadedAt"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    partial = dest / (MARKER + ".tmp")
    partial.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(partial, dest / MARKER)  # atomic: the marker is whole or absent
    print(f"weights loaded into {dest}: {record}")


def present(dest: Path) -> dict[str, int]:
    return {p.relative_to(dest).as_posix(): p.stat().st_size for p in dest.rglob("*") if p.is_file()}


def prune(dest: Path, keep: set[str]) -> None:
    """Remove what a previous loader put here beyond the selection (the folder is copied whole
    onto a disk sized for the selection)."""
    for path in sorted(present(dest), reverse=True):
        if path not in keep and path != MARKER:
            (dest / path).unlink()
    for folder in sorted((p for p in dest.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
        elif folder.name == ".cache" and folder.parent == dest:
            shutil.rmtree(folder)


def unloadable(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_UNLOADABLE


def too_large(total: float, max_gib: Optional[float], size_key: str, what: str) -> Optional[str]:
    if max_gib is None or total <= max_gib * GIB:
        return None
    return (f"the files vLLM reads from {what} take {total / GIB:.2f} GiB; the disk made for them holds "
            f"{max_gib:.2f} GiB. Set {size_key} to {int(total / GIB) + 1} (or more) and run pulumi up again.")


def done(dest: Path, source: str, rule: str, do_prune: bool, max_gib: Optional[float] = None,
         size_key: str = "") -> Optional[int]:
    """The exit status when a marker says this selection of this source is here (and, where asked,
    nothing else): 0, or EXIT_UNLOADABLE when it no longer fits the disk it fills (a smaller disk
    since: the copy would never complete). None when there is loading to do."""
    marker = read_marker(dest)
    if marker is None or marker.get("source") != source or marker.get("reads") != rule \
            or (do_prune and not marker.get("pruned")):
        return None
    if (problem := too_large(float(marker.get("bytes") or 0), max_gib, size_key, str(dest))) is not None:
        return unloadable(problem)
    print(f"weights already loaded in {dest}: {marker}")
    return 0


def _remove_tree(path: Path) -> None:
    """rmtree that takes another prune removing the same files first as no failure: it stops at
    the first file already gone, so it walks again until nothing of the tree is left."""
    for _attempt in range(10):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            if not path.exists():
                return


def prune_siblings(kept: list[Path]) -> None:
    """Remove the folders (and the old layout's links) beside the kept folders that no serving
    pool reads any more (an earlier revision or source of the same model or adapter): the store
    keeps one copy of each, plus a canary's, not one per roll. A sibling already gone (a
    concurrent prune) is skipped."""
    by_parent: dict[Path, set[str]] = {}
    for folder in kept:
        by_parent.setdefault(folder.parent, set()).add(folder.name)
    for parent, names in sorted(by_parent.items()):
        try:
            siblings = sorted(parent.iterdir())
        except FileNotFoundError:
            continue
        for sibling in siblings:
            if sibling.name in names or not (sibling.is_dir() or sibling.is_symlink()):
                continue
            print(f"removing {sibling}: no serving pool reads it")
            try:
                if sibling.is_symlink():
                    sibling.unlink()
                else:
                    _remove_tree(sibling)
            except FileNotFoundError:
                pass


def adopt_legacy(dest: Path, legacy: Optional[Path], source: str, rule: str, revision: Optional[str]) -> None:
    """The first run after folders took a digest: move a complete copy of the same source,
    selection and revision from the old folder (no download, no space), and leave a link there
    so the servers still on the old path find their files until they roll and the prune."""
    if legacy is None or legacy == dest or dest.exists() or legacy.is_symlink():
        return
    marker = read_marker(legacy)
    if marker is None or marker.get("source") != source or marker.get("reads") != rule \
            or marker.get("revision", revision) != revision:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(legacy, dest)
    print(f"moved the complete copy in {legacy} to {dest}")
    try:
        legacy.symlink_to(os.path.relpath(dest, legacy.parent), target_is_directory=True)
    except OSError as problem:
        print(f"no link left at {legacy}: {problem}")


def load(source: Source, dest: Path, rule: str, max_gib: Optional[float], size_key: str, do_prune: bool,
         record: dict[str, object]) -> int:
    if (status := done(dest, str(record["source"]), rule, do_prune, max_gib, size_key)) is not None:
        return status
    everything = source.files()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        wanted = selection(everything, rule, source.read)
    except Unloadable as problem:
        return unloadable(f"{source.description}: {problem}")
    total = sum(everything[f] for f in wanted)
    print(f"{source.description}: vLLM reads {len(wanted)} of its {len(everything)} files, {total / GIB:.2f} GiB")
    if (problem := too_large(total, max_gib, size_key, source.description)) is not None:
        return unloadable(problem)
    have = present(dest)
    missing = sum(size for f, size in everything.items() if f in wanted and have.get(f) != size)
    free = shutil.disk_usage(dest).free
    if missing > free:
        return unloadable(f"{source.description} needs {missing / GIB:.2f} GiB more on the store and "
                         f"{free / GIB:.2f} GiB are free. Raise weights.capacityGb and run pulumi up again.")
    source.fetch(wanted, everything, dest)
    if do_prune:
        prune(dest, set(wanted))
    mark(dest, **record, reads=rule, files=len(wanted), bytes=total, pruned=do_prune)
    return 0


def read_token(token_file: Optional[str]) -> Optional[str]:
    if token_file and Path(token_file).is_file():
        return Path(token_file).read_text().strip() or None
    return os.environ.get("HF_TOKEN") or None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="load model weights onto the shared store once")
    sub = parser.add_subparsers(dest="kind", required=True)
    pruner = sub.add_parser("prune", help="remove the folders beside the kept ones")
    pruner.add_argument("kept", type=Path, nargs="+", help="a folder a serving pool reads")
    for kind in ("hf", "gcs"):
        p = sub.add_parser(kind)
        if kind == "hf":
            p.add_argument("repo")
            p.add_argument("revision")
        else:
            p.add_argument("source")
            p.add_argument("--revision", help="the copy's revision, recorded in the marker")
        p.add_argument("dest", type=Path)
        p.add_argument("--reads", choices=RULES, required=True, help="which weight files vLLM opens")
        p.add_argument("--token-file")
        p.add_argument("--max-gib", type=float, help="the most the selection may take")
        p.add_argument("--size-key", default="the model's diskGb", help="the config key that sets --max-gib")
        p.add_argument("--prune", action="store_true", help="remove files beyond the selection")
        p.add_argument("--dest-uri", help="gs:// folder that dest mounts: copy bucket to bucket (gcs sources)")
        p.add_argument("--legacy-dest", type=Path, help="the folder before names carried a digest")
    args = parser.parse_args(argv)
    if args.kind == "prune":
        prune_siblings(args.kept)
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    source = f"hf://{args.repo}" if args.kind == "hf" else args.source
    adopt_legacy(args.dest, args.legacy_dest, source, args.reads, args.revision)
    if args.kind == "hf":
        if (status := done(args.dest, f"hf://{args.repo}", args.reads, args.prune, args.max_gib,
                           args.size_key)) is not None:
            return status  # before any call to the Hub: a re-run needs no network
        hub = HubSource(args.repo, args.revision, read_token(args.token_file), args.dest)
        return load(hub, args.dest, args.reads, args.max_gib, args.size_key, args.prune,
                    {"source": f"hf://{args.repo}", "revision": args.revision, "commit": hub.commit})
    return load(BucketSource(args.source, args.dest_uri), args.dest, args.reads, args.max_gib, args.size_key, args.prune,
                {"source": args.source, **({"revision": args.revision} if args.revision else {})})


if __name__ == "__main__":
    sys.exit(main())
