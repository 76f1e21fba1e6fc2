"""Prefill/decode disaggregation, the cluster side: the pods' roles, the routing sidecar, the picker's P/D
scheduling, the prefill pods' paths, and who may send vLLM kv_transfer_params (the guard, the identity
extension). The tuned stack's llama-70b-pd is the disaggregated model; the real vLLM and the real control
plane run in test_guard_in_vllm.py-style and test_on_cluster.py-style tests at the end."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_guard import call, error, forwarded, guarded, status
from tests.test_identity_extension import issuers  # noqa: F401, F811 (its fixture: a JWKS server)
from vllm_gke.components.model.disaggregation_cluster import (
    DECODE_ENGINE_PORT,
    PREFILL_HEADER,
    SIDECAR_IMAGE,
    UCX_PORTS,
    disaggregated_pod,
    pd_picker_config,
    prefill_ingress,
    role_guard_config,
)
from vllm_gke.components.model.fallback import shared_callers
from vllm_gke.components.model.picker import PickerSpec, picker_config_data
from vllm_gke.components.model.serving_api import IDENTITY_STRIPS
from vllm_gke.images.vllm_gke_guard.kv_transfer import PREFILL_LEG
from vllm_gke.images.vllm_gke_identity.salt import BadBody, salted
from vllm_gke.infra.contracts.disaggregation_cluster import ROWS, _pd_config_problems
from vllm_gke.infra.plan import Plan, read_stack_config, run_program

MODEL = "llama-70b-pd"


@pytest.fixture(scope="module")
def tuned() -> Plan:
    return run_program("tuned", read_stack_config("tuned"))


def _doc(plan: Plan, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in plan.manifests() if d["kind"] == kind and d["metadata"]["name"] == name)


def _template(plan: Plan, name: str) -> dict[str, Any]:
    return _doc(plan, "Deployment", name)["spec"]["template"]


def _guard_of(container: dict[str, Any]) -> dict[str, Any]:
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG"))


# --- the plan ----------------------------------------------------------------------------------

def test_the_prefill_pool_is_its_own_workload_with_scaling_budget_and_scrape(tuned):
    prefill = _doc(tuned, "Deployment", f"{MODEL}-prefill")
    labels = prefill["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/role"] == "prefill" and labels["vllm-gke.io/model"] == MODEL
    so = _doc(tuned, "ScaledObject", f"{MODEL}-prefill")["spec"]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 2)
    assert so["scaleTargetRef"]["name"] == f"{MODEL}-prefill"
    pdb = _doc(tuned, "PodDisruptionBudget", f"{MODEL}-prefill")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"]["vllm-gke.io/serving-pool"] == "prefill"
    assert _doc(tuned, "PodMonitoring", f"{MODEL}-prefill")["spec"]["endpoints"][0]["port"] == "http"
    vllm = prefill["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-transfer-config" in vllm["args"] and vllm["args"][vllm["args"].index("--port") + 1] == "8000"
    assert prefill["spec"]["template"]["spec"]["nodeSelector"]["vllm-gke.io/node-pool"] == "h100"
    # No routing sidecar on a prefill pod (docs/disaggregation.md: decode only).
    assert all(c["name"] != "routing-sidecar" for c in prefill["spec"]["template"]["spec"]["initContainers"])


def test_decode_pods_run_the_routing_sidecar_in_front_of_vllm(tuned):
    t = _template(tuned, f"{MODEL}-short")
    assert t["metadata"]["labels"]["llm-d.ai/role"] == "decode"
    (sidecar,) = [c for c in t["spec"]["initContainers"] if c["name"] == "routing-sidecar"]
    assert sidecar["image"] == SIDECAR_IMAGE.uri == "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.10.0"
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][:4] == ["--port=8100", f"--model-server-port={DECODE_ENGINE_PORT}", "--kv-connector=nixlv2",
                                   "--secure-proxy=false"]
    vllm = t["spec"]["containers"][0]
    assert vllm["args"][vllm["args"].index("--port") + 1] == str(DECODE_ENGINE_PORT)
    assert vllm["ports"] == [{"name": "http", "containerPort": DECODE_ENGINE_PORT}]
    guard = _guard_of(vllm)
    assert guard["trustedPeers"] == ["127.0.0.1"] and guard["kvTransfer"] == "routing-sidecar"
    # The pool's port is the P/D front's, before the sidecar (tests/test_pd_front.py).
    assert _doc(tuned, "InferencePool", MODEL)["spec"]["targetPorts"] == [{"number": 8000}]


def test_plain_pools_are_untouched(tuned):
    t = _template(tuned, "llama-70b-short")
    assert "llm-d.ai/role" not in t["metadata"]["labels"]
    assert all(c["name"] != "routing-sidecar" for c in t["spec"].get("initContainers") or [])
    assert _guard_of(t["spec"]["containers"][0]).get("kvTransfer", "refuse") == "refuse"


def test_the_pool_selects_both_roles_and_the_picker_schedules_them(tuned):
    pool = _doc(tuned, "InferencePool", MODEL)["spec"]["selector"]["matchLabels"]
    for name in (f"{MODEL}-short", f"{MODEL}-prefill"):
        labels = _template(tuned, name)["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in pool.items()), name
    config = yaml.safe_load(_doc(tuned, "ConfigMap", f"{MODEL}-router-epp")["data"]["default-plugins.yaml"])
    assert [p["name"] for p in config["schedulingProfiles"]] == ["prefill", "decode"]
    decider = next(p for p in config["plugins"] if p["type"] == "prefix-based-pd-decider")
    assert decider["parameters"] == {"nonCachedTokens": 256}  # the stack's minPromptTokens
    assert list(_pd_config_problems("x", config)) == []
    plain = yaml.safe_load(_doc(tuned, "ConfigMap", "llama-70b-router-epp")["data"]["default-plugins.yaml"])
    assert [p["name"] for p in plain["schedulingProfiles"]] == ["default"]


def test_the_prefill_pods_paths(tuned):
    policy = _doc(tuned, "NetworkPolicy", f"{MODEL}-prefill-ingress")["spec"]
    assert policy == prefill_ingress(MODEL)
    (decoders, scrapers) = policy["ingress"]
    assert decoders["from"] == [{"podSelector": {"matchLabels": {"vllm-gke.io/model": MODEL, "llm-d.ai/role": "decode"}}}]
    assert {"protocol": "TCP", "port": UCX_PORTS[0], "endPort": UCX_PORTS[-1]} in decoders["ports"]
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 8000}]
    mesh = _doc(tuned, "AuthorizationPolicy", f"{MODEL}-prefill-decode-only")["spec"]
    assert mesh["action"] == "DENY" and mesh["rules"][0]["from"][0]["source"] == {
        "notPrincipals": ["*/ns/vllm/sa/vllm-server"], "notIpBlocks": [tuned.config.cluster.pods_cidr]}
    assert _doc(tuned, "Service", f"{MODEL}-prefill-pods")["spec"]["clusterIP"] == "None"
    # The decode leg's token travels on: the prefill pod's mesh verifies it again.
    callers = {t.jwt.issuer for t in shared_callers(tuned.config, tuned.config.model(MODEL))}
    forwarded_by = {r["issuer"]: r["forwardOriginalToken"] for d in tuned.manifests()
                    if d["kind"] == "RequestAuthentication" and d["metadata"]["namespace"] == "vllm"
                    for r in d["spec"]["jwtRules"]}
    assert callers and all(forwarded_by[i] for i in callers)


def test_the_prefill_pods_paths_row_needs_the_token_forwarded(tuned):
    from vllm_gke.infra.contracts.disaggregation_cluster import prefill_pods_admit_their_decoders

    assert prefill_pods_admit_their_decoders(tuned) == []
    plan = dataclasses.replace(tuned, resources=copy.deepcopy(tuned.resources))
    for r in plan.resources:
        if r.props.get("kind") == "RequestAuthentication":
            for rule in r.props["spec"]["jwtRules"]:
                rule["forwardOriginalToken"] = False
    assert any("forwardOriginalToken off" in p for p in prefill_pods_admit_their_decoders(plan))


def test_every_contract_row_holds_on_the_tuned_stack(tuned):
    assert [(r.check.__name__, p) for r in ROWS for p in r.check(tuned)] == []


def test_the_identity_extension_strips_every_routing_header():
    assert {PREFILL_HEADER, "x-kv-cache-source-host-port", "x-encoder-hosts-ports",
            "x-data-parallel-host-port"} <= set(IDENTITY_STRIPS)


# --- the pieces --------------------------------------------------------------------------------

def _server_template() -> dict[str, Any]:
    return {"metadata": {"labels": {"vllm-gke.io/model": "m"}, "annotations": {}},
            "spec": {"initContainers": [], "containers": [{
                "name": "vllm", "args": ["/models/m", "--host", "0.0.0.0", "--port", "8000"],
                "ports": [{"name": "http", "containerPort": 8000}],
                "env": [{"name": "GKE_LLM_GUARD_CONFIG", "value": json.dumps({"trustedPeers": ["127.0.0.6"]})}]}]}}


def test_ucx_listens_inside_the_kernels_ephemeral_range():
    """UCX keeps only the part of UCX_TCP_PORT_RANGE inside ip_local_port_range (Linux: 32768-60999)."""
    assert 32768 <= UCX_PORTS[0] and UCX_PORTS[-1] <= 60999 and len(UCX_PORTS) >= 4 * 8


def test_a_worker_takes_the_role_label_alone():
    out = disaggregated_pod(_server_template(), "decode", worker=True)
    assert out["metadata"]["labels"]["llm-d.ai/role"] == "decode"
    assert out["spec"] == _server_template()["spec"]


def test_prefill_pods_keep_their_port_and_open_nixl_past_the_mesh():
    out = disaggregated_pod(_server_template(), "prefill", [{"name": "UCX_TLS", "value": "cuda_copy,tcp"}])
    vllm = out["spec"]["containers"][0]
    assert vllm["args"][-1] == "8000" and not out["spec"]["initContainers"]
    assert out["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"].startswith("5600,40000,40001")
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["UCX_TLS"] == "cuda_copy,tcp" and env["UCX_TCP_PORT_RANGE"] == "40000-40031"
    assert json.loads(env["GKE_LLM_GUARD_CONFIG"]) == {"trustedPeers": ["127.0.0.6"], "kvTransfer": "prefill-leg",
                                                        "unmetered": True}


def test_role_guard_config_never_widens_a_plain_pool():
    assert role_guard_config({"trustedPeers": ["127.0.0.6"]}, "decode") == {
        "trustedPeers": ["127.0.0.1"], "kvTransfer": "routing-sidecar"}


def test_the_prefill_pods_guard_meters_nothing_and_sheds_to_no_fallback(tuned):
    """The decode pod's guard limits and counts each request once; its prefill leg on a prefill pod is the
    same request (store.py keys the shared limit per tenant, usage_report sums every pod)."""
    shape = {"globalLimits": {"host": "h", "port": 1}, "fallback": {"model": "m"}, "overload": {"queueSloSeconds": 1}}
    assert role_guard_config(shape, "prefill") == {
        "globalLimits": {"host": "h", "port": 1}, "overload": {"queueSloSeconds": 1}, "kvTransfer": "prefill-leg",
        "unmetered": True}
    assert "unmetered" not in role_guard_config(shape, "decode") and "fallback" in role_guard_config(shape, "decode")
    prefill = _guard_of(_template(tuned, f"{MODEL}-prefill")["spec"]["containers"][0])
    assert prefill["unmetered"] is True and "fallback" not in prefill
    assert "unmetered" not in _guard_of(_template(tuned, f"{MODEL}-short")["spec"]["containers"][0])


def test_each_pools_nixl_transport_knows_the_other_pools_machines(tuned, monkeypatch):
    """`transport: auto` takes RDMA where both pools' machines have it (disaggregation.transport): each pod
    is told the other role's node pool, as the plan's table is (no machine of tuned's has RDMA: pretend)."""
    from vllm_gke.components.model import disaggregation

    def ucx(plan: Plan, name: str) -> str:
        vllm = _template(plan, name)["spec"]["containers"][0]
        return next(e["value"] for e in vllm["env"] if e["name"] == "UCX_TLS")

    assert {ucx(tuned, f"{MODEL}-{p}") for p in ("prefill", "short")} == {disaggregation.UCX_TLS["tcp"]}
    monkeypatch.setattr(disaggregation, "rdma_ready", lambda pool: True)
    plan = run_program("tuned", read_stack_config("tuned"))
    assert {ucx(plan, f"{MODEL}-{p}") for p in ("prefill", "short")} == {disaggregation.UCX_TLS["rdma"]}


def test_a_pools_in_place_rollout_waits_behind_the_prefill_pools_beside_it():
    from vllm_gke.components.model.serving_plan import wait_behind
    from vllm_gke.infra.config import parse

    def waits(prefill_max: int) -> float:
        values = read_stack_config("tuned")
        pd_model = next(m for m in values["vllm-gke:models"] if m["name"] == MODEL)
        pd_model["disaggregation"]["prefill"].update(maxReplicas=prefill_max)
        cfg = parse(values)
        return wait_behind(cfg, "h100", cfg.model("llama-70b"), None, "short")

    assert waits(2) > waits(1) > 0


def test_the_pd_picker_config_follows_upstreams_layout_and_is_checked():
    base = picker_config_data(PickerSpec(), [0])
    out = pd_picker_config(base, 64)
    assert [p["type"] for p in out["plugins"][-4:]] == ["prefill-filter", "decode-filter", "prefix-based-pd-decider",
                                                        "disagg-profile-handler"]
    assert [p["plugins"][0]["pluginRef"] for p in out["schedulingProfiles"]] == ["prefill-filter", "decode-filter"]
    assert out["schedulingProfiles"][0]["plugins"][1:] == base["schedulingProfiles"][0]["plugins"]
    assert base["schedulingProfiles"][0]["name"] == "default"  # not changed in place
    broken = copy.deepcopy(out)
    broken["plugins"][-2]["parameters"] = {"nonCachedTokens": 0, "minPromptTokens": 3}
    broken["plugins"][-1]["parameters"]["profiles"]["prefil"] = "x"
    broken["schedulingProfiles"][1]["plugins"].pop(0)
    found = list(_pd_config_problems("p", broken))
    assert any("minPromptTokens is not a field" in p for p in found)
    assert any("nonCachedTokens 0 turns P/D off" in p for p in found)
    assert any("['prefil']" in p for p in found)
    assert any("decode profile does not filter" in p for p in found)


# --- kv_transfer_params: the guard and the identity extension -----------------------------------

CLIENT_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2],
                 "remote_host": "10.0.0.9", "remote_port": 5600}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("policy", [None, "refuse", "prefill-leg"])
def test_the_guard_refuses_a_clients_kv_transfer_params(path, policy):
    mw, app = guarded(**({"kvTransfer": policy} if policy else {}))
    body = {**CHAT, "kv_transfer_params": CLIENT_PARAMS} if "chat" in path else {
        "model": "m", "prompt": "hi", "max_tokens": 4, "kv_transfer_params": CLIENT_PARAMS}
    sent = call(mw, body, path=path)
    assert status(sent) == 400 and error(sent)["param"] == "kv_transfer_params", sent
    assert not app.seen


@pytest.mark.parametrize("raw", [
    # The key escaped (json reads it as the key), a duplicate (the last wins), null (still set).
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"kv\\u005ftransfer_params":{"x":1}}',
    b'{"kv_transfer_params":{"x":1},"model":"m","messages":[],"kv_transfer_params":{"do_remote_decode":true}}',
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"kv_transfer_params":null}',
])
def test_the_guard_reads_the_key_as_vllm_does(raw):
    mw, app = guarded()
    sent = call(mw, raw=raw, path="/v1/chat/completions")
    assert status(sent) == 400 and not app.seen, sent


XARGS_BODIES = [  # what vLLM's engine reads out of extra_args = vllm_xargs (v1/request.py:123-131)
    {**CHAT, "vllm_xargs": {"kv_transfer_params": 0}},  # a non-dict kills the engine core (base_scheduler.py:204)
    {**CHAT, "vllm_xargs": {"ec_transfer_params": "x", "other": 1}},
    {**CHAT, "vllm_xargs": {"kv_cache_report_mode": "full"}},
]


@pytest.mark.parametrize("body", XARGS_BODIES)
@pytest.mark.parametrize("policy", [None, "refuse", "prefill-leg", "routing-sidecar"])
def test_the_guard_refuses_vllm_xargs_carrying_the_engines_keys_under_every_policy(body, policy):
    mw, app = guarded(**({"kvTransfer": policy} if policy else {}), trustedPeers=["127.0.0.6", "127.0.0.1"])
    for path in ("/v1/chat/completions", "/v1/completions"):
        sent = call(mw, body, path=path, client="127.0.0.1")
        assert status(sent) == 400 and error(sent)["param"] == "vllm_xargs", sent
        assert error(sent)["code"] == "kv_transfer_params_refused"
    # Escaped (json reads the keys as vLLM does); other xargs pass.
    sent = call(mw, raw=b'{"model":"m","messages":[],"max_tokens":4,"vllm\\u005fxargs":{"kv\\u005ftransfer_params":0}}',
                path="/v1/chat/completions", client="127.0.0.1")
    assert status(sent) == 400 and not app.seen, sent
    assert status(call(mw, {**CHAT, "vllm_xargs": {"session_id": "a"}}, path="/v1/chat/completions",
                       client="127.0.0.1")) == 200


def test_the_key_inside_a_prompt_passes():
    mw, app = guarded()
    body = {**CHAT, "messages": [{"role": "user", "content": 'say "kv_transfer_params" and \\u0041'}]}
    assert status(call(mw, body, path="/v1/chat/completions")) == 200 and app.seen


def test_the_guards_prefill_leg_is_the_sidecars():
    """The one kv_transfer_params a prefill pod's guard admits is what the routing sidecar sends on its
    prefill leg (llm-d-router v0.10.0 pkg/sidecar/proxy/connector_nixlv2.go:161-170): a copy kept in
    the image, which the plan (infra/) may not import."""
    assert PREFILL_LEG == {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                           "remote_block_ids": None, "remote_host": None, "remote_port": None}


def test_a_prefill_pod_admits_the_sidecars_prefill_leg_alone():
    mw, app = guarded(kvTransfer="prefill-leg")
    assert status(call(mw, {**CHAT, "kv_transfer_params": PREFILL_LEG}, path="/v1/chat/completions")) == 200
    assert forwarded(app)["kv_transfer_params"] == PREFILL_LEG
    leg = {**PREFILL_LEG, "remote_host": "10.0.0.9"}
    assert status(call(mw, {**CHAT, "kv_transfer_params": leg}, path="/v1/chat/completions")) == 400


def test_a_decode_pods_guard_passes_the_sidecars_legs_from_its_loopback_peer_only():
    mw, app = guarded(kvTransfer="routing-sidecar", trustedPeers=["127.0.0.1"])
    body = {**CHAT, "kv_transfer_params": CLIENT_PARAMS}
    assert status(call(mw, body, path="/v1/chat/completions", client="127.0.0.1")) == 200
    # Past the sidecar (Envoy's passthrough straight to vLLM's port): refused.
    sent = call(mw, body, path="/v1/chat/completions", client="127.0.0.6")
    assert status(sent) == 403 and len(app.seen) == 1


def test_an_unknown_policy_is_an_error_at_start():
    with pytest.raises(ValueError, match="kvTransfer"):
        guarded(kvTransfer="allow")


@pytest.mark.parametrize("body", [
    b'{"model":"m","kv_transfer_params":{"remote_host":"10.0.0.9"}}',
    b'{"model":"m","kv\\u005ftransfer_params":{}}',
])
def test_the_identity_extension_refuses_kv_transfer_params(body):
    with pytest.raises(BadBody, match="kv_transfer_params"):
        salted(body, "s")
    assert salted(b'{"model":"m","prompt":"kv_transfer_params"}', "s").endswith(b'"cache_salt":"s"}')


@pytest.mark.parametrize("body", XARGS_BODIES)
def test_the_identity_extension_refuses_vllm_xargs_carrying_the_engines_keys(body):
    with pytest.raises(BadBody, match="vllm_xargs") as refused:
        salted(json.dumps(body).encode(), "s")
    assert refused.value.param == "vllm_xargs" and refused.value.code == "kv_transfer_params_refused"
    with pytest.raises(BadBody):
        salted(b'{"model":"m","vllm\\u005fxargs":{"kv_transfer_params":0}}', "s")
    assert salted(b'{"model":"m","vllm_xargs":{"session_id":"kv_transfer_params"}}', "s").endswith(b'"cache_salt":"s"}')


def test_the_identity_extension_answers_a_clients_kv_transfer_params_400_before_the_picker(issuers):  # noqa: F811
    """On a salted picker URL (every POST route of a P/D model's tenant URLs: the contract checks), through
    the ext_proc stream: OpenAI's error naming the field, and the stream goes on."""
    from tests.test_identity_extension import claims, config_of, post, refusal, run, streamed_body

    token = issuers["keys"]["/a"].sign(claims())
    answers = run(config_of(issuers["base"]), [
        *post("/support/llama/v1/chat/completions", token, json.dumps({**CHAT, "kv_transfer_params": CLIENT_PARAMS}).encode()),
        *post("/support/llama/v1/completions", token, b'{"prompt": "kv_transfer_params"}')])
    status, answer = refusal(answers[0])
    assert status == 400 and answer["error"]["param"] == "kv_transfer_params"
    assert answer["error"]["code"] == "kv_transfer_params_refused"
    assert json.loads(streamed_body(answers[-1]))["prompt"] == "kv_transfer_params"


# --- the real vLLM ------------------------------------------------------------------------------

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "")


@pytest.fixture(scope="module", params=["prefill", "short"])
def pod(request, tuned, tmp_path_factory):
    """serve.py running the pinned vLLM (its engine core a stand-in) with the tuned stack's prefill (or
    decode: short) pod's flags, --kv-transfer-config included, behind the guard with that pod's own config
    (its trusted peers too): a dict of its URL, tenant headers, served model and engine log. Its tenants three
    requests a minute: the prefill pod's guard takes them (before the prefill runs), the decode pod's takes
    none for the sidecar's decode leg (the prefill pod's guard took them)."""
    if not VLLM_PYTHON:
        if os.environ.get("CI"):
            pytest.fail("CI runs the guard inside the real vLLM: VLLM_PYTHON must be set")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    import subprocess
    import sys
    import time

    from benchmarks.guard_overhead import stop
    from benchmarks.vllm_server import MIDDLEWARE, REPO, bench_guard_config, flag, server_args
    from tests.test_guard_in_vllm import _free_port

    tmp = tmp_path_factory.mktemp(request.param)
    subprocess.run([VLLM_PYTHON, "-m", "benchmarks.vllm_fake_engine", "make-model", str(tmp / "model")], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    vllm = _template(tuned, f"{MODEL}-{request.param}")["spec"]["containers"][0]
    args, own = list(vllm["args"]), _guard_of(vllm)
    guard = {**bench_guard_config(own), "trustedPeers": own["trustedPeers"]}
    guard["issuers"] = {iss: {**t, "requestsPerMinute": 3} for iss, t in guard["issuers"].items()}
    assert "--kv-transfer-config" in args
    port, marker = _free_port(), tmp / "warm"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "images"), str(REPO)]),
               GKE_LLM_GUARD_CONFIG=json.dumps(guard), GKE_LLM_WARM_MARKER=str(marker), GKE_LLM_WARMUP_PAUSE_SECONDS="1",
               GKE_LLM_SERVER_COMMAND=f"{VLLM_PYTHON} -m benchmarks.vllm_fake_engine serve",
               FAKE_ENGINE_LOG=str(tmp / "engine.jsonl"))
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, str(REPO / "images" / "serve.py"),
                             *server_args(args, tmp / "model", port, MIDDLEWARE["guard"])],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    try:
        assert marker.exists(), (tmp / "server.log").read_text()[-3000:]
        # Behind the picker: the tenant's URL and its objective (the identity extension sets it), the
        # issuer Istio wrote from the token.
        issuer, tenant = next(iter(guard["issuers"].items()))
        prefix = next(p for p in guard["pathPrefixes"] if p.startswith(f"/{tenant['tenant']}/"))
        yield {"role": request.param, "port": port, "path": f"{prefix}/v1/chat/completions", "log": tmp / "engine.jsonl",
               "model": flag(args, "--served-model-name", ""), "peer": guard["trustedPeers"][0],
               "headers": {"x-vllm-gke-issuer": issuer, guard["objectiveHeader"]: tenant["objective"]}}
    finally:
        stop(proc)
        log.close()


def _post(pod: dict[str, Any], body: dict[str, Any], peer: str = "") -> tuple[int, dict[str, Any]]:
    """POST from `peer` (default the pod's trusted one: Envoy's 127.0.0.6 on a prefill pod, the routing
    sidecar's 127.0.0.1 on a decode pod; the whole of 127/8 is this host's loopback)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", pod["port"], timeout=60, source_address=(peer or pod["peer"], 0))
    try:
        conn.request("POST", pod["path"], json.dumps(body), {"content-type": "application/json", **pod["headers"]})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


# The routing sidecar's decode leg: the prefill's answer (connector_nixlv2.go:276-290).
DECODE_LEG = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "prefill-engine",
              "remote_block_ids": [0, 1], "remote_host": "10.0.0.9", "remote_port": 5600, "tp_size": 4}


def test_in_vllm_kv_transfer_params_reach_the_engine_from_the_routing_sidecar_alone(pod):
    def engine_requests() -> int:
        return len(pod["log"].read_text().splitlines())

    body = {"model": pod["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    before = engine_requests()
    assert _post(pod, body)[0] == 200
    if pod["role"] == "prefill":
        # A client's own (or anything but the sidecar's prefill leg) is refused; the prefill leg is served.
        code, answer = _post(pod, {**body, "kv_transfer_params": CLIENT_PARAMS})
        assert code == 400 and answer["error"]["param"] == "kv_transfer_params", answer
        code, answer = _post(pod, {**body, "kv_transfer_params": PREFILL_LEG})
        assert code == 200, answer
    else:
        # The sidecar's decode leg, from its loopback peer, is served; the same straight from Envoy's
        # passthrough (vLLM's port reached past the sidecar) is refused.
        code, answer = _post(pod, {**body, "kv_transfer_params": DECODE_LEG})
        assert code == 200, answer
        code, answer = _post(pod, {**body, "kv_transfer_params": DECODE_LEG}, peer="127.0.0.6")
        assert code == 403, answer
    assert engine_requests() == before + 2


def test_in_vllm_the_prefill_pod_limits_and_counts_no_usage_the_decode_pod_counts_its_decode_leg(pod):
    import urllib.request

    body = {"model": pod["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if pod["role"] == "prefill":  # three a minute, taken here: the fourth never reaches the engine
        assert [_post(pod, {**body, "kv_transfer_params": PREFILL_LEG})[0] for _ in range(4)][-1] == 429
    else:  # the sidecar's decode legs take no window
        assert [_post(pod, {**body, "kv_transfer_params": DECODE_LEG})[0] for _ in range(4)] == [200] * 4
    with urllib.request.urlopen(f"http://127.0.0.1:{pod['port']}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith(("vllm_gke_tenant_requests_total{", "vllm_gke_tenant_prompt_tokens_total{")))
    assert (counted == 0) == (pod["role"] == "prefill"), counted


# --- the real control plane ---------------------------------------------------------------------

def test_on_the_control_plane_both_pools_schedule_drain_and_hold_their_floors(tuned):
    from tests.k8s_cluster import CONTROL_PLANE, CRD_FILES, CRDS, ControlPlane, apply_stack, crds_established

    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run this")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-pd-")))
    try:
        for name in CRD_FILES:
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        apply_stack(cp, tuned)

        def available() -> bool:  # this model's two pools (the stack's other pools are their tests')
            ds = {d["metadata"]["name"]: d.get("status") or {} for d in cp.get("deployments", "-n", "vllm")["items"]}
            return all(ds.get(f"{MODEL}-{p}", {}).get("availableReplicas") == ds.get(f"{MODEL}-{p}", {}).get("replicas")
                       == ds.get(f"{MODEL}-{p}", {}).get("updatedReplicas") == 1 for p in ("prefill", "short"))

        cp.wait_until("the P/D model's pools available", available, 180)
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cp.get("nodes")["items"]}

        def pods(role: str) -> list[dict[str, Any]]:
            return [p for p in cp.get("pods", "-n", "vllm", "-l", f"vllm-gke.io/model={MODEL},llm-d.ai/role={role}")["items"]
                    if not p["metadata"].get("deletionTimestamp")]

        for role in ("prefill", "decode"):
            (pod,) = pods(role)  # each at its floor, 1
            node = nodes[pod["spec"]["nodeName"]]
            assert node["vllm-gke.io/node-pool"] == "h100" and node["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
        # The routing sidecar as the API server stored it: a native sidecar, before vLLM.
        (decode,) = pods("decode")
        assert [c.get("restartPolicy") for c in decode["spec"]["initContainers"] if c["name"] == "routing-sidecar"] == ["Always"]
        # A node upgrade's drain through the Eviction API: the prefill pool's budget lets its one pod go and
        # it comes back on another node of the pool.
        (prefill,) = pods("prefill")
        first = prefill["spec"]["nodeName"]
        done = cp.kubectl("drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s",
                          check=False, timeout=90)
        assert done.returncode == 0, done.stderr[-600:]
        cp.wait_until("the prefill pool back on another node", lambda: available() and all(
            p["spec"].get("nodeName") not in (None, first) for p in pods("prefill")), 120)
        (moved,) = pods("prefill")
        assert moved["spec"]["nodeName"] != first and nodes[moved["spec"]["nodeName"]]["vllm-gke.io/node-pool"] == "h100"
        cp.kubectl("uncordon", first)
        # Its floor is 1 (a decode pod sent to no prefill pod fails the request): KEDA never takes it to 0.
        so = cp.get("scaledobject", f"{MODEL}-prefill", "-n", "vllm")
        assert so["spec"]["minReplicaCount"] == 1
    finally:
        cp.down()
