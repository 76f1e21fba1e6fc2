"""How many tokens a second one replica serves, estimated from the hardware and the model's shape.

A roofline (Williams et al., CACM 2009) at the pool's batch and context, per replica of D devices
(tensorParallelSize TP x pipelineParallelSize PP GPUs or TPU chips), per device:

  decode step  = max(bytes read / (HBM bandwidth x BW_EFFICIENCY),
                     2 x active params x batch / (D x peak FLOPS x FLOPS_EFFICIENCY)) / TP efficiency
                 + time on the network between hosts
      bytes read = stage-local weights once per micro-batch (vLLM splits the batch into PP
                   micro-batches, each passing every stage): weights / TP in all (a mixture of
                   experts: the experts a micro-batch touches, at most all)
                 + the device's KV cache of the batch: batch x mean context x KV bytes per token /
                   (min(TP, KV heads) x PP) (KV heads replicate past their count, as capacity.py counts)
      network    = across GPU hosts only (a TPU slice's hosts share its ICI): tensor parallelism
                   spanning hosts all-reduces batch x hidden x 2 bytes twice a layer (a ring's
                   2(h-1)/h of it crosses the network), pipeline stages on other hosts pass
                   batch x hidden x 2 bytes per crossing; each message also pays NET_LATENCY_S. The
                   link is the machine's TCP bandwidth (MachineType.nic_gbps) x NET_EFFICIENCY.
  ceiling      = batch / decode step             (what the hardware allows)
  decode tok/s = ceiling x ENGINE_EFFICIENCY     (what a serving engine reaches of it)
  prefill tok/s = 1 / (2 x active params / (D x peak FLOPS x FLOPS_EFFICIENCY) / TP efficiency
                       + network bytes per token / link)

The batch is the pool's maxNumSeqs, bounded by the sequences its KV cache holds; the mean context
during decode is half the pool's contextTokens (a sequence's KV grows from its prompt to its end).
The bandwidth and FLOPS efficiencies are what kernels reach of the datasheet peaks; the TP
efficiency loses a share per tensor-parallel doubling (all-reduce per layer over NVLink or ICI).
ENGINE_EFFICIENCY is calibrated on five published measurements on H100s and TPU v5e (MLPerf, vLLM,
JetStream; one of them pipeline parallel, but compute-bound at its batch of 1024, so it checks the
compute term only, not the pipeline memory term: 1/1.8 to 1/3.0 of the ceiling, geometric mean 1/2.3): it
is fitted to them, so the 1.5x band tests/test_throughput.py holds them to guards the formula across
hardware, not the constant; none is vLLM on TPU (no absolute figure is published), none spans hosts
(the network term rests on the NICs' datasheet rates, not on a measurement). Prefill time is left out
of the decode rate (the cost per token is a few per cent low for prompt-heavy traffic; over TCP the
prompt tokens' all-reduces make tensor parallelism across hosts costlier still than shown).
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
# Between GPU hosts over TCP (NCCL's socket transport): the share of the NIC's line rate a
# collective reaches (about 60% on 32 Gbps and faster links, NVIDIA/nccl#209), and what each
# message costs beyond its bytes (kernel launch, TCP and NCCL proxy steps; an assumption).
NET_EFFICIENCY = 0.6
NET_LATENCY_S = 100e-6
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


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding's terms for a decode step (components/model/speculative.py builds it):
    `tokens` proposed per step (k, the chain's depth), each accepted at `acceptance` (a), the seconds
    the drafter takes for them at the step's batch, and the tokens the verification scores a sequence
    (0: k + 1, a chain; a tree of drafts, as SGLang's EAGLE, scores more than its depth)."""

    tokens: int
    acceptance: float
    draft_seconds: float = 0.0
    verified: int = 0

    @property
    def scored(self) -> int:
        return self.verified or self.tokens + 1

    @property
    def expected_tokens(self) -> float:
        """Tokens a verification step yields: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023)."""
        return (1 - self.acceptance ** (self.tokens + 1)) / (1 - self.acceptance)


def parallel_efficiency(tp: int) -> float:
    """What the tensor-parallel all-reduces over one fabric (NVLink, ICI) leave of a step."""
    return TP_EFFICIENCY ** math.log2(max(tp, 1))


@dataclass(frozen=True)
class Network:
    """Bytes one decode step (or one prefill token) of a replica sends between hosts, and its messages."""

    step_bytes: float = 0.0
    step_messages: int = 0
    token_bytes: float = 0.0

    def seconds(self, gbps: float) -> float:
        if not self.step_messages:
            return 0.0
        return self.step_bytes / (gbps / 8 * GB * NET_EFFICIENCY) + self.step_messages * NET_LATENCY_S


def network(shape: ModelShape, devices: int, tp: int, hosts: int, batch: int) -> Network:
    """What crosses hosts: tensor-parallel all-reduces when TP spans them, else the activations at
    each pipeline boundary between hosts. Bytes are per host's link (they run in parallel)."""
    if hosts <= 1:
        return Network()
    pp, per_host = max(1, devices // tp), devices // hosts
    activation = shape.hidden * 2  # bytes a token's residual stream takes in 16 bits
    if tp > per_host:  # each all-reduce spans tp / per_host hosts
        span = tp // per_host
        ring = 2 * (span - 1) / span
        per_token = 2 * shape.layers / pp * activation * ring
        return Network(step_bytes=per_token * batch, step_messages=2 * shape.layers, token_bytes=per_token)
    crossings = hosts - 1  # stages on one host pass to the next host's
    return Network(step_bytes=crossings * batch / pp * activation, step_messages=crossings * pp,
                   token_bytes=crossings * activation)


def roofline(acc: Accelerator, shape: ModelShape, dtype: str, kv_cache_dtype: str, devices: int, tp: int,
             hosts: int, batch: int, context_tokens: int, network_gbps: float = 0.0,
             bytes_per_weight: float | None = None, speculation: Speculation | None = None) -> Throughput:
    """Tokens a second of one replica on `devices` of `acc` (tp x pipeline stages, over `hosts`),
    decoding `batch` sequences whose typical length (prompt + output) is `context_tokens`.
    `network_gbps`: the hosts' TCP link, when a GPU replica spans hosts (a TPU slice's ICI needs none).
    `bytes_per_weight`: a quantised checkpoint's own (scales included), else the dtype's.
    `speculation`: each step verifies k + 1 tokens a sequence (k + 1 times the compute, the same
    reads), after the drafter's k steps, and yields expected_tokens of them."""
    batch = max(1, batch)
    pp = max(1, devices // tp)
    micro = math.ceil(batch / pp)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * KV_CACHE_BYTES[kv_cache_dtype]
    # A stage reads its own weights for each micro-batch: over the step, the device's share of
    # all of them, PP times 1/PP. A mixture of experts reads only the experts a micro-batch routes to.
    weights = min(shape.params_billion, shape.active_billion * micro) * GB * (bytes_per_weight or WEIGHT_BYTES[dtype]) / tp
    kv = batch * (context_tokens / 2) * kv_per_token / (min(tp, shape.kv_heads) * pp)
    # Speculative decoding scores k + 1 tokens a sequence per step (throughput.Speculation).
    scored = speculation.scored if speculation else 1
    flops = 2 * shape.active_billion * GB * batch * scored
    # FP8 weights multiply in FP8 where the device can (H100, L4), else widened to 16 bits.
    peak = (acc.fp8_tflops if dtype == "fp8" and acc.fp8_tflops else acc.bf16_tflops) * 1e12
    t_memory = (weights + kv) / (acc.hbm_gb_s * GB * BW_EFFICIENCY)
    t_compute = flops / (devices * peak * FLOPS_EFFICIENCY)
    efficiency = parallel_efficiency(tp)
    net = Network() if acc.is_tpu else network(shape, devices, tp, hosts, batch)
    if net.step_messages and network_gbps <= 0:
        raise ValueError("a GPU replica across hosts needs the hosts' network_gbps")
    step = max(t_memory, t_compute) / efficiency + net.seconds(network_gbps)
    step += speculation.draft_seconds if speculation else 0.0
    tokens = batch * (speculation.expected_tokens if speculation else 1)
    per_prompt_token = 2 * shape.active_billion * GB / (devices * peak * FLOPS_EFFICIENCY) / efficiency
    if net.token_bytes:
        per_prompt_token += net.token_bytes / (network_gbps / 8 * GB * NET_EFFICIENCY)
    return Throughput(decode_tokens_s=tokens / step * ENGINE_EFFICIENCY,
                      prefill_tokens_s=ENGINE_EFFICIENCY / per_prompt_token,
                      batch=batch, bound="memory" if t_memory >= t_compute else "compute",
                      ceiling_tokens_s=tokens / step)


def slice_of(acc: Accelerator, partition: str | None) -> Accelerator:
    """One MIG slice as a device of its own: its memory, its share of the bandwidth (the memory
    share) and of the compute (g of 7 compute slices)."""
    if partition is None:
        return acc
    compute_slices = int(partition.split("g.", 1)[0])
    memory = acc.slice_memory_gb(partition)
    return replace(acc, memory_gb=memory, hbm_gb_s=acc.hbm_gb_s * memory / acc.memory_gb,
                   bf16_tflops=acc.bf16_tflops * compute_slices / 7, fp8_tflops=acc.fp8_tflops * compute_slices / 7)
