"""vLLM's own OpenAI API server with the GPU engine replaced by one that answers at once.

    python -m benchmarks.vllm_fake_engine MODEL_DIR -- <vllm serve flags>   # in a venv with vllm

Everything the API-server process does for a request is the pinned release's own code: its
argument parser, build_app (routes, CORS, metrics, the --middleware classes), the chat request
model, the chat template (jinja) and tokenization (Hugging Face tokenizers), the AsyncLLM input
processor, the output processor (detokenization), Prometheus stats and the response. Only the
engine core, a separate process on the GPU in real use, is a stand-in: each request gets its
tokens back in one output as soon as it is added, so the API server does less per request than
under real decoding (which streams a token at a time through the output processor) and the
guard's share measured against it is, if anything, larger than in production.

The model directory holds no weights (nothing loads them): a config, and a tokenizer built from
a real 130k-token byte-level BPE (Mistral's Tekken vocabulary, which ships in mistral_common, a
vLLM dependency) split as Llama 3 splits, and a ChatML chat template of Qwen2.5's shape.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

# Tokens the stand-in engine "generates" for every request, then stops.
GENERATED = 16

CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_model_dir(target: Path) -> Path:
    """A weightless model directory vLLM accepts: Qwen2 config, tokenizer, chat template."""
    from importlib.resources import files

    from transformers.convert_slow_tokenizer import TikTokenConverter  # type: ignore[import-not-found]

    if (target / "config.json").exists():
        return target
    final, target = target, target.with_name(f"{target.name}.{os.getpid()}.partial")  # renamed when whole
    target.mkdir(parents=True, exist_ok=True)
    tekken = json.loads(files("mistral_common").joinpath("data/tekken_240911.json").read_text())
    config = tekken["config"]
    ranks = tekken["vocab"][:config["default_vocab_size"] - config["default_num_special_tokens"]]
    with tempfile.NamedTemporaryFile("w", suffix=".tiktoken", delete=False) as bpe:
        for entry in ranks:
            bpe.write(f"{entry['token_bytes']} {entry['rank']}\n")
    try:
        # Split as Llama 3's tokenizer splits (the converter's default pattern): the prod stack's
        # longest-prompt pool serves Llama 3.
        tokenizer = TikTokenConverter(vocab_file=bpe.name, extra_special_tokens=SPECIAL).converted()
    finally:
        os.unlink(bpe.name)
    tokenizer.save(str(target / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL}
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 65536, "chat_template": CHAT_TEMPLATE,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for t, i in ids.items()}}))
    (target / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 65536, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True, "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"]}))
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": ids["<|im_end|>"]}))
    target.rename(final)
    return final


# A file each engine request is recorded in (its cache_salt and max_tokens), when set.
ENGINE_LOG_ENV = "FAKE_ENGINE_LOG"
# A file holding how many requests the engine says wait (vllm:num_requests_waiting, what the guard's
# overload protection reads), reported with each output as the real scheduler reports its stats;
# unset: no scheduler stats, as before.
WAITING_ENV = "FAKE_ENGINE_WAITING_FILE"
SWAP_LOG_ENV = "FAKE_ENGINE_SWAP_LOG"


class InstantEngineCore:
    """The engine-core client AsyncLLM talks to, answering every request at once: GENERATED
    tokens and a stop. Requests and outputs still go through vLLM's msgpack codec, as over
    the real client's ZMQ sockets."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any):
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason  # type: ignore[import-not-found]
        from vllm.v1.metrics.stats import SchedulerStats  # type: ignore[import-not-found]
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # type: ignore[import-not-found]

        self.output, self.outputs_of, self.stop = EngineCoreOutput, EngineCoreOutputs, FinishReason.STOP
        self.stats_of = SchedulerStats
        self.vllm_config = vllm_config
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(EngineCoreOutputs)
        self.engine_ranks_managed = [0]
        self.engine_status: dict[str, Any] = {"status": "healthy"}
        self.resources = types.SimpleNamespace(engine_dead=False, output_queue_task=None)

    async def add_request_async(self, request: Any) -> None:
        self.encoder.encode(request)
        if self.sleeping:  # a real engine would hold it until woken: a swap that let it through is wrong
            self.swap_log(op="request_while_asleep")
        if log := os.environ.get(ENGINE_LOG_ENV):  # what reached the engine, for tests
            params = request.sampling_params
            with open(log, "a") as fh:
                fh.write(json.dumps({"cache_salt": request.cache_salt,
                                     "max_tokens": getattr(params, "max_tokens", None)}) + "\n")
        prompt = request.prompt_token_ids or [0]
        # The trace context goes back with the output, as the real scheduler returns it
        # (vllm 0.34.0 v1/core/sched/scheduler.py:2596): the output processor's span continues it.
        out = self.outputs_of(outputs=[self.output(
            request_id=request.request_id, new_token_ids=[prompt[i % len(prompt)] for i in range(GENERATED)],
            finish_reason=self.stop, trace_headers=request.trace_headers)], scheduler_stats=self.scheduler_stats())
        self.outputs.put_nowait(self.decoder.decode(self.encoder.encode(out)))

    def scheduler_stats(self) -> Any:
        """The stats the real scheduler sends with its outputs (vllm 0.34.0 v1/core/sched/scheduler.py
        make_stats), its waiting count read from WAITING_ENV's file; None without it."""
        path = os.environ.get(WAITING_ENV)
        if not path:
            return None
        try:
            waiting = int(Path(path).read_text().strip() or 0)
        except (OSError, ValueError):
            waiting = 0
        return self.stats_of(num_waiting_reqs=waiting)

    async def get_output_async(self) -> Any:
        return await self.outputs.get()

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    # Sleep mode as AsyncLLM drives it (vllm 0.34.0 v1/engine/async_llm.py sleep, wake_up,
    # collective_rpc): the state kept, each call and each request that came while asleep written
    # to SWAP_LOG_ENV's file (the guard's swap tests read it).
    sleeping = 0

    def swap_log(self, **event: Any) -> None:
        if log := os.environ.get(SWAP_LOG_ENV):
            with open(log, "a") as fh:
                fh.write(json.dumps(event) + "\n")

    async def sleep_async(self, level: int = 1, mode: str = "abort", reset_connector: bool = True) -> None:
        self.sleeping = level
        self.swap_log(op="sleep", level=level, mode=mode)

    async def wake_up_async(self, tags: Any = None) -> bool:
        self.swap_log(op="wake_up", tags=tags)
        if tags is None or "kv_cache" in tags:
            self.sleeping = 0
        return not self.sleeping

    async def collective_rpc_async(self, method: str, timeout: Any = None, args: Any = (), kwargs: Any = None) -> list:
        self.swap_log(op="collective_rpc", method=method)
        return [None]

    async def is_sleeping_async(self) -> bool:
        return bool(self.sleeping)

    async def reset_prefix_cache_async(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def dp_engines_running(self) -> bool:
        return True

    def shutdown(self, timeout: Any = None) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_async"):  # everything else AsyncLLM may ask of its engine: done, nothing to say
            async def nothing(*args: Any, **kwargs: Any) -> None:
                return None
            return nothing
        raise AttributeError(name)


def install_instant_engine() -> None:
    """Make AsyncLLM talk to InstantEngineCore instead of starting an engine-core process."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU: vLLM's CPU platform
    import vllm.triton_utils  # type: ignore[import-not-found]
    from vllm.v1.engine import core_client  # type: ignore[import-not-found]

    # The CPU platform's config check wants triton-cpu for the model runner; none runs here.
    vllm.triton_utils.HAS_TRITON = True
    core_client.EngineCoreClient.make_async_mp_client = staticmethod(  # pyright: ignore[reportAttributeAccessIssue]
        lambda vllm_config, *a, **k: InstantEngineCore(vllm_config))


def main(argv: list[str]) -> int:
    """`make-model DIR`, or `serve MODEL_DIR [flags]`: exactly `vllm serve`, the real CLI, in this
    process (one API server runs in the CLI's own process), with the instant engine core."""
    if len(argv) == 2 and argv[0] == "make-model":
        make_model_dir(Path(argv[1]))
        return 0
    if len(argv) < 2 or argv[0] != "serve":
        print("usage: python -m benchmarks.vllm_fake_engine (make-model DIR | serve MODEL_DIR [vllm serve flags])",
              file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    install_instant_engine()
    from vllm.entrypoints.cli.main import main as vllm_cli  # type: ignore[import-not-found]

    sys.argv = ["vllm", *argv]
    vllm_cli()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
