"""Time from a GPU node being ready to a replica serving, estimated per pool at plan time.

    image      the server image with image streaming (every pool has it, `gcfs_config`): the
               container starts while its layers stream in, so seconds, not the minutes a
               multi-GB pull takes (IMAGE_START_S, an estimate)
  + weights    the model's (and its adapters') GB over the read throughput of the weights store:
               Filestore's documented per-tier figures (https://cloud.google.com/filestore/docs/performance:
               BASIC_HDD 100 MiB/s below 10 TiB and 180 above, BASIC_SSD 1,200, ZONAL 260 per TiB,
               REGIONAL 120 per TiB below 10 TiB and 260 above); for a bucket, Cloud Storage FUSE
               with parallel downloads has no documented figure, so GCS_FUSE_READ_MIB_S is an
               assumption; Hyperdisk ML reads at the disk's provisioned throughput
               (`weights.hyperdiskThroughputMiBps`); `weights.readThroughputMiBps` overrides any
               of them with a measured figure
  + engine     vLLM's start after the weights: CUDA graphs, compilation, the warm-up requests
               (ENGINE_START_S, an estimate)
One replica loading alone: replicas that start together share a Filestore share's throughput.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .specs import ModelSpec
from .weights_layout import plan_filestore

if TYPE_CHECKING:
    from .stack_config import StackConfig

IMAGE_START_S = 30.0
# A GPU node from a pool at zero nodes: the cluster autoscaler's scale-up plus node boot and the
# GPU driver (an estimate; before the replica's own cold start).
NODE_PROVISION_S = 300.0
ENGINE_START_S = 120.0
GCS_FUSE_READ_MIB_S = 1000.0
MIB = 1024 ** 2


def filestore_read_mib_s(tier: str, capacity_gib: int) -> float:
    tib = capacity_gib / 1024
    if tier == "BASIC_HDD":
        return 100.0 if tib < 10 else 180.0
    if tier == "BASIC_SSD":
        return 1200.0
    if tier == "ZONAL":
        return 260.0 * tib
    if tier == "REGIONAL":
        return (120.0 if tib < 10 else 260.0) * tib
    raise ValueError(f"unknown Filestore tier {tier}")


def read_mib_s(cfg: "StackConfig") -> float:
    if cfg.weights.read_throughput_mib_s is not None:
        return float(cfg.weights.read_throughput_mib_s)
    if cfg.weights.backend == "gcs":
        return GCS_FUSE_READ_MIB_S
    if cfg.weights.backend == "hyperdisk-ml":
        # The disk's provisioned throughput; replicas reading one disk together share it.
        return float(cfg.weights.hyperdisk_throughput_mib_s)
    return filestore_read_mib_s(*plan_filestore(cfg.models, cfg.weights))


def cold_start_seconds(cfg: "StackConfig", model: ModelSpec) -> float:
    gb = model.weights_gb + model.lora_gb()
    return IMAGE_START_S + gb * 1e9 / (read_mib_s(cfg) * MIB) + ENGINE_START_S
