"""The roofline's tokens/s against published measurements: the ceiling is one (no server runs
faster than its memory and compute allow), and the estimate - the ceiling times what serving
engines reach of it - is within 1.5x of each measurement, on GPUs and TPUs alike."""

from __future__ import annotations

import pytest

from vllm_gke.components.catalog import H100_80GB, MODEL_SHAPES, TPU_V5E, ModelShape
from vllm_gke.components.throughput import parallel_efficiency, roofline, slice_of

LLAMA_2_7B = ModelShape(6.74, 32, 32, 128)  # Llama 2 7B: multi-head attention, 32 KV heads
LLAMA_2_70B = ModelShape(69.0, 80, 8, 128)

# (what, accelerator, shape, dtype, kv dtype, devices, batch, mean context, measured output tokens/s, source)
REFERENCES = [
    ("MLPerf Inference v4.1 Llama2-70B offline, 8x H100-SXM-80GB, TensorRT-LLM FP8", H100_80GB, LLAMA_2_70B,
     "fp8", "fp8", 8, 512, 1300, 24524.9,
     "mlcommons/inference_results_v4.1 closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9/"
     "Offline/performance/run_1/mlperf_log_summary.txt"),
    ("vLLM 0.6.0 Llama 3.1 8B, 1x H100, max-num-seqs 256, 5000 prompts", H100_80GB, MODEL_SHAPES["llama-3-8b"],
     "bfloat16", "auto", 1, 256, 600, 8088.0,
     "LambdaLabsML/vllm-benchmark benchmark_v0.md (vLLM v0.5.4 v.s. v0.6.0)"),
    ("JetStream-PyTorch Llama-3-8B bf16, TPU v5e-8, batch 128, ShareGPT <=1024/<=1024", TPU_V5E,
     MODEL_SHAPES["llama-3-8b"], "bfloat16", "auto", 8, 128, 1024, 8249.0,
     "AI-Hypercomputer/jetstream-pytorch benchmarks/summary.md"),
    ("JetStream-PyTorch Llama-2-7B bf16, TPU v5e-8, batch 96", TPU_V5E, LLAMA_2_7B, "bfloat16", "auto", 8, 96,
     1024, 3663.0, "AI-Hypercomputer/jetstream-pytorch benchmarks/summary.md"),
]


@pytest.mark.parametrize("what,acc,shape,dtype,kv,devices,batch,context,measured,source", REFERENCES,
                         ids=[r[0].split(",")[0] for r in REFERENCES])
def test_roofline_bounds_published_measurements(what, acc, shape, dtype, kv, devices, batch, context, measured,
                                                source):
    speed = roofline(acc, shape, dtype, kv, devices, devices, 1, batch, context)
    assert speed.ceiling_tokens_s >= measured, (what, source)
    assert measured / 1.5 <= speed.decode_tokens_s <= 1.5 * measured, (what, source, round(speed.decode_tokens_s))


def test_decode_is_memory_bound_at_small_batch_and_compute_bound_at_large():
    shape = MODEL_SHAPES["llama-3-8b"]
    assert roofline(H100_80GB, shape, "bfloat16", "auto", 1, 1, 1, 1, 1024).bound == "memory"
    assert roofline(H100_80GB, shape, "bfloat16", "auto", 1, 1, 1, 4096, 64).bound == "compute"
    one = roofline(H100_80GB, shape, "bfloat16", "auto", 1, 1, 1, 1, 1024)
    many = roofline(H100_80GB, shape, "bfloat16", "auto", 1, 1, 1, 64, 1024)
    # Batching amortises the weights: far more tokens a second, fewer per sequence.
    assert many.decode_tokens_s > 20 * one.decode_tokens_s
    assert many.decode_tokens_per_sequence_s < one.decode_tokens_per_sequence_s


def test_a_mixture_of_experts_reads_only_its_active_experts_at_small_batch():
    moe = MODEL_SHAPES["deepseek-v3"]
    dense = ModelShape(moe.params_billion, moe.layers, moe.kv_heads, moe.head_dim)
    fast = roofline(H100_80GB, moe, "fp8", "auto", 16, 8, 2, 1, 1024).decode_tokens_s
    slow = roofline(H100_80GB, dense, "fp8", "auto", 16, 8, 2, 1, 1024).decode_tokens_s
    assert fast > 10 * slow


def test_across_hosts_and_wider_tensor_parallelism_cost_efficiency():
    assert parallel_efficiency(1, 1) == 1.0
    assert parallel_efficiency(8, 1) < parallel_efficiency(2, 1) < 1.0
    assert parallel_efficiency(8, 2) < parallel_efficiency(8, 1)


def test_a_mig_slice_and_a_two_core_tpu_chip_are_shares_of_the_device():
    slice_ = slice_of(H100_80GB, "3g.40gb")
    assert slice_.memory_gb == 40 and slice_.hbm_gb_s == pytest.approx(H100_80GB.hbm_gb_s / 2)
    assert slice_.bf16_tflops == pytest.approx(H100_80GB.bf16_tflops * 3 / 7)
    from vllm_gke.components.catalog import TPU_V5P

    core = slice_of(TPU_V5P, None)
    assert core.memory_gb == pytest.approx(47.5) and core.bf16_tflops == pytest.approx(229.5)
