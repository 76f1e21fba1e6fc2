"""The server image: a pinned Dockerfile, the tenant guard middleware and the warm-up entrypoint."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from tests.conftest import STACKS, vllm_deployments
from vllm_gke.components.model.vllm_server import GUARD_MIDDLEWARE, WARM_MARKER
from vllm_gke.infra.plan import REPO_ROOT

IMAGES = REPO_ROOT / "images"
sys.path.insert(0, str(IMAGES))


# --- Dockerfile (static: no Docker engine here; Cloud Build builds it) -----------------------

def dockerfile() -> str:
    return (IMAGES / "Dockerfile").read_text()


def test_base_image_is_pinned():
    text = dockerfile()
    version = re.search(r"^ARG VLLM_VERSION=(v\d+\.\d+\.\d+)$", text, re.M)
    assert version, "the vLLM version must be pinned in an ARG"
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert base == "${VLLM_IMAGE}:${VLLM_VERSION}"
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai$", text, re.M)
    assert "latest" not in version.group(1)


def test_the_tpu_server_image_is_built_from_the_same_file_on_the_tpu_release(stack_values):
    """cloudbuild-tpu.yaml: vllm/vllm-tpu at the pinned TPU release, tagged as the stacks'
    tpuServerImage expects (v<release>-<suffix>); the CUDA build stays alone in cloudbuild.yaml."""
    from vllm_gke.components.model.vllm_versions import DEFAULT_TPU_VLLM_VERSION

    assert "vllm-tpu" not in (IMAGES / "cloudbuild.yaml").read_text()
    build = (IMAGES / "cloudbuild-tpu.yaml").read_text()
    assert "VLLM_IMAGE=vllm/vllm-tpu" in build and f"_TPU_VLLM_VERSION: v{DEFAULT_TPU_VLLM_VERSION}" in build
    tag = re.search(r"^  _TPU_TAG: (\S+)$", build, re.M)
    assert tag and tag[1].startswith(f"v{DEFAULT_TPU_VLLM_VERSION}-")
    for stack in STACKS:
        image = stack_values[stack].get("vllm-gke:tpuServerImage")
        assert image is None or image["tag"].startswith(f"v{DEFAULT_TPU_VLLM_VERSION}-"), stack


def test_image_carries_what_the_deployment_runs(plans):
    text = dockerfile()
    # source -> where it lands (a folder's contents go into the destination folder)
    copied = {src.rstrip("/"): dest for srcs, dest in re.findall(r"^COPY (.+) (/opt/vllm-gke/\S*)$", text, re.M)
              for src in srcs.split()}
    for name in copied:
        assert (IMAGES / name).exists()
    container = vllm_deployments(plans["dev"])[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][1] == "/opt/vllm-gke/serve.py" and copied["serve.py"] == "/opt/vllm-gke/"
    # --middleware's module, a package: the folder itself on PYTHONPATH, not its files loose there.
    guard = GUARD_MIDDLEWARE.split(".")[0]
    assert copied[guard] == f"/opt/vllm-gke/{guard}/" and (IMAGES / guard / "__init__.py").exists()
    # The guard imports its limit-store client (globalLimits) from the package, and the client pinned.
    assert (IMAGES / guard / "store.py").exists()
    assert re.search(r'^ARG REDIS_PY_VERSION=\d+\.\d+\.\d+$', text, re.M)
    assert 'pip install --no-cache-dir --no-deps "redis==${REDIS_PY_VERSION}"' in text
    assert "PYTHONPATH=/opt/vllm-gke" in text and "HF_HUB_OFFLINE=1" in text


def test_stack_images_track_the_dockerfile_version(stack_values):
    version = re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile(), re.M).group(1)
    for stack in STACKS:
        image = stack_values[stack]["vllm-gke:serverImage"]
        assert "tag" not in image or image["tag"].startswith(version + "-"), stack
    build = (IMAGES / "cloudbuild.yaml").read_text()
    assert f"_VLLM_VERSION: {version}" in build


# --- warm-up entrypoint ----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_entrypoint_waits_for_health_warms_up_then_marks_warm(tmp_path):
    marker, log = tmp_path / "warm", tmp_path / "requests.jsonl"
    env = dict(os.environ, GKE_LLM_WARM_MARKER=str(marker), FAKE_VLLM_LOG=str(log),
               GKE_LLM_SERVER_COMMAND=f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'fake_vllm.py'}")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(IMAGES / "serve.py"), "/models/m/main",
                             "--served-model-name", "m", "--port", str(port)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        assert marker.exists()
        requests = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(requests) == 2
        assert all(r == {"path": "/v1/completions", "model": "m", "token_ok": True} for r in requests)
        proc.send_signal(signal.SIGTERM)  # forwarded to the server, which drains and exits
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_entrypoint_exits_with_server_when_it_dies(tmp_path):
    # A marker of the container's last run (the emptyDir outlives a restart) is no warm replica.
    (tmp_path / "warm").write_text("")
    env = dict(os.environ, GKE_LLM_WARM_MARKER=str(tmp_path / "warm"), FAKE_VLLM_EXIT="3",
               FAKE_VLLM_LOG=str(tmp_path / "log"),
               GKE_LLM_SERVER_COMMAND=f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'fake_vllm.py'}")
    proc = subprocess.run([sys.executable, str(IMAGES / "serve.py"), "--port", str(free_port())],
                          env=env, timeout=30)
    assert proc.returncode == 3 and not (tmp_path / "warm").exists()


def run_entrypoint(tmp_path, **extra):
    env = dict(os.environ, GKE_LLM_WARM_MARKER=str(tmp_path / "warm"), FAKE_VLLM_LOG=str(tmp_path / "log"),
               GKE_LLM_WARMUP_PAUSE_SECONDS="0.05",
               GKE_LLM_SERVER_COMMAND=f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'fake_vllm.py'}",
               **extra)
    return subprocess.Popen([sys.executable, str(IMAGES / "serve.py"), "/models/m/main",
                             "--served-model-name", "m", "--port", str(free_port())], env=env)


def test_entrypoint_starts_vllm_only_once_the_weights_are_there(tmp_path):
    """Bucket-backed weights: the wait is the entrypoint's (after the mesh sidecar), not an init
    container's; vLLM starts once every marker exists, and a stop while waiting ends it at once."""
    markers = [tmp_path / "m" / ".vllm-gke-complete", tmp_path / "a" / ".vllm-gke-complete"]
    proc = run_entrypoint(tmp_path, GKE_LLM_WEIGHTS_MARKERS=":".join(map(str, markers)))
    try:
        time.sleep(1.5)
        assert proc.poll() is None and not (tmp_path / "log").exists()  # vLLM not started
        for m in markers:
            m.parent.mkdir()
            m.write_text("{}")
        deadline = time.monotonic() + 30
        while not (tmp_path / "warm").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "warm").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    waiting = run_entrypoint(tmp_path / "x", GKE_LLM_WEIGHTS_MARKERS=str(tmp_path / "never"))
    time.sleep(0.5)
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=5) == 0 and not (tmp_path / "x" / "log").exists()


def test_a_mount_that_does_not_answer_is_said_not_waited_on_silently(tmp_path, capsys):
    sys.path.insert(0, str(IMAGES))
    import serve

    broken = tmp_path / "file"
    broken.write_text("")
    calls = []
    assert serve.wait_for_files([str(broken / "marker")], stopped=lambda: len(calls) >= 2,
                                say_every=1, sleep=calls.append) is False
    assert "does not answer" in capsys.readouterr().err


def test_entrypoint_never_marks_warm_when_every_warm_up_fails(tmp_path):
    proc = run_entrypoint(tmp_path, FAKE_VLLM_COMPLETION_STATUS="500")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log = tmp_path / "log"
            if log.exists() and len(log.read_text().splitlines()) >= 10:  # 5 rounds x 2 prompts
                break
            time.sleep(0.1)
        time.sleep(0.3)
        assert not (tmp_path / "warm").exists()
        assert proc.poll() is None  # still serving: the startup probe decides its fate
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_entrypoint_exits_128_plus_signal_when_the_server_is_killed(tmp_path):
    proc = run_entrypoint(tmp_path, FAKE_VLLM_DIE_ON_TERM="1")
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "warm").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # forwarded; the server dies of it
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM  # not 241, as sys.exit(-15) gives
    finally:
        if proc.poll() is None:
            proc.kill()


def test_platform_variables_avoid_vllms_prefix(plans):
    """vLLM warns about unknown VLLM_* variables, and --fail-on-environ-validation fails on them."""
    known = {"VLLM_NO_USAGE_STATS"}  # vLLM's own
    for dep in vllm_deployments(plans["prod"]):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            names = {e["name"] for e in c["env"] if e["name"].startswith("VLLM_")}
            assert names <= known, names
    for source in [IMAGES / "serve.py", *sorted((IMAGES / GUARD_MIDDLEWARE.split(".")[0]).glob("*.py"))]:
        # vLLM's own variables may be named (the dev-mode switch the swap keeps off), never new ones.
        assert not re.findall(r"VLLM_(?!NO_USAGE_STATS|SERVER_DEV_MODE\b)[A-Z_]+", source.read_text()), source


def test_warm_marker_matches_startup_probe(plans):
    c = vllm_deployments(plans["dev"])[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["startupProbe"]["exec"]["command"] == ["test", "-f", WARM_MARKER]
    assert {"name": "GKE_LLM_WARM_MARKER", "value": WARM_MARKER} in c["env"]


def test_the_tests_use_the_redis_client_the_image_ships():
    version = re.search(r"^ARG REDIS_PY_VERSION=(\S+)$", dockerfile(), re.M).group(1)
    assert f'"redis=={version}"' in (REPO_ROOT / "pyproject.toml").read_text()


def test_the_entrypoint_waits_as_long_as_the_startup_probe(plans):
    """Every serving pod of every stack tells the entrypoint its startup probe's window, at least
    failureThreshold x periodSeconds: a start slower than a fixed hour (a 405B's weights, a cold XLA
    compile) is not given up while the probe still waits for it."""
    import serve

    from vllm_gke.components.model.vllm_server import STARTUP_WINDOW_ENV
    from vllm_gke.infra.manifests import pod_templates

    assert serve.STARTUP_WINDOW_ENV == STARTUP_WINDOW_ENV
    windows = []
    for stack in STACKS:
        for doc in plans[stack].manifests():
            for role, template in pod_templates(doc) if doc["kind"] in ("Deployment", "LeaderWorkerSet") else []:
                c = template["spec"]["containers"][0]
                if (probe := c.get("startupProbe")) is None or c.get("name") != "vllm":
                    continue
                env = {e["name"]: e.get("value") for e in c["env"]}
                window = probe["failureThreshold"] * probe["periodSeconds"]
                assert float(env[STARTUP_WINDOW_ENV]) >= window, (stack, doc["metadata"]["name"], role)
                windows.append(window)
    assert max(windows) > serve.DEFAULT_STARTUP_WINDOW_S  # frontier's 405B and TPU 70B: past an hour


def test_the_entrypoint_honours_the_startup_window(monkeypatch, tmp_path):
    import serve

    seen = []

    class Server:  # vLLM that never turns healthy
        def poll(self):
            return None

        def send_signal(self, _sig):
            pass

        def wait(self):
            return 0

    monkeypatch.setattr(serve.subprocess, "Popen", lambda *a, **k: Server())
    monkeypatch.setattr(serve, "wait_healthy", lambda base, alive, timeout_s: seen.append(timeout_s) or False)
    monkeypatch.setattr(serve.signal, "signal", lambda *a: None)
    monkeypatch.setenv("GKE_LLM_WARM_MARKER", str(tmp_path / "warm"))
    monkeypatch.setenv(serve.STARTUP_WINDOW_ENV, "21140")
    assert serve.main(["/models/m/main", "--port", "1"]) == 0
    monkeypatch.delenv(serve.STARTUP_WINDOW_ENV)
    serve.main(["/models/m/main", "--port", "1"])
    assert seen == [21140.0, serve.DEFAULT_STARTUP_WINDOW_S] and not (tmp_path / "warm").exists()
