"""Model swapping on a shared GPU: a node pool whose GPUs GKE time-shares between pods
(nodePools[].gpuSharing), and models that sleep there with vLLM's sleep mode (models[].sleepMode),
one awake per GPU at a time."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Spec

# GKE's bound on the containers sharing one GPU by time-sharing
# (https://cloud.google.com/kubernetes-engine/docs/how-to/timesharing-gpus: 2 to 48).
MAX_SHARED_CLIENTS = 48


class GpuSharingSpec(Spec):
    """GKE GPU time-sharing: each GPU is offered to up to maxSharedClientsPerGpu pods, which take
    turns on it. GKE isolates no memory between them: only models with sleepMode share it, one
    awake at a time."""

    # How pods share a GPU; GKE's TIME_SHARING (MPS is not offered here: its clients run at once).
    strategy: Literal["TIME_SHARING"] = "TIME_SHARING"
    # Pods (servers of the models that swap) one GPU holds at most.
    max_shared_clients_per_gpu: int = Field(default=4, ge=2, le=MAX_SHARED_CLIENTS)


class SleepModeSpec(Spec):
    """vLLM's sleep mode (--enable-sleep-mode) on a time-shared GPU: the tenant guard wakes its
    server when a request comes and the GPU's lease is free, and puts it back to sleep when another
    model on the same GPU wants it. Needs vllm-gke:globalLimits (the lease is in the limit store)."""

    # 1: the weights go to the node's RAM while asleep and come back over PCIe in seconds (every
    # sleeping model's weights count against the node's memory). 2: the weights are dropped and
    # reloaded from the weights share on wake (slower, no RAM held).
    level: Literal[1, 2] = 1
    # Longest a request waits for its model to wake (the awake one to finish and sleep) before a
    # 503 with Retry-After.
    wait_seconds: int = Field(default=60, ge=1, le=600)
    # Once awake, the model keeps the GPU at least this long before it yields to another
    # (fewer swaps under mixed traffic, at the others' wait).
    min_awake_seconds: int = Field(default=5, ge=0, le=3600)
