"""The ext_proc service (envoy.service.ext_proc.v3.ExternalProcessor): what one request's headers
become. The load balancer sends only request headers (the GCPRoutingExtension's supportedEvents);
any other message is answered with an empty response of its kind, so no input ends the stream
with an error (FailClose would make that a 500)."""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, Iterable, Optional

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorServicer
from envoy.type.v3 import http_status_pb2
from grpc.aio import ServicerContext

from .config import Config
from .verify import Verdict, Verifier

log = logging.getLogger("vllm_gke_identity")
# xds-protos ships no type stubs: its messages are Any here.
pb: Any = external_processor_pb2
HeaderValue: Any = base_pb2.HeaderValue  # pyright: ignore[reportAttributeAccessIssue]
HeaderValueOption: Any = base_pb2.HeaderValueOption  # pyright: ignore[reportAttributeAccessIssue]
HttpStatus: Any = http_status_pb2.HttpStatus  # pyright: ignore[reportAttributeAccessIssue]

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 503: "service_unavailable"}


def header_values(headers: Any) -> dict[str, list[str]]:
    """Each header's values by lower-case name (Envoy sends raw_value; value where it does not)."""
    out: dict[str, list[str]] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out.setdefault(h.key.lower(), []).append(value)
    return out


def picker_prefix(path: str) -> str:
    """'/<a>/<b>' of a path '/<a>/<b>/...' (its query dropped), else ''."""
    parts = path.split("?", 1)[0].split("#", 1)[0].split("/")
    return f"/{parts[1]}/{parts[2]}" if len(parts) > 3 and parts[0] == "" and parts[1] and parts[2] else ""


def error_response(status: int, message: str) -> Any:
    """An OpenAI-style error the load balancer answers with, the request going no further."""
    code = {401: "invalid_token", 403: "forbidden", 503: "unavailable"}.get(status, "invalid_request")
    body = json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                                 "param": None, "code": code}}).encode()
    headers = [("content-type", "application/json")]
    if status == 401:
        headers.append(("www-authenticate", 'Bearer error="invalid_token"'))
    if status == 503:
        headers.append(("retry-after", "5"))
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=HttpStatus(code=status),
        headers=pb.HeaderMutation(set_headers=[_set(k, v) for k, v in headers]), body=body,
        details="vllm_gke_identity"))


def _set(name: str, value: str) -> Any:
    return HeaderValueOption(header=HeaderValue(key=name, raw_value=value.encode()),
                             append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def headers_response(remove: Iterable[str], set_headers: Iterable[tuple[str, str]]) -> Any:
    # The route is chosen again with the changed headers (ClearRouteCache, as GKE's body-based router does).
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[_set(k, v) for k, v in set_headers], remove_headers=list(remove)),
        clear_route_cache=True)))


class IdentityProcessor(ExternalProcessorServicer):
    def __init__(self, config: Config, verifier: Optional[Verifier] = None):
        self.config = config
        self.verifier = verifier or Verifier(dict(config.tenants))

    async def Process(self, request_iterator: AsyncIterator[Any],  # noqa: N802 (the proto's name)
                      context: ServicerContext) -> AsyncIterator[Any]:
        async for request in request_iterator:
            yield await self.answer(request)

    async def answer(self, request: Any) -> Any:
        """One message's answer; never raises (a bug refuses the request rather than pass it unchecked)."""
        try:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                return await self.on_headers(request.request_headers)
            return _pass(kind)
        except Exception:  # noqa: BLE001 - whatever went wrong, the stream answers and stays up
            log.exception("identity check failed")
            return error_response(503, "the request's identity could not be checked; retry")

    async def on_headers(self, headers: Any) -> Any:
        cfg = self.config
        values = header_values(headers)
        paths = values.get(":path") or [""]
        target = cfg.prefixes.get(picker_prefix(paths[0])) if len(paths) == 1 else None
        remove = [h for h in cfg.strip if h in values and h not in (cfg.objective_header, cfg.fairness_header,
                                                                    cfg.tenant_header)]
        if target is None:  # not a picker's URL: nothing to set, only the client's copies to drop
            return headers_response([h for h in cfg.strip if h in values], ())
        verdict: Verdict = await self.verifier.check(target.tenant, values.get("authorization") or [])
        if verdict.tenant is None:
            return error_response(verdict.status, verdict.message)
        return headers_response(remove, ((cfg.objective_header, target.objective),
                                         (cfg.fairness_header, verdict.tenant), (cfg.tenant_header, verdict.tenant)))


def _pass(kind: Optional[str]) -> Any:
    """The empty answer to a message this extension does not change."""
    if kind == "request_body":
        return pb.ProcessingResponse(request_body=pb.BodyResponse())
    if kind == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    if kind == "response_headers":
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    if kind == "response_body":
        return pb.ProcessingResponse(response_body=pb.BodyResponse())
    if kind == "response_trailers":
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse())
