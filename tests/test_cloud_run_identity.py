"""The guard's Cloud Run identity (images/vllm_gke_guard/cloud_run.py) as a unit, and the server image
carrying what it imports. Its requests are tested inside the real vLLM in test_cloud_run_guard_in_vllm.py."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.images.vllm_gke_guard.cloud_run import CloudRunIdentity
from vllm_gke.images.vllm_gke_guard.errors import GuardError
from vllm_gke.images.vllm_gke_guard.prefixes import Prefixes

IAM = {"auth": "iam", "accounts": {"a-team1@p-12345.iam.gserviceaccount.com": "search"},
       "tenantPrefixes": {"/search/m": "search"}, "refusedHeaders": ["x-vllm-gke-issuer"]}


def test_the_image_carries_what_the_guard_imports():
    source = (REPO_ROOT / "images" / "vllm_gke_guard" / "cloud_run.py").read_text()
    imported = set(re.findall(r"from vllm_gke_identity\.(\w+) import", source))
    assert imported == {"config", "verify"}
    dockerfile = (REPO_ROOT / "images" / "Dockerfile").read_text()
    copied = re.search(r"COPY ((?:vllm_gke_identity/\S+ )+)/opt/vllm-gke/vllm_gke_identity/", dockerfile)
    assert copied is not None and {f"vllm_gke_identity/{m}.py" for m in imported | {"__init__"}} == set(copied[1].split())
    assert '"pyjwt==${PYJWT_VERSION}" "cryptography==${CRYPTOGRAPHY_VERSION}"' in dockerfile
    # What verify.py and config.py import beyond the standard library: PyJWT and cryptography alone.
    for name in imported:
        text = (REPO_ROOT / "images" / "vllm_gke_identity" / f"{name}.py").read_text()
        third = {m for m in re.findall(r"^(?:from|import) (\w+)", text, re.M)} - {
            "__future__", "asyncio", "logging", "time", "dataclasses", "typing", "json", "os"}
        assert third <= {"jwt", "cryptography"}, (name, third)


def test_a_config_naming_an_unknown_tenant_stops_the_server():
    with pytest.raises(KeyError, match="no entry for"):
        CloudRunIdentity(IAM, ["support"])
    with pytest.raises(KeyError, match="neither jwt nor iam"):
        CloudRunIdentity({**IAM, "auth": "none"}, ["search"])


def test_the_paths_tenant_is_a_whole_segment_of_the_raw_path():
    identity = CloudRunIdentity(IAM, ["search"])
    assert identity.path_tenant("/search/m/v1/chat/completions") == "search"
    assert identity.path_tenant("/search/m/v1") == "search"
    for path in ("/m/v1/chat/completions", "/search/m-evil/v1/chat", "/search/m%2Fv1/chat", "/search/m/v10"):
        assert identity.path_tenant(path) is None, path
    # strip() records it from the raw path before the prefix comes off.
    scope = identity.strip(Prefixes(["/m", "/search/m"]), {"path": "/search/m/v1/models", "raw_path": b"/search/m/v1/models"})
    assert scope["path"] == "/v1/models" and scope["vllm_gke.path_tenant"] == "search"


@pytest.mark.parametrize("headers, status", [
    ([], 401),
    ([(b"authorization", b"Basic abc")], 401),
    ([(b"authorization", b"Bearer " + b"a" * 20000)], 401),
    ([(b"authorization", b"Bearer not.a.jwt")], 401),
    ([(b"authorization", b"Bearer x.y.SIGNATURE_REMOVED_BY_GOOGLE")], 401),
    ([(b"x-vllm-gke-issuer", b"https://accounts.google.com")], 400),
])
def test_a_malformed_credential_is_a_4xx_guard_error(headers, status):
    identity = CloudRunIdentity(IAM, ["search"])
    with pytest.raises(GuardError) as err:
        asyncio.run(identity.tenant({"headers": headers, "vllm_gke.path_tenant": None}))
    assert err.value.status == status


@pytest.fixture(scope="module")
def cloud_run_guard(stack_values):
    """The guard as staging's Cloud Run model runs it (auth iam), before a recording app."""
    from tests.test_cloud_run_tenancy import staging
    from tests.test_guard import Clock, Recorder
    from vllm_gke.components.model.cloud_run_tenancy import cloud_run_guard_config
    from vllm_gke.images.vllm_gke_guard import GuardMiddleware
    from vllm_gke.infra.config import parse

    cfg = parse(staging(stack_values, auth="iam"))
    guard = cloud_run_guard_config(cfg, cfg.cloud_run_models[0])
    guard.pop("globalLimits", None)
    app = Recorder()
    return GuardMiddleware(app, guard, Clock()), app


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1"])
def test_metrics_is_served_to_the_instances_own_sidecar(cloud_run_guard, peer):
    from tests.test_guard import call, status

    mw, app = cloud_run_guard
    before = len(app.seen)
    assert status(call(mw, None, path="/metrics", method="GET", issuer=None, client=peer)) == 200
    assert len(app.seen) == before + 1


@pytest.mark.parametrize("peer", ["10.30.0.7", "169.254.1.1", "127.0.0.2", "::ffff:127.0.0.1", ""])
def test_metrics_to_any_other_peer_is_a_4xx_in_openais_format(cloud_run_guard, peer):
    from tests.test_guard import call, error, status

    mw, app = cloud_run_guard
    before = len(app.seen)
    sent = call(mw, None, path="/metrics", method="GET", issuer=None, client=peer)
    assert status(sent) == 403 and error(sent)["code"] == "forbidden" and error(sent)["message"]
    assert len(app.seen) == before  # vLLM never saw it
    # /health stays open to everyone (the startup probe may read it; it says nothing).
    assert status(call(mw, None, path="/health", method="GET", issuer=None, client=peer)) == 200
