"""Trace context: what a client sends is dropped, and where tracing is on (`"traces": true`) each
tenant request gets a span of the guard's own - its tenant, route, model, outcome and tokens -
whose context vLLM's `llm_request` span continues.

A client's `traceparent` would otherwise decide whether vLLM records the request (its sampler
follows the parent's sampled flag: a client could sample everything it sends, at the platform's
cost) and would put its spans into a trace of the client's choosing. So the guard strips both
W3C headers from every tenant request and starts a root span, sampled by the ratio the pod's
environment gives vLLM's tracer provider (OTEL_TRACES_SAMPLER=parentbased_traceidratio,
OTEL_TRACES_SAMPLER_ARG): the guard's span is one of vLLM's provider's (vLLM sets it as the
global provider in this process when --otlp-traces-endpoint is given: vllm 0.34.0
vllm/tracing/otel.py:83-86), exported with vLLM's spans to the same collector. The guard then
hands vLLM its own context in `traceparent` (vLLM reads it from the request's headers:
vllm/entrypoints/serve/engine/serving.py:42-47), sampled or not, so vLLM's span is the guard's
child exactly when the guard's is recorded.
"""

from __future__ import annotations

from typing import Any, Optional

from .asgi import Scope
from .metrics import log

# Dropped from every tenant request (middleware.for_vllm, with the tenant's token).
TRACE_HEADERS = (b"traceparent", b"tracestate")


class Tracing:
    """Starts the guard's span for an admitted tenant request and puts its context in the headers
    vLLM reads; `finish` records how it ended."""

    def __init__(self, model: str, provider: Any = None):
        from opentelemetry import trace  # shipped with vLLM (its requirements: opentelemetry-sdk, -api, -exporter-otlp)
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.propagator = TraceContextTextMapPropagator()
        self.model = model
        # None: the global provider (vLLM's, once it has set it); tests give one of their own.
        self.provider = provider

    def start(self, scope: Scope, tenant: str, route: str) -> tuple[Scope, Any]:
        tracer = self.trace.get_tracer("vllm_gke_guard", tracer_provider=self.provider)
        span = tracer.start_span("vllm-gke tenant request", kind=self.trace.SpanKind.SERVER, attributes={
            "vllm_gke.tenant": tenant, "http.route": route, "http.request.method": scope.get("method") or "",
            "gen_ai.request.model": self.model})
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.trace.set_span_in_context(span))
        if not carrier:  # no provider (tracing off in vLLM): nothing to continue
            return scope, span
        headers = [*(scope.get("headers") or ()), *((k.encode(), v.encode()) for k, v in carrier.items())]
        return dict(scope, headers=headers), span

    def finish(self, span: Any, status: int, outcome: str, prompt: Optional[int], generated: Optional[int]) -> None:
        if span.is_recording():
            span.set_attributes({"http.response.status_code": status, "vllm_gke.outcome": outcome,
                                 "gen_ai.usage.input_tokens": prompt or 0, "gen_ai.usage.output_tokens": generated or 0})
            if outcome == "error":
                span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        span.end()


def tracing(enabled: bool, model: str) -> Optional[Tracing]:
    """The guard's tracing where the config turns it on and OpenTelemetry is importable."""
    if not enabled:
        return None
    try:
        return Tracing(model)
    except ImportError:  # pragma: no cover - vLLM's image has it; a hand-built one may not
        log.error("traces are on but opentelemetry is not installed: the guard adds no spans")
        return None
