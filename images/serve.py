"""Container entrypoint: start `vllm serve`, wait until healthy, warm it up, then mark it warm.

The pod's startup probe waits for the warm marker, so the load balancer only sends traffic
to a replica whose first requests (CUDA graph capture, prefix cache, tokenizer load) have
already been paid for by this script, not by a user. Signals go to vLLM so it can drain.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, Optional, Sequence

WARMUP_PROMPTS = ("Hello", "Summarise the following text in one sentence: " + "lorem ipsum " * 64)
WARMUP_HEADER = "x-gke-llm-warmup"
# Not VLLM_*: vLLM treats that prefix as its own and warns about (or refuses) unknown names.
WARM_MARKER_ENV, WARMUP_TOKEN_ENV, SERVER_COMMAND_ENV = (
    "GKE_LLM_WARM_MARKER", "GKE_LLM_WARMUP_TOKEN", "GKE_LLM_SERVER_COMMAND")
WARMUP_ROUNDS = 5
# How long to wait for vLLM's /health: the pod's startup probe window (components/model/vllm_server.py
# STARTUP_WINDOW_ENV), so a start that the probe still allows is never given up here first.
STARTUP_WINDOW_ENV = "GKE_LLM_STARTUP_WINDOW_SECONDS"
DEFAULT_STARTUP_WINDOW_S = 3600.0


def startup_window_s() -> float:
    return float(os.environ.get(STARTUP_WINDOW_ENV) or DEFAULT_STARTUP_WINDOW_S)
# Files that must exist before vLLM starts (bucket-backed weights: each copy's completion marker,
# read through the FUSE mount once the mesh sidecar serves), joined by ':'.
WEIGHTS_MARKERS_ENV = "GKE_LLM_WEIGHTS_MARKERS"
# A multi-host TPU group (components/model/vllm_server.py group_env): the leader starts Ray's head and
# waits for this many hosts; a worker joins the head at host:port and serves no vLLM itself.
RAY_HEAD_ENV, RAY_JOIN_ENV = "GKE_LLM_RAY_HEAD_NODES", "GKE_LLM_RAY_JOIN"
RAY_PORT = "6379"
GUARD_CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
RAY_ALIVE_NODES = "import ray; ray.init(address='auto', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"


def ray_nodes_alive() -> int:
    out = subprocess.run([sys.executable, "-c", RAY_ALIVE_NODES], capture_output=True, text=True, timeout=120)
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


RAY_JOIN_TIMEOUT_S = 600.0


def join_ray(address: str, stopped: Callable[[], bool], timeout_s: float = RAY_JOIN_TIMEOUT_S,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> int:
    """Join the leader's Ray head and block there; while the head is not up yet (the group's pods
    start together), try again, for up to `timeout_s` (as vLLM's multi-node-serving.sh does)."""
    deadline = clock() + timeout_s
    signalled: list[int] = []
    while True:
        ray = subprocess.Popen(["ray", "start", f"--address={address}", "--block"])

        def forward(sig: int, _frame: Any, proc: subprocess.Popen[bytes] = ray) -> None:
            signalled.append(sig)  # a stop, not a failed join: never started again
            proc.send_signal(sig)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        code = ray.wait()
        if code == 0 or signalled or stopped() or clock() >= deadline:
            return exit_status(code)
        print(f"vllm-gke: could not join the Ray head at {address} (exit {code}); retrying", file=sys.stderr, flush=True)
        sleep(5.0)


def start_ray_head(nodes: int, stopped: Callable[[], bool], alive: Callable[[], int] = ray_nodes_alive,
                   sleep: Callable[[float], None] = time.sleep) -> bool:
    """Ray's head on this host, then wait until all `nodes` hosts of the group have joined (vLLM's
    Ray executor places its workers on the cluster it finds at start); False once stopped."""
    subprocess.run(["ray", "start", "--head", f"--port={RAY_PORT}", "--disable-usage-stats"], check=True)
    while (joined := alive()) < nodes:
        if stopped():
            return False
        print(f"vllm-gke: {joined}/{nodes} hosts in the Ray cluster", file=sys.stderr, flush=True)
        sleep(5.0)
    return True


def wait_for_files(paths: Sequence[str], stopped: Callable[[], bool] = lambda: False,
                   say_every: int = 15, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait until every path exists (a mount that errors reads as not yet); False once stopped.
    Polls each second, so a SIGTERM while waiting ends the container at once."""
    for path in paths:
        waited = 0
        while True:
            try:
                os.stat(path)
                break
            except FileNotFoundError:
                problem = f"waiting for weights at {path}"
            except OSError as error:  # a mount that does not serve (ENOTCONN, EIO): say so
                problem = f"the weights mount does not answer for {path}: {error}"
            if stopped():
                return False
            if waited % say_every == 0:
                print(f"vllm-gke: {problem}", file=sys.stderr, flush=True)
            sleep(1.0)
            waited += 1
    return True


def flag(argv: Sequence[str], name: str, default: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def wait_healthy(base: str, alive: Callable[[], bool] = lambda: True, timeout_s: float = 3600,
                 interval_s: float = 2.0) -> bool:
    """Poll /health until it answers 200; False if vLLM died or time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(interval_s)
    return False


def warm_up(base: str, model: str, token: str) -> int:
    """Send short completions through the full path; returns how many succeeded."""
    ok = 0
    for prompt in WARMUP_PROMPTS:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", data=body, method="POST", headers={
            "content-type": "application/json", WARMUP_HEADER: token})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                ok += resp.status == 200
        except (urllib.error.URLError, OSError) as exc:
            print(f"vllm-gke: warm-up request failed: {exc}", file=sys.stderr)
    return ok


# A server stopped for a lost lease: the GPU is the waiter's a lease (at least 15 s) after the loss.
LOST_LEASE_GRACE_S = 5.0


def hold_gpu_lease(stopped: Callable[[], bool], on_lost: Callable[[], None]) -> Optional[Callable[[], None]]:
    """models[].sleepMode: the shared GPU's lease before vLLM starts, so no server loads beside an
    awake one (vLLM 0.34 does not refuse to: it loads into what is left, vllm_gke_guard/swap.py); the
    returned handoff stops this process renewing it once the guard holds it; on_lost runs (in the
    renewing thread) if the lease is lost before. None if the pod was told to stop while waiting."""
    cfg = guard_config()
    if not cfg.get("swap"):
        return lambda: None
    from vllm_gke_guard.swap import hold_for_startup  # the guard's package, in the image

    return hold_for_startup(cfg, stopped, on_lost)


def drop_gpu_lease() -> None:
    """vLLM has exited: the GPU's lease (if still this pod's) freed at once, not a lease and a fence later."""
    cfg = guard_config()
    if cfg.get("swap"):
        from vllm_gke_guard.swap import drop_after_exit

        drop_after_exit(cfg)


def guard_config() -> dict[str, Any]:
    return json.loads(os.environ.get(GUARD_CONFIG_ENV) or "{}")


def server_env(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """vLLM's environment: this one with the warm-up token, and on Cloud Run without the limit store's
    client certificate. The guard's config names the variable holding it (globalLimits.tlsEnv); it is
    written to a private file here and the guard's config names the file instead (tlsFile). The guard
    cannot drop the variable itself: vLLM's API server starts its engine processes before it loads the
    guard, and they would inherit the key. ValueError, naming only the variable, if it holds no PEM."""
    env = dict(environ, **{WARMUP_TOKEN_ENV: token})
    cfg: dict[str, Any] = json.loads(env.get(GUARD_CONFIG_ENV) or "{}")
    shared: dict[str, Any] = cfg.get("globalLimits") or {}
    if not shared.get("tlsEnv"):
        return env
    name = str(shared["tlsEnv"])
    cfg["globalLimits"] = {**{k: v for k, v in shared.items() if k != "tlsEnv"}, "tlsFile": private_pem(env.pop(name, ""), name)}
    env[GUARD_CONFIG_ENV] = json.dumps(cfg)
    return env


def private_pem(pem: str, name: str) -> str:
    """The PEM in a new 0600 file of a new 0700 folder (Python's TLS reads a certificate and key from
    files only); its path. The value is never printed."""
    if "PRIVATE KEY" not in pem or "CERTIFICATE" not in pem:
        raise ValueError(f"globalLimits.tlsEnv: env var {name} does not hold the limit store's client certificate "
                         "and key (one PEM); fill the Secret Manager secret the guide names")
    path = os.path.join(tempfile.mkdtemp(prefix="limits-tls-"), "tls.pem")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(pem)
    return path


def stop_server(proc: "subprocess.Popen[bytes]", grace_s: float = LOST_LEASE_GRACE_S) -> None:
    """SIGTERM, then SIGKILL past grace_s (the GPU is another's a fence after the loss)."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def exit_status(returncode: int) -> int:
    """A shell's convention: a child killed by signal N exits 128+N (Popen reports -N)."""
    return 128 - returncode if returncode < 0 else returncode


def warm_up_until_one_succeeds(base: str, model: str, token: str, alive: Callable[[], bool],
                               rounds: int = WARMUP_ROUNDS, pause_s: float = 5.0) -> bool:
    """A replica is warm only once a request has really been served; retry a few rounds."""
    for attempt in range(rounds):
        if not alive():
            return False
        done = warm_up(base, model, token)
        print(f"vllm-gke: {done}/{len(WARMUP_PROMPTS)} warm-up requests succeeded", file=sys.stderr)
        if done:
            return True
        if attempt + 1 < rounds:
            time.sleep(pause_s)
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    marker = os.environ.get(WARM_MARKER_ENV, "/tmp/vllm-gke-warm")
    # /tmp is an emptyDir, kept across container restarts: a marker of the last run would pass the
    # startup probe at once and hand a loading server to the liveness probe, which kills it again.
    with contextlib.suppress(FileNotFoundError):
        os.remove(marker)
    port = flag(argv, "--port", "8000")
    model = flag(argv, "--served-model-name", argv[0] if argv else "")
    base = f"http://127.0.0.1:{port}"
    # Only this process knows the token, so only its warm-up skips the tenant guard.
    token = secrets.token_hex(16)
    try:
        env = server_env(os.environ, token)
    except ValueError as bad:
        print(f"vllm-gke: {bad}", file=sys.stderr)
        return 2
    command = os.environ.get(SERVER_COMMAND_ENV, "vllm serve").split()
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: stop.append(s))
    markers = [m for m in os.environ.get(WEIGHTS_MARKERS_ENV, "").split(":") if m]
    if not wait_for_files(markers, stopped=lambda: bool(stop)):
        return 0
    if join := os.environ.get(RAY_JOIN_ENV):
        # A TPU group's worker: its host is a Ray node the leader's engine drives.
        return join_ray(join, stopped=lambda: bool(stop))
    if (head := os.environ.get(RAY_HEAD_ENV)) and not start_ray_head(int(head), stopped=lambda: bool(stop)):
        return 0
    lost: list[bool] = []
    server: list[subprocess.Popen[bytes]] = []

    def lease_lost() -> None:  # the lease's thread: a waiter wakes a fence later, vLLM must be gone by then
        print("vllm-gke: the GPU's lease was lost while vLLM started; stopping it (the container restarts and "
              "waits for the lease)", file=sys.stderr, flush=True)
        lost.append(True)
        for p in server:
            stop_server(p)

    handoff = hold_gpu_lease(stopped=lambda: bool(stop), on_lost=lease_lost)
    if handoff is None:
        return 0
    proc = subprocess.Popen([*command, *argv], env=env)
    server.append(proc)
    if lost:  # lost before the thread could see the server
        stop_server(proc)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    if "--headless" in argv:
        # A GPU group's worker: no API server to warm; it runs its ranks until the leader stops.
        return exit_status(proc.wait())

    alive = lambda: proc.poll() is None  # noqa: E731
    pause = float(os.environ.get("GKE_LLM_WARMUP_PAUSE_SECONDS", "5"))
    healthy = wait_healthy(base, alive=alive, timeout_s=startup_window_s())
    if healthy and not lost:
        # vLLM is up: the guard's watcher (started with its lifespan) renews the GPU's lease, and
        # yields it only after a request it served (this warm-up), so the handoff comes first.
        handoff()
    if healthy and not lost and warm_up_until_one_succeeds(base, model, token, alive, pause_s=pause):
        with open(marker, "w") as fh:
            fh.write(str(time.time()))
    elif alive():
        # Never warm: the startup probe fails and the kubelet restarts the container.
        print("vllm-gke: no warm-up request succeeded; not marking the replica ready", file=sys.stderr)
    code = exit_status(proc.wait())
    drop_gpu_lease()
    return code or int(bool(lost))  # a lost lease: non-zero, so the container restarts and waits for it


if __name__ == "__main__":
    sys.exit(main())
