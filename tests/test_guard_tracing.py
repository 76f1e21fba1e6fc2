"""The guard's trace context (images/vllm_gke_guard/tracing.py): a client's is always dropped; with
traces on, the guard's own root span, sampled at the configured ratio, is what vLLM continues -
recorded or not. The spans as exported from inside the real vLLM: tests/test_guard_in_vllm.py."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from tests.test_guard import ISSUER, Clock, call, config, guard
from tests.test_guard_usage import Answers

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}
USAGE = b'{"id":"c","usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}'


class Seen(Answers):
    """Answers as vLLM would, noting the trace headers each request reached it with."""

    def __init__(self, *replies):
        super().__init__(*replies)
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope, receive, send):
        self.headers.append({k: v for k, v in scope["headers"] if k in (b"traceparent", b"tracestate")})
        await super().__call__(scope, receive, send)


def traced(ratio: float, *replies):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = Seen(*replies)
    mw = guard.GuardMiddleware(app, config(traces=True), Clock())
    mw.tracing = guard.tracing.Tracing("m", provider)
    return mw, app, exporter


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])  # the fast path and the general
def test_without_traces_the_clients_context_is_dropped(path):
    app = Seen((200, [USAGE]))
    mw = guard.GuardMiddleware(app, config(), Clock())
    assert mw.tracing is None
    body = CHAT if path.endswith("chat/completions") else {"model": "m", "prompt": "hi", "max_tokens": 8}
    sent = call(mw, body, path=path, headers=[(b"traceparent", CLIENT.encode()), (b"tracestate", b"x=1")])
    assert sent[0]["status"] == 200
    assert app.headers == [{}]


def test_a_sampled_request_gets_the_guards_span_and_vllm_its_context():
    mw, app, exporter = traced(1.0, (200, [USAGE]))
    sent = call(mw, CHAT, path="/v1/chat/completions", headers=[(b"traceparent", CLIENT.encode()),
                                                                  (b"tracestate", b"x=1")])
    assert sent[0]["status"] == 200
    (span,) = exporter.get_finished_spans()
    ctx = span.get_span_context()
    (headers,) = app.headers
    assert b"tracestate" not in headers
    # vLLM gets the guard's span as its parent, sampled; not the client's trace.
    version, trace_id, parent, flags = headers[b"traceparent"].decode().split("-")
    assert (trace_id, parent) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") and int(flags, 16) & 1  # sampled
    assert f"{ctx.trace_id:032x}" not in CLIENT and span.parent is None
    assert dict(span.attributes or {}) == {
        "vllm_gke.tenant": "a", "http.route": "/v1/chat/completions", "http.request.method": "POST",
        "gen_ai.request.model": "m", "http.response.status_code": 200, "vllm_gke.outcome": "ok",
        "gen_ai.usage.input_tokens": 0, "gen_ai.usage.output_tokens": 0}  # vLLM left no usage on the state here


def test_an_unsampled_request_tells_vllm_not_to_record_either():
    mw, app, exporter = traced(0.0, (200, [USAGE]))
    call(mw, CHAT, path="/v1/chat/completions", headers=[(b"traceparent", CLIENT.encode())])
    assert exporter.get_finished_spans() == ()
    (headers,) = app.headers
    version, trace_id, _, flags = headers[b"traceparent"].decode().split("-")
    assert not int(flags, 16) & 1 and trace_id not in CLIENT  # vLLM's parent-based sampler then records nothing


def test_a_failed_request_is_an_error_span():
    mw, _, exporter = traced(1.0, RuntimeError("engine died"))
    with pytest.raises(RuntimeError):  # on to the server's own error handler (a 500)
        call(mw, CHAT, path="/v1/chat/completions")
    (span,) = exporter.get_finished_spans()
    assert span.attributes["vllm_gke.outcome"] == "error" and span.status.status_code.name == "ERROR"


def test_refused_and_open_requests_start_no_span():
    mw, _, exporter = traced(1.0)
    assert call(mw, CHAT, path="/v1/chat/completions", issuer=None)[0]["status"] == 403
    assert call(mw, {**CHAT, "max_completion_tokens": 10**6}, path="/v1/chat/completions")[0]["status"] == 400
    assert exporter.get_finished_spans() == ()
    assert ISSUER
