"""A model's shape read from its config.json (components/model/hf_config.py), on copies of real
configs (tests/fixtures/hf-configs/<org>--<repo>/config.json), checked against the catalog where it
holds the same model and against the model cards' parameter counts elsewhere; and what the spec
does with the shape it gives (sliding windows, quantised weights, the context limit)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.components.model.catalog import MODEL_SHAPES
from vllm_gke.components.model.config_errors import config_issues
from vllm_gke.components.model.hf_config import HfConfigError, shape_from_config
from vllm_gke.components.model.specs import ModelSpec

CONFIGS = REPO_ROOT / "tests" / "fixtures" / "hf-configs"


def config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize("name,catalog", [
    ("meta-llama--Llama-3.1-8B-Instruct", "llama-3-8b"),
    ("Qwen--Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("Qwen--Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b"),
    ("mistralai--Mistral-7B-Instruct-v0.1", "mistral-7b"),
    ("deepseek-ai--DeepSeek-V3", "deepseek-v3"),
])
def test_the_shape_is_the_catalogs_where_it_holds_the_model(name, catalog):
    facts, shape = shape_from_config(config(name)), MODEL_SHAPES[catalog]
    assert (facts.layers, facts.kv_heads, facts.head_dim, facts.attention_heads) == \
        (shape.layers, shape.kv_heads, shape.head_dim, shape.attention_heads)
    assert facts.params_billion == pytest.approx(shape.params_billion, rel=0.01)
    assert facts.hidden_size == shape.hidden


def test_llama_3_1_8b_is_the_catalog_shape_exactly():
    facts = shape_from_config(config("meta-llama--Llama-3.1-8B-Instruct"))
    assert facts.params_billion == pytest.approx(8.0, rel=0.02)
    assert facts.custom_shape()["paramsBillion"] == MODEL_SHAPES["llama-3-8b"].params_billion
    # llama3 RoPE leaves max_position_embeddings as it is (vLLM does not scale it again).
    assert (facts.max_context, facts.dtype, facts.active_params_billion, facts.sliding_window) == \
        (131072, "bfloat16", None, None)


@pytest.mark.parametrize("name,total,active", [
    ("mistralai--Mixtral-8x7B-Instruct-v0.1", 46.7, 12.9),  # the Mixtral paper's 46.7B, 12.9B active
    ("Qwen--Qwen3-30B-A3B", 30.5, 3.3),  # its model card
    ("deepseek-ai--DeepSeek-V3", 671.0, 37.0),  # the catalog and the paper (MTP module left out)
])
def test_a_mixture_of_experts_counts_all_experts_and_the_ones_a_token_uses(name, total, active):
    facts = shape_from_config(config(name))
    assert facts.params_billion == pytest.approx(total, rel=0.01)
    assert facts.active_params_billion == pytest.approx(active, rel=0.03)


def test_qwen3_moe_takes_its_head_dim_from_the_config_not_hidden_over_heads():
    facts = shape_from_config(config("Qwen--Qwen3-30B-A3B"))
    assert (facts.head_dim, facts.kv_heads, facts.attention_heads, facts.max_context) == (128, 4, 32, 40960)


def test_deepseek_caches_one_latent_per_layer_and_is_fp8():
    facts = shape_from_config(config("deepseek-ai--DeepSeek-V3"))
    assert (facts.kv_heads, facts.head_dim) == (1, (512 + 64) // 2)
    # yarn's max_position_embeddings is already scaled; the checkpoint's weights are FP8.
    assert (facts.max_context, facts.dtype, facts.weight_bits) == (163840, "fp8", 8.0)
    assert facts.bytes_per_weight == pytest.approx(1.0, abs=0.01)  # the 16-bit embeddings are 0.3% of it


def test_a_multimodal_config_reads_its_text_config_with_transformers_defaults():
    # gemma-3-4b-it's text_config names five keys; heads, head dim, vocabulary and context are defaults.
    facts = shape_from_config(config("google--gemma-3-4b-it"))
    assert (facts.layers, facts.attention_heads, facts.kv_heads, facts.head_dim, facts.hidden_size) == \
        (34, 8, 4, 256, 2560)
    assert facts.params_billion == pytest.approx(4.3, rel=0.02)  # the model card's 4.3B, vision tower included
    assert facts.active_params_billion == pytest.approx(3.88, rel=0.02)  # the language model a token passes
    # Gemma 3's 128K is already scaled: its linear RoPE factor is not applied again (vLLM's rule).
    assert facts.max_context == 131072


def test_sliding_window_layers_come_from_the_pattern_or_apply_to_all():
    gemma = shape_from_config(config("google--gemma-3-4b-it"))
    assert (gemma.sliding_window, gemma.sliding_window_layers) == (1024, 34 - 5)  # every 6th layer is global
    mistral = shape_from_config(config("mistralai--Mistral-7B-Instruct-v0.1"))
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (4096, 32)
    # Qwen2.5 names a window but turns it off.
    assert shape_from_config(config("Qwen--Qwen2.5-7B-Instruct")).sliding_window is None
    explicit = {**config("mistralai--Mistral-7B-Instruct-v0.1"),
                "layer_types": ["sliding_attention", "full_attention"] * 16}
    assert shape_from_config(explicit).sliding_window_layers == 16


def test_a_quantised_checkpoint_maps_to_the_stacks_dtype_and_its_bits():
    awq = shape_from_config(config("Qwen--Qwen2.5-7B-Instruct-AWQ"))
    plain = shape_from_config(config("Qwen--Qwen2.5-7B-Instruct"))
    # 4 bits a weight, plus a 16-bit scale and a 4-bit zero point per group of 128.
    assert (awq.dtype, awq.quant_method, awq.weight_bits) == ("awq", "awq", 4 + 16 / 128 + 4 / 128)
    assert awq.custom_shape()["paramsBillion"] == plain.custom_shape()["paramsBillion"]
    # 4-bit layers with their groups' scales, 16-bit embeddings and output head (1.09B of 7.62B).
    assert awq.bytes_per_weight == pytest.approx((1.09 * 2 + 6.53 * 4.15625 / 8) / 7.62, rel=0.02)
    assert "bytesPerWeight" not in plain.custom_shape()
    groups = {"quant_method": "compressed-tensors",
              "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}
    w4a16 = shape_from_config({**config("Qwen--Qwen2.5-7B-Instruct"), "quantization_config": groups})
    assert (w4a16.dtype, w4a16.weight_bits) == ("int8", 4.0)  # vLLM's --quantization compressed-tensors


def test_the_longest_context_follows_vllms_rope_scaling_rule():
    base = config("mistralai--Mistral-7B-Instruct-v0.1")
    assert shape_from_config({**base, "rope_scaling": {"type": "linear", "factor": 4.0}}).max_context == 4 * 32768
    assert shape_from_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}).max_context == 32768
    assert shape_from_config({**base, "model_max_length": 16384}).max_context == 16384


@pytest.mark.parametrize("change,named", [
    (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
    (lambda c: c.pop("num_experts_per_tok"), "num_experts_per_tok"),
    (lambda c: c.update(layer_types=["linear_attention", "full_attention"] * 24), "linear_attention"),
])
def test_a_config_the_estimate_cannot_read_names_the_key(change, named):
    doc = config("Qwen--Qwen3-30B-A3B")
    change(doc)
    with pytest.raises(HfConfigError, match=named) as err:
        shape_from_config(doc)
    assert "customShape" in str(err.value)


def test_a_nested_text_config_is_named_with_its_prefix():
    doc = config("google--gemma-3-4b-it")
    del doc["text_config"]["hidden_size"]
    with pytest.raises(HfConfigError, match=r"text_config\.hidden_size"):
        shape_from_config(doc)


def spec(name: str, **settings: Any) -> ModelSpec:
    facts = shape_from_config(config(name))
    return ModelSpec.model_validate({"name": "m", "source": "hf://org/repo", "nodePool": "gpu",
                                     "customShape": facts.custom_shape(), **settings})


def test_sliding_layers_shrink_the_kv_cache_per_token_at_the_shortest_pool_context():
    gemma = spec("google--gemma-3-4b-it", maxModelLen=8192, short={"contextTokens": 2048})
    full = 2 * 34 * 4 * 256 * 2
    # At 2,048 tokens a 1,024-token window keeps half of each of the 29 sliding layers.
    assert gemma.kv_bytes_per_token == int(full * (5 + 29 * 1024 / 2048) / 34)
    catalog = ModelSpec.model_validate({"name": "m", "source": "hf://org/repo", "nodePool": "gpu",
                                        "shape": "llama-3-8b"})
    assert spec("meta-llama--Llama-3.1-8B-Instruct").kv_bytes_per_token == catalog.kv_bytes_per_token


def test_a_quantised_checkpoint_weighs_its_bytes_per_weight():
    awq = spec("Qwen--Qwen2.5-7B-Instruct-AWQ", dtype="awq")
    assert awq.weights_gb == pytest.approx(7.62 * awq.shape.bytes_per_weight, rel=0.001)
    assert awq.weights_gb > 7.62 * 0.5


def test_max_model_len_above_the_models_context_is_refused_with_the_fix():
    _, issues = config_issues({"models": [{"name": "m", "source": "hf://org/repo", "nodePool": "gpu",
                                           "customShape": shape_from_config(config("Qwen--Qwen3-30B-A3B")).custom_shape(),
                                           "maxModelLen": 65536}]}, lambda k: f"vllm-gke:{k}")
    problems = [i for i in issues if i.key == "vllm-gke:models[m]"]
    assert problems and "40960" in problems[0].problem and "lower maxModelLen" in problems[0].problem


def test_a_model_with_no_shape_says_where_one_comes_from():
    _, issues = config_issues({"models": [{"name": "m", "source": "hf://org/repo", "nodePool": "gpu"}]},
                              lambda k: f"vllm-gke:{k}")
    shape = next(i for i in issues if i.key == "vllm-gke:models[m].shape")
    assert "customShape" in shape.problem and "with_model_configs" in shape.problem and "vllm-gke plan" in shape.problem
