"""Every emitted manifest validates as the API server would: built-in kinds against Kubernetes'
OpenAPI, custom resources against the upstream CRDs (schema, pruning, defaults, CEL rules)."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import STACKS, manifests_of
from vllm_gke.infra.crd_validation import apply_defaults, eval_rule, unknown_fields
from vllm_gke.infra.manifests import UNPUBLISHED_CRDS, is_builtin, unpublished, validate


@pytest.mark.parametrize("stack", STACKS)
def test_every_manifest_validates(plans, crd_catalog, stack):
    docs = plans[stack].manifests()
    assert docs
    failures = {f"{d['kind']}/{d['metadata']['name']}": errs for d in docs if (errs := validate(d, crd_catalog))}
    assert failures == {}


@pytest.mark.parametrize("stack", STACKS)
def test_every_custom_kind_has_an_upstream_crd(plans, crd_catalog, stack):
    """Every custom kind a stack emits is validated against a CRD the folder holds: none is
    left unchecked (the Inference Gateway, KEDA and Volume Populator kinds included)."""
    custom = {(d["apiVersion"], d["kind"]) for d in plans[stack].manifests() if not is_builtin(d) and not unpublished(d)}
    assert custom and custom <= crd_catalog.kinds()
    # A kind excused for want of a CRD is not in the folder: once it is, its excuse goes.
    assert not set(UNPUBLISHED_CRDS) & crd_catalog.kinds()


def test_leader_worker_sets_validate_against_the_pinned_crd(plans, crd_catalog):
    """kubernetes-sigs/lws v0.10.0's CRD (../shared/upstream-crds/lws-v0.10.0-leaderworkersets.yaml):
    its schema embeds the pod templates, so a typo there is pruned as the API server would."""
    assert any(v.source == "lws-v0.10.0-leaderworkersets.yaml"
               for v in crd_catalog.versions("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"))
    (lws, *_rest) = [d for d in plans["frontier"].manifests() if d["kind"] == "LeaderWorkerSet"]
    assert validate(lws, crd_catalog) == []
    typo = copy.deepcopy(lws)
    typo["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["volumeMount"] = []
    assert any("volumeMount" in e for e in validate(typo, crd_catalog))
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    bad["spec"]["rolloutStrategy"]["surge"] = 1
    errs = validate(bad, crd_catalog)
    assert any("'Always'" in e for e in errs) and any("surge" in e for e in errs)


def test_inference_keda_and_populator_kinds_are_validated_not_passed(plans, crd_catalog):
    """The kinds once listed as unheld are checked against their upstream CRDs: a bad field fails."""
    docs = plans["staging"].manifests()
    for kind in ("InferencePool", "InferenceObjective", "ScaledObject", "ClusterTriggerAuthentication"):
        doc = copy.deepcopy(next(d for d in docs if d["kind"] == kind))
        assert validate(doc, crd_catalog) == [], kind
        doc["spec"]["notAField"] = 1
        assert any("notAField" in e for e in validate(doc, crd_catalog)), kind
    assert validate({"apiVersion": "inference.networking.k8s.io/v2", "kind": "InferencePool",
                     "metadata": {"name": "p"}}, crd_catalog)  # an unlisted version is still an error


def test_every_custom_resource_is_checked_against_each_upstream_version(crd_catalog):
    sources = {v.source for v in crd_catalog.versions("gateway.networking.k8s.io/v1", "HTTPRoute")}
    assert {"gwapi-v1.2.1-httproutes.yaml", "gwapi-v1.6.1-httproutes.yaml", "gwapi-HEAD-httproutes.yaml"} <= sources
    sources = {v.source for v in crd_catalog.versions("networking.gke.io/v1", "HealthCheckPolicy")}
    assert {"gkegw-HEAD-healthcheckpolicies.yaml", "gke-healthcheckpolicy-v1-from-datree-bb63420.yaml"} <= sources


def test_manifest_count_per_stack(plans):
    counts = {s: len(plans[s].manifests()) for s in STACKS}
    assert counts["dev"] < counts["staging"] < counts["prod"]


def _mutated(plan, kind, mutate, catalog=None):
    doc = copy.deepcopy(manifests_of(plan, kind)[0])
    mutate(doc)
    return validate(doc, catalog)


def test_core_schema_rejects_unknown_field(plans):
    def typo(doc):
        doc["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    errs = _mutated(plans["dev"], "Deployment", typo)
    assert errs and "volumeMount" in errs[0]


def test_core_schema_rejects_wrong_type(plans):
    def bad(doc):
        doc["spec"]["minAvailable"] = ["one"]
    assert _mutated(plans["dev"], "PodDisruptionBudget", bad)


def test_crd_rejects_bad_enum_unknown_field_and_missing_required(plans, crd_catalog):
    errs = _mutated(plans["dev"], "AuthorizationPolicy", lambda d: d["spec"].update(action="PERMIT"), crd_catalog)
    assert any("PERMIT" in e for e in errs)

    def bad_route(doc):
        doc["spec"]["rules"][0]["backendRef"] = []
    errs = _mutated(plans["dev"], "HTTPRoute", bad_route, crd_catalog)
    assert any("unknown field 'backendRef'" in e and "prunes" in e for e in errs)

    def no_issuer(doc):
        del doc["spec"]["jwtRules"][0]["issuer"]
    assert _mutated(plans["dev"], "RequestAuthentication", no_issuer, crd_catalog)


def test_cel_rule_rewrite_needs_exactly_one_path_prefix_match(plans, crd_catalog):
    """The defect that once kept every HTTPRoute out of the cluster: two matches in a rewriting rule.
    The routes rewrite no path now (the guard strips the prefix); the CRDs still catch it."""
    def two_matches(doc):
        rule = doc["spec"]["rules"][0]
        rule["filters"].append({"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}})
        rule["matches"].append(copy.deepcopy(doc["spec"]["rules"][1]["matches"][0]))
    errs = _mutated(plans["dev"], "HTTPRoute", two_matches, crd_catalog)
    needle = "exactly one PathPrefix match must be specified"
    failing = {e.split("]")[0].lstrip("[") for e in errs if needle in e}
    assert {"gwapi-v1.2.1-httproutes.yaml", "gwapi-v1.6.1-httproutes.yaml", "gwapi-HEAD-httproutes.yaml"} <= failing


def test_cel_rule_health_check_port_needs_port_specification(plans, crd_catalog):
    def no_spec(doc):
        del doc["spec"]["default"]["config"]["httpHealthCheck"]["portSpecification"]
    errs = _mutated(plans["dev"], "HealthCheckPolicy", no_spec, crd_catalog)
    assert any(e.startswith("[gkegw-HEAD-healthcheckpolicies.yaml]") for e in errs)
    # The GKE 1.33 CRD accepts it: only holding both versions shows the difference.
    assert not any(e.startswith("[gke-healthcheckpolicy-v1-from-datree") for e in errs)


def test_cel_heterogeneous_equality_and_kubernetes_functions():
    assert eval_rule("self != 0", "http") == (True, None)  # int-or-string port: cel-go compares types
    assert eval_rule("self.substring(1, 3) == 'bc'", "abcd") == (True, None)
    assert eval_rule("isURL(self) && url(self).getScheme() == 'https'", "https://a.example/x") == (True, None)
    assert eval_rule("self.split('/').size() == 3", "a/b/c") == (True, None)
    ok, err = eval_rule("self.missing == 1", {"present": 1})
    assert not ok and err  # evaluation errors reject, as on the server


def test_defaults_are_applied_before_rules():
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "mode": {"type": "string", "default": "A"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "weight": {"type": "integer", "default": 1}}}}}}}}
    doc = apply_defaults({"spec": {"items": [{}, {"weight": 5}]}}, schema)
    assert doc == {"spec": {"mode": "A", "items": [{"weight": 1}, {"weight": 5}]}}


def test_pruning_reports_nested_unknown_fields_only():
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "a": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}
    doc = {"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
           "spec": {"a": {"anything": 1}, "b": 2}}
    assert unknown_fields(doc, schema) == ["spec.b: unknown field 'b' (the API server prunes it silently)"]


def test_unknown_custom_kind_is_reported(crd_catalog):
    errs = validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}, crd_catalog)
    assert errs and "no upstream CRD" in errs[0]


def test_a_kind_without_a_crd_fails_unless_excused_by_name(crd_catalog):
    """A custom kind the folder holds no CRD for fails the plan; only UNPUBLISHED_CRDS' kinds pass,
    each with the reason the plan prints."""
    stray = {"apiVersion": "networking.gke.io/v1", "kind": "GCPTrafficExtension", "metadata": {"name": "x"}, "spec": {}}
    assert validate(stray, crd_catalog) == [
        "no upstream CRD for networking.gke.io/v1 GCPTrafficExtension in the CRD folder: add it there"]
    excused = {**stray, "kind": "GCPRoutingExtension"}
    assert validate(excused, crd_catalog) == [] and "tests/test_inference_gateway.py" in (unpublished(excused) or "")
