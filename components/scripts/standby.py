"""Stands in for a serving pool while it has no ready replica (scale to zero).

Only while the pool has no ready replica is this pod ready (its /health answers 200), so the load
balancer sends it requests only then. It answers each with 503, a Retry-After and an OpenAI-style
error, and counts it: KEDA reads the count (vllm_gke_standby_requests_total, through Managed
Prometheus) to wake the pool. From a request until a replica is ready it also reports
vllm_gke_standby_waking 1, which keeps KEDA's trigger active while the replica loads, whether or
not clients retry (KEDA counts its cooldown from the last active poll), for at most twice the
expected wake after the last request. It reads no body beyond a
limit and keeps nothing.

    python3 standby.py --model NAME --ready-host HEADLESS_SERVICE [--port 8000] [--retry-after 30]
        [--expected-seconds N]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

MAX_DRAIN = 1 << 20
# getaddrinfo's answers that mean "this name has no address": NXDOMAIN (EAI_NONAME) or NODATA
# (EAI_NODATA). Anything else (EAI_AGAIN for a timeout or SERVFAIL, EAI_FAIL, ...) says nothing
# about the pool.
NO_ADDRESS = frozenset(code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
                       if code is not None)


def lookup(host: str) -> Optional[bool]:
    """Whether a headless Service has a ready endpoint: True if it resolves, False on a definite
    "no such name or address", None when DNS did not answer (the pool's state is unknown)."""
    try:
        socket.getaddrinfo(host, None)
        return True
    except socket.gaierror as exc:
        return False if exc.errno in NO_ADDRESS else None
    except (UnicodeError, OSError):
        return None


class PoolWatch:
    """The pool's readiness from its headless Service, looked up every `interval` seconds in the
    background so a probe never waits on DNS. Only definite answers move it: a DNS error keeps the
    last known state, and before the first answer the pool counts as serving (the standby stays
    out of rotation rather than answer 503 for a pool that may be up)."""

    def __init__(self, host: str, interval: float = 2.0, look: Callable[[str], Optional[bool]] = lookup):
        self.host, self.interval, self.look = host, interval, look
        self.serving: Optional[bool] = None

    def refresh(self) -> None:
        answer = self.look(self.host)
        if answer is not None:
            self.serving = answer

    def serving_ready(self) -> bool:
        return self.serving is not False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.refresh()
            stop.wait(self.interval)


class Standby:
    def __init__(self, model: str, serving_ready: Callable[[], bool], retry_after: int, expected_seconds: int):
        self.model = model
        self.serving_ready = serving_ready
        self.retry_after = retry_after
        self.expected_seconds = expected_seconds
        self.requests = 0
        self.wake_asked_at: Optional[float] = None
        self.lock = threading.Lock()
        self.clock = time.monotonic

    def count(self) -> None:
        with self.lock:
            self.requests += 1
            self.wake_asked_at = self.clock()

    def waking(self) -> bool:
        """Asked to wake and no replica ready yet. A ready replica ends the wake, and so does twice
        the expected wake with no request: a replica that never comes (a crash loop, no node) must
        not hold the pool, and its node, awake for good."""
        with self.lock:
            if self.serving_ready() or (self.wake_asked_at is not None
                                        and self.clock() - self.wake_asked_at > 2 * self.expected_seconds):
                self.wake_asked_at = None
            return self.wake_asked_at is not None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        standby = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "vllm-gke-standby"
            sys_version = ""

            def _send(self, status: int, body: bytes, content_type: str, extra: Optional[dict] = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _drain(self) -> None:
                try:
                    length = min(int(self.headers.get("Content-Length") or 0), MAX_DRAIN)
                except ValueError:
                    length = 0
                if length > 0:
                    self.rfile.read(length)

            def _handle(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/health" and self.command in ("GET", "HEAD"):
                    ready = not standby.serving_ready()  # ready only while the pool is not
                    self._send(200 if ready else 503, b"", "text/plain")
                    return
                if path == "/metrics" and self.command == "GET":
                    body = (f"# TYPE vllm_gke_standby_requests_total counter\n"
                            f"vllm_gke_standby_requests_total {standby.requests}\n"
                            f"# TYPE vllm_gke_standby_waking gauge\n"
                            f"vllm_gke_standby_waking {int(standby.waking())}\n").encode()
                    self._send(200, body, "text/plain; version=0.0.4")
                    return
                self._drain()
                standby.count()
                minutes = max(1, round(standby.expected_seconds / 60))
                error = {"error": {
                    "message": f"model {standby.model} is starting from zero replicas; retry in "
                               f"{standby.retry_after} s (ready in about {minutes} min)",
                    "type": "service_unavailable", "param": None, "code": "scaling_from_zero"}}
                self._send(503, json.dumps(error).encode(), "application/json",
                           {"Retry-After": str(standby.retry_after), "Connection": "close"})

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        return Handler


def main(argv: Optional[list[str]] = None) -> int:
    assert __doc__ is not None  # stripped only under -OO
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--ready-host", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--retry-after", type=int, default=30)
    parser.add_argument("--expected-seconds", type=int, default=600)
    args = parser.parse_args(argv)
    watch = PoolWatch(args.ready_host)
    threading.Thread(target=watch.run, args=(threading.Event(),), daemon=True).start()
    standby = Standby(args.model, watch.serving_ready, args.retry_after, args.expected_seconds)
    ThreadingHTTPServer(("0.0.0.0", args.port), standby.handler()).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
