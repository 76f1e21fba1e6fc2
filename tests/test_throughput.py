"""The roofline's tokens/s against published measurements: the ceiling is one (no server runs
faster than its memory and compute allow), and the estimate - the ceiling times what serving
engines reach of it, a constant calibrated on these same five (components/model/throughput.py) - is
within 1.5x of each, on GPUs and TPUs, tensor and pipeline parallel alike: the check guards the
formula across hardware and models, not the constant. The one pipeline-parallel point (MLPerf v5.0,
TP1 x PP2 at batch 1024) is compute-bound, so it exercises the compute term only, not the pipeline
memory term. Where a source leaves a condition out, the
value used here is an assumption, said so below. No absolute vLLM-on-TPU figure is published to
add, nor one of a replica across hosts with its conditions stated."""

from __future__ import annotations

import pytest

from vllm_gke.components.model.catalog import H100_80GB, L4, MODEL_SHAPES, TPU_V5E, TPU_V6E, ModelShape
from vllm_gke.components.model.throughput import TP_EFFICIENCY, parallel_efficiency, roofline, slice_of

LLAMA_2_7B = ModelShape(6.74, 32, 32, 128)  # Llama 2 7B: multi-head attention, 32 KV heads
LLAMA_2_70B = ModelShape(69.0, 80, 8, 128)

# (what, accelerator, shape, dtype, kv dtype, devices, tensor parallel, batch, typical sequence tokens,
# measured output tokens/s, source)
REFERENCES = [
    # Batch and sequence length are assumptions: the log gives 290 output tokens a sample
    # (24,524.9 / 84.48 samples/s), not the engine's batch.
    ("MLPerf Inference v4.1 Llama2-70B offline, 8x H100-SXM-80GB, TensorRT-LLM FP8", H100_80GB, LLAMA_2_70B,
     "fp8", "fp8", 8, 8, 512, 1300, 24524.9,
     "mlcommons/inference_results_v4.1 closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9/"
     "Offline/performance/run_1/mlperf_log_summary.txt"),
    # Pipeline parallel: the run's config is configs/llama2-70b/Offline/__init__.py's
    # H100_SXM_80GB_PP2x4 (mlcommons/inference_results_v5.0@6069beb: offline_expected_qps 300, 75 x 2 x 2,
    # the harness's expected rate, not a measurement): four replicas of tensor parallel 1 x pipeline
    # parallel 2, gpu_batch_size 1024, FP8 weights and KV cache. 31,306.8 tokens/s over the four
    # replicas; the sequence length is the v4.1 row's assumption (the same benchmark). At batch 1024
    # the roofline is compute-bound here: this point checks the FLOPS side of a pipeline split, not
    # its memory term (stages reading their weights once per micro-batch), which
    # test_pipeline_stages_read_their_own_weights_once_per_micro_batch covers.
    ("MLPerf Inference v5.0 Llama2-70B offline, 8x H100-SXM-80GB as 4 x (TP1 x PP2), TensorRT-LLM FP8", H100_80GB,
     LLAMA_2_70B, "fp8", "fp8", 2, 1, 1024, 1300, 31306.8 / 4,
     "mlcommons/inference_results_v5.0 closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99/"
     "Offline/performance/run_1/mlperf_log_summary.txt and closed/NVIDIA/configs/llama2-70b/Offline/__init__.py"),
    # The table's multi-step row (num-scheduler-steps 10, chunked prefill off); the table names no GPU
    # or dtype: H100 and bf16 assumed (its single-step rows, 3,958 and 3,032, reach less of the ceiling).
    ("vLLM 0.6.0 Llama 3.1 8B, 1x H100, max-num-seqs 256, 10 scheduler steps", H100_80GB,
     MODEL_SHAPES["llama-3-8b"], "bfloat16", "auto", 1, 1, 256, 600, 8088.0,
     "LambdaLabsML/vllm-benchmark benchmark_v0.md (vLLM v0.5.4 v.s. v0.6.0)"),
    ("JetStream-PyTorch Llama-3-8B bf16, TPU v5e-8, batch 128, ShareGPT <=1024/<=1024", TPU_V5E,
     MODEL_SHAPES["llama-3-8b"], "bfloat16", "auto", 8, 8, 128, 1024, 8249.0,
     "AI-Hypercomputer/jetstream-pytorch benchmarks/summary.md"),
    ("JetStream-PyTorch Llama-2-7B bf16, TPU v5e-8, batch 96", TPU_V5E, LLAMA_2_7B, "bfloat16", "auto", 8, 8, 96,
     1024, 3663.0, "AI-Hypercomputer/jetstream-pytorch benchmarks/summary.md"),
]


@pytest.mark.parametrize("what,acc,shape,dtype,kv,devices,tp,batch,context,measured,source", REFERENCES,
                         ids=[r[0].split(",")[0] for r in REFERENCES])
def test_roofline_bounds_published_measurements(what, acc, shape, dtype, kv, devices, tp, batch, context, measured,
                                                source):
    speed = roofline(acc, shape, dtype, kv, devices, tp, 1, batch, context)
    if "PP2" in what:  # as the docstring says: compute-bound, so no check of the pipeline memory term
        assert speed.bound == "compute"
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
    fast = roofline(H100_80GB, moe, "fp8", "auto", 16, 8, 2, 1, 1024, 200).decode_tokens_s
    slow = roofline(H100_80GB, dense, "fp8", "auto", 16, 8, 2, 1, 1024, 200).decode_tokens_s
    assert fast > 10 * slow


def test_wider_tensor_parallelism_costs_efficiency():
    assert parallel_efficiency(1) == 1.0
    assert parallel_efficiency(8) < parallel_efficiency(2) < 1.0


def test_a_mig_slice_is_a_share_of_the_device():
    slice_ = slice_of(H100_80GB, "3g.40gb")
    assert slice_.memory_gb == 40 and slice_.hbm_gb_s == pytest.approx(H100_80GB.hbm_gb_s / 2)
    assert slice_.bf16_tflops == pytest.approx(H100_80GB.bf16_tflops * 3 / 7)
    assert slice_of(H100_80GB, None) is H100_80GB


def test_a_tpu_slice_shares_one_fabric_across_its_hosts():
    """A v6e slice's hosts talk over its ICI; GPU hosts over the data-centre network."""
    shape = MODEL_SHAPES["llama-3-70b"]
    one = roofline(TPU_V6E, shape, "bfloat16", "auto", 16, 16, 1, 24, 16384).decode_tokens_s
    four = roofline(TPU_V6E, shape, "bfloat16", "auto", 16, 16, 4, 24, 16384).decode_tokens_s
    assert one == four
    gpu_one = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 1, 24, 16384).decode_tokens_s
    gpu_two = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 2, 24, 16384, 200).decode_tokens_s
    assert gpu_two < gpu_one


def test_pipeline_stages_read_their_own_weights_once_per_micro_batch():
    """405B as TP8 x PP2 (frontier's): each stage reads its half of the weights for each of two
    micro-batches, so at a memory-bound batch the 16 GPUs decode about as fast as 8 would hold
    the weights' reads, not twice as fast (the KV cache, halved per device, is all PP2 gains)."""
    shape = MODEL_SHAPES["llama-3.1-405b"]
    pp2 = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 1, 64, 4096)
    tp8 = roofline(H100_80GB, shape, "bfloat16", "auto", 8, 8, 1, 64, 4096)
    assert pp2.bound == "memory"
    assert 1.0 < pp2.ceiling_tokens_s / tp8.ceiling_tokens_s < 1.1


def test_kv_heads_replicate_past_their_count():
    """70B has 8 KV heads: at TP16 each device keeps as much KV cache as at TP8, so a KV-bound
    step gains nothing from the other 8 devices (and pays the wider all-reduce)."""
    kv_only = ModelShape(0.001, 80, 8, 128)
    tp16 = roofline(TPU_V6E, kv_only, "bfloat16", "auto", 16, 16, 1, 24, 16384).ceiling_tokens_s
    tp8 = roofline(TPU_V6E, kv_only, "bfloat16", "auto", 8, 8, 1, 24, 16384).ceiling_tokens_s
    assert tp16 / tp8 == pytest.approx(TP_EFFICIENCY, rel=0.01)


def test_tensor_parallelism_over_tcp_gains_nothing_per_gpu():
    """The mistaken tensorParallelSize 2 across two one-L4 g2-standard-4 hosts (10 Gbps): the
    all-reduces cross TCP twice a layer, so the pair decodes slower than two one-GPU replicas."""
    shape = MODEL_SHAPES["qwen2.5-7b"]
    single = roofline(L4, shape, "bfloat16", "auto", 1, 1, 1, 32, 2048)
    over_tcp = roofline(L4, shape, "bfloat16", "auto", 2, 2, 2, 32, 2048, 10)
    nvlink_like = roofline(L4, shape, "bfloat16", "auto", 2, 2, 1, 32, 2048)
    assert over_tcp.decode_tokens_s < 2 * single.decode_tokens_s
    assert over_tcp.decode_tokens_s < nvlink_like.decode_tokens_s
    assert over_tcp.prefill_tokens_s < single.prefill_tokens_s
    with pytest.raises(ValueError):  # no silent default for the link
        roofline(L4, shape, "bfloat16", "auto", 2, 2, 2, 32, 2048)


def test_pipeline_stages_across_hosts_pass_little():
    """405B's two stages on two a3-highgpu-8g: a micro-batch's activations per step, a few MB."""
    shape = MODEL_SHAPES["llama-3.1-405b"]
    one = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 1, 64, 4096).decode_tokens_s
    two = roofline(H100_80GB, shape, "bfloat16", "auto", 16, 8, 2, 64, 4096, 200).decode_tokens_s
    assert 0.97 * one < two < one


def test_a_quantised_checkpoints_own_bytes_per_weight_sets_the_decode_rate(plans):
    """The roofline reads the weights the capacity check counts: a checkpoint's bytesPerWeight (an AWQ
    model given by id, scales included) moves both, not only the memory."""
    from dataclasses import asdict

    from vllm_gke.components.model.capacity import pool_capacity
    from vllm_gke.components.model.specs.models import CustomShape

    cfg = plans["dev"].config
    model = cfg.model("qwen-7b")
    shape = asdict(model.model_shape)

    def row(per_weight: float):
        custom = CustomShape.model_validate({**{k: v for k, v in shape.items() if v is not None},
                                             "bytes_per_weight": per_weight})
        m = model.model_copy(update={"shape": custom})
        return pool_capacity(m, "short", m.short, cfg.pool(m.node_pool))

    half, whole = row(0.5), row(1.0)
    assert whole.weights_per_gpu_gb == pytest.approx(2 * half.weights_per_gpu_gb)
    assert whole.decode_tokens_s < half.decode_tokens_s  # memory-bound: more bytes a step, fewer tokens
