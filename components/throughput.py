"""How many tokens a second one replica serves, estimated from the hardware and the model's shape.

A roofline (Williams et al., CACM 2009) at the pool's batch and context, per replica of D devices
(tensorParallelSize x pipelineParallelSize GPUs or TPU chips):

  decode step  = max(bytes read / (D x HBM bandwidth x BW_EFFICIENCY),
                     2 x active params x batch / (D x peak FLOPS x FLOPS_EFFICIENCY)) / parallel efficiency
      bytes read = weights (a mixture of experts: the experts the batch touches, at most all) + the
                   batch's KV cache (batch x mean context x KV bytes per token)
  ceiling      = batch / decode step             (what the hardware allows)
  decode tok/s = ceiling x ENGINE_EFFICIENCY     (what a serving engine reaches of it)
  prefill tok/s = D x peak FLOPS x FLOPS_EFFICIENCY / (2 x active params) x parallel efficiency

The batch is the pool's maxNumSeqs, bounded by the sequences its KV cache holds; the mean context
during decode is half the pool's contextTokens (a sequence's KV grows from its prompt to its end).
The bandwidth and FLOPS efficiencies are what kernels reach of the datasheet peaks; parallel
efficiency loses a share per tensor-parallel doubling (all-reduce per layer) and more across
GPU hosts (the data-centre network instead of NVLink; a TPU slice's hosts share its ICI).
ENGINE_EFFICIENCY is calibrated on four published measurements on H100s and TPU v5e (MLPerf, vLLM,
JetStream: 1/1.8 to 1/3.0 of the ceiling, geometric mean 1/2.4): it is fitted to them, so the
1.5x band tests/test_throughput.py holds them to guards the formula across hardware, not the
constant; none is vLLM on TPU (no absolute figure is published). Prefill time is left out of the
decode rate (the cost per token is a few per cent low for prompt-heavy traffic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .catalog import KV_CACHE_BYTES, WEIGHT_BYTES, Accelerator, ModelShape

GB = 1e9
# Share of the HBM bandwidth a decode step's reads reach (weights and KV streamed once per step).
BW_EFFICIENCY = 0.75
# Share of the dense peak a step's matrix multiplies reach (model FLOPs utilisation).
FLOPS_EFFICIENCY = 0.5
# Per tensor-parallel doubling: the all-reduces after attention and MLP of every layer.
TP_EFFICIENCY = 0.92
# A replica across hosts: stages or shards talk over the data-centre network.
MULTI_HOST_EFFICIENCY = 0.85
# Scheduling, sampling, detokenising, padding and kernel launches between the ceiling and a server.
ENGINE_EFFICIENCY = 0.4


@dataclass(frozen=True)
class Throughput:
    decode_tokens_s: float  # output tokens a second a serving engine reaches at the batch below
    prefill_tokens_s: float  # prompt tokens a second
    batch: int
    bound: str  # memory | compute: what limits a decode step
    ceiling_tokens_s: float = 0.0  # what the hardware allows at that batch (the roofline itself)

    @property
    def decode_tokens_per_sequence_s(self) -> float:
        return self.decode_tokens_s / self.batch if self.batch else 0.0


def parallel_efficiency(tp: int, hosts: int, one_fabric: bool = False) -> float:
    """`one_fabric`: the hosts share one interconnect (a TPU slice's ICI), not the data-centre network."""
    return TP_EFFICIENCY ** math.log2(max(tp, 1)) * (MULTI_HOST_EFFICIENCY if hosts > 1 and not one_fabric else 1.0)


def roofline(acc: Accelerator, shape: ModelShape, dtype: str, kv_cache_dtype: str, devices: int, tp: int,
             hosts: int, batch: int, context_tokens: int) -> Throughput:
    """Tokens a second of one replica on `devices` of `acc`, decoding `batch` sequences whose
    typical length (prompt + output) is `context_tokens`."""
    batch = max(1, batch)
    weight_bytes = WEIGHT_BYTES[dtype]
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * KV_CACHE_BYTES[kv_cache_dtype]
    # A mixture of experts reads only the experts its batch routes to: at most all of them.
    read_params = min(shape.params_billion, shape.active_billion * batch) * GB
    bytes_read = read_params * weight_bytes + batch * (context_tokens / 2) * kv_per_token
    flops = 2 * shape.active_billion * GB * batch
    # FP8 weights multiply in FP8 where the device can (H100, L4), else widened to 16 bits.
    peak = (acc.fp8_tflops if dtype == "fp8" and acc.fp8_tflops else acc.bf16_tflops) * 1e12
    t_memory = bytes_read / (devices * acc.hbm_gb_s * GB * BW_EFFICIENCY)
    t_compute = flops / (devices * peak * FLOPS_EFFICIENCY)
    efficiency = parallel_efficiency(tp, hosts, one_fabric=acc.is_tpu)
    step = max(t_memory, t_compute) / efficiency
    prefill = devices * peak * FLOPS_EFFICIENCY / (2 * shape.active_billion * GB) * efficiency
    return Throughput(decode_tokens_s=batch / step * ENGINE_EFFICIENCY, prefill_tokens_s=prefill * ENGINE_EFFICIENCY,
                      batch=batch, bound="memory" if t_memory >= t_compute else "compute",
                      ceiling_tokens_s=batch / step)


def slice_of(acc: Accelerator, partition: str | None) -> Accelerator:
    """One MIG slice as a device of its own: its memory, its share of the bandwidth (the memory
    share) and of the compute (g of 7 compute slices)."""
    if partition is None:
        return acc
    compute_slices = int(partition.split("g.", 1)[0])
    memory = acc.slice_memory_gb(partition)
    return replace(acc, memory_gb=memory, hbm_gb_s=acc.hbm_gb_s * memory / acc.memory_gb,
                   bf16_tflops=acc.bf16_tflops * compute_slices / 7, fp8_tflops=acc.fp8_tflops * compute_slices / 7)
