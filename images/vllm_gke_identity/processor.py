"""The ext_proc service (envoy.service.ext_proc.v3.ExternalProcessor): what one request becomes.
The load balancer calls it from one of two extension chains (components/model/identity_extension.py):
on a salted picker URL's /v1/ paths with the request headers, body and trailers in full-duplex
streamed mode, its ProcessingRequest.metadata_context carrying BODY_CHAIN (the chain's metadata), so
the headers' answer of a salted route waits until the body is read and salted (salt.py); on every
other request with the headers only, answered at once (a request that came without BODY_CHAIN never
sends its body here, so its headers are never held). Any message it does not change is
answered with an empty response of its kind (a body chunk it does not read is sent back as it
came: in full duplex a body not sent back is an empty body), so no input ends the stream with an
error (FailClose would make that a 500)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Optional

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorServicer
from envoy.type.v3 import http_status_pb2
from grpc.aio import ServicerContext

from .config import Config, PickerPrefix
from .salt import BadBody, salted
from .verify import Verdict, Verifier

log = logging.getLogger("vllm_gke_identity")
# xds-protos ships no type stubs: its messages are Any here.
pb: Any = external_processor_pb2
HeaderValue: Any = base_pb2.HeaderValue  # pyright: ignore[reportAttributeAccessIssue]
HeaderValueOption: Any = base_pb2.HeaderValueOption  # pyright: ignore[reportAttributeAccessIssue]
HttpStatus: Any = http_status_pb2.HttpStatus  # pyright: ignore[reportAttributeAccessIssue]

# The body chain's extension metadata (components/model/identity_extension.py: BODY_CHAIN): GKE
# sends it in metadata_context under a com.google.* namespace of its own naming.
BODY_CHAIN = ("vllm-gke-chain", "body")
# Bytes of held bodies (their declared lengths) one process admits at once: beyond it a salted
# request is answered 503 with Retry-After before any of its body is read (the pod's memory limit
# is 512Mi; a held body is buffered, joined and copied once salted).
MAX_HELD_BYTES = int(os.environ.get("MAX_HELD_BYTES", str(64 << 20)))
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 503: "service_unavailable"}
ERROR_CODES = {401: "invalid_token", 403: "forbidden", 413: "payload_too_large", 400: "invalid_json",
               503: "unavailable"}


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


def error_response(status: int, message: str, code: Optional[str] = None, param: Optional[str] = None) -> Any:
    """An OpenAI-style error the load balancer answers with, the request going no further."""
    code = code or ERROR_CODES.get(status, "invalid_request")
    body = json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                                 "param": param, "code": code}}).encode()
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


def body_response(body: bytes, end_of_stream: bool = True) -> Any:
    """A body chunk sent on (full duplex: Envoy forwards what comes back, and nothing else)."""
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
        body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
            body=body, end_of_stream=end_of_stream)))))


def via_body_chain(request: Any) -> bool:
    """Whether the message came through the body chain (its extension's metadata, any namespace)."""
    key, value = BODY_CHAIN
    for struct in request.metadata_context.filter_metadata.values():
        field_value = struct.fields.get(key)
        if field_value is not None and field_value.string_value == value:
            return True
    return False


def declared_length(values: dict[str, list[str]], limit: int) -> Optional[int]:
    """The request's one Content-Length when within `limit` (and not chunked), else None."""
    lengths = values.get("content-length") or []
    if len(lengths) != 1 or "transfer-encoding" in values or not lengths[0].isascii() \
            or not lengths[0].isdigit() or int(lengths[0]) > limit:
        return None
    return int(lengths[0])


@dataclass
class Pending:
    """A picker request whose headers' answer waits for its body (at most `limit` bytes)."""

    remove: list[str]
    sets: list[tuple[str, str]]
    salt: str
    limit: int
    chunks: list[bytes] = field(default_factory=list[bytes])
    size: int = 0


@dataclass
class Echoed:
    """A body sent back as it comes, counted against its declared Content-Length (`limit`)."""

    limit: int
    size: int = 0


@dataclass
class Stream:
    """One ext_proc stream (one HTTP request): the body being read, if any."""

    pending: Optional[Pending] = None
    # A body of a salted URL not held (an unsalted route), bounded as it passes.
    echoed: Optional[Echoed] = None
    # Refused: nothing more of it is sent on (Envoy ends it on an immediate response anyway).
    refused: bool = False
    # Bytes of MAX_HELD_BYTES this stream's held body has reserved.
    reserved: int = 0


class IdentityProcessor(ExternalProcessorServicer):
    def __init__(self, config: Config, verifier: Optional[Verifier] = None, max_held: int = MAX_HELD_BYTES):
        self.config = config
        self.verifier = verifier or Verifier(dict(config.tenants))
        self.max_held = max_held
        self.held = 0  # bytes reserved by the streams holding a body now

    async def Process(self, request_iterator: AsyncIterator[Any],  # noqa: N802 (the proto's name)
                      context: ServicerContext) -> AsyncIterator[Any]:
        stream = Stream()
        try:
            async for request in request_iterator:
                for answer in await self.answer(request, stream):
                    yield answer
        finally:  # a stream that ends or is cancelled holding a body gives its bytes back
            self.release(stream)

    def release(self, stream: Stream) -> None:
        self.held -= stream.reserved
        stream.reserved = 0

    async def answer(self, request: Any, stream: Stream) -> list[Any]:
        """One message's answers (none while a body is read); never raises (a bug refuses the
        request rather than pass it unchecked)."""
        try:
            answers = await self._answers(request, stream)
        except Exception:  # noqa: BLE001 - whatever went wrong, the stream answers and stays up
            log.exception("identity check failed")
            answers = [error_response(503, "the request's identity could not be checked; retry")]
        if any(a.WhichOneof("response") == "immediate_response" for a in answers):
            stream.pending, stream.echoed, stream.refused = None, None, True
        if stream.pending is None:
            self.release(stream)
        return answers

    async def _answers(self, request: Any, stream: Stream) -> list[Any]:
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            stream.refused, stream.echoed = False, None  # a new request (a test's stream carries several)
            return await self.on_headers(request.request_headers, stream, via_body_chain(request))
        if kind == "request_body" and not stream.refused:
            return on_body(request.request_body, stream)
        if kind == "request_trailers" and stream.pending is not None:
            # The picker reads no trailers and decodes no body before them (its server.go).
            return [error_response(400, "a request body with trailers is not accepted on this route")]
        return [_pass(kind)]

    async def on_headers(self, headers: Any, stream: Stream, body_chain: bool) -> list[Any]:
        cfg = self.config
        values = header_values(headers)
        paths = values.get(":path") or [""]
        target = cfg.prefixes.get(picker_prefix(paths[0])) if len(paths) == 1 else None
        remove = [h for h in cfg.strip if h in values and h not in (cfg.objective_header, cfg.fairness_header,
                                                                    cfg.tenant_header)]
        if target is None:  # not a picker's URL: nothing to set, only the client's copies to drop
            return [headers_response([h for h in cfg.strip if h in values], ())]
        verdict: Verdict = await self.verifier.check(target.tenant, values.get("authorization") or [])
        if verdict.tenant is None:
            return [error_response(verdict.status, verdict.message)]
        sets = [(cfg.objective_header, target.objective), (cfg.fairness_header, verdict.tenant),
                (cfg.tenant_header, verdict.tenant)]
        if not headers.end_of_stream and not body_chain and target.disaggregated:
            # GKE programming lag (the body chain's match not yet there): nothing here reads this body.
            return [error_response(503, "this model's request bodies cannot be checked on this route yet; retry")]
        if headers.end_of_stream or target.salt is None:
            return [headers_response(remove, sets)]
        # A body under a salted URL: its routes match on no Content-Length (the body chain's Envoy
        # removes it), so it is bounded here, before a byte of it arrives (the route's own limit).
        length = declared_length(values, target.max_body_bytes)
        if length is None:
            return [error_response(413, f"this route takes a body with a Content-Length of at most "
                                        f"{target.max_body_bytes} bytes (none, chunked or larger was sent)")]
        if not body_chain or salted_path(paths[0], target) is None:  # never held: its body may never come here
            stream.echoed = Echoed(length) if body_chain else None
            return [headers_response(remove, sets)]
        if self.held + length > self.max_held:
            return [error_response(503, "too many request bodies are being checked now; retry")]
        self.held += length
        stream.reserved = length
        stream.pending = Pending(remove, sets, target.salt, length)
        return []  # answered with the body (full duplex: Envoy holds the headers until then)


def salted_path(path: str, target: PickerPrefix) -> Optional[str]:
    """The route ('/v1/...') of a picker URL whose body takes the salt, else None."""
    route = "/" + path.split("?", 1)[0].split("#", 1)[0].split("/", 3)[-1]
    return route if route in target.salted_paths else None


def on_body(body: Any, stream: Stream) -> list[Any]:
    """A chunk of a body being read (at its end: the headers' answer, then the salted body), or one
    this extension does not read, sent back as it came."""
    pending, echoed = stream.pending, stream.echoed
    if pending is None:
        if echoed is not None:
            echoed.size += len(body.body)
            if echoed.size > echoed.limit:
                return [error_response(413, f"the body is longer than its Content-Length ({echoed.limit} bytes)")]
        return [body_response(body.body, body.end_of_stream)]
    pending.size += len(body.body)
    if pending.size > pending.limit:  # more than the Content-Length declared: buffer no more
        return [error_response(413, f"the body is longer than its Content-Length ({pending.limit} bytes)")]
    pending.chunks.append(body.body)
    if not body.end_of_stream:
        return []
    stream.pending = None
    try:
        out = salted(b"".join(pending.chunks), pending.salt)
    except BadBody as exc:
        return [error_response(400, str(exc), exc.code, exc.param)]
    # No Content-Length: in FullDuplexStreamed Envoy removed the client's and ignores one set here
    # (ext_proc's processor_state.h shouldRemoveContentLength, mutation_utils.cc): the upstream
    # hop is told the length by its framing.
    return [headers_response(pending.remove, pending.sets), body_response(out)]


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
