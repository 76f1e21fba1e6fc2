"""What the tenant guard costs vLLM's API server, measured side by side in one run.

    .venv/bin/pip install -e '.[bench]'            # uvicorn[standard] (uvloop, httptools)
    .venv/bin/python -m benchmarks.guard_overhead  # needs wrk (apt-get install wrk) for part 2
    ... --vllm-python .vllm/bin/python             # also vLLM's own server (benchmarks/vllm_server.py)

1. In process: microseconds per request for an ASGI app alone, behind the guard, and behind a
   naive guard that decodes and re-encodes the whole body (what the guard used to do), for a
   1 KB and a 128 KB chat request that is within the tenant's cap (the common case: nothing to
   rewrite).
2. Inside uvicorn (uvloop + httptools, as vLLM runs): requests/s, p50 and p99 from wrk at 1, 64
   and 512 connections, baseline against guarded, both sizes, for each server:
   `vllm` (with --vllm-python), the pinned vLLM's own `vllm serve` with a stack deployment's
   flags and guard config, its GPU engine core answering at once (benchmarks/vllm_server.py);
   and two stand-ins of vLLM's HTTP layer only (benchmarks/vllm_stand_in.py): `vllm-like`, what
   vLLM's build_app puts in front of the engine on every chat request, and `bare`, one FastAPI
   route (the guard's largest possible share). The guard is loaded as vLLM's --middleware loads
   it (`app.add_middleware(GuardMiddleware)`, its config from GKE_LLM_GUARD_CONFIG). Each mode
   runs in two server processes, alternated; server CPU per request comes from /proc, and the
   share of CPU time the VM's host stole meanwhile from /proc/stat. Per server, the ratios of
   all cells pooled, with a bootstrap interval. Then the guard's own checks, timed by the guard
   inside a loaded server: part 1's figure with the server's other work around it, the guard's
   code and data out of the CPU's caches.
Ratios are guarded/baseline from the same run; absolute numbers depend on the machine.
"""

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "images"))
import vllm_gke_guard as guard  # noqa: E402

from benchmarks.vllm_stand_in import PATH, STAND_INS  # noqa: E402

ISSUER = "https://auth.example/bench"
SIZES = {"1KB": 1024, "128KB": 128 * 1024}
CONCURRENCY = (1, 64, 512)


def guard_config(trusted: str) -> dict[str, Any]:
    return {"issuerHeader": "x-vllm-gke-issuer",
            "issuers": {ISSUER: {"tenant": "bench", "maxTokens": 4096, "requestsPerMinute": 10**9}},
            "routes": {PATH: {"method": "POST", "kind": "chat"}}, "trustedPeers": [trusted]}


def chat_body(size: int, model: str = "m") -> bytes:
    text = ("The quick brown fox jumps over the lazy dog. " * (size // 40 + 1))
    doc = {"model": model, "messages": [{"role": "system", "content": "Answer briefly."},
                                      {"role": "user", "content": ""}], "max_completion_tokens": 256}
    room = size - len(json.dumps(doc))
    doc["messages"][1]["content"] = text[:room]
    return json.dumps(doc).encode()


class NaiveGuard:
    """The old approach, for reference: decode the whole body, re-encode it, always."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        message = await receive()
        payload = json.loads(message["body"])
        payload.setdefault("max_tokens", 256)
        body = json.dumps(payload).encode()

        async def replay():
            return {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay, send)


# --- 1. in process ---------------------------------------------------------------------------

def per_request_us(app: Callable, body: bytes, rounds: int = 7, n: int = 2000) -> float:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-vllm-gke-issuer", ISSUER.encode())]
    scope = {"type": "http", "method": "POST", "path": PATH, "headers": headers, "client": ("127.0.0.6", 1),
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("127.0.0.1", 8000), "asgi": {"version": "3.0"}}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(_message):
        pass

    async def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            await app(scope, receive, send)
        return (time.perf_counter() - start) / n * 1e6

    loop = asyncio.new_event_loop()
    try:
        return statistics.median(loop.run_until_complete(run()) for _ in range(rounds))
    finally:
        loop.close()


async def _noop(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def in_process() -> list[dict[str, Any]]:
    rows = []
    guarded = guard.GuardMiddleware(_noop, guard_config("127.0.0.6"))
    naive = NaiveGuard(_noop)
    for label, size in SIZES.items():
        body = chat_body(size)
        base = per_request_us(_noop, body)
        rows.append({"size": label, "baseline_us": base, "guard_us": per_request_us(guarded, body) - base,
                     "naive_us": per_request_us(naive, body) - base})
    return rows


# --- 2. inside uvicorn -------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPORT_ENV = "GUARD_BENCH_REPORT"


class TimedGuard(guard.GuardMiddleware):
    """The guard, timing its own checks (everything before the app is called) on each request;
    the samples go to the file named in GUARD_BENCH_REPORT every 500 requests (20 at first; outside
    the timed part), so that however the server is stopped they are there."""

    samples: list[int] = []

    async def _admit(self, scope, receive):
        start = time.perf_counter_ns()
        admitted = await super()._admit(scope, receive)
        self.samples.append(time.perf_counter_ns() - start)
        if len(self.samples) % (20 if len(self.samples) < 1000 else 500) == 0 and os.environ.get(REPORT_ENV):
            Path(os.environ[REPORT_ENV]).write_text(json.dumps(self.samples))
        return admitted


def serve(stack: str, mode: str, port: int) -> None:
    import uvicorn  # type: ignore[import-not-found]

    os.environ[guard.CONFIG_ENV] = json.dumps(guard_config("127.0.0.1"))
    middleware = {"baseline": None, "guard": guard.GuardMiddleware, "timed": TimedGuard}[mode]
    app = STAND_INS[stack](middleware)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False,
                loop="uvloop", http="httptools")


@dataclass
class StandInServer:
    """One of benchmarks/vllm_stand_in.py's apps, served by uvicorn in a process of its own."""

    name: str
    issuer: str = ISSUER
    model: str = "m"
    startup_s: float = 30
    warmup_s: int = 1

    def command(self, mode: str, port: int) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, "-m", "benchmarks.guard_overhead", "--serve", self.name, mode, str(port)],
                dict(os.environ))


def pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def start_server(server: Any, mode: str, report: str = "") -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv, env = server.command(mode, port)
    if report:
        env[REPORT_ENV] = report
    # Pinned apart (server on one core, wrk on the other) so they do not share a core's time.
    proc = subprocess.Popen([*pin(1), *argv], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + server.startup_s
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the {server.name} {mode} server did not start")


LUA = """wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["x-vllm-gke-issuer"] = "{issuer}"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
"""


def _found(match: re.Match[str] | None, text: str) -> re.Match[str]:
    if match is None:
        raise RuntimeError(f"unexpected wrk output: {text[-2000:]}")
    return match


def _ms(text: str) -> float:
    value, unit = _found(re.fullmatch(r"([\d.]+)(us|ms|s)", text), text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port: int, script: Path, connections: int, seconds: int, pid: int) -> dict[str, float]:
    cpu_before = cpu_seconds(pid)
    # A long timeout: a server taking ~80 ms a 128 KB request keeps 512 clients waiting ~40 s.
    out = subprocess.run([*pin(0), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "120s",
                          "--latency", "-s", str(script), f"http://127.0.0.1:{port}{PATH}"],
                         capture_output=True, text=True, check=True).stdout
    rps = float(_found(re.search(r"Requests/sec:\s+([\d.]+)", out), out).group(1))
    p50 = _ms(_found(re.search(r"^\s+50%\s+(\S+)", out, re.M), out).group(1))
    p99 = _ms(_found(re.search(r"^\s+99%\s+(\S+)", out, re.M), out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", out)
    if errors:
        raise RuntimeError(f"{errors.group(0)}: the benchmark is measuring errors")
    requests = int(_found(re.search(r"(\d+) requests in", out), out).group(1))
    if not requests:
        raise RuntimeError(f"no response in {seconds} s at {connections} connections")
    # Server CPU per request: what the guard adds, and unlike req/s blind to time the VM's host
    # takes from it (steal).
    cpu_us = (cpu_seconds(pid) - cpu_before) / requests * 1e6
    settle(pid)
    return {"rps": rps, "p50_ms": p50, "p99_ms": p99, "cpu_us": cpu_us}


def stat_ticks() -> tuple[int, int]:
    """(steal, total) CPU ticks of the machine so far, from /proc/stat: what the host took."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7], sum(fields[:8])


def settle(pid: int, timeout_s: float = 120) -> None:
    """Wait until the server has finished what the clients left behind (requests cut off when
    wrk stopped): it shares its core with the next server measured."""
    deadline = time.monotonic() + timeout_s
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = cpu_seconds(pid)
        if now - last < 0.02:
            return
        last = now


# Two server processes a mode: the same app in two processes differs by a few percent (memory
# layout), as much as what is measured; alternating over both evens that out.
INSTANCES = ("baseline", "baseline", "guard", "guard")


def in_uvicorn(server: Any, seconds: int, repeats: int = 3) -> list[dict[str, Any]]:
    """Per cell: each mode's medians, `ratio` (guard/baseline median req/s), `runs` (each mode's
    req/s of every run) and `steal` (the share of the machine's CPU time its host took meanwhile)."""
    rows = []
    servers = [(mode, *start_server(server, mode)) for mode in INSTANCES]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, size in SIZES.items():
                script = wrk_script(Path(tmp), server, label, size)
                for connections in CONCURRENCY:
                    result: dict[str, Any] = {"size": label, "connections": connections}
                    for _mode, proc, port in servers:  # warm all, then measure side by side
                        wrk(port, script, connections, server.warmup_s, proc.pid)
                    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "guard": []}
                    steal_before = stat_ticks()
                    for _ in range(repeats):  # alternate, so drift in the machine hits both alike
                        for mode, proc, port in servers:
                            runs[mode].append(wrk(port, script, connections, seconds, proc.pid))
                    steal_after = stat_ticks()
                    for mode, samples in runs.items():
                        result[mode] = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
                    result["ratio"] = result["guard"]["rps"] / result["baseline"]["rps"]
                    result["runs"] = {mode: [r["rps"] for r in samples] for mode, samples in runs.items()}
                    result["steal"] = (steal_after[0] - steal_before[0]) / max(1, steal_after[1] - steal_before[1])
                    rows.append(result)
    finally:
        for _mode, proc, _port in servers:
            stop(proc)
    return rows


def pooled_ratio(rows: list[dict[str, Any]], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Guarded/baseline req/s over all cells of a server: the geometric mean of the cells'
    ratios of medians, and a 95% interval from resampling each cell's runs (a bootstrap). One
    cell's runs scatter more than the guard's effect on a busy VM; the cells together say more."""
    rng = random.Random(seed)

    def estimate(pick: Callable[[list[float]], list[float]]) -> float:
        logs = [math.log(statistics.median(pick(r["runs"]["guard"])) / statistics.median(pick(r["runs"]["baseline"])))
                for r in rows]
        return math.exp(statistics.fmean(logs))

    point = estimate(lambda xs: xs)
    boot = sorted(estimate(lambda xs: rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return point, boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wrk_script(tmp: Path, server: Any, label: str, size: int) -> Path:
    body = tmp / f"{label}.json"
    body.write_bytes(chat_body(size, server.model))
    script = tmp / f"{label}.lua"
    script.write_text(LUA.format(issuer=server.issuer, body=body))
    return script


def guard_time_in_server(server: Any, seconds: int) -> dict[str, float]:
    """Median microseconds of the guard's own checks per request, timed by the guard inside a
    loaded server (64 connections): what it costs with the server's other work around it, its
    code and data no longer in the CPU's caches."""
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in SIZES.items():
            report = Path(tmp) / f"{label}.samples.json"
            proc, port = start_server(server, "timed", str(report))
            try:
                wrk(port, wrk_script(Path(tmp), server, label, size), 64, seconds, proc.pid)
            finally:
                stop(proc)
            samples = json.loads(report.read_text())
            medians[label] = statistics.median(samples[len(samples) // 5:]) / 1000  # past the warm-up
    return medians


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None  # stripped only under -OO
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=2, help="wrk duration per measurement")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds per cell, each over all four servers (two a mode); the median of each mode")
    parser.add_argument("--stand-in", choices=[*STAND_INS, "vllm", "all"], default="all",
                        help="which server part 2 measures ('all': every one available)")
    parser.add_argument("--vllm-python", metavar="PYTHON",
                        help="the python of an environment with the pinned vLLM (benchmarks/vllm_server.py): "
                             "adds the 'vllm' server, vLLM's own")
    parser.add_argument("--vllm-seconds", type=int, default=10,
                        help="wrk duration per measurement of the 'vllm' server (~250 req/s at 1 KB, ~12 at 128 KB)")
    parser.add_argument("--serve", nargs=3, metavar=("STAND_IN", "MODE", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], args.serve[1], int(args.serve[2]))
        return 0
    if args.stand_in == "vllm" and not args.vllm_python:
        print("--stand-in vllm needs --vllm-python: the python of an environment with the pinned vLLM "
              "(see benchmarks/vllm_server.py)", file=sys.stderr)
        return 2
    if args.vllm_python and not Path(args.vllm_python).exists():
        print(f"--vllm-python {args.vllm_python}: no such file", file=sys.stderr)
        return 2
    if not args.in_process_only and shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk); part 2 needs it, or pass --in-process-only",
              file=sys.stderr)
        return 2
    print("1. per request, in process (microseconds added to an app that does nothing)")
    print(f"{'body':>6} {'app alone':>10} {'+ guard':>9} {'+ naive decode/encode':>22}")
    for r in in_process():
        print(f"{r['size']:>6} {r['baseline_us']:>9.2f} {r['guard_us']:>9.2f} {r['naive_us']:>22.2f}")
    if args.in_process_only:
        return 0
    names = [*STAND_INS, *(["vllm"] if args.vllm_python else [])] if args.stand_in == "all" else [args.stand_in]
    for name in names:
        if name == "vllm":
            from benchmarks.vllm_server import VllmServer

            server: Any = VllmServer.prepare(args.vllm_python)
            seconds = args.vllm_seconds
        else:
            server, seconds = StandInServer(name), args.seconds
        print(f"\n2. inside uvicorn, server '{name}', wrk, median of {2 * args.repeats} alternating "
              f"{seconds} s runs a mode per cell, over two server processes a mode")
        print(f"{'body':>6} {'conns':>5} {'req/s base':>10} {'req/s guard':>11} {'ratio':>6} "
              f"{'p50 ms b/g':>13} {'p99 ms b/g':>15} {'CPU us/req b/g':>15} {'added':>6} {'steal':>6}")
        rows = in_uvicorn(server, seconds, args.repeats)
        for r in rows:
            b, g = r["baseline"], r["guard"]
            print(f"{r['size']:>6} {r['connections']:>5} {b['rps']:>10.0f} {g['rps']:>11.0f} "
                  f"{r['ratio']:>6.3f} {b['p50_ms']:>6.2f}/{g['p50_ms']:<6.2f} "
                  f"{b['p99_ms']:>7.2f}/{g['p99_ms']:<7.2f} {b['cpu_us']:>7.0f}/{g['cpu_us']:<7.0f} "
                  f"{g['cpu_us'] - b['cpu_us']:>6.1f} {r['steal']:>6.0%}", flush=True)
        point, low, high = pooled_ratio(rows)
        print(f"   guarded/baseline req/s over all {len(rows)} cells: {point:.3f} (95% interval {low:.3f}-{high:.3f})")
        timed = guard_time_in_server(server, seconds)
        print("   the guard's own checks, timed inside the server at 64 connections (median us/request): " +
              ", ".join(f"{label} {us:.1f}" for label, us in timed.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
