"""The vLLM releases the platform supports, and what differs between them.

Each entry is checked against a snapshot of that release's real parser, routes and metrics
(images/vllm-versions/<version>.json, made by images/vllm_snapshot.py): a flag or metric named
here that the release does not have fails the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class VllmRelease:
    version: str
    # Upstream image the server image builds FROM (vllm/vllm-openai:<tag>).
    image_tag: str
    # How chat requests resolve their output bound: `max_completion_tokens or max_tokens` (0
    # falls through) or max_completion_tokens unless it is null.
    max_tokens_rule: Literal["or", "not-none"]
    disable_prefix_caching: str
    disable_chunked_prefill: str
    # KV-cache usage gauge (renamed from vllm:gpu_cache_usage_perc, which 0.34 no longer has).
    kv_cache_metric: str


RELEASES: dict[str, VllmRelease] = {
    "0.34.0": VllmRelease("0.34.0", "v0.34.0", "not-none", "--disable-prefix-caching", "--disable-chunked-prefill",
                          "vllm:kv_cache_usage_perc"),
    "0.11.0": VllmRelease("0.11.0", "v0.11.0", "or", "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
                          "vllm:kv_cache_usage_perc"),
}
DEFAULT_VLLM_VERSION = "0.34.0"


def release(version: str) -> VllmRelease:
    return RELEASES[version]
