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
