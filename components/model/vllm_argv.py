"""Check a `vllm serve` argv against a snapshot of the real vLLM parser (images/vllm_snapshot.py).

The snapshot lists every option of one vLLM release's parser: switch or value, nargs, type
name and choices. An argv is checked the way vLLM's FlexibleArgumentParser reads it:
underscores in option names are dashes, `--x=y` is `--x y`.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

SNAPSHOT_DIR = Path(__file__).resolve().parents[2] / "images" / "vllm-versions"

_INT = re.compile(r"[+-]?\d+")
# vLLM's human_readable_int: 4096, 4k, 1M, 25.6k (decimal), 1Ki (binary).
_HUMAN_INT = re.compile(r"\d+(\.\d+)?([kKmMgGtT]i?)?")


def snapshot_versions() -> list[str]:
    """Every snapshot: the CUDA releases by version, then the TPU builds' (tpu-<version>)."""
    def key(name: str) -> tuple[bool, tuple[int, ...]]:
        tpu = name.startswith("tpu-")
        return tpu, tuple(int(x) for x in name.removeprefix("tpu-").split("."))
    return sorted((p.stem for p in SNAPSHOT_DIR.glob("*.json")), key=key)


@lru_cache(maxsize=None)
def load_snapshot(version: str) -> dict[str, Any]:
    path = SNAPSHOT_DIR / f"{version}.json"
    if not path.exists():
        raise FileNotFoundError(f"no vLLM {version} snapshot at {path}; generate it with images/vllm_snapshot.py")
    return json.loads(path.read_text())


def normalise(option: str) -> tuple[str, str | None]:
    """('--max_model_len=8', ...) -> ('--max-model-len', '8'), as FlexibleArgumentParser reads it."""
    name, eq, value = option.partition("=")
    return "--" + name[2:].replace("_", "-"), (value if eq else None)


# What the kubelet puts in for a pod's $(VAR) references before vLLM parses them: a multi-host
# group's host index (components/model/vllm_server.py group_args) is an int, its leader's address a host.
KUBELET_EXPANDED = {"$(LWS_WORKER_INDEX)": "1", "$(LWS_LEADER_ADDRESS)": "leader.group.namespace"}


def _type_ok(type_name: str | None, value: str) -> bool:
    value = KUBELET_EXPANDED.get(value, value)
    if type_name == "int":
        return bool(_INT.fullmatch(value))
    if type_name == "float":
        try:
            float(value)
        except ValueError:
            return False
        return True
    if type_name in ("human_readable_int", "human_readable_int_or_auto"):
        return bool(_HUMAN_INT.fullmatch(value)) or (type_name.endswith("auto") and value in ("auto", "-1"))
    return True  # str and vLLM's composite types (optional, json) take any text


def check_argv(argv: Sequence[str], snapshot: dict[str, Any]) -> list[str]:
    """Problems vLLM's parser would raise for `vllm serve <argv>`; empty when it parses."""
    flags: dict[str, dict[str, Any]] = snapshot["flags"]
    problems: list[str] = []
    tokens = list(argv)
    i = 0
    if tokens and not tokens[0].startswith("-"):
        i = 1  # the positional model_tag
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            problems.append(f"unexpected argument '{token}'")
            i += 1
            continue
        name, inline = normalise(token)
        spec = flags.get(name)
        i += 1
        if spec is None:
            problems.append(f"{name}: not an option of vLLM {snapshot['version']}")
            continue
        if spec["kind"] == "switch":
            if inline is not None:
                problems.append(f"{name}: is a switch and takes no value")
            continue
        values: list[str] = [inline] if inline is not None else []
        if inline is None:
            if spec["nargs"] in ("+", "*"):
                while i < len(tokens) and not tokens[i].startswith("--"):
                    values.append(tokens[i])
                    i += 1
            elif i < len(tokens) and not tokens[i].startswith("--"):
                values.append(tokens[i])
                i += 1
        if not values and spec["nargs"] not in ("?", "*"):
            problems.append(f"{name}: expects a value")
        for value in values:
            if spec["choices"] and value not in spec["choices"]:
                problems.append(f"{name}: '{value}' is not one of {', '.join(spec['choices'])}")
            elif not _type_ok(spec["type"], value):
                problems.append(f"{name}: '{value}' is not a valid {spec['type']}")
    return problems
