"""The components' pure parts in the model layer, without Pulumi: node pools and ComputeClasses,
the endpoint picker's objects, the Gateway's listeners and routes, tenants' identities and Istio
policies, and the monitoring definitions. Plain asserts on the data each builds."""

from __future__ import annotations

import re

import yaml

from vllm_gke.components.model.gateway_routes import (
    GATEWAY_NAME,
    HTTP_LISTENER,
    HTTPS_LISTENER,
    LENGTH_HINT_HEADER,
    MAX_DRAINING_S,
    PickerTarget,
    gateway_spec,
    https_redirect,
    length_rules,
    listeners,
    picker_rules,
    route_spec,
    service_backend_policy,
    serving_listener,
    weighted_backends,
)
from vllm_gke.components.model.k8s_objects import ACCESS_LABEL, COMPUTE_CLASS_LABEL, NODE_POOL_LABEL
from vllm_gke.components.model.mesh_identity import (
    STANDBY_SA,
    client_principal,
    jwks_host,
    request_principals,
    server_accounts,
    tenant_namespace,
)
from vllm_gke.components.model.monitoring import alert_policies
from vllm_gke.components.model.node_pools import (
    GPU_TAINT,
    TPU_TAINT,
    TRANSFER_POOL,
    compute_class_spec,
    compute_classes,
    gke_pools,
    placement_for,
)
from vllm_gke.components.model.picker import (
    EXT_PROC_PORT,
    GMP_NAMESPACES,
    METRICS_PORT,
    gmp_collectors,
    objective_spec,
    picker_config,
    picker_container,
    picker_deployment_spec,
    picker_ingress,
    pool_ref,
    pool_spec,
)
from vllm_gke.components.model.serving_api import (
    ISSUER_HEADER,
    OBJECTIVE_HEADER,
    SUBJECT_HEADER,
    TENANT_HEADER,
    VERIFIED_HEADERS,
    tenant_routes,
)
from vllm_gke.components.model.specs import GatewaySpec, MonitoringSpec, NodePoolSpec, PickerSpec, TenantSpec
from vllm_gke.components.model.tenant_policies import allow_tenant, jwt_rules
from vllm_gke.components.model.weights_layout import SERVER_SA


def tenant(name: str = "acme", subjects=None, dedicated: bool = False) -> TenantSpec:
    return TenantSpec.model_validate({
        "name": name, "jwt": {"issuer": "https://auth.example/a/", "jwksUri": "https://keys.example/a/jwks",
                              "audiences": ["vllm"], **({"subjects": subjects} if subjects else {})},
        "models": ["m"], "rateLimit": {"requestsPerMinute": 10}, "maxTokens": 100,
        **({"dedicated": {"models": ["m"], "nodePool": "own"}} if dedicated else {})})


# Node pools and ComputeClasses


def test_a_spot_pool_with_a_fallback_becomes_itself_then_its_on_demand_twin():
    spot = NodePoolSpec(name="l4", machine_type="g2-standard-8", spot=True, min_nodes=1, max_nodes=3)
    plain = NodePoolSpec(name="a100", machine_type="a2-highgpu-1g", min_nodes=1)
    pools = gke_pools([spot, plain])
    assert [(p.name, p.spot, p.is_twin, p.min_nodes) for p in pools] == [
        ("l4", True, False, 1), ("l4-ondemand", False, True, 0), ("a100", False, False, 1)]
    # Both halves carry the class's label and taint, so only pods the class places land there.
    for half in pools[:2]:
        assert half.node_labels() == {NODE_POOL_LABEL: "l4", COMPUTE_CLASS_LABEL: "l4"}
        assert half.taints() == [GPU_TAINT, (COMPUTE_CLASS_LABEL, "l4")]
    assert pools[2].node_labels() == {NODE_POOL_LABEL: "a100"} and pools[2].taints() == [GPU_TAINT]


def test_compute_classes_choose_spot_first_and_never_create_pools():
    spot = NodePoolSpec(name="l4", machine_type="g2-standard-8", spot=True, spot_return_migration=True)
    classes = compute_classes([spot, NodePoolSpec(name="a100", machine_type="a2-highgpu-1g")])
    assert classes == {"l4": {
        "priorities": [{"nodepools": ["l4"]}, {"nodepools": ["l4-ondemand"]}],
        "activeMigration": {"optimizeRulePriority": True},
        "nodePoolAutoCreation": {"enabled": False}, "whenUnsatisfiable": "DoNotScaleUp"}}
    # The transfer pool's class names one pool and says nothing of migration.
    assert compute_class_spec([TRANSFER_POOL]) == {
        "priorities": [{"nodepools": [TRANSFER_POOL]}], "nodePoolAutoCreation": {"enabled": False},
        "whenUnsatisfiable": "DoNotScaleUp"}


def test_placement_selects_the_class_or_the_pool_and_tolerates_the_accelerator():
    spot = placement_for(NodePoolSpec(name="l4", machine_type="g2-standard-8", spot=True))
    assert spot.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4", COMPUTE_CLASS_LABEL: "l4"}
    assert {"key": COMPUTE_CLASS_LABEL, "operator": "Equal", "value": "l4", "effect": "NoSchedule"} in spot.tolerations
    mig = placement_for(NodePoolSpec(name="mig", machine_type="a2-highgpu-1g", gpu_partition_size="3g.20gb"))
    assert mig.node_selector["cloud.google.com/gke-gpu-partition-size"] == "3g.20gb"
    assert mig.node_selector[NODE_POOL_LABEL] == "mig"
    assert list(mig.tolerations) == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    tpu_pool = NodePoolSpec(name="v6e", machine_type="ct6e-standard-4t")
    tpu = placement_for(tpu_pool)
    assert tpu.node_selector["cloud.google.com/gke-tpu-topology"] == tpu_pool.topology
    assert gke_pools([tpu_pool])[0].taints() == [TPU_TAINT]


# The endpoint picker


def test_the_picker_config_is_the_charts_default_profile():
    config = yaml.safe_load(picker_config(PickerSpec()))
    weights = [("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3)]
    assert config["schedulingProfiles"][0]["plugins"] == [{"pluginRef": n, "weight": w} for n, w in weights]


def test_the_picker_container_names_its_pool_and_sets_no_metric_flag():
    c = picker_container("m", "serving", "img:1", 600)
    args = c["args"]
    assert args[:4] == ["--pool-name", "m", "--pool-namespace", "serving"]
    assert not [a for a in args if str(a).endswith("-metric")]  # fatal at v0.10.0
    assert "--ha-enable-leader-election" in args and "--enable-pprof=false" in args
    spec = picker_deployment_spec("m-epp", c, "abc", 600, "m-router-epp")
    template = spec["template"]
    assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["annotations"]["vllm-gke.io/config-sha256"] == "abc"
    assert template["spec"]["containers"] == [c]
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": "100%", "maxUnavailable": "100%"}


def test_the_picker_admits_the_load_balancer_to_ext_proc_and_collectors_to_metrics():
    policy = picker_ingress("m-epp", ["10.0.0.0/23"], ["10.1.0.0/20"])
    ext_proc, metrics = policy["ingress"]
    assert ext_proc["from"] == [{"ipBlock": {"cidr": "10.0.0.0/23"}}]
    assert {"protocol": "TCP", "port": EXT_PROC_PORT} in ext_proc["ports"]
    assert metrics["from"] == [*gmp_collectors(), {"ipBlock": {"cidr": "10.1.0.0/20"}}]
    assert metrics["ports"] == [{"protocol": "TCP", "port": METRICS_PORT}]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in gmp_collectors()] \
        == list(GMP_NAMESPACES)


def test_the_pool_fails_closed_and_objectives_name_it():
    assert pool_spec("m-epp", 8000, {"app": "m"})["endpointPickerRef"] == {
        "name": "m-epp", "port": {"number": EXT_PROC_PORT}, "failureMode": "FailClose"}
    assert objective_spec("m", -1) == {"poolRef": {"name": "m", "group": "inference.networking.k8s.io"},
                                       "priority": -1}
    assert pool_ref("m") == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "m"}


# The Gateway's listeners and routes


def test_with_tls_routes_attach_to_https_and_http_only_redirects():
    spec = GatewaySpec(class_name="gke-l7-regional-external-managed", hostname="api.example.com",
                       managed_certificate=True)
    https, http = listeners(spec, certificate="vllm-gateway")
    assert serving_listener(spec) == HTTPS_LISTENER == https["name"]
    assert https["tls"] == {"mode": "Terminate", "options": {"networking.gke.io/cert-manager-certs": "vllm-gateway"}}
    assert https["allowedRoutes"]["namespaces"]["selector"]["matchLabels"] == {ACCESS_LABEL: "true"}
    assert http["allowedRoutes"] == {"namespaces": {"from": "Same"}}
    assert https_redirect(spec)["parentRefs"] == [{"name": GATEWAY_NAME, "sectionName": HTTP_LISTENER}]
    assert gateway_spec(spec, "vllm-gateway", "vllm-ip")["addresses"] == [{"type": "NamedAddress", "value": "vllm-ip"}]


def test_without_tls_the_http_listener_serves_tenants():
    spec = GatewaySpec(static_ip=False)
    (http,) = listeners(spec)
    assert serving_listener(spec) == HTTP_LISTENER == http["name"] and "hostname" not in http
    assert "addresses" not in gateway_spec(spec)


def test_length_rules_send_long_bodies_and_hints_to_the_long_pool_with_its_canary():
    short = weighted_backends("m-short", None, 8000, 0)
    long = weighted_backends("m-long", "m-canary-long", 8000, 10)
    assert long == [{"name": "m-long", "port": 8000, "weight": 90}, {"name": "m-canary-long", "port": 8000, "weight": 10}]
    by_length, by_hint, rest = length_rules("m", 16384, short, long)
    assert re.fullmatch(by_length["matches"][0]["headers"][0]["value"], "16384")
    assert by_hint["matches"][0]["headers"] == [{"type": "Exact", "name": LENGTH_HINT_HEADER, "value": "long"}]
    assert by_length["backendRefs"] == by_hint["backendRefs"] == long and rest["backendRefs"] == short
    assert rest["matches"] == [{"path": {"type": "PathPrefix", "value": "/m/v1"}}]
    for rule in (by_length, by_hint, rest):
        assert rule["filters"][0]["requestHeaderModifier"]["remove"] == list(VERIFIED_HEADERS)
    assert route_spec({"name": GATEWAY_NAME}, [rest], "api.example.com")["hostnames"] == ["api.example.com"]


def test_picker_rules_require_the_objective_and_tenant_the_identity_extension_set():
    picker = PickerTarget("m", "acme.m", "acme", routes=(("/v1/completions", "POST"), ("/v1/models", "GET")))
    completions, models = picker_rules("acme/m", picker)
    verified = [{"type": "Exact", "name": OBJECTIVE_HEADER, "value": "acme.m"},
                {"type": "Exact", "name": TENANT_HEADER, "value": "acme"}]
    assert completions["matches"][0]["path"] == {"type": "Exact", "value": "/acme/m/v1/completions"}
    assert completions["matches"][0]["headers"][:2] == verified and len(completions["matches"][0]["headers"]) == 3
    assert models["matches"][0]["headers"] == verified  # no body, no Content-Length bound
    assert models["backendRefs"] == [pool_ref("m")]
    assert models["filters"][0]["requestHeaderModifier"] == {"remove": list(VERIFIED_HEADERS)}


def test_service_backend_policy_keeps_draining_within_the_load_balancers_bound():
    policy = service_backend_policy("m-short", 3600, 5)
    assert policy["default"]["maxRatePerEndpoint"] == 5
    assert policy["default"]["connectionDraining"]["drainingTimeoutSec"] <= MAX_DRAINING_S
    assert policy["targetRef"] == {"group": "", "kind": "Service", "name": "m-short"}
    assert "maxRatePerEndpoint" not in service_backend_policy("m-short", 600)["default"]


# Tenants in the mesh


def test_a_tenants_identity():
    t = tenant(subjects=["svc-1"], dedicated=True)
    assert tenant_namespace(t) == "tenant-acme" and jwks_host(t) == "keys.example"
    assert request_principals(t) == ["https://auth.example/a//svc-1"]
    assert request_principals(tenant()) == ["https://auth.example/a//*"]
    assert server_accounts(t) == (SERVER_SA, STANDBY_SA) and server_accounts(tenant()) == ()
    assert client_principal("vllm") == f"*/ns/vllm/sa/{SERVER_SA}"


def test_tenant_policies_pin_issuer_subject_and_objective():
    t = tenant(subjects=["svc-1"])
    (rule,) = jwt_rules(t)["jwtRules"]
    assert rule["audiences"] == ["vllm"] and rule["forwardOriginalToken"] is False
    assert {h["header"] for h in rule["outputClaimToHeaders"]} == {ISSUER_HEADER, SUBJECT_HEADER}
    spec = allow_tenant(t, tenant_routes(), ["/acme/m"], {"app": "m"}, "acme.m")
    # One release: the move from bf329cd's routes (issue 39); drop next release. The same principals,
    # issuer, subject and objective under either name of the objective header, nothing wider.
    allow, legacy = spec["rules"]
    assert spec["selector"] == {"matchLabels": {"app": "m"}}
    for rule, header in ((allow, OBJECTIVE_HEADER), (legacy, "x-gateway-inference-objective")):
        assert rule["from"] == [{"source": {"requestPrincipals": request_principals(t)}}]
        assert rule["to"] == allow["to"]
        assert rule["when"] == [
            {"key": f"request.headers[{ISSUER_HEADER}]", "values": [t.jwt.issuer]},
            {"key": f"request.headers[{SUBJECT_HEADER}]", "values": ["svc-1"]},
            {"key": f"request.headers[{header}]", "values": ["acme.m"]}]
    (plain,) = allow_tenant(t, tenant_routes(), ["/acme/m"], {"app": "m"})["rules"]  # not behind a picker: one rule
    assert [w["key"] for w in plain["when"]] == [f"request.headers[{ISSUER_HEADER}]", f"request.headers[{SUBJECT_HEADER}]"]
    assert "selector" not in allow_tenant(t, tenant_routes(), ["/acme"])


# Monitoring


def test_a_model_with_a_replica_floor_is_paged_when_it_goes_silent():
    names = [p["display_name"] for p in alert_policies("c", MonitoringSpec(), always_on=["m"])]
    assert names[-1] == "No replica of m reports"
    assert "Tenants shed for overload" in [p["display_name"] for p in alert_policies("c", MonitoringSpec(), sheddable=True)]
