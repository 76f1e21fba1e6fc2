"""Time from a GPU node being ready to a replica serving, estimated per pool at plan time.

    image      the server image with image streaming (every pool has it, `gcfs_config`): the
               container starts while its layers stream in, so seconds, not the minutes a
               multi-GB pull takes (IMAGE_START_S, an estimate)
  + weights    the model's (and its adapters') GB over the read throughput of the weights store
               (each backend's read_mib_s, components/model/weights_backends.py): Filestore's
               documented per-tier figures (https://cloud.google.com/filestore/docs/performance:
               BASIC_HDD 100 MiB/s below 10 TiB and 180 above, BASIC_SSD 1,200, ZONAL 260 per TiB,
               REGIONAL 120 per TiB below 10 TiB and 260 above); for a bucket, Cloud Storage FUSE
               with parallel downloads has no documented figure, so GCS_FUSE_READ_MIB_S is an
               assumption; Hyperdisk ML reads at the disk's provisioned throughput
               (`weights.hyperdiskThroughputMiBps`); `weights.readThroughputMiBps` overrides any
               of them with a measured figure
  + engine     vLLM's start after the weights: CUDA graphs, compilation, the warm-up requests
               (ENGINE_START_S, an estimate)
  + TPU        on a TPU, the XLA compile of every shape the engine precompiles before it serves
               (xla_compile_seconds; the node's compile cache, components/model/vllm_server.py, spares a
               restarted replica most of it, but a new node starts empty), and across hosts the
               workers' joins to the leader's Ray cluster (RAY_JOIN_S)
One replica loading alone: replicas that start together share a Filestore share's throughput.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .capacity import hosts_per_replica
from .specs import ModelSpec, NodePoolSpec
from .weights_backends import backend_of

if TYPE_CHECKING:
    from .stack_config import StackConfig

IMAGE_START_S = 30.0
# A GPU node from a pool at zero nodes: the cluster autoscaler's scale-up plus node boot and the
# GPU driver (an estimate; before the replica's own cold start).
NODE_PROVISION_S = 300.0
ENGINE_START_S = 120.0
MIB = 1024 ** 2
# The one published cold XLA compile of vLLM TPU: tpu-inference's CI, about 90 minutes for
# Qwen3.5-397B-A17B-FP8 (about 400 GB of weights) where a warm cache takes about 10
# (vllm-project/tpu-inference releases/v0.27.0 .buildkite/xla_autotune/README.md:103-106). Scaled
# by the weights (the programs grow with the model's layers and width), 10 minutes at least.
XLA_COMPILE_S_PER_GB = 90 * 60 / 400
XLA_COMPILE_MIN_S = 600.0
# A group's workers join its leader's Ray head before the engine starts: a worker retries for up to
# RAY_JOIN_TIMEOUT_S (images/serve.py), the longest a group that will come up waits for its hosts.
RAY_JOIN_S = 600.0


def read_mib_s(cfg: "StackConfig") -> float:
    if cfg.weights.read_throughput_mib_s is not None:
        return float(cfg.weights.read_throughput_mib_s)
    return backend_of(cfg.weights).read_mib_s(cfg.models, cfg.weights)


def xla_compile_seconds(model: ModelSpec) -> float:
    return max(XLA_COMPILE_MIN_S, model.weights_gb * XLA_COMPILE_S_PER_GB)


def accelerator_start_seconds(model: ModelSpec, pool: NodePoolSpec) -> float:
    """What the accelerator adds to a start: on a TPU the XLA compile, and across hosts the workers'
    Ray joins; nothing on a GPU."""
    if not pool.is_tpu:
        return 0.0
    return xla_compile_seconds(model) + (RAY_JOIN_S if hosts_per_replica(model, pool) > 1 else 0.0)


def cold_start_seconds(cfg: "StackConfig", model: ModelSpec, node_pool: Optional[NodePoolSpec] = None) -> float:
    """From node ready to serving, for a replica of `model` on `node_pool` (default its own)."""
    pool = node_pool or cfg.pool(model.node_pool)
    gb = model.weights_gb + model.lora_gb()
    return (IMAGE_START_S + gb * 1e9 / (read_mib_s(cfg) * MIB) + ENGINE_START_S
            + accelerator_start_seconds(model, pool))


# The package's VllmService without coldStartSeconds (it knows no weights store): 15 minutes for the
# image, the weights and the engine, plus what its accelerator adds (accelerator_start_seconds).
PACKAGE_LOAD_S = 900.0


def package_cold_start_seconds(model: ModelSpec, pool: NodePoolSpec) -> float:
    return PACKAGE_LOAD_S + accelerator_start_seconds(model, pool)


def rollout_seconds(max_replicas: int, load_seconds: float, grace_seconds: int) -> int:
    """How long a rollout of a pool at its ceiling may take, one replica at a time: each a node
    (the replaced pod holds its devices through its grace period), then the load."""
    return int(max_replicas * (NODE_PROVISION_S + load_seconds + grace_seconds))
