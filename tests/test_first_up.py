"""What the real systems would reject or break on, checked without them: the loader under the
server image's environment, JWKS egress for managed Cloud Service Mesh, disruption settings,
pod hardening and plan warnings."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from components.model_store import loader_script
from components.tenant_auth import jwks_host
from infra.advice import plan_warnings
from tests.conftest import REPO_ROOT, STACKS, manifests_of, vllm_deployments

STANDIN_HF = """#!/bin/sh
# Stand-in for the Hugging Face CLI: like the real one, offline mode refuses to download.
if [ "$HF_HUB_OFFLINE" = "1" ]; then echo "offline mode is enabled" >&2; exit 1; fi
dir=""; while [ $# -gt 0 ]; do [ "$1" = "--local-dir" ] && dir="$2"; shift; done
mkdir -p "$dir" && echo '{}' > "$dir/config.json"
"""


def image_env() -> dict[str, str]:
    """ENV of the server image, from the Dockerfile."""
    text = (REPO_ROOT / "images" / "Dockerfile").read_text()
    block = re.search(r"^ENV (.+?)(?=^\S|\Z)", text, re.M | re.S).group(1)
    return dict(re.findall(r"(\w+)=(\S+)", block))


def run_loader(plan, tmp_path: Path) -> subprocess.CompletedProcess:
    job = manifests_of(plan, "Job", "vllm-gke-system")[0]
    container = job["spec"]["template"]["spec"]["containers"][0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hf = bin_dir / "hf"
    hf.write_text(STANDIN_HF)
    hf.chmod(hf.stat().st_mode | stat.S_IEXEC)
    # The container's environment: the image's ENV, overridden by the pod's env.
    env = {**image_env(), **{e["name"]: e["value"] for e in container["env"] if "value" in e},
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = container["command"][-1].replace("/models/", f"{tmp_path}/models/")
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)


def test_loader_downloads_under_the_server_image_environment(plans, tmp_path):
    result = run_loader(plans["dev"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "models/qwen-7b/main/.vllm-gke-complete").exists()
    assert (tmp_path / "models/qwen-7b/main/config.json").exists()


def test_the_image_environment_alone_would_stop_the_download(tmp_path):
    """The defect: the server image sets HF_HUB_OFFLINE=1, and the loader ran with it."""
    assert image_env()["HF_HUB_OFFLINE"] == "1"
    hf = tmp_path / "hf"
    hf.write_text(STANDIN_HF)
    hf.chmod(0o755)
    env = {**image_env(), "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run([str(hf), "download", "x", "--local-dir", str(tmp_path / "d")], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "offline" in result.stderr


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


def test_disruption_budgets_keep_a_serving_replica(plans):
    plan = plans["prod"]
    for pdb in manifests_of(plan, "PodDisruptionBudget", "vllm"):
        name = pdb["metadata"]["name"]
        model, pool = name.rsplit("-", 1)
        min_replicas = getattr(plan.config.model(model), pool).min_replicas
        expected = {"minAvailable": 1} if min_replicas == 1 else {"maxUnavailable": 1}
        assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == expected, name
    (dev_short,) = [p for p in manifests_of(plans["dev"], "PodDisruptionBudget") if p["metadata"]["name"] == "qwen-7b-short"]
    assert dev_short["spec"]["minAvailable"] == 1  # one replica: never evicted voluntarily


@pytest.mark.parametrize("stack", STACKS)
def test_vllm_pods_are_hardened(plans, stack):
    for dep in vllm_deployments(plans[stack]):
        pod = dep["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"] + pod["initContainers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert env["HOME"] in mounts and "/tmp" in mounts  # writable places on a read-only root
        assert env["USER"]  # getpass.getuser() fails for a UID without a passwd entry
        assert dep["spec"]["template"]["metadata"]["annotations"][
            "cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_plan_warns_about_a_zonal_share_behind_a_multi_zone_cluster(plans):
    staging = plan_warnings(plans["staging"].config, plans["staging"].platform.store.tier)
    assert any("zonal BASIC_HDD Filestore" in w and "REGIONAL" in w for w in staging)
    prod = plan_warnings(plans["prod"].config, plans["prod"].platform.store.tier)
    assert not any("Filestore" in w for w in prod)


def test_plan_warns_about_single_replica_pools(plans):
    dev = plan_warnings(plans["dev"].config, plans["dev"].platform.store.tier)
    assert any(w.startswith("qwen-7b short pool runs one replica") for w in dev)
