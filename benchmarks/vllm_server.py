"""The `vllm` server of benchmarks/guard_overhead.py: the pinned release's own `vllm serve`, run
with the flags and guard config a stack deploys, its GPU engine core replaced by one that
answers at once (benchmarks/vllm_fake_engine.py). Needs an environment with that release:

    python3 -m venv .vllm && .vllm/bin/pip install --no-deps vllm==0.34.0 \\
        && .vllm/bin/pip install -r benchmarks/vllm-0.34.0-frontend.txt
    .venv/bin/python -m benchmarks.guard_overhead --vllm-python .vllm/bin/python
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "images"))
from serve import flag  # noqa: E402  (the container entrypoint's reading of a vllm serve argv)

# The deployment whose flags and guard config the server runs with: the prod stack's pool that
# takes the longest prompts (--max-model-len 32768), where a 128 KB prompt (~29k tokens) goes.
STACK = "prod"
# What differs from the pod, because nothing here is a GPU, a sidecar or a Redis:
# one process (no tensor parallelism); the client is the local wrk, not Envoy; tenants are not
# throttled; no store across replicas (its round trip is not the guard's CPU).
SINGLE_PROCESS = {"--tensor-parallel-size": "1"}


def longest_prompt_deployment(stack: str = STACK) -> tuple[list[str], dict[str, Any]]:
    """The vLLM container's args and guard config of the stack deployment with the largest
    --max-model-len, as the offline plan declares them."""
    from vllm_gke.infra.plan import read_stack_config, run_program

    return longest_prompt_container(run_program(stack, read_stack_config(stack)), stack)


def longest_prompt_container(plan: Any, stack: str = STACK) -> tuple[list[str], dict[str, Any]]:
    best: tuple[int, list[str], dict[str, Any]] = (-1, [], {})
    for resource in plan.of_type("kubernetes:apps/v1:Deployment"):
        for container in resource.props["spec"]["template"]["spec"]["containers"]:
            if container["name"] != "vllm":
                continue
            args = list(container["args"])
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            length = int(flag(args, "--max-model-len", "0"))
            if length > best[0]:
                best = (length, args, json.loads(env.get("GKE_LLM_GUARD_CONFIG") or "{}"))
    if best[0] < 0:
        raise ValueError(f"stack '{stack}' declares no vLLM container")
    return best[1], best[2]


def bench_guard_config(config: dict[str, Any]) -> dict[str, Any]:
    """The deployment's guard config, with the local client trusted and no tenant throttled."""
    out = {k: v for k, v in config.items() if k != "globalLimits"}
    out["trustedPeers"] = ["127.0.0.1"]
    out["issuers"] = {iss: {**t, "requestsPerMinute": 10**9} for iss, t in (config.get("issuers") or {}).items()}
    return out


def server_args(args: list[str], model_dir: Path, port: int, middleware: str | None) -> list[str]:
    """`vllm serve` argv: the deployment's, with the local model, host and port, and the
    deployment's --middleware replaced by `middleware` (None: no middleware, the baseline)."""
    out = [str(model_dir)]
    rest = args[1:]  # the first is the model directory on the share
    i = 0
    while i < len(rest):
        name = rest[i]
        # No trace collector here (a test that reads the spans names its own receiver).
        if name in ("--host", "--port", "--middleware", "--otlp-traces-endpoint", *SINGLE_PROCESS):
            i += 2
            continue
        out.append(name)
        i += 1
    out += ["--host", "127.0.0.1", "--port", str(port)]
    for name, value in SINGLE_PROCESS.items():
        out += [name, value]
    if middleware:
        out += ["--middleware", middleware]
    return out


MIDDLEWARE = {"baseline": None, "guard": "vllm_gke_guard.GuardMiddleware",
              "timed": "benchmarks.guard_overhead.TimedGuard"}


@dataclass
class VllmServer:
    python: str
    model_dir: Path
    args: list[str]
    guard_config: dict[str, Any]
    name: str = "vllm"
    startup_s: float = 600
    warmup_s: int = 5  # its first requests are slow (templates compiled, caches filled)

    @classmethod
    def prepare(cls, python: str, stack: str = STACK) -> "VllmServer":
        args, config = longest_prompt_deployment(stack)
        model_dir = Path(tempfile.gettempdir()) / "vllm-gke-bench-model"
        subprocess.run([python, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                       check=True, stdout=subprocess.DEVNULL)
        return cls(python, model_dir, args, bench_guard_config(config))

    @property
    def model(self) -> str:
        return flag(self.args, "--served-model-name", str(self.model_dir))

    @property
    def issuer(self) -> str:
        return next(iter(self.guard_config["issuers"]))

    def command(self, mode: str, port: int) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        # The image installs the guard beside vLLM; here it is imported from images/.
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "images"), str(REPO)])
        env["GKE_LLM_GUARD_CONFIG"] = json.dumps(self.guard_config)
        argv = [self.python, "-m", "benchmarks.vllm_fake_engine", "serve",
                *server_args(self.args, self.model_dir, port, MIDDLEWARE[mode])]
        return argv, env


__all__ = ["VllmServer", "bench_guard_config", "longest_prompt_container", "longest_prompt_deployment", "server_args"]

if __name__ == "__main__":
    print(" ".join(VllmServer.prepare(sys.argv[1]).command("guard", 8000)[0]))
