"""Speculative decoding (models[].speculative): the config and its refusals, --speculative-config
read by vLLM 0.34's own parser and SpeculativeConfig, the draft loaded onto the share and waited
for, its GPU memory, the decode rate scaled by the acceptance rate (checked against a published
measurement) and the batch from which it stops paying."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vllm_gke.components.model.capacity import pool_capacity
from vllm_gke.components.model.catalog import H100_80GB, MODEL_SHAPES, ModelShape
from vllm_gke.components.model.gcs_weights import reader_prefixes
from vllm_gke.components.model.specs import ModelSpec, NodePoolSpec
from vllm_gke.components.model.speculative import (
    break_even_batch,
    draft_kv_per_device,
    expected_tokens,
    pool_rates,
    speculative_config,
)
from vllm_gke.components.model.throughput import Speculation, roofline
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import vllm_args, weights_markers
from vllm_gke.components.model.weights_layout import DRAFTS_DIR, draft_dir, served_files_gb, weight_copies
from vllm_gke.infra.advice import plan_warnings
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.plan import read_stack_config
from vllm_gke.infra.speculative_plan import speculative_trade_offs

REPO_ROOT = Path(__file__).resolve().parent.parent
EAGLE3_70B = {"method": "eagle3", "numSpeculativeTokens": 3, "acceptanceRate": 0.66,
              "draft": {"source": "hf://yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
                        "shape": {"paramsBillion": 1.4, "layers": 1, "kvHeads": 8, "headDim": 128}}}


def model(speculative: dict[str, Any] | None = None, **kw: Any) -> ModelSpec:
    base = {"name": "m", "source": "hf://meta-llama/Llama-3.3-70B-Instruct", "shape": "llama-3-70b",
            "nodePool": "h100", "tensorParallelSize": 4, "maxModelLen": 16384, "routing": "inference-gateway",
            "short": {"maxNumSeqs": 64, "contextTokens": 4096}}
    return ModelSpec.model_validate({**base, **kw, **({"speculative": speculative} if speculative else {})})


H100 = NodePoolSpec(name="h100", machine_type="a3-highgpu-8g")


# --- the config -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,words", [
    ({"method": "eagle3"}, "method eagle3 needs draft"),
    ({"method": "draft_model"}, "method draft_model needs draft"),
    ({"method": "ngram", "draft": EAGLE3_70B["draft"]}, "method ngram proposes from the prompt: remove draft"),
    ({"method": "mtp", "draft": EAGLE3_70B["draft"]}, "reads the model's own MTP layers"),
    ({**EAGLE3_70B, "promptLookupMax": 4}, "apply to method ngram only"),
    ({"method": "ngram", "promptLookupMin": 6, "promptLookupMax": 3}, "promptLookupMin (6) is above promptLookupMax (3)"),
    ({**EAGLE3_70B, "draft": {**EAGLE3_70B["draft"], "shape": "llama-9b"}}, "unknown draft shape 'llama-9b'"),
    ({**EAGLE3_70B, "draft": {**EAGLE3_70B["draft"], "source": "meta-llama/x"}}, "must be hf://<org>/<repo>"),
    ({**EAGLE3_70B, "acceptanceRate": 1.0}, "less than 1"),
    ({"method": "suffix"}, "'ngram', 'draft_model', 'eagle', 'eagle3' or 'mtp'"),
])
def test_bad_speculative_configs_are_refused_naming_the_fix(spec, words):
    with pytest.raises(ValidationError) as exc:
        model(spec)
    assert words in str(exc.value)


def test_the_component_packages_custom_shape_is_the_drafts_shape():
    draft = {k: v for k, v in EAGLE3_70B["draft"].items() if k != "shape"}
    m = model({**EAGLE3_70B, "draft": {**draft, "customShape": EAGLE3_70B["draft"]["shape"]}})
    assert m.speculative and m.speculative.draft and m.speculative.draft.params_billion == 1.4
    with pytest.raises(ValidationError, match="not both"):
        model({**EAGLE3_70B, "draft": {**EAGLE3_70B["draft"], "customShape": EAGLE3_70B["draft"]["shape"]}})


@pytest.mark.parametrize("arg", ['--speculative-config={"method":"ngram"}', "--spec-model", "--spec_tokens=3",
                                 "--spec-method"])
def test_extra_args_may_not_set_speculation_around_the_spec(arg):
    with pytest.raises(ValidationError, match="set models\\[\\].speculative"):
        model(extraArgs=[arg])


def tuned() -> dict[str, Any]:
    return copy.deepcopy(read_stack_config("tuned"))


def spec_model(values: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-spec")


def test_a_bad_speculative_key_is_a_config_error_naming_it():
    values = tuned()
    spec_model(values)["speculative"]["draft"] = None
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert "models[llama-70b-spec].speculative" in str(exc.value) and "needs draft" in str(exc.value)


def test_mtp_needs_a_checkpoint_with_mtp_layers():
    values = tuned()
    spec_model(values)["speculative"] = {"method": "mtp", "numSpeculativeTokens": 1}
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert "models[llama-70b-spec].speculative.method: shape 'llama-3-70b' has no multi-token-prediction" \
        in str(exc.value)


def test_lora_with_speculation_needs_room_for_every_proposal_in_a_step():
    # vLLM refuses LoRA + speculation when maxNumBatchedTokens < maxNumSeqs x (k + 1) (arg_utils.py:2747-2761).
    values = tuned()
    m = spec_model(values)
    m["adapters"] = [{"name": "sql", "source": "hf://org/sql-lora", "tenants": ["chat"]}]
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert "models[llama-70b-spec].short.maxNumBatchedTokens: with adapters and speculative decoding" in str(exc.value)
    assert "= 256" in str(exc.value)  # 64 x (3 + 1)
    m["short"]["maxNumBatchedTokens"] = 256
    assert parse(values).models  # enough room: accepted


# --- the command line and the draft on the share ------------------------------------------------

def test_the_speculative_config_names_the_shares_copy_never_the_hub():
    m = model(EAGLE3_70B)
    config = speculative_config(m)
    assert config is not None and config == {"method": "eagle3", "num_speculative_tokens": 3, "model": draft_dir(m)}
    assert str(config["model"]).startswith(f"{DRAFTS_DIR}/m/main-")
    argv = vllm_args(m, m.short)
    flag = argv.index("--speculative-config")
    assert json.loads(argv[flag + 1]) == config and "yuhuili" not in argv[flag + 1]
    assert model().speculative is None and "--speculative-config" not in vllm_args(model(), model().short)


def test_ngram_and_mtp_need_no_draft_folder():
    ngram = speculative_config(model({"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}))
    assert ngram == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 4}
    assert (speculative_config(model({"method": "ngram"})) or {})["prompt_lookup_min"] == 5  # vLLM's default window
    mtp = model({"method": "mtp", "numSpeculativeTokens": 1}, shape="deepseek-v3", tensorParallelSize=8)
    assert speculative_config(mtp) == {"method": "mtp", "num_speculative_tokens": 1}  # vLLM reads the model's folder
    assert draft_dir(mtp) is None and weight_copies([mtp]) == weight_copies([mtp.model_copy(update={"speculative": None})])


def test_every_argv_parses_in_the_vllm_0_34_snapshot():
    for spec in (EAGLE3_70B, {"method": "ngram"}):
        m = model(spec)
        assert check_argv(vllm_args(m, m.short), load_snapshot("0.34.0")) == []


def test_the_draft_is_loaded_like_a_model_and_the_servers_wait_for_it():
    m = model(EAGLE3_70B)
    copies = weight_copies([m])
    draft = next(c for c in copies if c.key == "m-draft")
    assert (draft.source, draft.directory, draft.adapter) == ("hf://yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", draft_dir(m), False)
    assert draft.size_key == "models[m].speculative.draft.diskGb" and draft.weights_gb == pytest.approx(2.8)
    assert draft.marker in weights_markers(m) and served_files_gb(m) == pytest.approx(m.files_gb + 2.8)
    assert ".drafts/m/" in reader_prefixes([m])  # the servers' bucket identity may read it
    assert len(weight_copies([model()])) == len(copies) - 1


# --- memory -------------------------------------------------------------------------------------

def test_the_drafts_weights_and_kv_cache_are_counted():
    plain, spec = (pool_capacity(x, "short", x.short, H100) for x in (model(), model(EAGLE3_70B)))
    assert spec.draft_per_gpu_gb == pytest.approx(1.4 * 2 / 4)  # sharded as the model (TP 4)
    assert spec.kv_budget_gb == pytest.approx(plain.kv_budget_gb - 0.7)
    # One more layer of the same KV shape: 1/80 more bytes a token.
    assert spec.kv_bytes_per_token_per_gpu == pytest.approx(plain.kv_bytes_per_token_per_gpu * 81 / 80)
    assert spec.tokens_fit < plain.tokens_fit and plain.draft_per_gpu_gb == 0
    assert draft_kv_per_device(model({"method": "ngram"})) == 0


def test_a_draft_that_does_not_fit_is_named_in_the_problem():
    big = {**EAGLE3_70B, "method": "draft_model", "draft": {"source": "hf://org/too-big", "shape": "qwen2.5-72b"}}
    row = pool_capacity(model(big), "short", model(big).short, H100)
    assert not row.fits and "GB of speculative draft" in (row.problem or "")


# --- speed --------------------------------------------------------------------------------------

def test_expected_tokens_per_step_is_leviathans():
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert Speculation(4, 0.8).expected_tokens == pytest.approx(expected_tokens(0.8, 4))
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_a_memory_bound_step_gains_the_expected_tokens_and_a_compute_bound_one_loses():
    s = MODEL_SHAPES["llama-3-70b"]
    spec = Speculation(3, 0.66)
    small = [roofline(H100_80GB, s, "bfloat16", "auto", 4, 4, 1, 1, 4096, speculation=x).decode_tokens_s
             for x in (None, spec)]
    assert small[1] / small[0] == pytest.approx(spec.expected_tokens, rel=0.01)  # free extra tokens
    large = [roofline(H100_80GB, s, "bfloat16", "auto", 4, 4, 1, 1024, 4096, speculation=x) for x in (None, spec)]
    assert large[1].bound == "compute" and large[1].decode_tokens_s < large[0].decode_tokens_s


def test_published_eagle3_speedups_on_an_h100():
    """Llama 3.1 8B with EAGLE-3 on one H100, MT-bench, SGLang: 158.34 -> 373.25 tokens/s at batch 1
    (2.36x; SGLang's speculative decoding docs, docs.sglang.io/advanced_features/speculative_decoding,
    "Performance Highlights") and 1.38x at batch 64 (Li et al., "EAGLE-3", arXiv:2503.01840, abstract).
    SGLang verifies speculative_num_draft_tokens = 8 tokens a sequence by default (same page): k = 7.
    The acceptance rate is fitted to the batch-1 figure (a = 0.7); the batch-64 speedup, where the
    verification turns compute-bound, is the model's prediction: 1.33x against the 1.38x measured."""
    s, head = MODEL_SHAPES["llama-3-8b"], ModelShape(0.38, 1, 8, 128)  # EAGLE-3 head: 1 layer of hidden 4096

    def speedup(batch: int) -> float:
        draft = roofline(H100_80GB, head, "bfloat16", "auto", 1, 1, 1, batch, 1024)
        spec = Speculation(7, 0.7, 7 * batch / draft.ceiling_tokens_s)
        plain, fast = (roofline(H100_80GB, s, "bfloat16", "auto", 1, 1, 1, batch, 1024, speculation=x)
                       for x in (None, spec))
        return fast.decode_tokens_s / plain.decode_tokens_s

    assert speedup(1) == pytest.approx(373.25 / 158.34, rel=0.05)
    assert speedup(64) == pytest.approx(1.38, rel=0.10)


def test_the_capacity_tables_tokens_s_is_the_speculative_rate():
    m = model(EAGLE3_70B)
    plain, spec = (pool_capacity(x, "short", x.short, H100) for x in (model(), m))
    assert spec.decode_tokens_s == pytest.approx(pool_rates(m, m.short, H100, min(64, spec.seqs_fit))[1])
    assert spec.decode_tokens_s > 2 * plain.decode_tokens_s  # 2.38 tokens a step, still memory-bound at 64


def test_the_stack_shows_where_speculation_stops_paying():
    cfg = parse(read_stack_config("tuned"))
    m = next(x for x in cfg.models if x.name == "llama-70b-spec")
    end = break_even_batch(m, m.short, cfg.pool(m.node_pool))
    assert end is not None and 64 < end < 4096
    below, above = (pool_rates(m, m.short, cfg.pool(m.node_pool), b) for b in (end - 1, end))
    assert below[1] > below[0] and above[1] <= above[0]
    [line] = speculative_trade_offs(cfg)
    assert line in plan_warnings(cfg, "ZONAL")  # the plan prints it
    assert line.startswith("llama-70b-spec short: speculative decoding (eagle3, 3 tokens a step, acceptance 0.66 stated")
    assert f"stops paying from batch {end}" in line and "$ a token x0.4" in line


def test_the_plan_says_when_it_does_not_pay_at_the_pools_batch():
    values = tuned()
    m = spec_model(values)
    m["speculative"] = {"method": "ngram", "numSpeculativeTokens": 8, "acceptanceRate": 0.1}
    [line] = speculative_trade_offs(parse(values))
    assert "it does NOT pay here" in line and "lower numSpeculativeTokens" in line


# --- vLLM 0.34 reads it -------------------------------------------------------------------------

def vllm_python() -> str:
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI") == "true":
            pytest.fail("CI builds --speculative-config with the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    return python


# The server's argv parsed by `vllm serve`'s parser and resolved into the engine's config, the
# platform stubbed to CPU: SpeculativeConfig is built whole from the drafts' config.json (draft
# model config, method checked against the checkpoint, draft TP); what is left for a GPU is loading
# the weights and the drafter's kernels.
ENGINE_CONFIG = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.check_and_update_config = classmethod(lambda cls, c: None)
platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
out = []
for argv in json.loads(sys.argv[1]):
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(argv)
    args.model = args.model_tag
    validate_parsed_serve_args(args)
    s = AsyncEngineArgs.from_cli_args(args).create_engine_config().speculative_config
    out.append({"method": s.method, "k": s.num_speculative_tokens, "model": s.model,
                "lookup": [s.prompt_lookup_min, s.prompt_lookup_max], "draft_tp": s.draft_tensor_parallel_size,
                "draft_kv": s.uses_draft_kv_cache(), "draft_arch": s.draft_model_config.architectures})
print(json.dumps(out))
"""


def _draft_dirs(tmp_path: Path, python: str) -> tuple[Path, Path, Path]:
    """A weightless target (benchmarks/vllm_fake_engine), a draft of its config, an EAGLE-3 head's config."""
    target = tmp_path / "model"
    subprocess.run([python, "-m", "benchmarks.vllm_fake_engine", "make-model", str(target)], cwd=REPO_ROOT,
                   check=True, capture_output=True)
    config = json.loads((target / "config.json").read_text())
    draft, head = tmp_path / "draft", tmp_path / "eagle3"
    draft.mkdir()
    head.mkdir()
    (draft / "config.json").write_text(json.dumps(config))
    (head / "config.json").write_text(json.dumps({
        **{k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                  "head_dim", "vocab_size", "rms_norm_eps", "torch_dtype")},
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "max_position_embeddings": 2048, "draft_vocab_size": config["vocab_size"], "tie_word_embeddings": False}))
    return target, draft, head


def _served(m: ModelSpec, target: Path, draft: Path | None) -> list[str]:
    """The argv as the pod runs it, the share's folders pointed at the local ones; the platform's
    guard middleware left out (it is not importable here)."""
    argv = vllm_args(m, m.short)
    middleware = argv.index("--middleware")
    argv = argv[1:middleware] + argv[middleware + 2:]
    d = draft_dir(m)
    return [str(target), *(a.replace(d, str(draft)) if d and draft else a for a in argv)]


def test_vllm_0_34_builds_the_speculative_config_from_the_platforms_argv(tmp_path: Path):
    python = vllm_python()
    target, draft, head = _draft_dirs(tmp_path, python)
    tp1 = {"tensorParallelSize": 1, "shape": "llama-3-8b"}
    cases = [
        (model({"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}, **tp1), None),
        (model({"method": "draft_model", "numSpeculativeTokens": 4,
                "draft": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct",
                          "shape": {"paramsBillion": 1.24, "layers": 16, "kvHeads": 8, "headDim": 64}}}, **tp1), draft),
        (model({**EAGLE3_70B}, **tp1), head),
    ]
    got = json.loads(subprocess.run(
        [python, "-c", ENGINE_CONFIG, json.dumps([_served(m, target, d) for m, d in cases])],
        capture_output=True, text=True, cwd=REPO_ROOT, check=False,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}).stdout.strip().splitlines()[-1])
    assert got[0] == {"method": "ngram", "k": 4, "model": "ngram", "lookup": [2, 5], "draft_tp": None,
                      "draft_kv": False, "draft_arch": ["Qwen2ForCausalLM"]}  # the target's config stands in
    assert got[1] | {"draft_arch": None} == {"method": "draft_model", "k": 4, "model": str(draft), "lookup": [0, 0],
                                             "draft_tp": 1, "draft_kv": True, "draft_arch": None}
    assert (got[2]["method"], got[2]["k"], got[2]["model"], got[2]["draft_kv"]) == ("eagle3", 3, str(head), True)
