"""What the real systems would reject or break on, checked without them: the loader under the
server image's environment, JWKS egress for managed Cloud Service Mesh, disruption settings,
pod hardening and plan warnings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, STACKS, manifests_of, vllm_deployments, without_cloud_run
from vllm_gke.components.model.mesh_identity import jwks_host
from vllm_gke.infra.advice import plan_warnings

HUB = REPO_ROOT / "tests" / "fixtures" / "hub"
PROGRAM = REPO_ROOT / "components" / "scripts" / "load_weights.py"


def image_env() -> dict[str, str]:
    """ENV of the server image, from the Dockerfile."""
    text = (REPO_ROOT / "images" / "Dockerfile").read_text()
    block = re.search(r"^ENV (.+?)(?=^\S|\Z)", text, re.M | re.S).group(1)
    return dict(re.findall(r"(\w+)=(\S+)", block))


def loader_container(plan, model="qwen-7b"):
    job = next(j for j in manifests_of(plan, "Job", "vllm-gke-system") if j["metadata"]["name"] == f"load-{model}")
    return job["spec"]["template"]["spec"]["containers"][0]


POD_PATHS = (("/models", "models"), ("/var/run/secrets/hf", "secrets"), ("/home/loader", "home"), ("/tmp", "tmp"))


def run_loader(container, tmp_path: Path, env_from_pod=True, extra_env=None) -> subprocess.CompletedProcess:
    """The container's command, locally: the image's ENV overridden by the pod's env, the pod's
    paths under tmp_path, and (as under its read-only root filesystem) any write outside the
    container's writable mounts an error."""
    def local(value: str) -> str:
        for pod_path, folder in POD_PATHS:
            if value == pod_path or value.startswith(pod_path + "/"):
                return str(tmp_path / folder) + value[len(pod_path):]
        return value

    writable = [local(m["mountPath"]) for m in container.get("volumeMounts", []) if not m.get("readOnly")]
    for folder in writable:
        Path(folder).mkdir(parents=True, exist_ok=True)
    env = {**image_env(), "PATH": os.environ["PATH"], "PYTHONPATH": str(HUB), "FAKE_HUB_LOG": str(tmp_path / "hub.log"),
           "PYTHONDONTWRITEBYTECODE": "1", "FAKE_WRITABLE": os.pathsep.join([*writable, str(tmp_path / "hub.log")]),
           **(extra_env or {})}
    if env_from_pod:
        env.update({e["name"]: local(e["value"]) for e in container["env"] if "value" in e})
    argv = [local(a) for a in container["command"]]
    argv[0:2] = [sys.executable, str(HUB / "run_loader.py"), str(PROGRAM)]
    return subprocess.run(argv, env=env, capture_output=True, text=True)


def hub_calls(tmp_path):
    log = tmp_path / "hub.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_loader_runs_without_a_shell(plans):
    for plan in plans.values():
        for job in manifests_of(plan, "Job", "vllm-gke-system"):
            (container,) = job["spec"]["template"]["spec"]["containers"]
            assert container["command"][:2] == ["python3", "/opt/vllm-gke-loader/load_weights.py"]
            assert not any(a in ("sh", "/bin/sh", "bash", "-c") for a in container["command"])


def test_loader_downloads_under_the_server_image_environment(plans, tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("hf_fromsecretmanager\n")
    container = loader_container(plans["dev"])
    result = run_loader(container, tmp_path)
    assert result.returncode == 0, result.stderr
    dest = tmp_path / container["command"][5].removeprefix("/")
    marker = json.loads((dest / ".vllm-gke-complete").read_text())
    # A mutable revision is resolved once, downloaded exactly, and the commit recorded.
    assert marker["source"] == "hf://Qwen/Qwen2.5-7B-Instruct" and marker["revision"] == "main"
    assert marker["commit"] == "0123456789abcdef0123456789abcdef01234567"
    info, index, download = hub_calls(tmp_path)
    assert info["files_metadata"] and index["filename"] == "model.safetensors.index.json"
    assert download["revision"] == index["revision"] == marker["commit"]
    assert download["token"] == "hf_fromsecretmanager"
    assert (dest / "config.json").exists() and (dest / "model-00004-of-00004.safetensors").exists()
    assert marker["reads"] == "mistral-first" and marker["files"] == 14
    # Run again (a re-created Job): the marker stops it before any call to the Hub.
    assert run_loader(container, tmp_path).returncode == 0
    assert len(hub_calls(tmp_path)) == 3


def test_the_image_environment_alone_would_stop_the_download(plans, tmp_path):
    """The defect: the server image sets HF_HUB_OFFLINE=1, and the loader ran with it."""
    assert image_env()["HF_HUB_OFFLINE"] == "1"
    result = run_loader(loader_container(plans["dev"]), tmp_path, env_from_pod=False)
    assert result.returncode != 0 and "offline" in result.stderr
    assert not list((tmp_path / "models/qwen-7b").glob("*/.vllm-gke-complete"))


@pytest.mark.parametrize("stack", STACKS)
def test_every_jwks_host_is_known_to_the_mesh_with_tls(plans, stack):
    plan = plans[stack]
    for ra in manifests_of(plan, "RequestAuthentication"):
        ns = ra["metadata"]["namespace"]
        entries = {h: se for se in manifests_of(plan, "ServiceEntry", ns) for h in se["spec"]["hosts"]}
        rules = {dr["spec"]["host"]: dr for dr in manifests_of(plan, "DestinationRule", ns)}
        for rule in ra["spec"]["jwtRules"]:
            host = re.match(r"https://([^/:]+)", rule["jwksUri"]).group(1)
            se = entries[host]["spec"]
            assert se["location"] == "MESH_EXTERNAL" and se["resolution"] == "DNS"
            assert se["ports"] == [{"number": 443, "name": "https", "protocol": "HTTPS"}]
            assert rules[host]["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "sni": host}


def test_a_shared_jwks_host_gets_one_entry_per_namespace(plans):
    plan = plans["prod"]
    hosts = [se["spec"]["hosts"][0] for se in manifests_of(plan, "ServiceEntry", "vllm")]
    assert hosts == ["auth.acme.example"]  # three tenants, one JWKS host
    assert jwks_host(plan.config.tenants[0]) == "auth.acme.example"


@pytest.mark.parametrize("stack", STACKS)
def test_disruption_budgets_let_every_drain_through(plans, stack):
    """One down at a time, never none: a budget allowing no disruption would hold each drain of its
    node for GKE's hour (tests/test_on_cluster.py drains every node on the control plane)."""
    servers = [p for p in manifests_of(plans[stack], "PodDisruptionBudget", "vllm")
               if not p["metadata"]["name"].endswith("-epp")]  # the picker's: tests/test_inference_gateway.py
    assert servers
    for pdb in servers:
        assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == {"maxUnavailable": 1}, \
            pdb["metadata"]["name"]


@pytest.mark.parametrize("stack", STACKS)
def test_vllm_pods_are_hardened(plans, stack):
    for dep in vllm_deployments(plans[stack]):
        pod = dep["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        hardened = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
        for c in pod["containers"] + pod["initContainers"]:
            tpu = "google.com/tpu" in ((c.get("resources") or {}).get("limits") or {})
            # On TPUs the server runs as root, as GKE's TPU examples do (the chips' device nodes),
            # and keeps the rest (tests/test_tpu_serving.py, policy pods-hardened).
            root = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False} if tpu else {}
            # A disaggregated pool's decode pods run llm-d's routing sidecar and the P/D front as the sidecar
            # image's own unprivileged user (its Dockerfile's 65532), never root.
            if c["name"] in ("routing-sidecar", "pd-front"):
                root = {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True}
            assert c["securityContext"] == {**hardened, **root}, (dep["metadata"]["name"], c["name"])
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert env["HOME"] in mounts and "/tmp" in mounts  # writable places on a read-only root
        assert env["USER"]  # getpass.getuser() fails for a UID without a passwd entry
        assert dep["spec"]["template"]["metadata"]["annotations"][
            "cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_plan_warns_about_a_zonal_share_behind_a_multi_zone_cluster(plan_variant, plans):
    def on_filestore(values):
        del values["vllm-gke:weights"]
        without_cloud_run(values)
    staging = plan_variant("staging", on_filestore)
    warnings = plan_warnings(staging.config, staging.platform.store.tier)
    assert any("zonal ZONAL Filestore" in w and "REGIONAL" in w for w in warnings)
    prod = plan_warnings(plans["prod"].config, plans["prod"].platform.store.tier)
    assert not any("Filestore" in w for w in prod)
    # A bucket is regional: staging as shipped (weights.backend gcs) gets no such warning.
    shipped = plan_warnings(plans["staging"].config, plans["staging"].platform.store.tier)
    assert not any("Filestore" in w for w in shipped)


def test_plan_warns_about_single_replica_pools(plans):
    dev = plan_warnings(plans["dev"].config, plans["dev"].platform.store.tier)
    # One warning for every such pool: the same hazard, the same fix, said once.
    (single,) = [w for w in dev if w.startswith("these pools run one replica")]
    assert single.startswith("these pools run one replica (qwen-7b short ~5 min, qwen-7b long ~5 min): a node "
                             "upgrade, repair or spot preemption drains it")
    assert "set a maintenance window" in single
    prod = plan_warnings(plans["prod"].config, plans["prod"].platform.store.tier)
    (single,) = [w for w in prod if w.startswith("these pools run one replica")]
    assert "inside the maintenance window" in single


@pytest.mark.parametrize("stack", STACKS)
def test_pods_outside_the_mesh_accept_no_connection_they_do_not_serve(plans, stack):
    """The loaders and the mesh-readiness check serve nothing: their namespaces deny all ingress
    (Dataplane V2 enforces it); the picker admits only the load balancer (test_inference_gateway)."""
    plan = plans[stack]
    denied = {n["metadata"]["namespace"] for n in manifests_of(plan, "NetworkPolicy")
              if n["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}}
    assert {"vllm-gke-system", "vllm-gke-mesh-check"} <= denied


def test_the_standby_has_a_liveness_probe_that_holds_whatever_the_pool_does(plans):
    standby = next(d for d in manifests_of(plans["staging"], "Deployment") if d["metadata"]["name"].endswith("-standby"))
    (c,) = standby["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"  # /health is 503 while the pool serves


def test_a_cluster_without_dataplane_v2_is_warned_for_every_unenforced_policy(dev_values):
    from vllm_gke.infra.config import parse

    dev_values["vllm-gke:cluster"]["dataplaneV2"] = False
    (warning,) = [w for w in plan_warnings(parse(dev_values), "BASIC_HDD") if "dataplaneV2" in w]
    assert "no NetworkPolicy is enforced" in warning and "KEDA" in warning and "loaders" in warning
    assert "endpoint pickers" not in warning  # dev has none


def test_a_region_is_checked_not_warned(dev_values):
    """A region outside the catalog is refused at parse (gcp:region, tests/test_config_rules.py), so
    no plan warns that its zones went unchecked."""
    from vllm_gke.infra.config import parse

    assert not any("zone table" in w for w in plan_warnings(parse(dev_values), "BASIC_HDD"))


def test_a_model_no_tenant_may_call_is_said(dev_values):
    from vllm_gke.infra.config import parse

    dev_values["vllm-gke:models"].append({**dev_values["vllm-gke:models"][0], "name": "orphan"})
    dev_values["vllm-gke:nodePools"][0]["maxNodes"] = 4
    assert any(w.startswith("orphan: no tenant lists it") for w in plan_warnings(parse(dev_values), "BASIC_HDD"))
