"""The weights loader: put one model onto the shared share once, then mark it complete.

    python3 load_weights.py hf <org/repo> <revision> <dest> [--token-file F]
    python3 load_weights.py gcs <gs://bucket/path> <dest>

Runs in the loader Job (the server image for hf://, the Cloud SDK image for gs://), mounted from
a ConfigMap. No shell: every value arrives as an argument, never as code. Files go straight into
<dest>; the completion marker is written last, so a half-loaded tree never carries it, and a
run that finds the marker does nothing. For a mutable revision (a branch such as main) the
commit actually fetched is resolved first, downloaded exactly, and recorded in the marker.

Hugging Face downloads go through huggingface_hub's Python API (snapshot_download), whose
arguments mean the same in 0.x and 1.x - unlike the `hf download --exclude` CLI, whose
multi-value parsing changed between them. Standard library plus what the image ships.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

MARKER = ".vllm-gke-complete"
# Repositories often carry the original (non-safetensors) checkpoint too: never needed to serve.
IGNORE_PATTERNS = ["original/*", "*.pth"]


def already_loaded(dest: Path) -> bool:
    if (dest / MARKER).exists():
        print(f"weights already loaded in {dest}: {(dest / MARKER).read_text().strip()}")
        return True
    return False


def mark(dest: Path, **record: str) -> None:
    record["loadedAt"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    partial = dest / (MARKER + ".tmp")
    partial.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(partial, dest / MARKER)  # atomic: the marker is whole or absent
    print(f"weights loaded into {dest}: {record}")


def read_token(token_file: Optional[str]) -> Optional[str]:
    if token_file and Path(token_file).is_file():
        return Path(token_file).read_text().strip() or None
    return os.environ.get("HF_TOKEN") or None


def load_hf(repo: str, revision: str, dest: Path, token_file: Optional[str]) -> int:
    if already_loaded(dest):
        return 0
    from huggingface_hub import HfApi, snapshot_download

    token = read_token(token_file)
    commit = HfApi().model_info(repo, revision=revision, token=token).sha
    dest.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo_id=repo, revision=commit, local_dir=str(dest), ignore_patterns=IGNORE_PATTERNS,
                      token=token)
    mark(dest, source=f"hf://{repo}", revision=revision, commit=commit)
    return 0


def load_gcs(source: str, dest: Path) -> int:
    if already_loaded(dest):
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    # rsync: a retried Job resumes instead of starting over.
    subprocess.run(["gcloud", "storage", "rsync", "--recursive", source.rstrip("/"), str(dest)], check=True)
    mark(dest, source=source)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="load model weights onto the shared share once")
    sub = parser.add_subparsers(dest="kind", required=True)
    hf = sub.add_parser("hf")
    hf.add_argument("repo")
    hf.add_argument("revision")
    hf.add_argument("dest", type=Path)
    hf.add_argument("--token-file")
    gcs = sub.add_parser("gcs")
    gcs.add_argument("source")
    gcs.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.kind == "hf":
        return load_hf(args.repo, args.revision, args.dest, args.token_file)
    return load_gcs(args.source, args.dest)


if __name__ == "__main__":
    sys.exit(main())
