"""The vLLM releases the platform supports, and what differs between them.

Each entry is checked against a snapshot of that release's real parser, routes and metrics
(images/vllm-versions/<version>.json, made by images/vllm_snapshot.py): a flag or metric named
here that the release does not have fails the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


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
    # The flag that lets the engine finish in-flight requests after SIGTERM instead of aborting
    # them (0.34's --shutdown-timeout, default 0 = abort); None where the release has none.
    shutdown_timeout_flag: Optional[str] = None
    # The gauges the endpoint picker and KEDA read (the same names in both releases).
    queue_metric: str = "vllm:num_requests_waiting"
    running_metric: str = "vllm:num_requests_running"
    lora_info_metric: str = "vllm:lora_requests_info"
    cache_info_metric: str = "vllm:cache_config_info"

    # Tenant routes whose request models take `cache_salt` (a per-request prefix-cache salt).
    cache_salt_paths: tuple[str, ...] = ()
    # Tenant routes that reach the shared prefix cache with no salt the guard can set: refused,
    # or two tenants' prompts would share cached prefixes (a timing side channel).
    unsalted_paths: tuple[str, ...] = ()
    # Which weight files the release's loader opens with load_format auto (the loader program's
    # --reads): 0.34 prefers Mistral's consolidated*.safetensors where a repository has them
    # (model_loader/default_loader.py:170-183), 0.11 reads the HF shards.
    weights_rule: Literal["hf", "mistral-first"] = "hf"
    # The flag that replaces a histogram family's buckets (0.34's --custom-histogram-buckets,
    # config/observability.py:72); None where the release has none.
    histogram_buckets_flag: Optional[str] = None
    # The release requires the OpenTelemetry SDK and OTLP exporters (0.34's METADATA: opentelemetry-sdk,
    # -api, -exporter-otlp), so its image can export traces; older ones list them as an extra only.
    ships_opentelemetry: bool = False
    # The accelerators it serves on: CUDA GPUs (vllm/vllm-openai) or TPUs (the vllm-tpu build,
    # vLLM with tpu-inference as its platform, image vllm/vllm-tpu).
    platform: Literal["cuda", "tpu"] = "cuda"
    image_repository: str = "vllm/vllm-openai"

    @property
    def snapshot(self) -> str:
        """The file of its parser snapshot (images/vllm-versions/<snapshot>.json)."""
        return f"tpu-{self.version}" if self.platform == "tpu" else self.version

    @property
    def label(self) -> str:
        return f"vLLM TPU {self.version}" if self.platform == "tpu" else f"vLLM {self.version}"


RELEASES: dict[str, VllmRelease] = {
    # cache_salt: 0.34's chat, chat batch, completions, responses, messages and pooling request
    # models (vllm/entrypoints/pooling/base/protocol.py:84 and the openai/anthropic protocols);
    # not tokenize/detokenize. 0.11: chat, completions, responses (entrypoints/openai/protocol.py).
    "0.34.0": VllmRelease("0.34.0", "v0.34.0", "not-none", "--disable-prefix-caching", "--disable-chunked-prefill",
                          "vllm:kv_cache_usage_perc", shutdown_timeout_flag="--shutdown-timeout",
                          cache_salt_paths=("/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
                                            "/v1/responses", "/v1/messages", "/v1/embeddings", "/pooling", "/classify",
                                            "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"),
                          weights_rule="mistral-first", histogram_buckets_flag="--custom-histogram-buckets",
                          ships_opentelemetry=True),
    "0.11.0": VllmRelease("0.11.0", "v0.11.0", "or", "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
                          "vllm:kv_cache_usage_perc",
                          cache_salt_paths=("/v1/completions", "/v1/chat/completions", "/v1/responses"),
                          # 0.11 keeps prefix caching on for pooling models (engine/arg_utils.py:1563-1577)
                          # and its pooling requests' prompt form takes no salt (serving_embedding.py
                          # renders it without one; serving_engine.py:848 salts only the chat form).
                          unsalted_paths=("/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score",
                                          "/rerank", "/v1/rerank", "/v2/rerank")),
}
DEFAULT_VLLM_VERSION = "0.34.0"
# The vLLM TPU build (vllm-tpu on PyPI: vLLM with tpu-inference as its platform; image
# vllm/vllm-tpu:v<version>, the one GKE's TPU serving guides run). Its serving surface is vLLM's
# own, checked against images/vllm-versions/tpu-<version>.json: the same routes and metrics as
# 0.34.0, the request models taking cache_salt (entrypoints/*/protocol.py), Mistral's
# consolidated files first (model_loader/default_loader.py:176-197), OpenTelemetry among its
# requirements; off switches are 0.32's --no-enable-*.
TPU_RELEASES: dict[str, VllmRelease] = {
    "0.32.0": VllmRelease("0.32.0", "v0.32.0", "not-none", "--no-enable-prefix-caching",
                          "--no-enable-chunked-prefill", "vllm:kv_cache_usage_perc",
                          shutdown_timeout_flag="--shutdown-timeout",
                          cache_salt_paths=RELEASES["0.34.0"].cache_salt_paths, weights_rule="mistral-first",
                          histogram_buckets_flag="--custom-histogram-buckets", ships_opentelemetry=True,
                          platform="tpu", image_repository="vllm/vllm-tpu"),
}
DEFAULT_TPU_VLLM_VERSION = "0.32.0"
# vLLM's default time-to-first-token buckets (vllm 0.34.0 vllm/v1/metrics/buckets.py:57-80).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


def ttft_buckets_with(seconds: float) -> Optional[list[float]]:
    """The time-to-first-token buckets with `seconds` among their bounds, where it is not one."""
    if any(abs(b - seconds) < 1e-9 for b in TTFT_BUCKETS):
        return None
    return sorted([*TTFT_BUCKETS, seconds])


def release(version: str) -> VllmRelease:
    return RELEASES[version]
