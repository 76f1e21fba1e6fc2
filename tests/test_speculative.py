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
from vllm_gke.components.model.specs import ModelSpec, NodePoolSpec, extra_arg_problem
from vllm_gke.components.model.speculative import (
    acceptance,
    break_even_batch,
    draft_kv_per_device,
    expected_tokens,
    max_num_batched_tokens,
    per_token_acceptance,
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
from vllm_gke.infra.speculative_plan import speculative_lines, speculative_trade_offs

REPO_ROOT = Path(__file__).resolve().parent.parent
EAGLE3_70B = {"method": "eagle3", "numSpeculativeTokens": 3, "meanAcceptanceLength": 2.41,
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
    ({**EAGLE3_70B, "meanAcceptanceLength": 4.0}, "meanAcceptanceLength (4) must be below numSpeculativeTokens + 1 (4)"),
    ({**EAGLE3_70B, "meanAcceptanceLength": 1.0}, "greater than 1"),
    ({**EAGLE3_70B, "method": "draft_model"}, "draft.shape needs attentionHeads and vocabSize for draft_model"),
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
                                 "--spec-method", "-sc", '-sc={"method":"ngram"}'])
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
    # vLLM refuses LoRA + speculation when maxNumBatchedTokens < maxNumSeqs x (k + 1) (arg_utils.py:2747-2761);
    # unset, it is vLLM's default for the GPU: 8192 on an H100 (arg_utils.py:3023-3033).
    values = tuned()
    m = spec_model(values)
    m["adapters"] = [{"name": "sql", "source": "hf://org/sql-lora", "tenants": ["chat"]}]
    assert parse(values).models  # 64 x (3 + 1) = 256 within the H100's default 8192
    m["speculative"]["numSpeculativeTokens"] = 2
    m["speculative"].pop("meanAcceptanceLength")
    m["short"]["maxNumSeqs"] = 3000
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert ("models[llama-70b-spec].short.maxNumBatchedTokens: with adapters and speculative decoding vLLM needs "
            "maxNumBatchedTokens of at least maxNumSeqs x (numSpeculativeTokens + 1) = 9000, and on 'h100' it is 8192 "
            "(its default)") in str(exc.value)
    m["short"]["maxNumBatchedTokens"] = 9000
    assert "maxNumBatchedTokens" not in _problems(values)  # enough room


def _problems(values: dict[str, Any]) -> str:
    try:
        parse(values)
    except ConfigError as exc:
        return str(exc)
    return ""


def test_vllms_default_batched_tokens_is_the_gpus():
    m = model(EAGLE3_70B)
    l4 = NodePoolSpec(name="l4", machine_type="g2-standard-8")
    assert max_num_batched_tokens(m, m.short, H100) == 8192  # H100, H200: 8192 (arg_utils.py:3023-3033)
    assert max_num_batched_tokens(m, m.short, l4) == 2048  # other GPUs: 2048
    assert max_num_batched_tokens(model(EAGLE3_70B, enableChunkedPrefill=False), m.short, l4) == 16384  # max_model_len
    assert max_num_batched_tokens(model(EAGLE3_70B, short={"maxNumSeqs": 64, "maxNumBatchedTokens": 512}),
                                  m.short.model_copy(update={"max_num_batched_tokens": 512}), H100) == 512


def test_level_2_sleep_would_drop_the_drafts_weights_and_is_refused():
    # vLLM 0.34's level-2 sleep discards the drafter's weights; the wake reloads the target's only
    # (v1/worker/gpu_worker.py:297-318).
    values = tuned()
    spec_model(values)["sleepMode"] = {"level": 2}
    assert ("models[llama-70b-spec].sleepMode.level: level 2 sleep discards the eagle3 drafter's weights"
            in _problems(values))
    spec_model(values)["sleepMode"] = {"level": 1}
    assert "discards the eagle3 drafter" not in _problems(values)
    spec_model(values)["sleepMode"] = {"level": 2}
    spec_model(values)["speculative"] = {"method": "ngram"}  # no weights to drop
    assert "drafter's weights" not in _problems(values)


def test_a_draft_vllm_would_refuse_beside_its_model_is_refused():
    values = tuned()
    draft = {"source": "hf://org/draft", "shape": {"paramsBillion": 0.5, "layers": 24, "kvHeads": 2, "headDim": 64,
                                                    "attentionHeads": 14, "vocabSize": 151936}}
    spec_model(values)["speculative"] = {"method": "draft_model", "draft": draft}
    problems = _problems(values)
    assert "models[llama-70b-spec].speculative.draft.shape: the draft's 14 attention heads are not divisible by " \
           "tensorParallelSize 4" in problems
    assert "the draft's vocabulary (151936 tokens) is not the model's (128256)" in problems
    draft["shape"] |= {"attentionHeads": 32, "vocabSize": 128256}  # Llama 3.2 1B's
    assert "speculative.draft.shape" not in _problems(values)
    spec_model(values)["speculative"]["draft"] = {"source": "hf://org/draft", "shape": "qwen2.5-1.5b"}
    assert "not the model's (128256)" in _problems(values)  # a catalog draft's vocabulary is known


def test_tpu_pools_are_refused():
    values = tuned()
    values["vllm-gke:nodePools"].append({"name": "v6e", "machineType": "ct6e-standard-4t", "tpuTopology": "2x2",
                                         "minNodes": 0, "maxNodes": 1})
    m = spec_model(values)
    m |= {"nodePool": "v6e", "speculative": {"method": "ngram"}}
    assert "models[llama-70b-spec].speculative: node pool 'v6e' is a TPU pool" in _problems(values)


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


def test_the_stated_mean_acceptance_length_is_solved_for_the_per_token_rate():
    # vLLM measures 1 + accepted / drafts (v1/spec_decode/metrics.py:184-188); a is its root.
    a = per_token_acceptance(2.41, 3)
    assert expected_tokens(a, 3) == pytest.approx(2.41) and a == pytest.approx(0.667, abs=1e-3)
    assert per_token_acceptance(2.88, 7) == pytest.approx(0.666, abs=1e-3)  # the stack's derivation
    spec = model(EAGLE3_70B).speculative
    assert spec is not None and acceptance(spec) == pytest.approx(a)
    # accepted / draft tokens is another number: a(1 - a^k) / (k(1 - a)), 0.47 here, not a.
    assert a * (1 - a ** 3) / (3 * (1 - a)) == pytest.approx(0.47, abs=0.01)


def test_published_eagle3_speedup_at_batch_64_predicted_from_batch_1():
    """Llama 3.1 8B with EAGLE-3 on one H100, MT-bench, SGLang: 158.34 -> 373.25 tokens/s at batch 1
    (2.36x; SGLang's speculative decoding docs, "Performance Highlights") and 1.38x at batch 64 (Li et
    al., "EAGLE-3", arXiv:2503.01840, abstract). SGLang's configuration as that page gives its
    defaults: a tree 5 drafts deep (speculative_num_steps 5, topk 4), 8 tokens verified a sequence
    (speculative_num_draft_tokens). The per-token rate is fitted to the batch-1 figure; at batch 64,
    where the verification of 8 tokens turns compute-bound, the roofline's speedup is a prediction."""
    s, head = MODEL_SHAPES["llama-3-8b"], ModelShape(0.38, 1, 8, 128)  # EAGLE-3 head: 1 layer of hidden 4096

    def speedup(batch: int, a: float) -> float:
        draft = roofline(H100_80GB, head, "bfloat16", "auto", 1, 1, 1, batch, 1024)
        spec = Speculation(5, a, 5 * batch / draft.ceiling_tokens_s, verified=8)
        plain, fast = (roofline(H100_80GB, s, "bfloat16", "auto", 1, 1, 1, batch, 1024, speculation=x)
                       for x in (None, spec))
        return fast.decode_tokens_s / plain.decode_tokens_s

    lo, hi = 0.01, 0.99
    while hi - lo > 1e-4:  # fit a at batch 1
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(1, mid) < 373.25 / 158.34 else (lo, mid)
    assert speedup(1, lo) == pytest.approx(373.25 / 158.34, rel=1e-3)
    assert speedup(64, lo) == pytest.approx(1.38, rel=0.10)  # the prediction: 1.29x


def test_the_capacity_tables_tokens_s_is_the_speculative_rate():
    m = model(EAGLE3_70B)
    plain, spec = (pool_capacity(x, "short", x.short, H100) for x in (model(), m))
    assert spec.decode_tokens_s == pytest.approx(pool_rates(m, m.short, H100, min(64, spec.seqs_fit))[1])
    assert spec.decode_tokens_s > 2 * plain.decode_tokens_s  # 2.41 tokens a step, still memory-bound at 64


def test_the_stack_shows_the_gains_ceiling_and_where_speculation_stops_paying():
    cfg = parse(read_stack_config("tuned"))
    m = next(x for x in cfg.models if x.name == "llama-70b-spec")
    end = break_even_batch(m, m.short, cfg.pool(m.node_pool))
    assert end is not None and 64 < end < 4096
    below, above = (pool_rates(m, m.short, cfg.pool(m.node_pool), b) for b in (end - 1, end))
    assert below[1] > below[0] and above[1] <= above[0]
    [line] = speculative_lines(cfg)
    assert line not in plan_warnings(cfg, "ZONAL")  # it pays: the plan's section, not a warning
    assert line.startswith("llama-70b-spec short: speculative decoding (eagle3, 3 tokens a step, mean acceptance "
                           "length 2.41 stated, per-token a 0.67) at batch 64: at most ")
    assert "the roofline's bound" in line and "1.38x at batch 64 (EAGLE-3, SGLang)" in line
    assert "1.10-1.21x up to 200 concurrent requests" in line
    assert "it pays at every batch this replica holds (up to 64)" in line and "$ a token x0.4" in line


def test_the_plan_warns_when_it_does_not_pay_at_the_pools_batch():
    values = tuned()
    m = spec_model(values)
    m["speculative"] = {"method": "ngram", "numSpeculativeTokens": 8, "meanAcceptanceLength": 1.1}
    cfg = parse(values)
    [line] = speculative_lines(cfg)
    assert "it does NOT pay here" in line and "lower numSpeculativeTokens" in line
    assert speculative_trade_offs(cfg) == [line] and line in plan_warnings(cfg, "ZONAL")


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
                          "shape": {"paramsBillion": 1.24, "layers": 16, "kvHeads": 8, "headDim": 64,
                                    "attentionHeads": 32, "vocabSize": 128256}}}, **tp1), draft),
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


# --- the options and capacity tables ------------------------------------------------------------

def test_the_options_leave_out_accelerators_speculation_is_refused_on():
    from vllm_gke.infra.accelerator_options import model_options
    plain = {o.accelerator for o in model_options(model())}
    spec = {o.accelerator for o in model_options(model(EAGLE3_70B))}
    assert any(a.startswith("tpu") for a in plain)  # the plain 70B has TPU options
    assert spec and not any(a.startswith("tpu") for a in spec)


def test_the_tables_mark_the_speculative_rate_as_a_ceiling():
    from typing import cast

    from rich.console import Console

    from vllm_gke.infra.accelerator_options import AcceleratorOption
    from vllm_gke.infra.plan_text import capacity_table, options_table
    from vllm_gke.infra.report import Verdicts
    cfg = parse(read_stack_config("tuned"))
    plain, spec = cfg.model("llama-70b"), cfg.model("llama-70b-spec")
    rows = [pool_capacity(m, "short", m.short, H100) for m in (plain, spec)]
    options = [AcceleratorOption(m.name, "nvidia-h100-80gb", "a3-highgpu-8g", None, 4, 4, 1, 1, 64, r.decode_tokens_s,
                                 44.0) for m, r in zip((plain, spec), rows)]
    v = cast(Verdicts, type("V", (), {"capacity": rows, "options": options}))
    console = Console(width=400, record=True)
    console.print(capacity_table(v, frozenset({spec.name})), options_table(cfg, v))
    lines = console.export_text().splitlines()
    [plain_capacity, plain_option] = [x for x in lines if x.lstrip("│ ").startswith("llama-70b ")]
    [spec_capacity, spec_option] = [x for x in lines if x.lstrip("│ ").startswith("llama-70b-spec ")]
    assert f"≤{rows[1].decode_tokens_s:,.0f}" in spec_capacity and "≤" not in plain_capacity
    assert f"≤{rows[1].decode_tokens_s:,.0f}" in spec_option and "≥" in spec_option and "≤" not in plain_option


@pytest.mark.parametrize("arg,full,key", [("--speculative-conf", "--speculative-config", "models[].speculative"),
                                          ("--speculative_conf={}", "--speculative-config", "models[].speculative"),
                                          ("--kv-offloading-s=64", "--kv-offloading-size", "models[].kvOffload")])
def test_abbreviations_of_managed_flags_are_refused_as_such(arg: str, full: str, key: str):
    # vLLM's parser reads an unambiguous prefix as the option: not "not an option", but a managed flag.
    problem = extra_arg_problem(arg) or ""
    assert f"which vLLM reads as {full}" in problem and key in problem


def test_no_vllm_option_is_taken_for_an_abbreviation_of_a_managed_one():
    # An option of vLLM 0.34 that is not managed is never refused as a prefix of a managed one.
    from vllm_gke.components.model.specs.models import MANAGED_VLLM_OPTIONS
    managed = {f"--{d.replace('_', '-')}" for d in MANAGED_VLLM_OPTIONS}
    flags = [f for f in load_snapshot("0.34.0")["flags"] if f.startswith("--")]
    assert [f for f in flags if f not in managed and "which vLLM reads as" in (extra_arg_problem(f) or "")] == []


def test_the_ngram_line_says_vllms_length_counts_only_matched_steps():
    cfg = parse(read_stack_config("tuned"))
    ngram = [m.model_copy(update={"speculative": m.speculative.model_copy(update={"method": "ngram", "draft": None})})
             if m.name == "llama-70b-spec" and m.speculative else m for m in cfg.models]
    [line] = speculative_lines(cfg.model_copy(update={"models": ngram}))
    assert "counts only the steps where an n-gram matched" in line and "vllm:generation_tokens_total" in line
    assert "n-gram matched" not in speculative_lines(cfg)[0]
