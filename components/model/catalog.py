"""Hardware and model catalog: the facts the rest of the library derives from.

Machine types map to their accelerator so config never repeats what GCE already fixes
(a2-highgpu-4g always carries four A100 40GB, ct6e-standard-4t four TPU v6e chips). MIG profiles
are the ones GKE accepts for `gpu_partition_size`; memory is the nominal GB in the profile name.
Bandwidth and peak dense 16-bit compute per device are the vendors' datasheet figures (NVIDIA's
A100/H100/L4 datasheets; cloud.google.com/tpu/docs/v5e, v6e, v5p): the plan's roofline
(components/model/throughput.py) estimates tokens/s from them.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Literal, Mapping


@dataclass(frozen=True)
class Accelerator:
    # GPUs: guest_accelerators.type and the cloud.google.com/gke-accelerator label; TPUs: the
    # cloud.google.com/gke-tpu-accelerator label.
    gke_type: str
    memory_gb: float
    # MIG profile -> instances per physical GPU; empty when the GPU has no MIG.
    mig_profiles: Mapping[str, int]
    # HBM bandwidth per device, GB/s.
    hbm_gb_s: float = 0.0
    # Peak dense bf16 TFLOPS per device.
    bf16_tflops: float = 0.0
    kind: Literal["gpu", "tpu"] = "gpu"
    # Peak dense FP8 TFLOPS where the device multiplies in FP8 (H100, L4); 0: FP8 weights are
    # widened to 16 bits and run at the bf16 peak.
    fp8_tflops: float = 0.0

    @property
    def is_tpu(self) -> bool:
        return self.kind == "tpu"

    @property
    def resource(self) -> str:
        """The extended resource a pod requests for one device."""
        return "google.com/tpu" if self.is_tpu else "nvidia.com/gpu"

    def slice_memory_gb(self, partition: str | None) -> float:
        if partition is None:
            return self.memory_gb
        return float(partition.split(".")[1].removesuffix("gb"))

    def slices_per_gpu(self, partition: str | None) -> int:
        return 1 if partition is None else self.mig_profiles[partition]


A100_40GB = Accelerator(
    "nvidia-tesla-a100", 40,
    {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}, 1555, 312,
)
A100_80GB = Accelerator(
    "nvidia-a100-80gb", 80,
    {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}, 2039, 312,
)
H100_80GB = Accelerator(
    "nvidia-h100-80gb", 80,
    {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}, 3350, 989,
    fp8_tflops=1979,
)
H100_MEGA_80GB = Accelerator("nvidia-h100-mega-80gb", 80, H100_80GB.mig_profiles, 3350, 989, fp8_tflops=1979)
L4 = Accelerator("nvidia-l4", 24, {}, 300, 121, fp8_tflops=242)
# TPU chips (per chip): HBM, bandwidth and bf16 peak from cloud.google.com/tpu/docs/v5e, v6e and
# v5p-training. Each is one JAX device, the unit of vLLM TPU's tensor parallelism: v5p's two
# TensorCores work as one megacore device (tpu-inference 0.32.0 utils.py:278-296 gives a v5p device
# the chip's 95 GB). Ironwood (tpu7x, two devices a chip) is not here yet: no public list price to
# plan its cost with, and its multi-host node pools take a workload policy, not a topology.
TPU_V5E = Accelerator("tpu-v5-lite-podslice", 16, {}, 819, 197, "tpu")
TPU_V6E = Accelerator("tpu-v6e-slice", 32, {}, 1640, 918, "tpu")
TPU_V5P = Accelerator("tpu-v5p-slice", 95, {}, 2765, 459, "tpu")

ACCELERATORS: Mapping[str, Accelerator] = {
    a.gke_type: a for a in (A100_40GB, A100_80GB, H100_80GB, H100_MEGA_80GB, L4, TPU_V5E, TPU_V6E, TPU_V5P)
}


def topology_chips(topology: str) -> int:
    """Chips of a TPU slice topology: '4x4' -> 16, '2x2x2' -> 8."""
    return math.prod(int(d) for d in topology.split("x"))


@dataclass(frozen=True)
class MachineType:
    name: str
    accelerator: Accelerator | None
    # Accelerator devices per node: GPUs, or TPU chips.
    gpus: int
    vcpus: int
    memory_gb: int
    # TPU machine types: the slice topologies GKE builds of them, the single-host one first; a
    # larger one spans several nodes (chips / chips per node), a multi-host slice.
    tpu_topologies: tuple[str, ...] = ()
    # The boot disk type: TPU VMs take Balanced Persistent Disk (v5e, v5p) or Hyperdisk Balanced
    # (v6e) only, not pd-ssd (cloud.google.com/tpu/docs/storage-options-compute).
    boot_disk_type: str = "pd-ssd"
    # GPU hosts: the VM's network bandwidth a pod reaches over TCP (Gbps), and the GPU-to-GPU
    # fabric the machine's extra NICs carry, if any ("GPUDirect-TCPX", "GPUDirect-TCPXO",
    # "GPUDirect-RDMA"). From compute/docs/gpus/gpu-network-bandwidth: A2 and G2 have no GPUDirect;
    # a3-highgpu-8g's four GPU NICs (800 Gbps) and a3-megagpu-8g's eight (1,600 Gbps) take GKE
    # multi-networking and the NCCL plugin, which vllm-gke does not set up, so pods talk over the
    # primary gVNIC (200 Gbps). A TPU slice's hosts share its ICI instead.
    nic_gbps: float = 0.0
    gpudirect: str = ""

    @property
    def is_gpu(self) -> bool:
        """Carries accelerators (GPUs or TPU chips): a serving machine, not a system one."""
        return self.accelerator is not None

    @property
    def is_tpu(self) -> bool:
        return self.accelerator is not None and self.accelerator.is_tpu


def _table(*rows: MachineType) -> Mapping[str, MachineType]:
    return {m.name: m for m in rows}


MACHINE_TYPES: Mapping[str, MachineType] = _table(
    MachineType("a2-highgpu-1g", A100_40GB, 1, 12, 85, nic_gbps=24),
    MachineType("a2-highgpu-2g", A100_40GB, 2, 24, 170, nic_gbps=32),
    MachineType("a2-highgpu-4g", A100_40GB, 4, 48, 340, nic_gbps=50),
    MachineType("a2-highgpu-8g", A100_40GB, 8, 96, 680, nic_gbps=100),
    MachineType("a2-megagpu-16g", A100_40GB, 16, 96, 1360, nic_gbps=100),
    MachineType("a2-ultragpu-1g", A100_80GB, 1, 12, 170, nic_gbps=24),
    MachineType("a2-ultragpu-2g", A100_80GB, 2, 24, 340, nic_gbps=32),
    MachineType("a2-ultragpu-4g", A100_80GB, 4, 48, 680, nic_gbps=50),
    MachineType("a2-ultragpu-8g", A100_80GB, 8, 96, 1360, nic_gbps=100),
    MachineType("a3-highgpu-8g", H100_80GB, 8, 208, 1872, nic_gbps=200, gpudirect="GPUDirect-TCPX"),
    MachineType("a3-megagpu-8g", H100_MEGA_80GB, 8, 208, 1872, nic_gbps=200, gpudirect="GPUDirect-TCPXO"),
    MachineType("g2-standard-4", L4, 1, 4, 16, nic_gbps=10),
    MachineType("g2-standard-8", L4, 1, 8, 32, nic_gbps=16),
    MachineType("g2-standard-12", L4, 1, 12, 48, nic_gbps=16),
    MachineType("g2-standard-16", L4, 1, 16, 64, nic_gbps=32),
    MachineType("g2-standard-24", L4, 2, 24, 96, nic_gbps=32),
    MachineType("g2-standard-32", L4, 1, 32, 128, nic_gbps=32),
    MachineType("g2-standard-48", L4, 4, 48, 192, nic_gbps=50),
    MachineType("g2-standard-96", L4, 8, 96, 384, nic_gbps=100),
    # TPU hosts (cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus): 2D topologies for
    # v5e and v6e, 3D for v5p; the 4-chip hosts build multi-host slices.
    MachineType("ct5lp-hightpu-1t", TPU_V5E, 1, 24, 48, ("1x1",), "pd-balanced"),
    MachineType("ct5lp-hightpu-4t", TPU_V5E, 4, 112, 192, ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
                "pd-balanced"),
    MachineType("ct5lp-hightpu-8t", TPU_V5E, 8, 224, 384, ("2x4",), "pd-balanced"),
    MachineType("ct6e-standard-1t", TPU_V6E, 1, 44, 176, ("1x1",), "hyperdisk-balanced"),
    MachineType("ct6e-standard-4t", TPU_V6E, 4, 180, 720, ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
                "hyperdisk-balanced"),
    MachineType("ct6e-standard-8t", TPU_V6E, 8, 180, 1440, ("2x4",), "hyperdisk-balanced"),
    MachineType("ct5p-hightpu-4t", TPU_V5P, 4, 208, 448, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"), "pd-balanced"),
    # CPU machines for the system pool.
    MachineType("e2-standard-4", None, 0, 4, 16),
    MachineType("e2-standard-8", None, 0, 8, 32),
    MachineType("n2-standard-4", None, 0, 4, 16),
    MachineType("n2-standard-8", None, 0, 8, 32),
    MachineType("n2-standard-16", None, 0, 16, 64),
)

# Serving machine types: GPU and TPU hosts.
GPU_MACHINE_TYPES = tuple(n for n, m in MACHINE_TYPES.items() if m.is_gpu)
TPU_MACHINE_TYPES = tuple(n for n, m in MACHINE_TYPES.items() if m.is_tpu)

# Machine series that attach Hyperdisk ML: A3 and G2 (and C3 for loaders) in Compute Engine's
# machine-series support list; A2 only as A2 Ultra (compute/docs/disks/hyperdisk-perf-limits lists
# no A2 Standard type). A2 Standard (a2-highgpu, a2-megagpu) takes Persistent Disk only.
HYPERDISK_ML_PREFIXES = ("a2-ultragpu-", "a3-", "g2-", "c3-", "c3d-")


def attaches_hyperdisk_ml(machine_type: str) -> bool:
    return machine_type.startswith(HYPERDISK_ML_PREFIXES)


def populator_vcpus(machine_type: str) -> int | None:
    """vCPUs of a C3/C3D machine type (the Volume Populator's transfer nodes), None if it is not
    one or has fewer than 8."""
    m = re.fullmatch(r"c3d?-(standard|highcpu|highmem)-(\d+)(-lssd)?", machine_type)
    return int(m[2]) if m and int(m[2]) >= 8 else None


CPU_MACHINE_TYPES = tuple(n for n, m in MACHINE_TYPES.items() if not m.is_gpu)


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers that decide memory (weights, KV cache per token) and speed (the
    parameters each token reads: all of them, or a mixture of experts' active ones)."""

    params_billion: float
    layers: int
    kv_heads: int
    head_dim: int
    # Parameters one token passes through (a mixture of experts routes it to a few); None: all.
    active_params_billion: float | None = None
    # Query heads: vLLM's tensor parallelism must divide them; None: not known (not checked).
    attention_heads: int | None = None
    # Width of the residual stream (what an all-reduce or a pipeline stage sends per token); None:
    # attention heads x head dim, or estimated from the parameters (about 12 x layers x hidden^2).
    hidden_size: int | None = None

    @property
    def active_billion(self) -> float:
        return self.active_params_billion or self.params_billion

    @property
    def hidden(self) -> int:
        if self.hidden_size:
            return self.hidden_size
        if self.attention_heads:
            return self.attention_heads * self.head_dim
        return int(math.sqrt(self.params_billion * 1e9 / (12 * self.layers)))


MODEL_SHAPES: Mapping[str, ModelShape] = {
    # (num_attention_heads from each model's config.json.)
    "llama-3-8b": ModelShape(8.03, 32, 8, 128, attention_heads=32),
    "llama-3-70b": ModelShape(70.6, 80, 8, 128, attention_heads=64),
    "qwen2.5-1.5b": ModelShape(1.54, 28, 2, 128, attention_heads=12),
    "qwen2.5-7b": ModelShape(7.62, 28, 4, 128, attention_heads=28),
    "qwen2.5-72b": ModelShape(72.7, 80, 8, 128, attention_heads=64),
    "mistral-7b": ModelShape(7.25, 32, 8, 128, attention_heads=32),
    # Llama 3.1 405B: 126 layers, GQA with 8 KV heads (its config.json).
    "llama-3.1-405b": ModelShape(405.9, 126, 8, 128, attention_heads=128),
    # DeepSeek-V3/R1: 671B parameters, 37B active per token; multi-head latent attention caches one
    # 576-wide latent (kv_lora_rank 512 + 64 rope dims) per layer, counted as 1 head x 288 for K and V.
    "deepseek-v3": ModelShape(671.0, 61, 1, 288, active_params_billion=37.0, attention_heads=128, hidden_size=7168),
}

# Bytes per weight for each dtype/quantisation the config accepts.
WEIGHT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "awq": 0.5, "gptq": 0.5}
KV_CACHE_BYTES = {"auto": 2.0, "fp8": 1.0}


# Compute Engine regions and their zones (the suffixes), every public region
# (cloud.google.com/compute/docs/regions-zones): gcp:region and cluster.zones are checked against
# them. GPUs and TPUs are offered in some zones of some regions only (compute/docs/gpus/gpu-regions-zones,
# tpu/docs/regions-zones); that is left to GKE, which refuses a node pool where its machine is not.
REGION_ZONES: Mapping[str, tuple[str, ...]] = {
    # Americas
    "us-central1": ("a", "b", "c", "f"), "us-east1": ("b", "c", "d"), "us-east4": ("a", "b", "c"),
    "us-east5": ("a", "b", "c"), "us-south1": ("a", "b", "c"), "us-west1": ("a", "b", "c"),
    "us-west2": ("a", "b", "c"), "us-west3": ("a", "b", "c"), "us-west4": ("a", "b", "c"),
    "northamerica-northeast1": ("a", "b", "c"), "northamerica-northeast2": ("a", "b", "c"),
    "northamerica-south1": ("a", "b", "c"), "southamerica-east1": ("a", "b", "c"),
    "southamerica-west1": ("a", "b", "c"),
    # Europe
    "europe-central2": ("a", "b", "c"), "europe-north1": ("a", "b", "c"), "europe-north2": ("a", "b", "c"),
    "europe-southwest1": ("a", "b", "c"), "europe-west1": ("b", "c", "d"), "europe-west2": ("a", "b", "c"),
    "europe-west3": ("a", "b", "c"), "europe-west4": ("a", "b", "c"), "europe-west6": ("a", "b", "c"),
    "europe-west8": ("a", "b", "c"), "europe-west9": ("a", "b", "c"), "europe-west10": ("a", "b", "c"),
    "europe-west12": ("a", "b", "c"),
    # Middle East and Africa
    "me-central1": ("a", "b", "c"), "me-central2": ("a", "b", "c"), "me-west1": ("a", "b", "c"),
    "africa-south1": ("a", "b", "c"),
    # Asia Pacific
    "asia-east1": ("a", "b", "c"), "asia-east2": ("a", "b", "c"), "asia-northeast1": ("a", "b", "c"),
    "asia-northeast2": ("a", "b", "c"), "asia-northeast3": ("a", "b", "c"), "asia-south1": ("a", "b", "c"),
    "asia-south2": ("a", "b", "c"), "asia-southeast1": ("a", "b", "c"), "asia-southeast2": ("a", "b", "c"),
    "australia-southeast1": ("a", "b", "c"), "australia-southeast2": ("a", "b", "c"),
}


def region_problem(name: str, zones_key: str = "cluster.zones") -> str | None:
    """Why `name` is not a region, with the ones it resembles; None if it is one."""
    if name in REGION_ZONES:
        return None
    near = nearest_regions(name)
    hint = f"did you mean {' or '.join(near)}?" if near else f"use one of {', '.join(REGION_ZONES)}"
    return (f"'{name}' is not a Compute Engine region; {hint} (cloud.google.com/compute/docs/regions-zones), and "
            f"list zones of it under {zones_key}")


def nearest_regions(name: str) -> list[str]:
    """Regions spelled like `name` ('europe-west-4' -> europe-west4), closest first."""
    squashed = {r.replace("-", ""): r for r in REGION_ZONES}
    exact = squashed.get(name.lower().replace("-", "").replace("_", ""))
    return [exact] if exact else difflib.get_close_matches(name.lower(), list(REGION_ZONES), n=3, cutoff=0.75)
