"""Precise prefix-cache routing (components/model/picker_prefix.py): vLLM 0.34's KV-events flags
(checked by its real parser where VLLM_PYTHON names it), the picker's plugins agreeing with them,
the tenant's cache_salt in block 0 only as vLLM publishes it, the render server apart from the
picker, the index sized by the pool, and the KV-events ports open to the pool's picker's pods alone
(policies/kv_events.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT, manifests_of, vllm_deployments
from tests.k8s_cluster import CONTROL_PLANE, CRD_FILES, CRDS, ControlPlane, apply_stack, crds_established, settle
from vllm_gke.components.model import picker_prefix as pp
from vllm_gke.components.model.gcs_weights import weights_volume
from vllm_gke.components.model.picker import picker_config_data, picker_labels
from vllm_gke.components.model.specs import ModelSpec, PickerSpec, ServingPoolSpec
from vllm_gke.components.model.vllm_argv import KUBELET_EXPANDED, check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import vllm_args
from vllm_gke.components.model.vllm_versions import TPU_RELEASES, release
from vllm_gke.components.model.weights_mount import claim_mount, tokenizer_mount
from vllm_gke.infra.advice import CONFIG_CHECKS
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.plan import Plan, read_stack_config, run_program
from vllm_gke.policies.base import Resource
from vllm_gke.policies.kv_events import events_ports, kv_events_private

MODEL = ModelSpec(name="chat", source="hf://org/repo", shape="llama-3-8b", node_pool="gpu")
POD_IP = "10.8.0.7"


def vllm_python() -> str:
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the KV-events flags against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    return python


def run_in_vllm(program: str, *argv: str) -> Any:
    out = subprocess.run([vllm_python(), "-c", program, *argv], capture_output=True, text=True, cwd=REPO_ROOT,
                         env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def served_argv() -> list[str]:
    return vllm_args(MODEL, ServingPoolSpec()) + pp.kv_events_args(MODEL.name)


def test_the_servers_argv_with_events_parses_in_the_snapshot():
    assert check_argv(served_argv(), load_snapshot("0.34.0")) == []
    assert "--enable-prefix-caching" in served_argv()  # events need the prefix cache (vllm/config/vllm.py:1959)


# The argv the kubelet hands vLLM ($(POD_IP) expanded), parsed by `vllm serve`'s own parser and
# resolved into the engine's config (the platform stubbed to CPU, as this machine has no GPU).
ENGINE_CONFIG = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.check_and_update_config = classmethod(lambda cls, c: None)
platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
argv = json.loads(sys.argv[1])
parser = make_arg_parser(FlexibleArgumentParser())
parser.parse_args(json.loads(sys.argv[2]))  # the whole server argv parses too
args = parser.parse_args(argv)
args.model = args.model_tag
validate_parsed_serve_args(args)
vc = AsyncEngineArgs.from_cli_args(args).create_engine_config()
render = parser.parse_args(json.loads(sys.argv[3]))  # `vllm launch render` takes vllm serve's parser
k = vc.kv_events_config
print(json.dumps({"events": {f: getattr(k, f) for f in ("enable_kv_cache_events", "publisher", "endpoint",
                                                          "replay_endpoint", "topic")},
                  "block_size": vc.cache_config.block_size, "prefix": vc.cache_config.enable_prefix_caching,
                  "render_model": render.model_tag, "render_names": render.served_model_name,
                  "render_mode": render.tokenizer_mode, "render_dtype": render.dtype,
                  "render_tokenizer_revision": render.tokenizer_revision}))
"""


def test_vllm_0_34_reads_the_events_config(tmp_path: Path):
    python = vllm_python()
    model_dir = tmp_path / "model"
    subprocess.run([python, "-m", "benchmarks.vllm_fake_engine", "make-model", str(model_dir)], cwd=REPO_ROOT,
                   check=True, capture_output=True)
    kubelet = {f"$({pp.POD_IP_ENV})": POD_IP}
    events = [a.replace(f"$({pp.POD_IP_ENV})", POD_IP) for a in pp.kv_events_args(MODEL.name)]
    whole = [str(model_dir), *(KUBELET_EXPANDED.get(a, kubelet.get(a, a)) for a in served_argv()[1:])]
    whole = [a.replace(f"$({pp.POD_IP_ENV})", POD_IP) for a in whole]
    model = MODEL.model_copy(update={"extra_args": ["--tokenizer-mode", "mistral", "--tokenizer-revision", "r1"]})
    render = [str(model_dir), *pp.render_args(model)[1:]]
    got = run_in_vllm(ENGINE_CONFIG, json.dumps([str(model_dir), "--enable-prefix-caching", *events]),
                      json.dumps(whole), json.dumps(render))
    assert got["events"] == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
                             "replay_endpoint": "tcp://*:5657", "topic": f"kv@{POD_IP}@chat"}
    assert got["block_size"] == pp.BLOCK_SIZE_TOKENS and got["prefix"] is True
    assert (got["render_model"], got["render_names"], got["render_mode"]) == (str(model_dir), ["chat"], "mistral")
    assert (got["render_dtype"], got["render_tokenizer_revision"]) == (MODEL.dtype, "r1")


# A salted request's blocks cached by vLLM's own BlockPool at the platform's block size, and the
# BlockStored events it publishes: the extra keys per block, and the hashes of two tenants' blocks.
SALTED_BLOCKS = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.request import Request
B = int(sys.argv[1])
fn = get_hash_fn_by_name("sha256")
ku.init_none_hash(fn)
hasher = ku.get_request_block_hasher(B, fn)
tokens = list(range(1000, 1000 + 3 * B))
def stored(salt, rid):
    r = Request(rid, tokens, SamplingParams(max_tokens=1), None, cache_salt=salt, block_hasher=hasher)
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=B, enable_kv_cache_events=True)
    pool.cache_full_blocks(r, pool.get_new_blocks(3), 0, 3, B, 0)
    (event,) = pool.take_events()
    return {"extra_keys": event.extra_keys, "block_size": event.block_size, "tokens": len(event.token_ids),
            "hashes": [str(h) for h in event.block_hashes]}
print(json.dumps({"a": stored("tenant-a", "1"), "b": stored("tenant-b", "2"), "none": stored(None, "3")}))
"""


def test_vllm_publishes_the_tenants_salt_in_block_zero_only():
    """What the picker's precise producer expects (P/preciseprefixcache/blockkeys.go:78-92 folds the
    body's cache_salt into canonical block 0; pkg/kvcache/kvblock/extra_keys.go:43-85 reads a bare
    string as block 0's feature): vLLM 0.34 publishes the bare salt in block 0's extra keys and
    nothing in the others (vllm/v1/core/kv_cache_utils.py:655-658,674-700), at the block size both
    sides share, so the picker's canonical blocks are vLLM's."""
    got = run_in_vllm(SALTED_BLOCKS, str(pp.BLOCK_SIZE_TOKENS))
    a, b, unsalted = got["a"], got["b"], got["none"]
    assert a["extra_keys"] == [["tenant-a"], None, None] and b["extra_keys"] == [["tenant-b"], None, None]
    assert unsalted["extra_keys"] == [None, None, None]
    assert a["block_size"] == pp.BLOCK_SIZE_TOKENS and a["tokens"] == 3 * pp.BLOCK_SIZE_TOKENS
    # Salt in block 0 chains into every block: no block of one tenant is another's, or an unsalted one.
    assert not set(a["hashes"]) & set(b["hashes"]) and not set(a["hashes"]) & set(unsalted["hashes"])


def test_the_pickers_plugins_agree_with_vllms_flags():
    ext = pp.precise_extension(MODEL.name, 3, 40)
    config = picker_config_data(PickerSpec(), extension=ext)
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    events = json.loads(pp.kv_events_args(MODEL.name)[3])
    producer = plugins["precise-prefix-cache-producer"]["parameters"]
    discovery = producer["kvEventsConfig"]["podDiscoveryConfig"]
    assert (discovery["socketPort"], discovery["replaySocketPort"]) == (5557, 5657)
    assert events["endpoint"].endswith(f":{discovery['socketPort']}")
    assert events["replay_endpoint"].endswith(f":{discovery['replaySocketPort']}")
    assert events["topic"].startswith(producer["kvEventsConfig"]["topicFilter"])
    # the topic's model segment is the name the picker forwards, the render server's modelName
    assert events["topic"].split("@")[2] == MODEL.name == plugins["token-producer"]["parameters"]["modelName"]
    assert producer["tokenProcessorConfig"]["blockSizeTokens"] == int(pp.kv_events_args(MODEL.name)[1])
    assert producer["indexerConfig"]["kvBlockIndexConfig"]["costAwareMemoryConfig"] == {"size": "40MiB"}
    # the render server's Service, a miss costing the precise score after half a second, not TTFT for 5 s
    assert plugins["token-producer"]["parameters"]["vllm"] == {"url": "http://chat-render:8000", "timeout": "500ms",
                                                                  "mmTimeout": "500ms"}
    assert ext.memory_mib == pp.INDEX_FIXED_MIB + 40
    assert plugins["precise-prefix-scorer"] == {"name": "precise-prefix-scorer", "type": "prefix-cache-scorer",
                                                "parameters": {"prefixMatchInfoProducerName": pp.PRODUCER}}
    assert {"pluginRef": "precise-prefix-scorer", "weight": 3} in config["schedulingProfiles"][0]["plugins"]
    assert config["dataLayer"]["sources"] == [{"pluginRef": "endpoint-notification-source",
                                               "extractors": [{"pluginRef": pp.PRODUCER}]}]


def test_the_render_server_reads_the_shared_weights_offline():
    model = MODEL.model_copy(update={"extra_args": [
        "--enforce-eager", "--chat-template=/models/t.jinja", "--tokenizer-mode", "mistral", "--trust-remote-code",
        "--tokenizer", "/models/tok", "--tokenizer-revision=r1", "--revision", "r2", "--max-num-seqs", "8"]})
    spec = pp.render_deployment_spec(model, release("0.34.0"), claim_mount("weights-ro"))
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "vllm/vllm-openai-cpu:v0.34.0" and c["command"] == ["vllm", "launch", "render"]
    assert c["args"][:3] == [f"/models/chat/{c['args'][0].rsplit('/', 1)[1]}", "--served-model-name", "chat"]
    # the server's dtype and every flag that shapes tokens, nothing else
    assert c["args"][7:] == ["--dtype", MODEL.dtype, "--chat-template=/models/t.jinja", "--tokenizer-mode", "mistral",
                             "--trust-remote-code", "--tokenizer", "/models/tok", "--tokenizer-revision=r1",
                             "--revision", "r2"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert {"name": "weights", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert pod["volumes"][0] == {"name": "weights", "persistentVolumeClaim": {"claimName": "weights-ro", "readOnly": True}}
    assert c["securityContext"]["readOnlyRootFilesystem"]
    # out of its Service until it answers; two replicas on two nodes; no API token, its own identity
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": pp.RENDER_PORT}
    assert spec["replicas"] == 2 and pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("chat-render", False)
    assert spec["template"]["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"


def test_the_render_servers_bucket_mount_has_no_file_cache():
    bucket = tokenizer_mount(weights_volume("b", read_only=True, uid=1000), {"gke-gcsfuse/volumes": "true"})
    assert "file-cache:max-size-mb:-1" in bucket.volumes[0]["csi"]["volumeAttributes"]["mountOptions"]
    pod = pp.render_deployment_spec(MODEL, release("0.34.0"), bucket)["template"]
    options = pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["mountOptions"].split(",")
    assert [o for o in options if o.startswith("file-cache:")] == ["file-cache:max-size-mb:0"]
    assert "implicit-dirs" in options and "uid=1000" in options
    assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}


def test_the_index_is_sized_by_what_the_pool_holds():
    """costAwareMemoryConfig: the pool's KV blocks at its most replicas, never the 1e8-key default."""
    values = read_stack_config("staging")
    cfg = parse(values)
    model = cfg.model("llama-8b")
    node_pool = cfg.pool(model.node_pool)
    blocks = pp.pool_blocks(model, node_pool)
    assert 0 < blocks < 100_000  # a few thousand blocks per A100 slice, four replicas at most
    more = model.model_copy(update={"short": model.short.model_copy(update={"max_replicas": 400})})
    assert pp.pool_blocks(more, node_pool) == 100 * blocks
    assert pp.index_mib(model, node_pool) == pp.INDEX_MIN_MIB
    assert pp.index_mib(more, node_pool) == -(-100 * blocks * pp.INDEX_BYTES_PER_BLOCK // 2 ** 20)


def test_what_keeps_events_from_matching_is_refused():
    assert pp.precise_prefix_problems(MODEL, release("0.34.0")) == []
    off = MODEL.model_copy(update={"enable_prefix_caching": False})
    assert [k for k, _ in pp.precise_prefix_problems(off, release("0.34.0"))] == ["enablePrefixCaching"]
    assert [k for k, _ in pp.precise_prefix_problems(MODEL, TPU_RELEASES["0.32.0"])] == ["vllmVersion"]
    sized = MODEL.model_copy(update={"extra_args": ["--block-size", "16"]})
    assert [k for k, _ in pp.precise_prefix_problems(sized, release("0.34.0"))] == ["extraArgs"]
    # a chat template the render server's image lacks; one in the weights, or inline, is fine
    for template, refused in (("/opt/t.jinja", True), ("t.jinja", True), ("/models/chat/t.jinja", False),
                              ("{{ messages }}", False)):
        model = MODEL.model_copy(update={"extra_args": [f"--chat-template={template}"]})
        assert bool(pp.precise_prefix_problems(model, release("0.34.0"))) is refused, template


# --- the events' ports: the picker's pods alone ------------------------------------------------

SERVERS = {"app": "vllm", "model": "chat"}


def plan(policy_specs: list[dict[str, Any]], dataplane: bool = True) -> list[Resource]:
    container = {"name": "vllm", "command": ["python3", "/opt/vllm-gke/serve.py"], "args": served_argv(),
                 "env": pp.kv_events_env()}
    deployment = {"kind": "Deployment", "metadata": {"name": "chat-short", "namespace": "serving"},
                  "spec": {"template": {"metadata": {"labels": SERVERS, "annotations": pp.kv_events_annotations()},
                                        "spec": {"containers": [container]}}}}
    cluster = {"datapathProvider": "ADVANCED_DATAPATH"} if dataplane else {}
    return [Resource("kubernetes:apps/v1:Deployment", "d", deployment),
            Resource("gcp:container/cluster:Cluster", "c", cluster),
            *(Resource("kubernetes:networking.k8s.io/v1:NetworkPolicy", f"np{i}",
                       {"kind": "NetworkPolicy", "metadata": {"name": f"np{i}", "namespace": "serving"}, "spec": s})
              for i, s in enumerate(policy_specs))]


def ingress() -> dict[str, Any]:
    return pp.events_ingress(SERVERS, "serving", picker_labels("chat-epp"))


def test_only_the_pickers_pods_reach_the_events_ports():
    spec = ingress()
    assert events_ports(served_argv()) == [5557, 5657]
    assert list(kv_events_private(plan([spec]))) == []
    # the serving and sidecar ports stay open to all, the events' ports to the picker alone
    assert spec["ingress"][0] == {"ports": [{"protocol": "TCP", "port": p} for p in (8000, 15006, 15020, 15021, 15090)]}
    assert pp.kv_events_annotations() == {"traffic.sidecar.istio.io/excludeInboundPorts": "5557,5657"}
    assert pp.kv_events_env()[0]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize("breach", ["no-policy", "open-rule", "ip-block", "any-namespace", "range", "no-dataplane",
                                    "other-picker"])
def test_the_policy_refuses_events_readable_by_other_pods(breach: str):
    spec = ingress()
    picker = spec["ingress"][1]["from"][0]
    specs, dataplane = [spec], True
    if breach == "no-policy":
        specs = []
    elif breach == "open-rule":
        specs.append({"podSelector": {"matchLabels": {"app": "vllm"}}, "ingress": [{}]})
    elif breach == "ip-block":
        spec["ingress"][1]["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}})
    elif breach == "any-namespace":
        spec["ingress"][1]["from"] = [{**picker, "namespaceSelector": {}}]
    elif breach == "range":
        spec["ingress"][0]["ports"].append({"protocol": "TCP", "port": 5000, "endPort": 6000})
    elif breach == "other-picker":  # another model's picker: not this pool's
        spec["ingress"][1]["from"].append({"podSelector": {"matchLabels": picker_labels("other-epp")}})
    else:
        dataplane = False
    findings = [message for _, message in kv_events_private(plan(specs, dataplane))]
    assert len(findings) == 1 and "Deployment serving/chat-short" in findings[0], findings


# --- wired end to end: staging's llama-8b (picker.prefixCache precise) ----------------------------

@pytest.fixture(scope="module")
def staging() -> Plan:
    return run_program("staging", read_stack_config("staging"))


def _servers(plan: Plan) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in vllm_deployments(plan)}


def _vllm(d: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return c


def test_staging_publishes_events_from_the_picker_pool_alone(staging: Plan):
    servers = _servers(staging)
    assert {"llama-8b-short", "mistral-7b-short", "mistral-7b-long"} <= set(servers)
    for name, d in servers.items():
        args = [str(a) for a in _vllm(d)["args"]]
        annotations = d["spec"]["template"]["metadata"]["annotations"]
        if name == "llama-8b-short":  # behind the picker
            assert args[-4:] == pp.kv_events_args("llama-8b"), args
            assert check_argv(args, load_snapshot("0.34.0")) == []
            assert pp.kv_events_env()[0] in _vllm(d)["env"]
            assert annotations[pp.EXCLUDE_INBOUND] == "5557,5657"
        else:  # length-routed pools publish nothing
            assert "--kv-events-config" not in args and pp.EXCLUDE_INBOUND not in annotations, name


def test_staging_admits_only_the_pickers_pods_to_the_events(staging: Plan):
    selecting = [p for p in manifests_of(staging, "NetworkPolicy", "vllm")
                 if any(5557 == q.get("port") for r in p["spec"].get("ingress") or [] for q in r.get("ports") or [])]
    (policy,) = selecting
    spec = policy["spec"]
    # the pool's vLLM pods (not its standby, not another pool's)
    selector = spec["podSelector"]["matchLabels"].items()
    pods = {n: d["spec"]["template"]["metadata"]["labels"].items() for n, d in _servers(staging).items()}
    assert [n for n, labels in pods.items() if selector <= labels] == ["llama-8b-short"]
    assert ("app.kubernetes.io/name", "vllm") in selector
    (events,) = [r for r in spec["ingress"] if r.get("from")]
    assert sorted(q["port"] for q in events["ports"]) == [5557, 5657]
    assert events["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "vllm"}},
                               "podSelector": {"matchLabels": picker_labels("llama-8b-epp")}}]
    # the picker's pods carry those labels
    (picker,) = [d for d in manifests_of(staging, "Deployment", "vllm") if d["metadata"]["name"] == "llama-8b-router-epp"]
    labels = picker["spec"]["template"]["metadata"]["labels"]
    assert picker_labels("llama-8b-epp").items() <= labels.items()


def _deployment(plan: Plan, name: str) -> dict[str, Any]:
    (d,) = [d for d in manifests_of(plan, "Deployment", "vllm") if d["metadata"]["name"] == name]
    return d


def test_staging_pickers_tokenizer_runs_apart_with_its_own_identity(staging: Plan):
    """The picker's pod mounts no weights and runs no vLLM: a failed mount or image pull of the render
    server never keeps it from starting. The render server's identity alone reads the bucket."""
    pod = _deployment(staging, "llama-8b-router-epp")["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["epp"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["plugins-config"]
    assert "gke-gcsfuse/volumes" not in pod["metadata"]["annotations"]
    # the index's fixed cost and its bound on top of the picker's own memory
    (epp,) = pod["spec"]["containers"]
    extra = pp.INDEX_FIXED_MIB + pp.INDEX_MIN_MIB
    assert epp["resources"]["limits"]["memory"] == f"{4096 + extra}Mi"
    assert {"name": "GOMEMLIMIT", "value": f"{3072 + extra}MiB"} in epp["env"]
    render = _deployment(staging, "llama-8b-render")["spec"]["template"]
    (c,) = render["spec"]["containers"]
    assert c["name"] == pp.RENDER_CONTAINER and c["args"][1:3] == ["--served-model-name", "llama-8b"]
    assert any((v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io" for v in render["spec"]["volumes"])
    assert render["spec"]["automountServiceAccountToken"] is False
    (sa,) = [a for a in manifests_of(staging, "ServiceAccount", "vllm") if a["metadata"]["name"] == "llama-8b-render"]
    assert sa["automountServiceAccountToken"] is False
    # the Service the token-producer calls, on the render's pods
    (svc,) = [v for v in manifests_of(staging, "Service", "vllm") if v["metadata"]["name"] == "llama-8b-render"]
    assert svc["spec"]["selector"].items() <= render["metadata"]["labels"].items()
    assert [q["port"] for q in svc["spec"]["ports"]] == [pp.RENDER_PORT]
    (config,) = [c for c in manifests_of(staging, "ConfigMap", "vllm") if c["metadata"]["name"] == "llama-8b-router-epp"]
    data = yaml.safe_load(config["data"]["default-plugins.yaml"])
    plugins = {p.get("name", p["type"]): p for p in data["plugins"]}
    assert plugins[pp.TOKEN_PRODUCER]["parameters"]["vllm"]["url"] == f"http://llama-8b-render:{pp.RENDER_PORT}"
    # the config: the precise scorer in, the approximate one out, the producer fed by the pool's endpoints
    types = [p["type"] for p in data["plugins"]]
    assert types.count("prefix-cache-scorer") == 1 and pp.PRODUCER in types
    refs = {p["pluginRef"]: p["weight"] for p in data["schedulingProfiles"][0]["plugins"]}
    assert refs[pp.SCORER] == 3 and "prefix-cache-scorer" not in refs
    # the render's identity lists the bucket and opens its model's revision; the picker's nothing
    members = [r.props for r in staging.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")]
    assert not [m for m in members if "/sa/llama-8b-epp" in str(m.get("member"))]
    render_reads = [m for m in members if "/sa/llama-8b-render" in str(m.get("member"))]
    assert {m["role"] for m in render_reads} >= {"roles/storage.objectViewer"} and len(render_reads) == 2
    folder = c["args"][0].removeprefix("/models/")
    assert f"{folder}/" in json.dumps([m.get("condition") for m in render_reads])


def test_staging_admits_only_the_picker_to_the_render_server(staging: Plan):
    (policy,) = [p for p in manifests_of(staging, "NetworkPolicy", "vllm") if p["metadata"]["name"] == "llama-8b-render"]
    render = _deployment(staging, "llama-8b-render")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= render.items()
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": picker_labels("llama-8b-epp")}}],
                                          "ports": [{"protocol": "TCP", "port": pp.RENDER_PORT}]}]


def test_staging_plan_warns_of_the_restart_and_adapters_that_miss(staging: Plan):
    (note,) = pp.precise_restart_notes(staging.config)
    assert note.startswith("llama-8b: ") and "rolls every GPU replica" in note
    assert pp.adapters_miss(staging.config) == [] and pp.adapters_miss in CONFIG_CHECKS
    values = copy.deepcopy(read_stack_config("staging"))
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-8b")
    model["adapters"] = [{"name": "sql", "source": "hf://org/sql-lora", "rank": 16, "tenants": ["search"]}]
    (warning,) = pp.adapters_miss(parse(values))
    assert warning.startswith("llama-8b: ") and "(sql)" in warning and "never matches" in warning


def test_the_policy_is_clean_on_staging_and_refuses_a_copy_without_the_events_policy(staging: Plan):
    resources = staging.policy_resources()
    assert list(kv_events_private(resources)) == []
    broken = [r for r in resources if not r.name.endswith("-kv-events")]
    assert len(broken) == len(resources) - 1
    (finding,) = [m for _, m in kv_events_private(broken)]
    assert "Deployment vllm/llama-8b-short" in finding and "no NetworkPolicy selects its pods" in finding
    opened = copy.deepcopy(resources)
    for r in opened:
        if r.name.endswith("-kv-events"):
            r.props["spec"]["ingress"][1]["from"].append({"ipBlock": {"cidr": "0.0.0.0/0"}})
    assert [m for _, m in kv_events_private(opened)][0].endswith('{"ipBlock": {"cidr": "0.0.0.0/0"}}')


@pytest.mark.parametrize("case", ["no-dataplane", "no-prefix-caching", "own-block-size", "no-weight", "template"])
def test_what_precise_needs_is_refused_naming_the_key(case: str):
    values = copy.deepcopy(read_stack_config("staging"))
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-8b")
    key, words = {
        "no-dataplane": ("vllm-gke:cluster.dataplaneV2", "set dataplaneV2 true"),
        "no-prefix-caching": ("vllm-gke:models[llama-8b].enablePrefixCaching", "set it true or picker.prefixCache"),
        "own-block-size": ("vllm-gke:models[llama-8b].extraArgs", "sets --block-size, which precise"),
        "no-weight": ("vllm-gke:picker.scorers.prefixCache", "give it a weight"),
        "template": ("vllm-gke:models[llama-8b].extraArgs", "sets --chat-template /opt/chat.jinja, outside the weights"),
    }[case]
    if case == "no-dataplane":
        values["vllm-gke:cluster"]["dataplaneV2"] = False
    elif case == "no-prefix-caching":
        model["enablePrefixCaching"] = False
    elif case == "own-block-size":
        model["extraArgs"] = ["--block-size", "16"]
    elif case == "template":
        model["extraArgs"] = ["--chat-template", "/opt/chat.jinja"]
    else:
        values["vllm-gke:picker"]["scorers"] = {"prefixCache": 0}
    with pytest.raises(ConfigError) as err:
        parse(values)
    issues = [i for i in err.value.issues if i.key == key]
    assert issues and words in issues[0].problem, [str(i) for i in err.value.issues]
    values["vllm-gke:picker"]["prefixCache"] = "approximate"  # the fix each one names
    if case != "own-block-size":
        parse(values)


def test_the_picker_and_its_tokenizer_schedule_on_the_system_pool(staging: Plan):
    """The picker's and the render server's pods on staging's system nodes at their most, each
    Deployment's two on two nodes, through a rollout of each (the picker's 100% surge beside the old
    pods)."""
    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}: CI must run this")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-picker-prefix-")))
    try:
        for name in CRD_FILES:
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        apply_stack(cp, staging)
        settle(cp)
        system = {n["metadata"]["name"] for n in cp.get("nodes", "-l", "cloud.google.com/gke-nodepool=system")["items"]}
        workloads = {"llama-8b-router-epp": ("inferencepool=llama-8b-epp,vllm-gke.io/picker=llm-d-router", ["epp"]),
                     "llama-8b-render": ("app.kubernetes.io/name=vllm-gke-render,vllm-gke.io/render=llama-8b",
                                         [pp.RENDER_CONTAINER])}

        def placed(sel: str) -> list[dict[str, Any]]:
            return [p for p in cp.get("pods", "-n", "vllm", "-l", sel)["items"] if not p["metadata"].get("deletionTimestamp")]

        for stamp in ("", "rolled"):
            for deployment, (sel, containers) in workloads.items():
                if stamp:
                    cp.kubectl("rollout", "restart", "deployment", deployment, "-n", "vllm")
                    settle(cp)
                pods = cp.wait_until(f"{deployment}'s pods placed", lambda sel=sel: (
                    ps if len(ps := placed(sel)) == 2 and all(p["spec"].get("nodeName") for p in ps) else None))
                nodes = {p["spec"]["nodeName"] for p in pods}
                assert nodes <= system and len(nodes) == 2, (deployment, nodes)
                assert all([c["name"] for c in p["spec"]["containers"]] == containers for p in pods)
    finally:
        cp.down()
