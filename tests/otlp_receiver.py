"""A local OTLP/HTTP traces endpoint for tests: what the OpenTelemetry SDK's HTTP exporter posts
(an ExportTraceServiceRequest, protobuf), decoded into plain spans."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1; `spans` holds each span received: name, ids (hex), parent, its
    attributes and its resource's."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.paths.append(self.path)
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    # xds-protos (the identity extension's test dependency) ships its own, older copy
                    # of these modules, which may overwrite opentelemetry-proto's in one environment
                    # (pip installs them in either order): the same field numbers under the old name.
                    scopes = rs.scope_spans if hasattr(rs, "scope_spans") else rs.instrumentation_library_spans
                    for ss in scopes:
                        for span in ss.spans:
                            receiver.spans.append({
                                "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(), "status": span.status.code,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "resource": resource})
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.paths: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
