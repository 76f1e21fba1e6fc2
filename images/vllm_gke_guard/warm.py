"""GET /vllm-gke/warm on Cloud Run: 200 once the entrypoint (images/serve.py) has warmed this server, 503
until then. Cloud Run routes a request to an instance as soon as its startup probe passes, and runs HTTP,
TCP or gRPC probes only (no exec probe of the warm marker, as GKE's pods have), so the service's probe
reads this path: vLLM's /health answers before the warm-up requests have been served.

The warm marker is the file serve.py writes once a warm-up request succeeded (it removes it when it
starts). The path is answered only where the guard's config has `cloudRun`; it is no tenant route: the
load balancer forwards /<model>/v1 paths alone, and the answer says nothing /health does not.
"""

from __future__ import annotations

import os

from .asgi import Scope, Send

WARM_PATH = "/vllm-gke/warm"
# The entrypoint's marker file (components/model/vllm_server.py WARM_MARKER_ENV, serve.py's default).
WARM_MARKER_ENV = "GKE_LLM_WARM_MARKER"
DEFAULT_WARM_MARKER = "/tmp/vllm-gke-warm"


class WarmCheck:
    """Answers WARM_PATH from the marker's presence; once warm, warm until the process ends."""

    __slots__ = ("marker", "warm")

    def __init__(self, marker: str = ""):
        self.marker = marker or os.environ.get(WARM_MARKER_ENV) or DEFAULT_WARM_MARKER
        self.warm = False

    def is_warm(self) -> bool:
        self.warm = self.warm or os.path.exists(self.marker)
        return self.warm

    async def answer(self, scope: Scope, send: Send) -> None:
        if scope.get("method") not in ("GET", "HEAD"):
            status, body = 405, b'{"status":"method not allowed"}'
        elif self.is_warm():
            status, body = 200, b'{"status":"warm"}'
        else:
            status, body = 503, b'{"status":"warming up"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})
