"""The guard maps the verified identity to a tenant: its issuer, and where the tenant lists
subjects (jwt.subjects), the verified subject header must be one of them - refused otherwise with
a 403 in OpenAI's error format, on the common chat path and the general one alike."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_guard import Clock, Recorder, _call, error, guard, status
from vllm_gke.components.model.serving_api import ISSUER_HEADER, SUBJECT_HEADER, guard_config, tenant_routes
from vllm_gke.components.model.specs import TenantSpec

GOOGLE = "https://accounts.google.com"
AUTH0 = "https://acme.eu.auth0.com/"  # Auth0's iss ends in '/'
LISTED, OTHER = "104476360121718219735", "999999999999999999999"


def tenant(name, issuer, subjects=None):
    jwt = {"issuer": issuer, "jwksUri": "https://keys.example/jwks", "audiences": ["x"]}
    if subjects is not None:
        jwt["subjects"] = subjects
    return TenantSpec.model_validate({"name": name, "jwt": jwt, "models": ["m"],
                                      "rateLimit": {"requestsPerMinute": 1000}, "maxTokens": 100})


def guarded():
    app = Recorder()
    cfg = guard_config([tenant("listed", GOOGLE, [LISTED, "2"]), tenant("own", AUTH0)], tenant_routes())
    return guard.GuardMiddleware(app, cfg, Clock()), app


def chat(mw, issuer=GOOGLE, subjects=(LISTED,), client="127.0.0.6", path="/v1/chat/completions"):
    raw = b'{"messages": [], "max_completion_tokens": 5}'
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if issuer is not None:
        hdrs.append((ISSUER_HEADER.encode(), issuer.encode()))
    hdrs += [(SUBJECT_HEADER.encode(), s.encode()) for s in subjects]
    return asyncio.run(_call(mw, raw, path, "POST", hdrs, client, split=None))


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_only_a_listed_subject_is_the_tenant(fast_path, path):
    mw, app = guarded()
    mw.fast_path = fast_path
    assert status(chat(mw, path=path)) == 200 and status(chat(mw, subjects=("2",), path=path)) == 200
    for subjects in ((OTHER,), (), (LISTED, LISTED), (LISTED, OTHER), (LISTED + " ",)):
        sent = chat(mw, subjects=subjects, path=path)
        assert status(sent) == 403, subjects
        assert error(sent) == {"message": "this token's subject is not one tenant 'listed' lists (jwt.subjects)",
                               "type": "permission_error", "param": None, "code": "forbidden"}
    assert len(app.seen) == 2


def test_a_tenant_without_a_list_is_every_subject_of_its_issuer_verbatim():
    mw, app = guarded()
    assert status(chat(mw, issuer=AUTH0, subjects=())) == 200
    assert status(chat(mw, issuer=AUTH0, subjects=("auth0|1", "auth0|2"))) == 200
    # The issuer is compared as the token carries it: without its '/', it names no tenant.
    assert status(chat(mw, issuer=AUTH0.rstrip("/"), subjects=())) == 403


def test_a_client_set_subject_header_is_not_trusted_off_the_sidecar():
    mw, app = guarded()
    assert status(chat(mw, client="10.20.0.5")) == 403 and not app.seen


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([GOOGLE, AUTH0, None]),
                          st.lists(st.sampled_from([LISTED, OTHER, "2", ""]), max_size=2)), min_size=1, max_size=4))
def test_the_common_chat_path_decides_subjects_as_the_general_one(requests):
    pairs = []
    for fast in (True, False):
        mw, app = guarded()
        mw.fast_path = fast
        pairs.append((mw, app))
    for issuer, subjects in requests:
        outcomes = [(chat(mw, issuer, subjects), list(app.seen)) for mw, app in pairs]
        assert outcomes[0] == outcomes[1], (issuer, subjects)
