"""vLLM 0.34's speculative decoding (models[].speculative): how --speculative-config is read, where the
draft comes from, the memory it takes beside the model, and what vLLM refuses with it."""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

from ...components.model.specs import ModelSpec
from ...components.model.speculative import default_batched_tokens, speculative_config
from ...components.model.vllm_server import WEIGHTS_MARKERS_ENV
from ...components.model.weights_layout import draft_copies
from ..plan import Plan
from .base import Contract, _flag, _vllm_deployments

FLAG = "--speculative-config"


def _servers(plan: Plan) -> Iterator[tuple[str, ModelSpec, dict[str, Any], dict[str, Any]]]:
    """(name, the model it serves, its vllm container, its pod spec) for every server of the plan."""
    models = {m.name: m for m in plan.config.models}
    for d in _vllm_deployments(plan):
        spec = d["spec"]["template"]["spec"]
        model = models.get((d["spec"]["template"]["metadata"].get("labels") or {}).get("vllm-gke.io/model", ""))
        (c,) = [c for c in spec["containers"] if c["name"] == "vllm"]
        if model is not None:
            yield f"{d['metadata']['namespace']}/{d['metadata']['name']}", model, c, spec


def _config(c: dict[str, Any]) -> Optional[dict[str, Any]]:
    raw = _flag(c["args"], FLAG)
    return None if raw is None else json.loads(raw)


def speculative_config_is_the_models(plan: Plan) -> list[str]:
    out = []
    for name, model, c, _spec in _servers(plan):
        got, want = _config(c), speculative_config(model)
        if got != want:
            out.append(f"{name}: {FLAG} {got}, not the model's {want} (the draft named by the share's copy)")
    return out


def draft_waited_for_before_vllm_starts(plan: Plan) -> list[str]:
    out = []
    for name, model, c, spec in _servers(plan):
        waits = " ".join(" ".join(i.get("command") or []) for i in spec.get("initContainers") or [])
        waits += " ".join(e.get("value", "") for e in c.get("env") or [] if e["name"] == WEIGHTS_MARKERS_ENV)
        for copy in draft_copies(model):
            if copy.marker not in waits:
                out.append(f"{name}: vLLM may start before the draft's ready marker {copy.marker} is written")
    return out


def draft_sharded_as_counted(plan: Plan) -> list[str]:
    out = []
    for name, model, c, _spec in _servers(plan):
        config = _config(c) or {}
        tp = config.get("draft_tensor_parallel_size")
        if tp is not None and tp != model.tensor_parallel_size:
            out.append(f"{name}: draft_tensor_parallel_size {tp} puts the whole draft on fewer GPUs than the capacity "
                       f"check counts (its weights / {model.tensor_parallel_size})")
    return out


def lora_steps_hold_every_proposal(plan: Plan) -> list[str]:
    out = []
    for name, model, c, _spec in _servers(plan):
        config, args = _config(c), [str(a) for a in c["args"]]
        if config is None or "--enable-lora" not in args:
            continue
        seqs = int(_flag(c["args"], "--max-num-seqs") or 0)
        need = seqs * (int(config["num_speculative_tokens"]) + 1)
        # Unset, vLLM's own default for the GPU the pod runs on (speculative.default_batched_tokens).
        have = _flag(c["args"], "--max-num-batched-tokens") or default_batched_tokens(
            plan.config.pool(model.node_pool), seqs, int(_flag(c["args"], "--max-model-len") or 0),
            "--enable-chunked-prefill" in args)
        if int(have) < need:
            out.append(f"{name}: LoRA with speculative decoding needs --max-num-batched-tokens of at least {need}, "
                       f"not {have}")
    return out


def ngram_window_ordered(plan: Plan) -> list[str]:
    out = []
    for name, _model, c, _spec in _servers(plan):
        config = _config(c) or {}
        if config.get("method") != "ngram":
            continue
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            out.append(f"{name}: n-gram window {low}..{high}: vLLM refuses a minimum above the maximum")
    return out


SOURCE = "vllm-project/vllm@v0.34.0:vllm/"
ROWS = (
    Contract("vLLM", "0.34.0",
             "--speculative-config is one JSON value (json.loads), its keys SpeculativeConfig's fields, built with the "
             "target's model and parallel configs; method one of its SpeculativeMethod, num_speculative_tokens > 0",
             f"{SOURCE}engine/arg_utils.py:1892-1898,2133-2172; vllm/config/speculative.py:53-97,455,1645-1663",
             "each server of a model with speculative passes speculative.speculative_config(model) and the others "
             "none; tests/test_speculative.py builds it with vLLM's own parser and SpeculativeConfig",
             speculative_config_is_the_models),
    Contract("vLLM", "0.34.0",
             "a draft_model/eagle/eagle3 `model` is loaded as a model of its own (ModelConfig(model=..., revision=...): "
             "its config.json and weight files), from a local folder as from the hub; mtp reads the target's folder",
             f"{SOURCE}v1/worker/gpu/spec_decode/speculator_config.py:178-212; "
             "vllm/v1/worker/gpu/spec_decode/mtp/config.py:43-56",
             "the draft is a weight copy of its own (loader Job, /models/.drafts/<model>/<revision-digest>, ready "
             "marker) named by that folder, and the server waits for its marker as for the model's",
             draft_waited_for_before_vllm_starts),
    Contract("vLLM", "0.34.0",
             "the draft's tensor parallelism defaults to the target's (1 or the target's allowed); eagle, eagle3, mtp "
             "and draft models keep the drafter's layers in the same KV cache (uses_draft_kv_cache)",
             f"{SOURCE}config/speculative.py:1530-1552,1789-1797",
             "the capacity check counts the draft's weights / tensorParallelSize per GPU and its layers' KV bytes in "
             "every token; no draft_tensor_parallel_size is passed",
             draft_sharded_as_counted),
    Contract("vLLM", "0.34.0",
             "with LoRA, vLLM refuses speculative decoding unless max_num_batched_tokens >= max_num_seqs x "
             "(num_speculative_tokens + 1); unset, max_num_batched_tokens is the API server's default for the GPU "
             "(16384 from 160 GiB, 8192 from 70 GiB but an A100, else 2048; at least max_model_len without chunked "
             "prefill, at most max_num_seqs x max_model_len)",
             f"{SOURCE}engine/arg_utils.py:2747-2761,3005-3045,3200-3262",
             "config_rules/speculative.py asks for each pool's maxNumBatchedTokens (or vLLM's default on its node "
             "pool's GPU) at that bound where the model has adapters",
             lora_steps_hold_every_proposal),
    Contract("vLLM", "0.34.0",
             "ngram: prompt_lookup_min must not exceed prompt_lookup_max; either alone sets both, neither gives 5",
             f"{SOURCE}v1/worker/gpu/spec_decode/ngram/config.py:19-37",
             "the spec refuses promptLookupMin above promptLookupMax, and the argv passes both (5 where neither is set)",
             ngram_window_ordered),
)
