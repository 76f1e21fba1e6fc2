"""A vLLM replica as a pod runs it, for tests that call it: the container's entrypoint
(images/serve.py) starting the pinned vLLM's own API server with a deployment's flags and
`--middleware vllm_gke_guard.GuardMiddleware`, warming it up through the guard; only the GPU
engine core is a stand-in that answers at once (benchmarks/vllm_fake_engine.py).

Needs a Python with the pinned vLLM in VLLM_PYTHON (benchmarks/vllm_server.py says how).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import MIDDLEWARE, REPO, server_args

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
# The pod's startup probe allows far more; a stand-in engine starts in well under a minute.
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_pod(args: Sequence[str], guard_config: dict[str, Any], tmp: Path) -> Iterator[dict[str, Any]]:
    """serve.py running vLLM with the container's `args` behind the guard with `guard_config`,
    until the replica is warm: {"base": its URL, "port", "proc", "log"}. Fails with the server's
    log if it never warms up."""
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port, marker, log_path = free_port(), tmp / "warm", tmp / "server.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]),
               GKE_LLM_GUARD_CONFIG=json.dumps(guard_config), GKE_LLM_WARM_MARKER=str(marker),
               GKE_LLM_WARMUP_PAUSE_SECONDS="1",
               GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve")
    # No trace collector here: the deployment's --otlp-traces-endpoint is dropped (server_args).
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"),
                                 *server_args(list(args), model_dir, port, MIDDLEWARE["guard"])],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(1)
            if not marker.exists():
                raise AssertionError(f"the replica never warmed up:\n{log_path.read_text()[-3000:]}")
            yield {"base": f"http://127.0.0.1:{port}", "port": port, "proc": proc, "log": log_path}
        finally:
            stop(proc)
