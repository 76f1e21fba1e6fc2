"""Stand-ins for vLLM's OpenAI HTTP layer up to the engine, for benchmarks/guard_overhead.py.

Two, because the guard's share of a request depends on what else the server does for it:

- `bare_app`: one FastAPI route taking a small pydantic chat model and answering at once. The
  least any server does per request: the guard's share is at its largest here.
- `vllm_like_app`: what the pinned vLLM's `build_app` puts in front of the engine on every chat
  request, as far as it can be had without vLLM (which needs a GPU build of torch):
    * HTTP metrics for every request from prometheus-fastapi-instrumentator (vLLM's metrics
      router calls `Instrumentator(...).instrument(app).expose(app)`; the pinned release's route
      snapshot, images/vllm-versions/0.34.0.json, lists the GET /metrics route `expose` adds);
    * Starlette's CORSMiddleware with vLLM's defaults (--allowed-origins/--allowed-methods/
      --allowed-headers '*', no credentials), which build_app always adds;
    * each `--middleware` class added last with `app.add_middleware`, which is how the guard is
      loaded: it runs outermost of them, inside Starlette's error middleware;
    * the chat route: a dependency refusing non-JSON content types, the handler raced against
      a task listening for the client's disconnect (vLLM's `with_cancellation`: two tasks and
      asyncio.wait per request), the request validated into a model with the fields of
      OpenAI's chat API and vLLM's documented extra sampling parameters, the response built as
      a model and dumped to JSON.
  Not modelled, and all heavier than anything here: chat templating, tokenization and
  detokenization, the engine client. A real server spends more per request than this
  stand-in, so the guard's share in production is smaller still.
"""

# No `from __future__ import annotations`: FastAPI and pydantic resolve the local models.

import asyncio
import time
from typing import Any, Literal, Optional, Union

PATH = "/v1/chat/completions"


def bare_app(middleware: Optional[type] = None):
    from fastapi import FastAPI  # type: ignore[import-not-found]
    from pydantic import BaseModel, ConfigDict

    class Message(BaseModel):
        role: str
        content: str

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="allow")
        model: Optional[str] = None
        messages: list[Message]
        max_tokens: Optional[int] = None
        max_completion_tokens: Optional[int] = None
        n: Optional[int] = 1
        temperature: Optional[float] = None

    app = FastAPI()

    @app.post(PATH)
    async def chat(request: ChatRequest) -> dict:
        return {"ok": True, "n": request.n}

    if middleware is not None:
        app.add_middleware(middleware)
    return app


def needs(data: Any, field: str, other: str) -> Any:
    if isinstance(data, dict) and data.get(field) and not data.get(other):
        raise ValueError(f"{field} needs {other}")
    return data


def vllm_like_app(middleware: Optional[type] = None):
    from fastapi import Depends, FastAPI, HTTPException, Request  # type: ignore[import-not-found]
    from fastapi.middleware.cors import CORSMiddleware  # type: ignore[import-not-found]
    from fastapi.responses import JSONResponse  # type: ignore[import-not-found]
    from prometheus_client import CollectorRegistry
    from prometheus_fastapi_instrumentator import Instrumentator  # type: ignore[import-not-found]
    from pydantic import BaseModel, ConfigDict, Field, model_validator

    class TextPart(BaseModel):
        type: Literal["text"]
        text: str

    class ToolCall(BaseModel):
        id: str
        type: Literal["function"] = "function"
        function: dict[str, Any]

    class Message(BaseModel):
        model_config = ConfigDict(extra="allow")
        role: str
        content: Union[str, list[TextPart], None] = None
        name: Optional[str] = None
        tool_calls: Optional[list[ToolCall]] = None
        tool_call_id: Optional[str] = None

    class StreamOptions(BaseModel):
        include_usage: Optional[bool] = True
        continuous_usage_stats: Optional[bool] = False

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="allow")
        # OpenAI's chat completions request
        messages: list[Message]
        model: Optional[str] = None
        frequency_penalty: Optional[float] = 0.0
        logit_bias: Optional[dict[str, float]] = None
        logprobs: Optional[bool] = False
        top_logprobs: Optional[int] = 0
        max_tokens: Optional[int] = None
        max_completion_tokens: Optional[int] = None
        n: Optional[int] = 1
        presence_penalty: Optional[float] = 0.0
        response_format: Optional[dict[str, Any]] = None
        seed: Optional[int] = None
        stop: Union[str, list[str], None] = Field(default_factory=list)
        stream: Optional[bool] = False
        stream_options: Optional[StreamOptions] = None
        temperature: Optional[float] = None
        top_p: Optional[float] = None
        tools: Optional[list[dict[str, Any]]] = None
        tool_choice: Union[str, dict[str, Any], None] = "none"
        parallel_tool_calls: Optional[bool] = True
        user: Optional[str] = None
        metadata: Optional[dict[str, str]] = None
        reasoning_effort: Optional[Literal["low", "medium", "high"]] = None
        # vLLM's extra sampling and templating parameters
        best_of: Optional[int] = None
        use_beam_search: bool = False
        top_k: Optional[int] = None
        min_p: Optional[float] = None
        repetition_penalty: Optional[float] = None
        length_penalty: float = 1.0
        stop_token_ids: Optional[list[int]] = Field(default_factory=list)
        include_stop_str_in_output: bool = False
        ignore_eos: bool = False
        min_tokens: int = 0
        skip_special_tokens: bool = True
        spaces_between_special_tokens: bool = True
        truncate_prompt_tokens: Optional[int] = None
        prompt_logprobs: Optional[int] = None
        allowed_token_ids: Optional[list[int]] = None
        bad_words: list[str] = Field(default_factory=list)
        echo: bool = False
        add_generation_prompt: bool = True
        continue_final_message: bool = False
        add_special_tokens: bool = False
        documents: Optional[list[dict[str, str]]] = None
        chat_template: Optional[str] = None
        chat_template_kwargs: Optional[dict[str, Any]] = None
        mm_processor_kwargs: Optional[dict[str, Any]] = None
        structured_outputs: Optional[dict[str, Any]] = None
        priority: int = 0
        request_id: Optional[str] = None
        return_tokens_as_token_ids: Optional[bool] = None
        cache_salt: Optional[str] = None
        kv_transfer_params: Optional[dict[str, Any]] = None

        # Separate validators, as vLLM's model has several: each is a call on every request.
        @model_validator(mode="before")
        @classmethod
        def stream_options_need_stream(cls, data: Any) -> Any:
            return needs(data, "stream_options", "stream")

        @model_validator(mode="before")
        @classmethod
        def top_logprobs_need_logprobs(cls, data: Any) -> Any:
            return needs(data, "top_logprobs", "logprobs")

    class ResponseMessage(BaseModel):
        role: str
        content: Optional[str] = None

    class Choice(BaseModel):
        index: int
        message: ResponseMessage
        logprobs: Optional[dict[str, Any]] = None
        finish_reason: Optional[str] = "stop"

    class Usage(BaseModel):
        prompt_tokens: int = 0
        completion_tokens: int = 0
        total_tokens: int = 0

    class ChatResponse(BaseModel):
        id: str
        object: Literal["chat.completion"] = "chat.completion"
        created: int = Field(default_factory=lambda: int(time.time()))
        model: str
        choices: list[Choice]
        usage: Usage

    async def json_only(raw_request: Request) -> None:  # async, as vLLM's: a sync one would run in a thread
        media = raw_request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise HTTPException(status_code=415, detail="Unsupported Media Type: only application/json")

    async def disconnected(raw_request: Request) -> None:
        while (await raw_request.receive())["type"] != "http.disconnect":
            pass

    app = FastAPI()
    Instrumentator(excluded_handlers=["/metrics", "/health"], registry=CollectorRegistry()) \
        .add().instrument(app).expose(app)

    @app.post(PATH, dependencies=[Depends(json_only)])
    async def chat(request: ChatRequest, raw_request: Request):
        async def handle() -> JSONResponse:
            response = ChatResponse(id=f"chatcmpl-{id(request):x}", model=request.model or "m",
                                    choices=[Choice(index=i, message=ResponseMessage(role="assistant", content="ok"))
                                             for i in range(request.n or 1)],
                                    usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))
            return JSONResponse(content=response.model_dump())

        work, listener = asyncio.create_task(handle()), asyncio.create_task(disconnected(raw_request))
        done, pending = await asyncio.wait((work, listener), return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return work.result() if work in done else None

    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=False, allow_methods=["*"],
                       allow_headers=["*"])
    if middleware is not None:
        app.add_middleware(middleware)
    return app


STAND_INS = {"vllm-like": vllm_like_app, "bare": bare_app}
