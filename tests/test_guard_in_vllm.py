"""The guard inside the real vLLM, started as the pod starts it.

The container's entrypoint (images/serve.py) runs the pinned vLLM's own `vllm serve` with the
prod stack's flags for its longest-prompt pool, `--middleware vllm_gke_guard.GuardMiddleware`
included; only the GPU engine core is a stand-in that answers at once
(benchmarks/vllm_fake_engine.py). Needs an environment with the pinned vLLM
(benchmarks/vllm_server.py says how): VLLM_PYTHON=/path/to/its/python. Skipped without it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest

from benchmarks.guard_overhead import stop
from benchmarks.vllm_server import MIDDLEWARE, REPO, bench_guard_config, flag, longest_prompt_container, server_args
from tests.otlp_receiver import OtlpReceiver

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON and not os.environ.get("CI"),
                                reason="VLLM_PYTHON (a python with the pinned vllm) is not set")


@pytest.fixture(scope="module", autouse=True)
def _pinned_vllm():
    if not VLLM_PYTHON:
        pytest.fail("CI runs the guard inside the real vLLM: .ci/run installs it and sets VLLM_PYTHON")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTED_ISSUER, LISTED_SUBJECT = "https://accounts.google.com", "104476360121718219735"


@pytest.fixture(scope="module")
def pod(plans, tmp_path_factory):
    """serve.py running vLLM behind the guard: (base URL, served model, issuer, cap, marker)."""
    tmp = tmp_path_factory.mktemp("vllm")
    model_dir = tmp / "model"
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    args, config = longest_prompt_container(plans["prod"])
    guard_config = bench_guard_config(config)  # no sidecar here: the local client stands in for Envoy
    # One more tenant, on an issuer anyone gets tokens from: only its listed subject is it.
    first = next(iter(guard_config["issuers"].values()))
    guard_config["issuers"][LISTED_ISSUER] = {**first, "tenant": "listed", "cacheSalt": "tenant-listed",
                                              "subjects": [LISTED_SUBJECT]}
    port = _free_port()
    marker = tmp / "warm"
    # Traces as prod sends them (its flag and OTEL_* environment), to a local receiver instead of
    # the collector, every request sampled, exported at once.
    assert flag(args, "--otlp-traces-endpoint", "").endswith("/v1/traces") and guard_config.get("traces")
    receiver = OtlpReceiver()
    trace_env = {k: v for k, v in _container_env(plans["prod"]).items()
                 if k.startswith("OTEL_") and v is not None and "$(" not in v}
    assert trace_env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf", trace_env
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]),
               GKE_LLM_GUARD_CONFIG=json.dumps(guard_config), GKE_LLM_WARM_MARKER=str(marker),
               GKE_LLM_WARMUP_PAUSE_SECONDS="1",
               GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve",
               FAKE_ENGINE_LOG=str(tmp / "engine.jsonl"),
               **{**trace_env, "OTEL_TRACES_SAMPLER_ARG": "1.0", "OTEL_BSP_SCHEDULE_DELAY": "100"})
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"),
                             *server_args(args, model_dir, port, MIDDLEWARE["guard"]),
                             "--otlp-traces-endpoint", receiver.url],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    issuer, tenant = next(iter(guard_config["issuers"].items()))
    served = flag(args, "--served-model-name", "")
    try:
        yield {"base": f"http://127.0.0.1:{port}", "model": served, "issuer": issuer, "cap": tenant["maxTokens"],
               "marker": marker, "proc": proc, "log": tmp / "server.log", "engine": tmp / "engine.jsonl",
               "salt": tenant.get("cacheSalt"), "tenant": tenant["tenant"], "receiver": receiver,
               # The tenant URL's prefix the Gateway routes to this pool (and forwards as sent).
               "prefix": guard_config["pathPrefixes"][0]}
    finally:
        stop(proc)
        log.close()
        receiver.close()


def _container_env(plan) -> dict[str, Any]:
    """The literal environment of the deployment longest_prompt_container picks."""
    args, _ = longest_prompt_container(plan)
    for resource in plan.of_type("kubernetes:apps/v1:Deployment"):
        for c in resource.props["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "vllm" and list(c["args"]) == args:
                return {e["name"]: e.get("value") for e in c.get("env", [])}
    raise AssertionError("no such container")


def call(pod: dict[str, Any], path: str, body: Optional[dict[str, Any]] = None, issuer: bool = True,
         method: str = "POST", extra: Optional[dict[str, str]] = None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json", **(extra or {})}
    if issuer:
        headers["x-vllm-gke-issuer"] = pod["issuer"]
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(pod["base"] + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def chat(pod: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": pod["model"], "messages": [{"role": "user", "content": "Hello there"}], **fields}


def test_the_pod_warms_up_through_the_guard(pod):
    # serve.py marks the replica warm only once a warm-up request (which carries its own token,
    # not a tenant's) was served: the guard let it through and vLLM answered.
    assert pod["marker"].exists(), pod["log"].read_text()[-3000:]
    assert pod["proc"].poll() is None


def test_a_tenant_request_within_the_cap_is_served(pod):
    status, body = call(pod, "/v1/chat/completions", chat(pod, max_completion_tokens=256))
    assert status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] > 0


def test_a_tenant_calls_its_prefixed_url_as_the_gateway_forwards_it(pod):
    """No HTTPRoute rewrites the path (GKE does not claim it): the request arrives as
    /<prefix>/v1/..., and the guard strips the prefix before its checks and vLLM's router."""
    prefix = pod["prefix"]
    status, body = call(pod, f"{prefix}/v1/chat/completions?trace=1", chat(pod, max_completion_tokens=8))
    assert status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"
    status, body = call(pod, f"{prefix}/v1/models", method="GET")
    assert status == 200 and [m["id"] for m in body["data"]] == [pod["model"]]
    # The guard's checks hold after the strip.
    status, body = call(pod, f"{prefix}/v1/chat/completions", chat(pod, max_completion_tokens=pod["cap"] + 1))
    assert status == 400 and body["error"]["code"] == "max_tokens_exceeded"
    assert call(pod, f"{prefix}/v1/chat/completions", chat(pod, max_completion_tokens=8), issuer=False)[0] == 403


def test_an_unknown_prefix_is_the_guards_404_in_openai_format(pod):
    prefix = pod["prefix"]
    # A look-alike name, a prefix this pool does not serve, an encoded '/' (the raw path decides).
    for path in (f"{prefix}-evil/v1/chat/completions", "/some-other-model/v1/chat/completions",
                 f"{prefix}%2Fv1/chat/completions", f"{prefix}/health"):
        status, body = call(pod, path, chat(pod, max_completion_tokens=8))
        assert status == 404, (path, body)
        assert body["error"]["code"] == "not_found" and body["error"]["type"] == "invalid_request_error", path


def test_a_request_without_a_bound_is_served_with_the_cap_added(pod):
    status, body = call(pod, "/v1/chat/completions", chat(pod))
    assert status == 200, body


def test_over_the_cap_is_refused_in_openai_format(pod):
    status, body = call(pod, "/v1/chat/completions", chat(pod, max_completion_tokens=pod["cap"] + 1))
    assert status == 400
    assert body["error"]["code"] == "max_tokens_exceeded" and body["error"]["type"] == "invalid_request_error"
    status, body = call(pod, "/v1/completions", {"model": pod["model"], "prompt": ["a", "b"],
                                                 "max_tokens": pod["cap"] // 2 + 1})
    assert status == 400 and body["error"]["code"] == "max_tokens_exceeded"


def test_no_issuer_no_service(pod):
    status, body = call(pod, "/v1/chat/completions", chat(pod, max_completion_tokens=8), issuer=False)
    assert status == 403 and body["error"]["type"] == "permission_error"


def test_a_vllm_route_the_guard_does_not_know_is_refused(pod):
    # The pinned vLLM serves these; the guard's routes do not list them: deny by default.
    for path in ("/v1/chat/completions/render", "/inference/v1/generate", "/scale_elastic_ep"):
        status, body = call(pod, path, {"model": pod["model"]})
        assert status == 404 and body["error"]["code"] == "not_found", path


def test_the_model_list_and_health_pass(pod):
    status, body = call(pod, "/v1/models", method="GET")
    assert status == 200 and [m["id"] for m in body["data"]] == [pod["model"]]
    with urllib.request.urlopen(pod["base"] + "/health", timeout=10) as resp:
        assert resp.status == 200


def engine_requests(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in pod["engine"].read_text().splitlines()] if pod["engine"].exists() else []


def test_the_tenants_cache_salt_reaches_the_engine_whatever_the_client_sent(pod):
    """Prefix-cache isolation, as the engine sees it: every salted route's request carries the
    tenant's own salt, and a client's salt (another tenant's) is overwritten."""
    assert pod["salt"]
    seen = len(engine_requests(pod))
    assert call(pod, "/v1/chat/completions", chat(pod, max_tokens=8, cache_salt="tenant-someone-else"))[0] == 200
    assert call(pod, "/v1/completions", {"model": pod["model"], "prompt": "Hello", "max_tokens": 8})[0] == 200
    reached = engine_requests(pod)[seen:]
    assert [r["cache_salt"] for r in reached] == [pod["salt"], pod["salt"]]
    assert all(r["max_tokens"] == 8 for r in reached)


def test_the_guards_counters_are_on_vllms_metrics(pod):
    """The alerts read the guard's counters from the replica's own /metrics."""
    assert call(pod, "/v1/chat/completions", chat(pod), issuer=False)[0] == 403
    with urllib.request.urlopen(pod["base"] + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    assert "vllm_gke_guard_untrusted_peer_requests_total" in text


def test_the_queue_the_guard_sheds_on_is_vllms_own_in_its_process(pod):
    """overload.py reads vllm:num_requests_waiting and the count of vllm:time_to_first_token_seconds
    (requests that left the queue) from the registry of the process it runs in: the one this
    /metrics serves, where each request's first token lands."""
    from vllm_gke_guard.overload import FIRST_TOKENS, WAITING

    def metrics() -> dict[str, float]:
        with urllib.request.urlopen(pod["base"] + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith((WAITING + "{", FIRST_TOKENS + "_count{")):
                name = line.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    left = f"{FIRST_TOKENS}_count"
    before = metrics()
    assert WAITING in before and left in before
    assert call(pod, "/v1/chat/completions", chat(pod, max_completion_tokens=4))[0] == 200
    deadline = time.monotonic() + 10  # stats reach the logger with the engine's next output
    while metrics()[left] <= before[left] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metrics()[left] > before[left]


def tenant_counters(pod: dict[str, Any]) -> dict[str, float]:
    """The guard's per-tenant counters on the replica's /metrics, by their full series name."""
    with urllib.request.urlopen(pod["base"] + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {name: float(value) for line in text.splitlines() if line.startswith("vllm_gke_tenant_")
            for name, value in [line.rsplit(" ", 1)]}


def stream(pod: dict[str, Any], path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed request's events, as the client gets them."""
    req = urllib.request.Request(pod["base"] + path, data=json.dumps({**body, "stream": True}).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-vllm-gke-issuer": pod["issuer"]})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        lines = resp.read().decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_each_tenant_requests_tokens_are_counted_as_vllm_reports_them(pod):
    """Chargeback: prompt and generated tokens per tenant and model, vLLM's own count for each
    request - a streamed one too, though its client asked for no usage and got none - and each
    request's outcome."""
    tenant = pod["tenant"]
    series = f'{{model="{pod["model"]}",tenant="{tenant}"}}'
    prompt, generated = (f"vllm_gke_tenant_{k}_tokens_total{series}" for k in ("prompt", "generation"))
    ok = f'vllm_gke_tenant_requests_total{{model="{pod["model"]}",outcome="ok",tenant="{tenant}"}}'
    refused = ok.replace('outcome="ok"', 'outcome="refused"')
    before = tenant_counters(pod)
    assert before[ok] >= 0 and before[refused] >= 0  # every series exists from the start

    request = chat(pod, max_completion_tokens=16)
    status, body = call(pod, "/v1/chat/completions", request)
    assert status == 200
    answered = body["usage"]
    # The same request streamed, with no usage asked for: the client gets none (the wire is unchanged).
    events = stream(pod, "/v1/chat/completions", request)
    assert events and all(e.get("usage") is None for e in events)
    # A completion streamed with usage asked for: what the client is told is what is counted.
    events = stream(pod, "/v1/completions", {"model": pod["model"], "prompt": "Hello there", "max_tokens": 8,
                                             "stream_options": {"include_usage": True}})
    (told,) = [e["usage"] for e in events if e.get("usage")]
    status, _ = call(pod, "/v1/chat/completions", chat(pod, model="no-such-model", max_completion_tokens=8))
    assert status == 404  # vLLM's own refusal: the tenant's fault, not the service's

    after = tenant_counters(pod)
    assert after[prompt] - before[prompt] == 2 * answered["prompt_tokens"] + told["prompt_tokens"]
    assert after[generated] - before[generated] == 2 * answered["completion_tokens"] + told["completion_tokens"]
    assert after[ok] - before[ok] == 3 and after[refused] - before[refused] == 1


CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _spans_of(pod: dict[str, Any], request_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """The spans of the trace whose vLLM span is this request's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = list(pod["receiver"].spans)
        ours = [s for s in spans if s["name"] == "llm_request" and request_id in str(s["attributes"].get("gen_ai.request.id"))]
        if ours:
            trace = ours[0]["trace_id"]
            found = [s for s in spans if s["trace_id"] == trace]
            if any(s["name"] == "vllm-gke tenant request" for s in found):
                return found
        time.sleep(0.2)
    raise AssertionError(f"no spans for {request_id}: {pod['receiver'].spans[-5:]}")


def test_a_tenant_request_is_traced_under_the_guards_span(pod):
    # The client's own trace context, sampled: dropped, so it cannot choose the trace or the rate.
    status, body = call(pod, "/v1/chat/completions", chat(pod, max_completion_tokens=16),
                        extra={"traceparent": f"00-{CLIENT_TRACE}-b7ad6b7169203331-01", "tracestate": "x=1"})
    assert status == 200, body
    spans = _spans_of(pod, body["id"])
    (guard,) = [s for s in spans if s["name"] == "vllm-gke tenant request"]
    (vllm,) = [s for s in spans if s["name"] == "llm_request"]
    assert guard["trace_id"] != CLIENT_TRACE and guard["parent"] == ""  # a root of the guard's own
    assert vllm["parent"] == guard["span_id"]  # vLLM's span continues the guard's
    attrs = guard["attributes"]
    assert attrs["vllm_gke.tenant"] == pod["tenant"] and attrs["http.route"] == "/v1/chat/completions"
    assert attrs["gen_ai.request.model"] == pod["model"] and attrs["vllm_gke.outcome"] == "ok"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"] > 0
    assert attrs["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"] == vllm["attributes"][
        "gen_ai.usage.prompt_tokens"]
    assert guard["resource"]["service.name"] == vllm["resource"]["service.name"] != "unknown_service"
    assert set(pod["receiver"].paths) == {"/v1/traces"}


def test_a_tenant_with_subjects_is_only_its_listed_subject(pod):
    """The guard inside the real server maps the verified issuer and subject headers to the tenant:
    another identity of the same public issuer is refused in OpenAI's format before vLLM sees it."""
    def as_subject(subject: Optional[str]) -> tuple[int, dict[str, Any]]:
        headers = {"content-type": "application/json", "x-vllm-gke-issuer": LISTED_ISSUER}
        if subject is not None:
            headers["x-vllm-gke-subject"] = subject
        req = urllib.request.Request(pod["base"] + "/v1/chat/completions", method="POST", headers=headers,
                                     data=json.dumps(chat(pod, max_completion_tokens=8)).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, body = as_subject(LISTED_SUBJECT)
    assert status == 200, body
    for subject in ("999999999999999999999", None):
        status, body = as_subject(subject)
        assert status == 403 and body["error"]["type"] == "permission_error", body
        assert "lists (jwt.subjects)" in body["error"]["message"]
