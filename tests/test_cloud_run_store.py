"""The limit store over the VPC for the Cloud Run models' guards: Redis' TLS port with the stack's
client certificate on a real redis-server, the guard's client on it, what the stacks declare (the
load balancer, the mesh and NetworkPolicy lock), and the objects on the real control plane."""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.components.limit_store import LABELS, NAMESPACE, REDIS_CONF, cloud_run_lock
from vllm_gke.components.model import cloud_run_store as crs
from vllm_gke.infra.plan import read_stack_config, run_program

sys.path.insert(0, str(REPO_ROOT / "images"))
from vllm_gke_guard import limits as guard_limits  # noqa: E402
from vllm_gke_guard import store as guard_store  # noqa: E402


def _pem(directory: Path, name: str) -> Path:
    """A self-signed certificate and its key in one PEM, as the guide has the operator make it."""
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    pem = directory / f"{name}.pem"
    pem.write_text(key.read_text() + cert.read_text())
    return pem


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tls_store(tmp_path):
    """The store as its pod starts it with Cloud Run guards: its config, ACL, library and TLS port."""
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary or not shutil.which("openssl"):
        if os.environ.get("CI"):
            pytest.fail("CI runs the limit store against a real redis-server (and openssl)")
        pytest.skip("no redis-server or openssl here")
    from benchmarks.limit_store import start_redis

    pem = _pem(tmp_path, "store").rename(tmp_path / crs.PEM_FILE)  # where the pod mounts it
    tls_port = _free_port()
    tls = crs.redis_tls_conf().replace(crs.STORE_MOUNT, str(tmp_path)).replace(
        f"tls-port {crs.TLS_PORT}", f"tls-port {tls_port}")
    proc, port = start_redis(binary, tmp_path, extra_conf=tls)
    yield port, tls_port, pem, tmp_path
    proc.terminate()
    proc.wait(5)


def _tls_client(port: int, pem, ca=None):
    import redis

    return redis.Redis(port=port, ssl=True, ssl_certfile=pem and str(pem), ssl_keyfile=pem and str(pem),
                       ssl_ca_certs=str(ca or pem), ssl_cert_reqs="required", ssl_check_hostname=False,
                       socket_timeout=2)


def test_the_guard_client_counts_the_same_windows_over_tls(tls_store):
    """A Cloud Run guard (TLS port, the certificate) and a GKE guard (plain port, the mesh) share one
    tenant's window: 3 requests a minute across both."""
    import redis.asyncio as aioredis

    port, tls_port, pem, _ = tls_store

    async def go():
        run_guard = guard_store.SharedLimiter.connect("127.0.0.1", tls_port, timeout=2, tls_pem=str(pem))
        gke_guard = guard_store.SharedLimiter(aioredis.Redis(port=port))
        return [await (run_guard if i % 2 else gke_guard).take("t", 3, None, 0) for i in range(4)]

    assert [v.wait is None for v in asyncio.run(go())] == [True, True, True, False]


def test_the_tls_port_refuses_whoever_lacks_the_certificate(tls_store):
    import redis

    _, tls_port, pem, tmp = tls_store
    other = _pem(tmp, "other")
    assert _tls_client(tls_port, pem).ping()
    # No certificate, another one, or plain text: refused before any command (no AUTH to skip).
    for client in (_tls_client(tls_port, None, ca=pem), _tls_client(tls_port, other, ca=pem),
                   redis.Redis(port=tls_port, socket_timeout=2)):
        with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ssl.SSLError)):
            client.ping()


def test_a_cloud_run_guard_may_what_a_mesh_client_may_and_nothing_else(tls_store):
    """FCALL of the guards' function, and (Redis runs a function with its caller's ACL) the commands it calls
    on rl: keys directly: the certificate's holder can reset or fill a tenant's window, as a mesh client can."""
    import redis

    _, tls_port, pem, _ = tls_store
    c = _tls_client(tls_port, pem)
    assert c.fcall(guard_store.FUNCTION, 1, "rl:{t}:w", 1000, 61, 5, 0, 0)[0] == 1
    assert c.hset("rl:{u}:w", "n", 0) == 1 and c.hincrby("rl:{u}:w", "n", 1) == 1 and c.hmget("rl:{u}:w", ["n"]) == [b"1"]
    assert c.pexpire("rl:{u}:w", 61000) and c.hdel("rl:{u}:w", "n") == 1
    assert c.delete("rl:{t}:w") == 1  # the window fcall kept, gone
    code = "#!lua name=mine\nredis.register_function('mine', function() return 1 end)"
    for forbidden in (lambda: c.eval("return 1", 0), lambda: c.function_load(code, replace=True),
                      lambda: c.function_flush(), lambda: c.config_get("*"), lambda: c.keys("*"),
                      lambda: c.get("rl:{t}:w"), lambda: c.hset("elsewhere", "a", 1), lambda: c.flushall(),
                      lambda: c.acl_list(), lambda: c.execute_command("ACL", "SETUSER", "x", "on", "+@all")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()


# What the server process (and the engine processes it starts) sees: its environment, dumped as JSON.
DUMP_ENV = """import json, os, subprocess, sys
json.dump(dict(os.environ), open(os.environ["DUMP_TO"] + ".server", "w"))
engine = "import json, os; json.dump(dict(os.environ), open(os.environ['DUMP_TO'] + '.engine', 'w'))"
subprocess.run([sys.executable, "-c", engine])
"""


def _serve(tmp: Path, pem_text: str, tls_port: int) -> subprocess.CompletedProcess[str]:
    """The entrypoint (images/serve.py) as a Cloud Run instance runs it, its `vllm serve` a stand-in that
    records its own environment and that of a process it starts, as vLLM's API server starts its engine's."""
    import json

    script = tmp / "fake_vllm.py"
    script.write_text(DUMP_ENV)
    guard = {"model": "m", "globalLimits": {"host": "127.0.0.1", "port": tls_port, "tlsEnv": crs.GUARD_ENV}}
    env = dict(os.environ, **{crs.GUARD_ENV: pem_text, "GKE_LLM_GUARD_CONFIG": json.dumps(guard),
                              "GKE_LLM_SERVER_COMMAND": f"{sys.executable} {script}", "DUMP_TO": str(tmp / "env"),
                              "GKE_LLM_WARM_MARKER": str(tmp / "warm")})
    return subprocess.run([sys.executable, str(REPO_ROOT / "images" / "serve.py"), "m", "--port", str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=120)


def test_vllm_and_its_engine_processes_inherit_no_key(tls_store, monkeypatch):
    """The entrypoint writes the certificate to a private file and starts vLLM without the variable (vLLM's
    API server starts its engine processes before it loads the guard: a variable the guard dropped would
    already be theirs); the guard's config names the file, which the guard's client connects with."""
    import json

    _, tls_port, pem, tmp = tls_store
    assert _serve(tmp, pem.read_text(), tls_port).returncode == 0
    for process in ("server", "engine"):
        seen = json.loads((tmp / f"env.{process}").read_text())
        assert crs.GUARD_ENV not in seen and not any("PRIVATE KEY" in v for v in seen.values()), process
    shared = json.loads(json.loads((tmp / "env.server").read_text())["GKE_LLM_GUARD_CONFIG"])["globalLimits"]
    assert "tlsEnv" not in shared and Path(shared["tlsFile"]).read_text() == pem.read_text()
    path = Path(shared["tlsFile"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    connect = guard_store.SharedLimiter.connect
    # This machine's handshake may take longer than the guard's 0.25 s (a loaded CI runner).
    monkeypatch.setattr(guard_store.SharedLimiter, "connect", lambda *a, **kw: connect(*a, **{**kw, "timeout": 2}))
    limiter, _ = guard_limits.connect_store(shared)
    assert asyncio.run(limiter.take("t", 1, None, 0)).wait is None
    shutil.rmtree(path.parent)


def test_a_missing_certificate_is_named_not_shown_and_vllm_never_starts(tls_store):
    _, tls_port, _, tmp = tls_store
    done = _serve(tmp, "-----BEGIN PRIVATE KEY-----\nnot-a-pem", tls_port)
    assert done.returncode == 2 and crs.GUARD_ENV in done.stderr and "not-a-pem" not in done.stderr + done.stdout
    assert not (tmp / "env.server").exists()


def test_the_guard_refuses_the_variable_itself():
    """A guard handed tlsEnv (not started through the entrypoint) would leave the key in the engine's env."""
    with pytest.raises(RuntimeError, match="images/serve.py"):
        guard_limits.connect_store({"host": "127.0.0.1", "port": 1, "tlsEnv": crs.GUARD_ENV})


def test_no_tls_env_connects_as_before():
    limiter, _ = guard_limits.connect_store({"host": "127.0.0.1", "port": 1})
    assert "ssl_certfile" not in limiter.client.connection_pool.connection_kwargs


# --- what the stacks declare --------------------------------------------------------------------

@pytest.fixture(scope="module")
def staging():
    return run_program("staging", read_stack_config("staging"))


@pytest.fixture(scope="module")
def gke_only():
    """Prod (globalLimits, no Cloud Run model)."""
    values = read_stack_config("prod")
    assert "vllm-gke:cloudRun" not in values and values["vllm-gke:globalLimits"]["enabled"]
    return run_program("prod", values)


def _store_objects(plan) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in plan.manifests()
            if m["metadata"].get("namespace") == NAMESPACE}


def test_staging_exposes_the_tls_port_to_the_egress_subnet_alone(staging):
    cfg_cidr = crs.cloud_run_access(staging.config).source_cidr  # type: ignore[union-attr]
    assert cfg_cidr == "10.30.0.0/24"
    objs = _store_objects(staging)
    lb = objs[("Service", "limits-cloud-run")]
    assert lb["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal",
                                             "networking.gke.io/load-balancer-ip-addresses": "vllm-staging-limits-cloud-run"}
    assert lb["spec"]["loadBalancerSourceRanges"] == [cfg_cidr] and lb["spec"]["externalTrafficPolicy"] == "Local"
    assert [p["port"] for p in lb["spec"]["ports"]] == [crs.TLS_PORT]  # never the plain, mesh-only port
    # The reserved address is the one the guard's config names, in the node subnet.
    (addr,) = [r.props for r in staging.of_type("gcp:compute/address:Address")
               if r.props.get("name") == crs.address_name(staging.config)]
    assert addr["address"] == crs.guard_store_config(staging.config)["host"] == "10.10.15.253"  # type: ignore[index]
    assert addr["addressType"] == "INTERNAL"
    # mTLS stays STRICT but on that one port; ALLOW from the subnet to that port only.
    pa = objs[("PeerAuthentication", "strict-but-cloud-run-tls")]["spec"]
    assert pa["mtls"] == {"mode": "STRICT"} and pa["portLevelMtls"] == {str(crs.TLS_PORT): {"mode": "DISABLE"}}
    allow = objs[("AuthorizationPolicy", "allow-cloud-run-guards")]["spec"]["rules"]
    assert allow == [{"from": [{"source": {"ipBlocks": [cfg_cidr]}}], "to": [{"operation": {"ports": [str(crs.TLS_PORT)]}}]}]
    # Redis requires the certificate there, read from Secret Manager at start.
    conf = objs[("ConfigMap", "limits")]["data"]["redis.conf"]
    assert conf.startswith(REDIS_CONF) and "tls-auth-clients yes" in conf
    pod = objs[("Deployment", "limits")]["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if "csi" in v]
    assert vol["csi"]["volumeAttributes"]["secretProviderClass"] == "cloud-run-tls"
    spc = objs[("SecretProviderClass", "cloud-run-tls")]["spec"]["parameters"]["secrets"]
    assert f"/secrets/{crs.secret_id(staging.config)}/versions/latest" in spc
    (grant,) = [r.props for r in staging.of_type("gcp:secretmanager/secretIamMember:SecretIamMember")
                if r.props.get("secretId") == crs.secret_id(staging.config)
                and f"/ns/{NAMESPACE}/sa/" in str(r.props.get("member"))]
    assert grant["role"] == "roles/secretmanager.secretAccessor"


def test_the_network_policy_refuses_the_tls_port_to_everyone_else():
    (np,) = [spec for kind, _, spec in cloud_run_lock("10.30.0.0/24") if kind == "NetworkPolicy"]
    by_port: dict[int, list] = {}
    for rule in np["ingress"]:
        for p in rule["ports"]:
            for port in range(p["port"], p.get("endPort", p["port"]) + 1):
                by_port.setdefault(port, []).append(rule.get("from"))
    assert by_port[crs.TLS_PORT] == [[{"ipBlock": {"cidr": "10.30.0.0/24"}}]]
    assert by_port[6379] == [None] and by_port[15006] == [None]  # the rest: the mesh decides, as before


def test_a_gke_only_stack_admits_nothing_new(gke_only):
    objs = _store_objects(gke_only)
    assert {k for k in objs if k[0] in ("PeerAuthentication", "AuthorizationPolicy", "NetworkPolicy")} == {
        ("PeerAuthentication", "strict"), ("AuthorizationPolicy", "deny-all"),
        ("AuthorizationPolicy", "allow-vllm-guards")}
    assert [k for k in objs if k[0] == "Service"] == [("Service", "limits")]
    assert objs[("Service", "limits")]["spec"]["type"] == "ClusterIP"
    assert objs[("ConfigMap", "limits")]["data"]["redis.conf"] == REDIS_CONF  # no TLS port; the pod does not roll
    assert "serviceAccountName" not in objs[("Deployment", "limits")]["spec"]["template"]["spec"]
    assert not [r for r in gke_only.of_type("gcp:compute/address:Address") if "limits" in str(r.props.get("name"))]
    assert crs.guard_store_config(gke_only.config) is None and crs.secret_env(gke_only.config) == []


def test_without_global_limits_the_cloud_run_guards_count_alone(staging):
    cfg = staging.config.model_copy(update={"global_limits": staging.config.global_limits.model_copy(update={"enabled": False})})
    assert crs.cloud_run_access(cfg) is None and crs.guard_store_config(cfg) is None and crs.secret_env(cfg) == []


def test_the_cloud_run_service_takes_the_secret_as_env(staging):
    (env,) = crs.secret_env(staging.config)
    assert env == {"name": crs.GUARD_ENV, "value_source": {"secret_key_ref": {
        "secret": "vllm-staging-limits-cloud-run-tls", "version": "latest"}}}
    assert crs.guard_store_config(staging.config) == {"host": "10.10.15.253", "port": crs.TLS_PORT, "tlsEnv": crs.GUARD_ENV}


# --- on the real control plane --------------------------------------------------------------------

def test_the_store_objects_on_the_real_control_plane(staging):
    from tests.k8s_cluster import CONTROL_PLANE, CRDS, ControlPlane, crds_established

    if not CONTROL_PLANE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no control plane at {CONTROL_PLANE}")
        pytest.skip(f"no control plane at {CONTROL_PLANE}")
    docs = [copy.deepcopy(m) for m in staging.manifests() if m["metadata"].get("namespace") == NAMESPACE
            or (m["kind"] == "Namespace" and m["metadata"]["name"] == NAMESPACE)]
    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="k8s-limits-")))
    try:
        for name in ("istio-1.30.3-crds.yaml", "sscsi-v1.6.0-spc.yaml"):
            cp.kubectl("apply", "--server-side", "-f", str(CRDS / name), timeout=300)
        crds_established(cp)
        cp.apply([d for d in docs if d["kind"] == "Namespace"])
        cp.apply([d for d in docs if d["kind"] != "Namespace"])
        svc = cp.get("service", "-n", NAMESPACE, "limits-cloud-run")
        assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["loadBalancerSourceRanges"] == ["10.30.0.0/24"]
        assert svc["spec"]["healthCheckNodePort"] > 0  # Local: the load balancer checks nodes holding the pod
        for kind, name, _ in cloud_run_lock("10.30.0.0/24"):  # stored as declared: the API server took them
            assert cp.get(kind.lower(), "-n", NAMESPACE, name)["metadata"]["name"] == name
        np = cp.get("networkpolicy", "-n", NAMESPACE, "cloud-run-tls-from-egress-subnet")
        assert np["spec"]["podSelector"]["matchLabels"] == LABELS
        pa = cp.get("peerauthentication", "-n", NAMESPACE, "strict-but-cloud-run-tls")
        assert pa["spec"]["portLevelMtls"] == {str(crs.TLS_PORT): {"mode": "DISABLE"}}
        cp.get("secretproviderclass", "-n", NAMESPACE, "cloud-run-tls")
        pods = cp.get("deployment", "-n", NAMESPACE, "limits")["spec"]["template"]["spec"]
        assert pods["serviceAccountName"] == "limits"
    finally:
        cp.down()


# --- the policy pack --------------------------------------------------------------------------------

def _store_violations(plan, mutate=None):
    from vllm_gke.policies.rules import evaluate

    rs = copy.deepcopy(plan.policy_resources())
    for r in rs:
        if mutate and (r.props.get("metadata") or {}).get("namespace") == NAMESPACE:
            mutate(r.props)
    return [v.message for v in evaluate(rs) if v.policy == "limit-store-mesh-only"]


def test_the_policy_takes_the_tls_port_from_the_egress_subnet(staging):
    assert _store_violations(staging) == []


def _allow_plain_port(props):
    if props.get("kind") == "AuthorizationPolicy" and props["metadata"]["name"] == "allow-cloud-run-guards":
        props["spec"]["rules"][0]["to"][0]["operation"]["ports"] = ["6379"]


def _mtls_off_on_plain_port(props):
    if props.get("kind") == "PeerAuthentication" and props["spec"].get("portLevelMtls"):
        props["spec"]["portLevelMtls"] = {"6379": {"mode": "PERMISSIVE"}}


def _no_client_certificates(props):
    if props.get("kind") == "ConfigMap" and "redis.conf" in (props.get("data") or {}):
        props["data"]["redis.conf"] = props["data"]["redis.conf"].replace("tls-auth-clients yes", "tls-auth-clients no")


def _from_anywhere(props):
    if props.get("kind") == "AuthorizationPolicy" and props["metadata"]["name"] == "allow-cloud-run-guards":
        props["spec"]["rules"][0]["from"][0]["source"]["ipBlocks"] = ["0.0.0.0/0"]


@pytest.mark.parametrize("mutate", [_allow_plain_port, _mtls_off_on_plain_port, _no_client_certificates, _from_anywhere])
def test_the_policy_refuses_any_other_way_in(staging, mutate):
    assert _store_violations(staging, mutate)
