"""Weight loading: the files vLLM opens, which the loader Jobs copy, and where huggingface_hub and
hf_xet write."""

from __future__ import annotations

from typing import Any, Iterator

from ...components.model.vllm_versions import release
from ...components.model.weights_layout import LOADER_PROGRAM
from ..plan import Plan
from .base import Contract, _docs, _env, _flag, _writable_mounts


def _loaders(plan: Plan) -> Iterator[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """Each weights-loader container: (its Job, the container, its argv as strings)."""
    for job in _docs(plan, "Job"):
        for c in job["spec"]["template"]["spec"].get("containers", []):
            argv = [str(a) for a in c.get("command") or []]
            if any(a.endswith("/" + LOADER_PROGRAM.name) for a in argv):
                yield job, c, argv


def loader_copies_what_vllm_opens(plan: Plan) -> list[str]:
    """Each loader Job selects by the pinned release's rule (models) or vLLM's adapter rule."""
    out, rule = [], release(plan.config.vllm_version).weights_rule
    for job, _c, argv in _loaders(plan):
        if "prune" in argv and "--reads" not in argv:
            continue  # the prune Job copies nothing
        wanted = "adapter" if ".adapters[" in (_flag(argv, "--size-key") or "") else rule
        if _flag(argv, "--reads") != wanted:
            out.append(f"{job['metadata']['name']}: loads by rule {_flag(argv, '--reads')}, "
                       f"but vLLM {plan.config.vllm_version} opens by {wanted}")
    return out


def loader_writes_only_to_volumes(plan: Plan) -> list[str]:
    """huggingface_hub and gcloud write under HOME (HF_HOME, hf_xet's logs, CLOUDSDK_CONFIG) and
    TMPDIR besides the weights: on a read-only root filesystem those must be writable mounts."""
    out = []
    for job, c, _argv in _loaders(plan):
        env = _env(c)
        writable = _writable_mounts(c)
        if not (c.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            out.append(f"{job['metadata']['name']}: the loader's root filesystem is writable")
        for var in ("HOME", "TMPDIR"):
            if env.get(var) not in writable:
                out.append(f"{job['metadata']['name']}: {var} is not a writable volume: the Hub client and "
                           "gcloud write there")
        if env.get("HF_XET_CHUNK_CACHE_SIZE_BYTES") != "0":
            out.append(f"{job['metadata']['name']}: hf_xet's 10 GB chunk cache would fill the loader's home")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("vLLM", "0.34.0",
             "with load_format auto a model folder holding top-level consolidated*.safetensors loads those "
             "(filtered by consolidated.safetensors.index.json), else the first of *.safetensors, *.bin, *.pt "
             "(safetensors filtered by model.safetensors.index.json); a LoRA adapter opens the first of "
             "adapter_model.safetensors, .bin, .pt",
             "vllm-project/vllm@v0.34.0:vllm/model_executor/model_loader/default_loader.py:170-258; "
             "vllm/lora/lora_model.py:243-245",
             "each loader Job copies the config and tokenizer files and only the weights that rule opens "
             "(--reads, VllmRelease.weights_rule), so a disk sized for them holds them",
             loader_copies_what_vllm_opens),
    Contract("huggingface_hub / hf_xet", ">=2.0 (vLLM 0.34's floor), which requires hf-xet >=1.6.0,<2.0.0; "
             "xet-core >=1.6.0",
             "downloads into local_dir write their metadata under <local_dir>/.cache/huggingface; the client "
             "keeps HF_HOME (XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface) and hf_xet logs under "
             "HF_XET_CACHE/logs (HF_HOME/xet) with a 10 GB chunk cache there unless "
             "HF_XET_CHUNK_CACHE_SIZE_BYTES says otherwise",
             "huggingface/huggingface_hub@v2.4.0:src/huggingface_hub/constants.py:159-170,341-342; "
             "huggingface/xet-core@v1.6.0:xet_runtime/src/config/groups/log.rs:5-18, chunk_cache.rs:1-10",
             "loader containers run on a read-only root filesystem with HOME and TMPDIR on emptyDirs, the "
             "chunk cache off; the weights' own metadata lands in the weights folder (<folder>/.cache/huggingface): "
             "on hyperdisk-ml the loader removes it (--prune) before the disk is filled from the folder, on "
             "filestore and gcs it stays there beside the weights (a few KB a file)",
             loader_writes_only_to_volumes),
)
