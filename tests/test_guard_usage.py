"""The guard's per-tenant counters (images/vllm_gke_guard/usage.py) where vLLM's handler leaves no
usage on the request state - the Responses API - and for each way a request ends. The counted
tokens of chat and completions, streamed or not, are checked inside the real vLLM
(tests/test_guard_in_vllm.py)."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY

from tests.test_guard import Clock, call, config, guard

MODEL = "usage-test"


def counter(name: str, outcome: str = "") -> float:
    labels = {"tenant": "a", "model": MODEL, **({"outcome": outcome} if outcome else {})}
    return REGISTRY.get_sample_value(f"vllm_gke_tenant_{name}_total", labels) or 0.0


class Answers:
    """Stands in for vLLM: answers each request with the next of `replies` (status, body chunks),
    or raises."""

    def __init__(self, *replies):
        self.replies = list(replies)

    async def __call__(self, scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        status, chunks = reply
        await send({"type": "http.response.start", "status": status, "headers": []})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})


def guarded(*replies):
    return guard.GuardMiddleware(Answers(*replies), config(model=MODEL), Clock())


RESPONSE = {"id": "resp_1", "object": "response", "status": "completed",
            # Generated text that spells a usage object: inside a JSON string its quotes are escaped.
            "output": [{"type": "message", "content": [{"type": "output_text",
                                                        "text": '"usage":{"input_tokens":999,"output_tokens":999}'}]}],
            "usage": {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}}


def test_a_responses_answer_is_counted_from_its_usage():
    prompt, generated, ok = counter("prompt_tokens"), counter("generation_tokens"), counter("requests", "ok")
    body = json.dumps(RESPONSE).encode()
    sent = call(guarded((200, [body[:40], body[40:]])), {"model": "m", "input": "hi", "max_output_tokens": 8},
                path="/v1/responses")
    assert sent[0]["status"] == 200
    assert counter("prompt_tokens") - prompt == 7 and counter("generation_tokens") - generated == 5
    assert counter("requests", "ok") - ok == 1


def test_a_streamed_responses_answer_is_counted_from_its_last_event():
    generated = counter("generation_tokens")
    created = {"type": "response.created", "response": {**RESPONSE, "usage": None}}
    done = {"type": "response.completed", "response": RESPONSE}
    events = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in (created, done)]
    call(guarded((200, events)), {"model": "m", "input": "hi", "max_output_tokens": 8, "stream": True},
         path="/v1/responses")
    assert counter("generation_tokens") - generated == 5


# vLLM's answers on the pooling routes, as OpenAI's usage object shapes them (an embedding's
# numbers first, the usage last); rerank's names only total_tokens.
EMBEDDING = {"id": "embd-1", "object": "list", "created": 1, "model": "m",
             "data": [{"index": 0, "object": "embedding", "embedding": [0.1] * 64}],
             "usage": {"prompt_tokens": 11, "total_tokens": 11, "completion_tokens": 0, "prompt_tokens_details": None}}
RERANK = {"id": "rerank-1", "model": "m", "usage": {"total_tokens": 23},
          "results": [{"index": 0, "document": {"text": '"usage":{"total_tokens":999}'}, "relevance_score": 0.9}]}


@pytest.mark.parametrize("path, body, answer, tokens", [
    ("/v1/embeddings", {"model": "m", "input": "hi"}, EMBEDDING, 11),
    ("/v1/score", {"model": "m", "text_1": "a", "text_2": "b"},
     {"id": "score-1", "object": "list", "model": "m", "data": [{"index": 0, "object": "score", "score": 0.5}],
      "usage": {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0}}, 5),
    ("/v1/rerank", {"model": "m", "query": "q", "documents": ["d"]}, RERANK, 23),
])
def test_a_pooling_answer_counts_its_prompt_tokens(path, body, answer, tokens):
    """Embeddings and the other pooling routes are metered like generations: the prompt tokens
    vLLM counted, from the answer's usage (their handlers leave none on the request state)."""
    prompt, generated, ok = counter("prompt_tokens"), counter("generation_tokens"), counter("requests", "ok")
    raw = json.dumps(answer).encode()
    sent = call(guarded((200, [raw])), body, path=path)
    assert sent[0]["status"] == 200
    assert counter("prompt_tokens") - prompt == tokens
    assert counter("generation_tokens") == generated and counter("requests", "ok") - ok == 1


@pytest.mark.parametrize("reply, outcome", [
    ((200, [b"{}"]), "ok"),
    ((404, [b'{"error":{}}']), "refused"),
    ((500, [b'{"error":{}}']), "error"),
    (RuntimeError("the engine died"), "error"),  # no answer at all: the server's 500
])
def test_each_request_is_counted_once_by_how_it_ended(reply, outcome):
    before = {o: counter("requests", o) for o in ("ok", "refused", "error", "shed")}
    mw = guarded(reply)
    try:
        call(mw, {"model": "m", "prompt": "hi", "max_tokens": 8})
    except RuntimeError:
        pass  # the server turns it into a 500
    after = {o: counter("requests", o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {o: float(o == outcome) for o in before}


def test_the_guards_own_refusals_and_the_open_routes_are_not_tenant_requests():
    before = {o: counter("requests", o) for o in ("ok", "refused", "error")}
    mw = guarded((200, [b"ok"]))
    assert call(mw, {"model": "m", "prompt": "hi", "max_tokens": 10**6})[0]["status"] == 400  # over the cap
    assert call(mw, None, path="/health", method="GET", issuer=None)[0]["status"] == 200
    assert {o: counter("requests", o) for o in before} == before


def test_the_model_list_is_not_a_request_the_slos_count():
    """A client polling GET /v1/models must not dilute the availability its generations get."""
    before = {o: counter("requests", o) for o in ("ok", "refused", "error")}
    sent = call(guarded((200, [b'{"object":"list","data":[]}'])), None, path="/v1/models", method="GET")
    assert sent[0]["status"] == 200
    assert {o: counter("requests", o) for o in before} == before
