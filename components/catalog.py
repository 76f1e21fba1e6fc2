"""Hardware and model catalog: the facts the rest of the library derives from.

Machine types map to their accelerator so config never repeats what GCE already fixes
(a2-highgpu-4g always carries four A100 40GB). MIG profiles are the ones GKE accepts for
`gpu_partition_size`; memory is the nominal GB in the profile name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Accelerator:
    gke_type: str  # guest_accelerators.type and the cloud.google.com/gke-accelerator label
    memory_gb: float
    # MIG profile -> instances per physical GPU; empty when the GPU has no MIG.
    mig_profiles: Mapping[str, int]

    def slice_memory_gb(self, partition: str | None) -> float:
        if partition is None:
            return self.memory_gb
        return float(partition.split(".")[1].removesuffix("gb"))

    def slices_per_gpu(self, partition: str | None) -> int:
        return 1 if partition is None else self.mig_profiles[partition]


A100_40GB = Accelerator(
    "nvidia-tesla-a100", 40,
    {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
)
A100_80GB = Accelerator(
    "nvidia-a100-80gb", 80,
    {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
)
H100_80GB = Accelerator(
    "nvidia-h100-80gb", 80,
    {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
)
H100_MEGA_80GB = Accelerator("nvidia-h100-mega-80gb", 80, H100_80GB.mig_profiles)
L4 = Accelerator("nvidia-l4", 24, {})

ACCELERATORS: Mapping[str, Accelerator] = {
    a.gke_type: a for a in (A100_40GB, A100_80GB, H100_80GB, H100_MEGA_80GB, L4)
}


@dataclass(frozen=True)
class MachineType:
    name: str
    accelerator: Accelerator | None
    gpus: int
    vcpus: int
    memory_gb: int

    @property
    def is_gpu(self) -> bool:
        return self.accelerator is not None


def _table(*rows: MachineType) -> Mapping[str, MachineType]:
    return {m.name: m for m in rows}


MACHINE_TYPES: Mapping[str, MachineType] = _table(
    MachineType("a2-highgpu-1g", A100_40GB, 1, 12, 85),
    MachineType("a2-highgpu-2g", A100_40GB, 2, 24, 170),
    MachineType("a2-highgpu-4g", A100_40GB, 4, 48, 340),
    MachineType("a2-highgpu-8g", A100_40GB, 8, 96, 680),
    MachineType("a2-megagpu-16g", A100_40GB, 16, 96, 1360),
    MachineType("a2-ultragpu-1g", A100_80GB, 1, 12, 170),
    MachineType("a2-ultragpu-2g", A100_80GB, 2, 24, 340),
    MachineType("a2-ultragpu-4g", A100_80GB, 4, 48, 680),
    MachineType("a2-ultragpu-8g", A100_80GB, 8, 96, 1360),
    MachineType("a3-highgpu-8g", H100_80GB, 8, 208, 1872),
    MachineType("a3-megagpu-8g", H100_MEGA_80GB, 8, 208, 1872),
    MachineType("g2-standard-4", L4, 1, 4, 16),
    MachineType("g2-standard-8", L4, 1, 8, 32),
    MachineType("g2-standard-12", L4, 1, 12, 48),
    MachineType("g2-standard-16", L4, 1, 16, 64),
    MachineType("g2-standard-24", L4, 2, 24, 96),
    MachineType("g2-standard-32", L4, 1, 32, 128),
    MachineType("g2-standard-48", L4, 4, 48, 192),
    MachineType("g2-standard-96", L4, 8, 96, 384),
    # CPU machines for the system pool.
    MachineType("e2-standard-4", None, 0, 4, 16),
    MachineType("e2-standard-8", None, 0, 8, 32),
    MachineType("n2-standard-4", None, 0, 4, 16),
    MachineType("n2-standard-8", None, 0, 8, 32),
    MachineType("n2-standard-16", None, 0, 16, 64),
)

GPU_MACHINE_TYPES = tuple(n for n, m in MACHINE_TYPES.items() if m.is_gpu)

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
    """Architecture numbers that decide memory: weights and KV cache per token."""

    params_billion: float
    layers: int
    kv_heads: int
    head_dim: int


MODEL_SHAPES: Mapping[str, ModelShape] = {
    "llama-3-8b": ModelShape(8.03, 32, 8, 128),
    "llama-3-70b": ModelShape(70.6, 80, 8, 128),
    "qwen2.5-1.5b": ModelShape(1.54, 28, 2, 128),
    "qwen2.5-7b": ModelShape(7.62, 28, 4, 128),
    "qwen2.5-72b": ModelShape(72.7, 80, 8, 128),
    "mistral-7b": ModelShape(7.25, 32, 8, 128),
}

# Bytes per weight for each dtype/quantisation the config accepts.
WEIGHT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "awq": 0.5, "gptq": 0.5}
KV_CACHE_BYTES = {"auto": 2.0, "fp8": 1.0}


# Compute Engine zones by region (the suffixes), for the regions GPU serving usually runs in
# (cloud.google.com/compute/docs/regions-zones); a region not listed is not checked.
REGION_ZONES: dict[str, tuple[str, ...]] = {
    "us-central1": ("a", "b", "c", "f"), "us-east1": ("b", "c", "d"), "us-east4": ("a", "b", "c"),
    "us-east5": ("a", "b", "c"), "us-south1": ("a", "b", "c"), "us-west1": ("a", "b", "c"),
    "us-west2": ("a", "b", "c"), "us-west3": ("a", "b", "c"), "us-west4": ("a", "b", "c"),
    "northamerica-northeast1": ("a", "b", "c"), "southamerica-east1": ("a", "b", "c"),
    "europe-west1": ("b", "c", "d"), "europe-west2": ("a", "b", "c"), "europe-west3": ("a", "b", "c"),
    "europe-west4": ("a", "b", "c"), "europe-west6": ("a", "b", "c"), "europe-north1": ("a", "b", "c"),
    "asia-east1": ("a", "b", "c"), "asia-northeast1": ("a", "b", "c"), "asia-northeast3": ("a", "b", "c"),
    "asia-south1": ("a", "b", "c"), "asia-southeast1": ("a", "b", "c"), "australia-southeast1": ("a", "b", "c"),
    "me-west1": ("a", "b", "c"),
}
