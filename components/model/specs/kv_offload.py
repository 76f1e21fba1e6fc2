"""KV-cache offload to host memory (models[].kvOffload): vLLM's native CPU offloading, which copies
each newly computed KV block into pinned host memory of the server's pod, so a prefix the GPU has
since dropped or a preempted sequence is loaded back instead of recomputed."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from .base import Spec


class KvOffloadSpec(Spec):
    """What the server passes vLLM as --kv-offloading-backend and --kv-offloading-size."""

    # native (the only one served): vLLM's own CPU offloading (its OffloadingConnector) into pinned host
    # memory inside the server container. lmcache is refused: vLLM 0.34 runs it as a client of a separate
    # LMCache server that this platform does not deploy, and the server image adds no lmcache package.
    backend: str = "native"  # a string: an enum would take the name of the weights' Backend in the package's types
    # GiB of host memory one replica's offloaded KV cache takes, summed over its GPUs as vLLM counts
    # it (--kv-offloading-size). Default: nine tenths of what each replica's pods may take on the node
    # (its allocatable after the kernel's and GKE's reservations and GKE's own pods, shared among the
    # replicas) beside the server's estimated own need; the plan refuses a size that does not fit.
    size_gb: Optional[float] = Field(default=None, gt=0, le=4096)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        # lmcache passes here so the placement check can say why it is refused (config_rules/kv_offload.py).
        if v not in ("native", "lmcache"):
            raise ValueError(f"is {v!r}: vLLM 0.34 offloads with native or lmcache; use native")
        return v
