"""Every emitted Kubernetes manifest validates against its schema, and the check has teeth."""

from __future__ import annotations

import copy

import pytest

from infra.manifests import validate
from tests.conftest import STACKS, manifests_of


@pytest.mark.parametrize("stack", STACKS)
def test_every_manifest_validates(plans, stack):
    docs = plans[stack].manifests()
    assert docs
    failures = {f"{d['kind']}/{d['metadata']['name']}": errs for d in docs if (errs := validate(d))}
    assert failures == {}


def test_manifest_count_per_stack(plans):
    counts = {s: len(plans[s].manifests()) for s in STACKS}
    assert counts["dev"] < counts["staging"] < counts["prod"]


def _mutated(plan, kind, mutate):
    doc = copy.deepcopy(manifests_of(plan, kind)[0])
    mutate(doc)
    return validate(doc)


def test_core_schema_rejects_unknown_field(plans):
    def typo(doc):
        doc["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    errs = _mutated(plans["dev"], "Deployment", typo)
    assert errs and "volumeMount" in errs[0]


def test_core_schema_rejects_wrong_type(plans):
    def bad(doc):
        doc["spec"]["minReplicas"] = "one"
    assert _mutated(plans["dev"], "HorizontalPodAutoscaler", bad)


def test_crd_schema_rejects_bad_enum_and_unknown_field(plans):
    assert any("PERMIT" in e for e in _mutated(plans["dev"], "AuthorizationPolicy", lambda d: d["spec"].update(action="PERMIT")))
    def bad_route(doc):
        doc["spec"]["rules"][0]["backendRef"] = []
    assert any("backendRef" in e for e in _mutated(plans["dev"], "HTTPRoute", bad_route))
    def no_issuer(doc):
        del doc["spec"]["jwtRules"][0]["issuer"]
    assert any("issuer" in e for e in _mutated(plans["dev"], "RequestAuthentication", no_issuer))


def test_unknown_kind_is_reported():
    errs = validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    assert errs and "no schema" in errs[0]
