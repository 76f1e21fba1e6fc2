"""Prefill/decode disaggregation of a model (models[].disaggregation): a prefill pool beside the
model's decode pool (its `short` pool), the KV cache moved between them by vLLM's NIXL connector."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from .base import Name, Spec, max_replicas_over_min


class PrefillPoolSpec(Spec):
    """The prefill pool: its own workload, node pool, scaling and disruption budget."""

    # Node pool the prefill replicas run on (default: the model's nodePool).
    node_pool: Optional[Name] = None
    # Fewest prefill replicas; at least 1: a decode pod told to pull KV blocks from a prefill pod
    # that does not exist fails the request.
    min_replicas: int = Field(default=1, ge=1)
    # Most prefill replicas (the autoscaler's ceiling).
    max_replicas: int = Field(default=2, ge=1)
    # Sequences a prefill replica batches at once (--max-num-seqs).
    max_num_seqs: int = Field(default=16, ge=1, le=4096)
    # Tokens per prefill scheduler step (--max-num-batched-tokens; default vLLM's).
    max_num_batched_tokens: Optional[int] = Field(default=None, ge=256)

    @field_validator("max_replicas")
    @classmethod
    def _replicas(cls, v: int, info: ValidationInfo) -> int:
        return max_replicas_over_min(v, info)


class DisaggregationLoad(Spec):
    """The traffic both pools are sized for (the plan's capacity and cost comparison)."""

    # Prompt tokens per second across the model (what the prefill pool computes).
    prompt_tokens_per_second: float = Field(gt=0)
    # Output tokens per second across the model (what the decode pool generates).
    output_tokens_per_second: float = Field(gt=0)


class DisaggregationSpec(Spec):
    """Prefill on one pool, decode on another: llm-d-router's P/D scheduling picks a decode pod and,
    for prompts long enough, a prefill pod; the decode pod's routing sidecar asks the prefill pod for
    the prompt's KV cache, which vLLM's NixlConnector then reads across (routing: inference-gateway)."""

    # The prefill pool (the model's `short` pool is the decode pool).
    prefill: PrefillPoolSpec = Field(default_factory=PrefillPoolSpec)
    # How NIXL (UCX) moves KV blocks between the pools. rdma: GPUDirect RDMA over the node pool's
    # RDMA NICs (only machines vllm-gke sets that network up for); tcp: the data-centre network;
    # auto: rdma where the prefill and decode node pools both have it, else tcp.
    transport: Literal["auto", "rdma", "tcp"] = "auto"
    # Prompts with fewer uncached tokens than this (after the decode pod's prefix-cache hit) are
    # prefilled on the decode pod itself (llm-d-router's prefix-based-pd-decider nonCachedTokens;
    # 0 there turns P/D off, so at least 1). The picker counts its tokenizer's tokens: with its
    # estimate backend (no real tokenizer), 4-byte pseudo-tokens (tokenizer/estimate.go:35-37).
    min_prompt_tokens: int = Field(default=256, ge=1, le=1_000_000)
    # The traffic the two pools are sized for; unset, the plan sizes them from their replicas.
    load: Optional[DisaggregationLoad] = None
