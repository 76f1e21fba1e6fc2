"""The roofline's tokens/s against published measurements: the ceiling is one (no server runs
faster than its memory and compute allow), and the estimate - the ceiling times what serving
engines reach of it, a constant calibrated on these same four (components/throughput.py) - is
within 1.5x of each, on GPUs and TPUs alike: the check guards the formula across hardware and
models, not the constant. Where a source leaves a condition out, the value used here is an
assumption, said so below. No absolute vLLM-on-TPU figure is published to add."""

from __future__ import annotations

import pytest

from vllm_gke.components.catalog import H100_80GB, MODEL_SHAPES, TPU_V5E, ModelShape
from vllm_gke.components.throughput import parallel_efficiency, roofline, slice_of

LLAMA_2_7B = ModelShape(6.74, 32, 32, 128)  # Llama 2 7B: multi-head attention, 32 KV heads
LLAMA_2_70B = ModelShape(69.0, 80, 8, 128)

# (what, accelerator, shape, dtype, kv dtype, devices, batch, typical sequence tokens, measured output
# tokens/s, source)
REFERENCES = [
    # Batch and sequence length are assumptions: the log gives 290 output tokens a sample
    # (24,524.9 / 84.48 samples/s), not the engine's batch.
    ("MLPerf Inference v4.1 Llama2-70B offline, 8x H100-SXM-80GB, TensorRT-LLM FP8", H100_80GB, LLAMA_2_70B,
     "fp8", "fp8", 8, 512, 1300, 24524.9,
     "mlcommons/inference_results_v4.1 closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9/"
     "Offline/performance/run_1/mlperf_log_summary.txt"),
    # The table's multi-step row (num-scheduler-steps 10, chunked prefill off); the table names no GPU
    # or dtype: H100 and bf16 assumed (its single-step rows, 3,958 and 3,032, reach less of the ceiling).
    ("vLLM 0.6.0 Llama 3.1 8B, 1x H100, max-num-seqs 256, 10 scheduler steps", H100_80GB,
     MODEL_SHAPES["llama-3-8b"], "bfloat16", "auto", 1, 256, 600, 8088.0,
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


def test_a_mig_slice_is_a_share_of_the_device():
    slice_ = slice_of(H100_80GB, "3g.40gb")
    assert slice_.memory_gb == 40 and slice_.hbm_gb_s == pytest.approx(H100_80GB.hbm_gb_s / 2)
    assert slice_.bf16_tflops == pytest.approx(H100_80GB.bf16_tflops * 3 / 7)
    assert slice_of(H100_80GB, None) is H100_80GB


def test_a_tpu_slice_shares_one_fabric_across_its_hosts():
    """A v6e slice's hosts talk over its ICI; GPU hosts over the data-centre network."""
    shape = MODEL_SHAPES["llama-3-70b"]
    from vllm_gke.components.catalog import TPU_V6E

    one = roofline(TPU_V6E, shape, "bfloat16", "auto", 16, 16, 1, 24, 16384).decode_tokens_s
    four = roofline(TPU_V6E, shape, "bfloat16", "auto", 16, 16, 4, 24, 16384).decode_tokens_s
    assert one == four
    gpu_one = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 1, 24, 16384).decode_tokens_s
    gpu_two = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 2, 24, 16384).decode_tokens_s
    assert gpu_two < gpu_one
