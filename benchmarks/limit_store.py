"""The shared limit store's cost per call against a real redis-server, by what the window holds.

    .venv/bin/python -m benchmarks.limit_store [--calls 2000] [--repeats 5]

Starts redis-server (Debian's package; REDIS_SERVER names another) with the store's own config
and ACL on a free loopback port, fills three tenants' windows with 10, 1,000 and 10,000
admissions, then, alternating the tenants, times the guard's function: refused calls (the window
full at its limit, as a flooding tenant's are) and admitted ones (a limit far above). Each figure
is the median over the repeats of the server's own time per call (INFO commandstats for FCALL,
what every other tenant waits behind on the single-threaded store) and of the round trip seen by
the client. Goal: the 10,000 case within 1.5x of the 10 case.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from vllm_gke.components.limit_store import LIBRARY, LOADED, PORT, REDIS_CONF, startup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "images"))
from vllm_gke_guard import store as limits  # noqa: E402

SIZES = (10, 1_000, 10_000)
ADMIN = "bench-admin"


def start_redis(binary: str, workdir: Path, extra_conf: str = "") -> tuple[subprocess.Popen, int]:
    """redis-server started as the store's container starts it (its config, ACL and function
    library, plus `extra_conf`) on a free loopback port, in `workdir`, answering with the library
    loaded once it returns (the tests use it too)."""
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = workdir / "redis.conf"
    conf.write_text(REDIS_CONF.replace(f"port {PORT}", f"port {port}").replace("bind * -::*", "bind 127.0.0.1")
                    + f"dir {workdir}\n" + extra_conf)
    (workdir / "limits.lua").write_text(LIBRARY)
    command = startup(str(workdir), str(workdir), port).replace("exec redis-server", f"exec {binary}")
    proc = subprocess.Popen(["sh", "-c", command], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            if client.ping() and (workdir / LOADED).exists():
                break
        except redis.ConnectionError:
            pass
        time.sleep(0.05)
    return proc, port


def fcall_usec(admin: Any) -> tuple[int, float]:
    """FCALL's calls and total microseconds so far, as the server counts them."""
    stats = admin.info("commandstats").get("cmdstat_fcall", {})
    return int(stats.get("calls", 0)), float(stats.get("usec", 0))


def main(argv: Optional[list[str]] = None) -> int:
    assert __doc__ is not None  # stripped only under -OO
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        print("error: no redis-server: apt-get install redis-server, or set REDIS_SERVER", file=sys.stderr)
        return 2
    import redis

    with tempfile.TemporaryDirectory() as tmp:
        # An admin user for this benchmark alone: INFO is outside the store's ACL.
        proc, port = start_redis(binary, Path(tmp), f"user {ADMIN} on >{ADMIN} ~* &* +@all\n")
        try:
            client = redis.Redis(port=port)

            def call(tenant: str, requests: int) -> Any:  # the function's list (redis-py says str)
                args: list[Any] = [f"rl:{{{tenant}}}:w", limits.BUCKET_MS, limits.BUCKETS, requests, 10**12, 10]
                return client.execute_command("FCALL", limits.FUNCTION, 1, *args)

            for size in SIZES:  # fill each window (admitted: the limit far above)
                for _ in range(size):
                    call(f"t{size}", 10**9)
            admin = redis.Redis(port=port, username=ADMIN, password=ADMIN)
            results: dict[tuple[str, int], dict[str, list[float]]] = {}
            for _ in range(args.repeats):
                for mode in ("refused", "admitted"):
                    for size in SIZES:
                        limit = size if mode == "refused" else 10**9
                        before = fcall_usec(admin)
                        start = time.perf_counter()
                        for _ in range(args.calls):
                            call(f"t{size}", limit)
                        wall = (time.perf_counter() - start) / args.calls * 1e6
                        cell = results.setdefault((mode, size), {"rtt": [], "server": []})
                        after = fcall_usec(admin)
                        cell["rtt"].append(wall)
                        cell["server"].append((after[1] - before[1]) / max(1, after[0] - before[0]))
        finally:
            proc.terminate()
            proc.wait(5)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[2]
    print(f"redis-server {version}; {args.calls} calls x {args.repeats} repeats a cell, medians\n")
    print("| call | entries in the window | round trip µs | server µs | vs 10 entries (round trip) |")
    print("|---|---|---|---|---|")
    for mode in ("refused", "admitted"):
        base = statistics.median(results[(mode, SIZES[0])]["rtt"])
        for size in SIZES:
            cell = results[(mode, size)]
            rtt = statistics.median(cell["rtt"])
            server = statistics.median(cell["server"])
            print(f"| {mode} | {size:,} | {rtt:.1f} | {server:.1f} | {rtt / base:.2f}x |")
    def ratio(mode: str, key: str) -> float:
        return statistics.median(results[(mode, SIZES[-1])][key]) / statistics.median(results[(mode, SIZES[0])][key])

    worst = max(ratio(m, k) for m in ("refused", "admitted") for k in ("rtt", "server"))
    print(f"\n10,000 vs 10 entries: {worst:.2f}x at worst, round trip or server time (goal: within 1.5x)")
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
