"""docs/guides/first-request.md, run as written: its curl commands (the real curl) and its Python
(the OpenAI SDK, from the pinned vLLM's environment) against the dev stack's qwen-7b replica as
the pod runs it (serve.py, the pinned vLLM's API server with the guard, a stand-in engine;
tests/vllm_pod.py) behind a stand-in for its Envoy sidecar that applies the plan's mesh policies
(tests/mesh_sidecar.py). Each block the page marks `<!-- tested: NAME -->` is read from the page,
so the page cannot drift from what runs. Only BASE_URL and TOKEN are the test's own, and the
answers must be the ones the page shows.

The tokens are signed with the test's key, which the stand-in trusts for the tenant's issuer:
the page's commands that get a token (gcloud, google-auth, an identity provider) are not run.
Needs VLLM_PYTHON (a Python with the pinned vLLM, and so the OpenAI SDK) and curl; without them
the page's own checks still run, the requests skip, and under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from benchmarks.vllm_server import REPO, longest_prompt_container
from tests.mesh_sidecar import Issuer, Sidecar
from tests.vllm_pod import VLLM_PYTHON, serve_pod
from vllm_gke.components.model.tenant_urls import TenantUrl, tenant_urls

PAGE = REPO / "docs" / "guides" / "first-request.md"
TENANT, MODEL = "dev-team", "qwen-7b"
# The page's blocks that get a token: they need a Google account or an identity provider.
NOT_RUN = ("gcloud auth print-identity-token", "fetch_id_token", "grant_type=client_credentials")


def page_blocks() -> dict[str, str]:
    """The page's fenced blocks, by the name in the `<!-- tested: NAME -->` line above each."""
    found = re.findall(r"<!-- tested: (\S+) -->\n```[^\n]*\n(.*?)```\n", PAGE.read_text(), re.S)
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), names
    return dict(found)


BLOCKS = page_blocks()


def _tenant_url(plans: Any) -> TenantUrl:
    (url,) = [u for u in tenant_urls(plans["dev"].config) if (u.tenant, u.model) == (TENANT, MODEL)]
    return url


def test_every_block_of_the_page_is_run_or_gets_a_token():
    """A block added to the page is tested here, or is one of those that get a token."""
    fences = re.findall(r"(<!-- tested: \S+ -->\n)?```(\w*)\n(.*?)```\n", PAGE.read_text(), re.S)
    untested = [body for marker, _, body in fences if not marker]
    assert untested and all(any(cmd in body for cmd in NOT_RUN) for body in untested), untested
    assert set(BLOCKS) == {
        "url-table", "base-url", "claims", "claims-output", "curl-chat", "curl-stream", "curl-models", "sdk",
        "curl-over-cap", "over-cap", "curl-wrong-model", "wrong-model", "curl-check-token", "expired",
        "bad-signature", "other-issuer", "other-audience", "not-listed", "rate-limited", "sdk-errors",
        "sdk-errors-output"}


def test_the_pages_url_is_the_one_the_plan_prints(plans):
    """The block is what `vllm-gke plan --stack dev` prints for its tenant URLs, as printed."""
    import io

    from rich.console import Console

    from vllm_gke.infra.plan_text import url_lines
    from vllm_gke.infra.report import verdicts

    url = _tenant_url(plans)
    out = io.StringIO()
    console = Console(file=out, width=200)
    for line in url_lines(verdicts(plans["dev"])):
        console.print(line, soft_wrap=True, highlight=False)
    assert BLOCKS["url-table"].strip() == out.getvalue().strip()
    assert f"{url.tenant}, {url.model}: {url.url} ({url.via})" in BLOCKS["url-table"]
    (line,) = BLOCKS["base-url"].splitlines()
    assert line.replace("$(pulumi stack output gatewayAddress -s dev)", "<gatewayAddress>") == f'export BASE_URL="{url.url}"'


def test_the_routes_the_page_lists_are_the_ones_served(plans):
    _, config = longest_prompt_container(plans["dev"], "dev")
    served = {(r["method"], path.removeprefix("/v1")) for path, r in config["routes"].items()}
    (paragraph,) = re.findall(r"Served under the URL.*?admitted\.", PAGE.read_text(), re.S)
    listed, method = set(), ""
    for verb, path in re.findall(r"`(?:(POST|GET) )?(/[a-z/]+)`", paragraph):
        method = verb or method
        listed.add((method, path))
    assert listed == served


def test_the_pages_token_is_the_dev_tenants(plans):
    (tenant,) = [t for t in plans["dev"].config.tenants if t.name == TENANT]
    assert tenant.jwt.subjects
    assert json.loads(BLOCKS["claims-output"]) == {"iss": tenant.jwt.issuer, "aud": tenant.jwt.audiences[0],
                                                   "sub": tenant.jwt.subjects[0]}
    assert f"--audiences={tenant.jwt.audiences[0]}" in PAGE.read_text()


def _need_curl() -> None:
    if shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs the page's curl commands: curl must be on PATH")
        pytest.skip("curl is not installed")


@pytest.fixture(scope="module")
def served(plans, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The dev stack's qwen-7b replica behind the sidecar stand-in: {"base_url", "tokens", "tenant"}."""
    if not VLLM_PYTHON:
        if os.environ.get("CI"):
            pytest.fail("CI runs the first-request page inside the real vLLM: .ci/run installs it and sets VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    plan = plans["dev"]
    args, config = longest_prompt_container(plan, "dev")
    assert config["model"] == MODEL
    # The deployment's guard config as planned (its tenants' caps and limits), the stand-in's
    # 127.0.0.1 trusted in place of the sidecar's 127.0.0.6.
    config = {**config, "trustedPeers": ["127.0.0.1"]}
    (deployment,) = [m for m in plan.manifests() if m["kind"] == "Deployment" and any(
        c["name"] == "vllm" and list(c["args"]) == args for c in m["spec"]["template"]["spec"]["containers"])]
    (tenant,) = [t for t in plan.config.tenants if t.name == TENANT]
    issuer = Issuer()
    with serve_pod(args, config, tmp_path_factory.mktemp("vllm")) as pod:
        sidecar = Sidecar(plan.manifests(), deployment["metadata"]["namespace"],
                          deployment["spec"]["template"]["metadata"]["labels"], {tenant.jwt.issuer: issuer},
                          pod["port"])
        try:
            yield {"base_url": _tenant_url(plans).url.replace("http://<gatewayAddress>", sidecar.url),
                   "tokens": _tokens(issuer, tenant), "tenant": tenant, "pod": pod}
        finally:
            sidecar.close()


def _tokens(issuer: Issuer, tenant: Any) -> dict[str, str]:
    """The tenant's token, and one with each thing the page says the mesh refuses."""
    now = int(time.time())
    claims = {"iss": tenant.jwt.issuer, "aud": tenant.jwt.audiences[0], "sub": tenant.jwt.subjects[0],
              "iat": now, "exp": now + 3600}
    return {"valid": issuer.mint(claims),
            "expired": issuer.mint({**claims, "iat": now - 7200, "exp": now - 3600}),
            "bad-signature": Issuer().mint(claims),
            "other-issuer": issuer.mint({**claims, "iss": "https://auth.example.com/someone-else"}),
            "other-audience": issuer.mint({**claims, "aud": "another-service"}),
            "not-listed": issuer.mint({**claims, "sub": "999999999999999999999"})}


def run_sh(served: dict[str, Any], block: str, token: str = "valid") -> subprocess.CompletedProcess[str]:
    _need_curl()
    # The venv's python3 first on PATH, for the page's python3 one-liner.
    env = dict(os.environ, BASE_URL=served["base_url"], TOKEN=served["tokens"][token],
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.run(["bash", "-c", block], env=env, capture_output=True, text=True, timeout=120)


def run_python(served: dict[str, Any], block: str, token: str = "valid") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(BASE_URL=served["base_url"], TOKEN=served["tokens"][token])
    return subprocess.run([VLLM_PYTHON, "-c", block], env=env, capture_output=True, text=True, timeout=120)


def response(text: str) -> tuple[int, dict[str, str], str]:
    """An HTTP answer as `curl -i` prints it (or as the page shows it): status, headers, body."""
    head, _, body = text.replace("\r\n", "\n").partition("\n\n")
    status, *lines = head.split("\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status.split()[1]), headers, body.strip()


def assert_shown(result: subprocess.CompletedProcess[str], shown: str) -> None:
    """The answer is the page's: its status, each header it shows (Retry-After, a number of
    seconds within the window), and its body (as JSON where it is JSON)."""
    assert result.returncode == 0, result.stderr
    status, headers, body = response(result.stdout)
    want_status, want_headers, want_body = response(shown)
    assert status == want_status, result.stdout
    for name, value in want_headers.items():
        if name == "retry-after":
            assert 1 <= int(headers[name]) <= 60, headers
        else:
            assert headers.get(name) == value, headers
    if want_headers.get("content-type") == "application/json":
        assert json.loads(body) == json.loads(want_body)
    else:
        assert body == want_body


def test_the_claims_check_prints_what_the_page_shows(served):
    result = run_sh(served, BLOCKS["claims"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(BLOCKS["claims-output"])


def test_the_chat_request_is_answered(served):
    result = run_sh(served, BLOCKS["curl-chat"])
    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["message"]["content"]
    assert 0 < body["usage"]["completion_tokens"] <= 64


def test_the_streamed_request_streams_events_then_done(served):
    result = run_sh(served, BLOCKS["curl-stream"])
    assert result.returncode == 0, result.stdout + result.stderr
    events = [line for line in result.stdout.splitlines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in events[:-1]]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_the_model_list_is_the_urls_model_and_checks_the_token(served):
    result = run_sh(served, BLOCKS["curl-models"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["id"] for m in json.loads(result.stdout)["data"]] == [MODEL]
    status, _, body = response(run_sh(served, BLOCKS["curl-check-token"]).stdout)
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [MODEL]


def test_the_sdk_answers_and_streams(served):
    result = run_python(served, BLOCKS["sdk"])
    assert result.returncode == 0, result.stderr
    # The reply, then the same reply streamed (the stand-in engine answers alike): each a line.
    out = result.stdout
    assert out.endswith("\n") and len(out) > 2
    assert out[:len(out) // 2] == out[len(out) // 2:], out


def test_over_the_cap_is_the_pages_400(served):
    assert_shown(run_sh(served, BLOCKS["curl-over-cap"]), BLOCKS["over-cap"])


def test_a_model_the_url_does_not_serve_is_vllms_404(served):
    assert_shown(run_sh(served, BLOCKS["curl-wrong-model"]), BLOCKS["wrong-model"])


@pytest.mark.parametrize("token", ["expired", "bad-signature", "other-issuer", "other-audience", "not-listed"])
def test_each_token_the_mesh_refuses_is_the_pages_answer(served, token):
    assert_shown(run_sh(served, BLOCKS["curl-check-token"], token), BLOCKS[token])


def test_no_token_is_the_pages_403(served):
    req = urllib.request.Request(served["base_url"] + "/models")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    want_status, _, want_body = response(BLOCKS["not-listed"])
    assert refused.value.code == want_status and refused.value.read().decode() == want_body


def sdk_error_lines() -> list[str]:
    return BLOCKS["sdk-errors-output"].splitlines()


def test_the_sdk_sees_the_guards_and_the_meshs_refusals_as_the_page_shows(served):
    cap, expired, _ = sdk_error_lines()
    result = run_python(served, BLOCKS["sdk-errors"])
    assert result.returncode == 0 and result.stdout == cap + "\n", result.stdout + result.stderr
    result = run_python(served, BLOCKS["sdk-errors"], "expired")
    assert result.returncode == 0 and result.stdout == expired + "\n", result.stdout + result.stderr


# Last in the module: it spends the tenant's requests for the next minute.
def test_over_the_rate_limit_is_the_pages_429(served):
    rpm = served["tenant"].rate_limit.requests_per_minute
    req = urllib.request.Request(served["base_url"] + "/models",
                                 headers={"Authorization": f"Bearer {served['tokens']['valid']}"})
    for _ in range(rpm + 1):
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as err:
            assert err.code == 429, err.read()
            break
    else:
        raise AssertionError(f"{rpm + 1} requests in a row were admitted")
    assert_shown(run_sh(served, BLOCKS["curl-check-token"]), BLOCKS["rate-limited"])
    *_, limited = sdk_error_lines()
    result = run_python(served, BLOCKS["sdk-errors"])
    assert result.returncode == 0, result.stderr
    assert limited.count("52") == 1  # the page's example of a Retry-After
    seconds = re.fullmatch(re.escape(limited).replace("52", r"(\d+)"), result.stdout.strip())
    assert seconds and 1 <= int(seconds.group(1)) <= 60, result.stdout


def test_the_refusal_tables_guard_codes_are_the_guards():
    """Each code the table says the guard answers is one the guard's code raises (a renamed code fails)."""
    guard = "\n".join(p.read_text() for p in (REPO / "images" / "vllm_gke_guard").glob("*.py"))
    standby = (REPO / "components" / "scripts" / "standby.py").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in PAGE.read_text().splitlines()
            if re.match(r"^\| \d", line)]
    for status, body, source, *_ in rows:
        codes = re.findall(r"`([a-z_]+)`", body) if "code" in body else []
        where = {"guard": guard, "standby": standby}.get(source)
        for code in codes if where else []:
            assert f'"{code}"' in where, (status, code, source)
    assert {r[2] for r in rows} <= {"mesh", "guard", "vLLM", "standby"}
    assert sum(r[2] == "guard" for r in rows) >= 5
