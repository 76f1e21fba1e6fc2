"""The endpoint picker's config from the stack (vllm-gke:picker and the tenants' priorities), checked
against llm-d-router v0.10.0's strict decoder (the contract's table of JSON tags; against the Go
source itself where the mirror is here), the flow-control bands, and the move from v1.2.0 in one
`pulumi up` as the plan's resource graph orders it."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import manifests_of
from vllm_gke.components.model.picker import (
    PickerExtension,
    picker_config_data,
    picker_migration_notes,
)
from vllm_gke.components.model.specs import PickerSpec, TenantSpec
from vllm_gke.infra.contracts.picker import (
    CONFIG_FIELDS,
    DEPRECATED_FIELDS,
    PLUGIN_TYPES,
    TYPES,
    picker_config_is_strictly_decodable,
    picker_flow_control_bands,
)

MIRROR = Path("/work/.mirror/llm-d+llm-d-router/repo")


def _go(path: str) -> str:
    return subprocess.run(["git", "-C", str(MIRROR), "show", f"v0.10.0:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _config(plan) -> dict:
    (cm,) = [c for c in manifests_of(plan, "ConfigMap") if c["metadata"]["name"] == "llama-8b-router-epp"]
    return yaml.safe_load(cm["data"]["default-plugins.yaml"])


@pytest.mark.skipif(not MIRROR.is_dir(), reason="llm-d-router's mirror is not here (CI): the table is checked instead")
def test_the_tables_json_tags_are_the_go_structs():
    """CONFIG_FIELDS (file:line of each tag) is what endpointpickerconfig_types.go says at v0.10.0,
    and each registered plugin type is registered on the line the table names."""
    lines = _go(TYPES).splitlines()
    structs: dict[str, dict[str, int]] = {}
    current = None
    for n, line in enumerate(lines, 1):
        if m := re.match(r"type (\w+) struct", line):
            current = m.group(1)
        elif current and (m := re.search(r'json:"([^",]*)', line)):
            structs.setdefault(current, {})[m.group(1) or "inline"] = n
    for struct, fields in CONFIG_FIELDS.items():
        wanted = {k: v for k, v in fields.items() if k not in ("apiVersion", "kind")}
        assert {k: structs[struct][k] for k in wanted} == wanted, struct
        deprecated = DEPRECATED_FIELDS.get(struct, {})
        assert {k: structs[struct][k] for k in deprecated} == deprecated, struct
        assert set(structs[struct]) - {"inline"} == set(wanted) | set(deprecated), struct
    runner = _go("cmd/epp/runner/runner.go").splitlines()
    for kind, line in PLUGIN_TYPES.items():
        assert "Register" in runner[line - 1] and "StabilityBeta" in runner[line - 1], kind


def test_every_key_the_stacks_emit_is_a_field(plans):
    for stack in ("staging", "frontier"):
        assert picker_config_is_strictly_decodable(plans[stack]) == []
        assert picker_flow_control_bands(plans[stack]) == []


def test_an_extension_plugs_in_and_the_check_catches_a_typo():
    ext = PickerExtension(plugins=({"type": "precise-prefix-cache-producer", "parameters": {}},),
                          profile_plugins=({"pluginRef": "precise-prefix-cache-producer", "weight": 3},),
                          data_sources=({"pluginRef": "endpoint-notification-source",
                                         "extractors": [{"pluginRef": "precise-prefix-cache-producer"}]},))
    config = picker_config_data(PickerSpec(), [0], ext)
    assert config["dataLayer"] == {"sources": [dict(ext.data_sources[0])]}
    assert {"pluginRef": "precise-prefix-cache-producer", "weight": 3} in config["schedulingProfiles"][0]["plugins"]
    assert "dataLayer" not in picker_config_data(PickerSpec(), [0])


def test_a_band_per_priority_round_robin_in_each_and_small_sheddable_bounds():
    config = picker_config_data(PickerSpec(), [10, 0, -1, -5, 10])
    fc = config["flowControl"]
    assert config["featureGates"] == ["flowControl"]
    assert [b["priority"] for b in fc["priorityBands"]] == [10, 0]  # negative ones from the template
    bands = [*fc["priorityBands"], fc["defaultPriorityBand"], fc["defaultNegativePriorityBand"]]
    assert {(b["fairnessPolicyRef"], b["orderingPolicyRef"]) for b in bands} == {
        ("round-robin-fairness-policy", "fcfs-ordering-policy")}
    assert (fc["priorityBands"][0]["maxRequests"], fc["priorityBands"][0]["maxBytes"]) == ("1000", "512Mi")
    assert (fc["defaultNegativePriorityBand"]["maxRequests"], fc["defaultNegativePriorityBand"]["maxBytes"]) == (
        "50", "64Mi")
    assert (fc["maxRequests"], fc["maxBytes"], fc["defaultRequestTTL"]) == ("2000", "1024Mi", "60s")
    assert fc["saturationDetector"] == {"pluginRef": "utilization-detector"}
    (detector,) = [p for p in config["plugins"] if p["type"] == "utilization-detector"]
    assert detector["parameters"] == {"queueDepthThreshold": 5, "kvCacheUtilThreshold": 0.8,
                                      "metricsStalenessThreshold": "200ms"}


def test_without_flow_control_only_the_detector_remains():
    spec = PickerSpec.model_validate({"flowControl": {"enabled": False}, "scorers": {"prefixCache": 0}})
    config = picker_config_data(spec, [0, -1])
    assert "featureGates" not in config
    assert config["flowControl"] == {"saturationDetector": {"pluginRef": "utilization-detector"}}
    assert {p["type"] for p in config["plugins"]} == {"queue-scorer", "kv-cache-utilization-scorer",
                                                      "utilization-detector", "openai-parser", "anthropic-parser"}


def test_positive_priorities_are_accepted_again_within_range():
    base = {"name": "t", "jwt": {"issuer": "https://a.example/t", "jwksUri": "https://a.example/t/jwks",
                                 "audiences": ["x"]}, "models": ["m"], "rateLimit": {"requestsPerMinute": 1},
            "maxTokens": 1}
    assert TenantSpec.model_validate({**base, "priority": 10}).priority == 10
    with pytest.raises(ValueError):
        TenantSpec.model_validate({**base, "priority": 101})


def test_the_stacks_picker_settings_reach_the_pool_and_the_config(plans, stack_values):
    from vllm_gke.infra.plan import run_program

    values = copy.deepcopy(stack_values["staging"])
    values["vllm-gke:picker"] = {"failureMode": "FailOpen", "flowControl": {"queueTtlSeconds": 30},
                                 "scorers": {"prefixCache": 5}}
    values["vllm-gke:tenants"][0]["priority"] = 10
    plan = run_program("staging", values)
    (pool,) = manifests_of(plan, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    config = _config(plan)
    assert config["flowControl"]["defaultRequestTTL"] == "30s"
    assert [b["priority"] for b in config["flowControl"]["priorityBands"]] == [10, 0]
    assert {"pluginRef": "prefix-cache-scorer", "weight": 5} in config["schedulingProfiles"][0]["plugins"]
    assert _config(plans["staging"])["flowControl"]["defaultRequestTTL"] == "60s"  # the default


def test_the_move_from_v1_2_0_is_ordered_in_the_plan(plans):
    """llm-d.ai's CRDs, then the new objectives (a new type token: created, the old ones deleted at
    the end), then the new picker under names of its own (so the v1.2.0 picker serves until the end
    of the update), then the pool; v1.2.0's objective CRD keeps its logical name."""
    plan = plans["staging"]
    crds = [r for r in plan.of_type("kubernetes:yaml/v2:ConfigFile") if "llm-d-router" in r.props["file"]]
    objectives = plan.of_type("kubernetes:llm-d.ai/v1alpha2:InferenceObjective")
    picker = plan.kube("Deployment", "llama-8b-router-epp")
    assert len(crds) == 2 and len(objectives) == 2
    assert all(plan.waits_for(o, c) for o in objectives for c in crds)
    assert all(plan.waits_for(picker, o) for o in objectives)
    # The pool does not wait for the picker (which turns ready only once it has read its pool: a first
    # `pulumi up` would never end); the routes do.
    assert not plan.waits_for(plan.kube("InferencePool", "llama-8b"), picker)
    routes = plan.of_type("kubernetes:gateway.networking.k8s.io/v1:HTTPRoute")
    assert routes and all(plan.waits_for(route, picker) for route in routes)
    # One release: the move from bf329cd's routes (issue 39); drop next release. The identity extension
    # (which strips the old objective header those routes match) is programmed only after the new
    # routes (which take that header too); its pods and Service are up before them, and the routes
    # never wait for the extension (no cycle: the plan above ran).
    extension = plan.kube("GCPRoutingExtension", "vllm-gke-identity")
    identity = [plan.kube(k, "vllm-gke-identity") for k in ("Deployment", "Service")]
    assert all(plan.waits_for(extension, route) for route in routes)
    assert all(plan.waits_for(route, d) and not plan.waits_for(route, extension) for route in routes for d in identity)
    # Not the old Deployment's or ConfigMap's name: created beside them, they are deleted at the end.
    assert plan.kube("ConfigMap", "llama-8b-router-epp") and not [
        r for r in plan.kubernetes() if r.props.get("kind") in ("Deployment", "ConfigMap")
        and r.props["metadata"]["name"] == "llama-8b-epp"]
    # ...and the Service selects the old picker's pods and the new one's alike.
    (svc,) = [s for s in manifests_of(plan, "Service") if s["metadata"]["name"] == "llama-8b-epp"]
    assert svc["spec"]["selector"] == {"inferencepool": "llama-8b-epp"}
    assert plan.named("kubernetes:yaml/v2:ConfigFile", "inference-objective-crd-crd")
    (note,) = picker_migration_notes(plan.config)
    assert note.index("(1)") < note.index("CRDs") < note.index("(2)") < note.index("(3)") < note.index("(4)")
    # One release: the move from bf329cd's routes (issue 39); drop next release.
    assert note.index("(3)") < note.index("updates the tenants' routes") < note.index(
        "only then programs the identity extension") < note.index("nothing is refused") < note.index("(4)")
    # The seconds at the end when the old pods no longer take ext_proc and the load balancer still sends to
    # them, said as they are, with the way around them.
    assert "without a gap" not in note and "about 4 s once GKE applies the picker's HealthCheckPolicy" in note
    assert "500 under FailClose" in note and "`vllm-gke:picker.failureMode: FailOpen`" in note
    assert picker_migration_notes(plans["dev"].config) == []


def test_the_llm_d_objectives_validate_against_the_shared_crd(plans, crd_catalog):
    from vllm_gke.infra.manifests import validate

    (objective, _other) = manifests_of(plans["staging"], "InferenceObjective")
    assert any(v.source == "llmd-router-v0.10.0-inferenceobjectives.yaml"
               for v in crd_catalog.versions("llm-d.ai/v1alpha2", "InferenceObjective"))
    assert validate(objective, crd_catalog) == []
    bad = copy.deepcopy(objective)
    del bad["spec"]["poolRef"]["name"]
    assert validate(bad, crd_catalog)
    (pool,) = manifests_of(plans["staging"], "InferencePool")
    assert any(v.source == "gie-v1.5.0-inferencepools.yaml"
               for v in crd_catalog.versions("inference.networking.k8s.io/v1", "InferencePool"))
    assert validate(pool, crd_catalog) == []
    wrong = copy.deepcopy(pool)
    wrong["spec"]["endpointPickerRef"]["failureMode"] = "FailClosed"  # the chart README's spelling
    assert validate(wrong, crd_catalog)


def test_the_load_balancer_checks_the_pickers_readiness_every_2_s(plans, crd_catalog):
    """A stopping leader answers 503 rejected-shutting-down until the load balancer stops sending to it:
    its Service is checked on the leader-only 'readiness' service every 2 s (out after 2 failures, a new
    leader in at its first pass), against both HealthCheckPolicy CRDs; the policy waits for its Service."""
    from vllm_gke.infra.manifests import validate

    plan = plans["staging"]
    (check,) = [h for h in manifests_of(plan, "HealthCheckPolicy")
                if h["spec"]["targetRef"] == {"group": "", "kind": "Service", "name": "llama-8b-epp"}]
    assert check["spec"]["default"] == {
        "checkIntervalSec": 2, "timeoutSec": 2, "healthyThreshold": 1, "unhealthyThreshold": 2,
        "config": {"type": "GRPC", "grpcHealthCheck": {"portSpecification": "USE_FIXED_PORT", "port": 9003,
                                                       "grpcServiceName": "readiness"}}}
    assert {v.source for v in crd_catalog.versions("networking.gke.io/v1", "HealthCheckPolicy")} >= {
        "gkegw-HEAD-healthcheckpolicies.yaml", "gke-healthcheckpolicy-v1-from-datree-bb63420.yaml"}
    assert validate(check, crd_catalog) == []
    misspelt = copy.deepcopy(check)
    misspelt["spec"]["default"]["config"]["grpcHealthCheck"]["serviceName"] = "readiness"
    assert validate(misspelt, crd_catalog)
    policy = plan.kube("HealthCheckPolicy", "llama-8b-epp")
    assert plan.waits_for(policy, plan.kube("Service", "llama-8b-epp"))


def test_the_plan_says_the_queue_may_outlast_the_load_balancers_callout(plans, stack_values):
    """GKE documents no per-message timeout for an InferencePool's picker, so a queued request's fate past
    some seconds is unverified: the plan says so wherever a picker queues, and nowhere else."""
    from vllm_gke.infra.advice import plan_warnings
    from vllm_gke.infra.config import parse

    def said(cfg):
        return [w for w in plan_warnings(cfg, "ZONAL") if "per-message timeout" in w]

    (warning,) = said(plans["staging"].config)
    assert warning.startswith("llama-8b: picker.flowControl.queueTtlSeconds is 60")
    assert "unverified" in warning and "at most 10 s" in warning and "500 under FailClose" in warning
    assert said(plans["dev"].config) == []  # no picker
    values = copy.deepcopy(stack_values["staging"])
    values["vllm-gke:picker"] = {"flowControl": {"enabled": False}}
    assert said(parse(values)) == []  # nothing waits in the picker
