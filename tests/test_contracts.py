"""The component contracts: every stack honours every row, each row's check catches the plan
breaking it, and docs/contracts.md is the table as the code has it."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Callable

import pytest
import yaml

from tests.conftest import STACKS
from vllm_gke.components.model.serving_api import OBJECTIVE_HEADER
from vllm_gke.infra.contracts import CONTRACTS, DOC, markdown, problems
from vllm_gke.infra.mocks import PlannedResource


@pytest.fixture(scope="module")
def hyperdisk():
    """Staging on Hyperdisk ML weights, the one backend no stack uses (Volume Populator's rows)."""
    from tests.test_hyperdisk_weights import hyperdisk_values
    from vllm_gke.infra.plan import run_program

    return run_program("staging", hyperdisk_values(extra=True))


@pytest.fixture
def any_plan(plans, hyperdisk):
    return lambda stack: hyperdisk if stack == "hyperdisk" else plans[stack]


@pytest.mark.parametrize("stack", [*STACKS, "hyperdisk"])
def test_every_stack_honours_every_contract(any_plan, stack):
    assert [(c.component, c.behaviour[:40], p) for c, p in problems(any_plan(stack))] == []


def test_every_row_names_an_upstream_source_at_a_version():
    for c in CONTRACTS:
        assert c.version and ("@" in c.source or c.source.startswith("https://")), c.behaviour
        assert c.behaviour and c.honoured_by


def test_the_contracts_page_is_generated_from_the_table():
    assert DOC.read_text() == markdown(), "run: python -m vllm_gke.infra.contracts"


def _kube(plan, kind, name=None):
    return next(r for r in plan.resources if r.props.get("kind") == kind
                and (name is None or r.props["metadata"]["name"] == name))


def _container(plan, kind, name):
    return _kube(plan, kind, name).props["spec"]["template"]["spec"]["containers"][0]


def _drop(plan, kind, name):
    plan.resources.remove(_kube(plan, kind, name))


def _wake_on_a_made_up_label(plan):
    """A picker wake trigger selecting the pool by a label the picker's series do not carry."""
    for r in plan.resources:
        for t in r.props.get("spec", {}).get("triggers") or [] if r.props.get("kind") == "ScaledObject" else []:
            if "llm_d_epp_" in str(t.get("metadata", {}).get("query", "")):
                t["metadata"]["query"] = t["metadata"]["query"].replace("inference_pool=", "pool_name=")
                return
    raise AssertionError("no picker wake trigger")


def _drop_arg(plan, kind, name, flag, with_value=True):
    args = _container(plan, kind, name)["args"]
    i = args.index(flag)
    del args[i:i + (2 if with_value else 1)]


def _add_external_apiservice(plan):
    plan.resources.append(PlannedResource("kubernetes:apiregistration.k8s.io/v1:APIService", "x", "urn:x", None, True, {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1"}}))


def _no_firewall(plan):
    plan.resources[:] = [r for r in plan.resources if r.type != "gcp:compute/firewall:Firewall"]


def _no_pod_identity(plan):
    release = next(r for r in plan.resources if r.type == "kubernetes:helm.sh/v3:Release")
    release.props["values"]["podIdentity"]["gcp"]["enabled"] = False


def _unsummed_query(plan):
    trigger = _kube(plan, "ScaledObject").props["spec"]["triggers"][0]
    trigger["metadata"]["query"] = "vllm:num_requests_waiting{pod=~'x'}"


def _cooldown_on_a_floor(plan):
    so = next(r for r in plan.resources if r.props.get("kind") == "ScaledObject"
              and r.props["spec"]["minReplicaCount"] > 0)
    so.props["spec"]["cooldownPeriod"] = 300


def _short_cooldown(plan):
    _kube(plan, "ScaledObject", "llama-405b-short").props["spec"]["cooldownPeriod"] = 60


def _adapter_named_image(plan):
    args = _container(plan, "Deployment", "llama-8b-short")["args"]
    i = args.index("--lora-modules") + 1
    args[i] = "image=" + str(args[i]).split("=", 1)[1]


PICKER = "llama-8b-router-epp"  # staging's llm-d-router Deployment (and its ConfigMap)


def _single_picker(plan):
    _kube(plan, "Deployment", PICKER).props["spec"]["replicas"] = 1


def _picker_port(plan):
    _container(plan, "Deployment", PICKER)["ports"][0]["containerPort"] = 9000


def _picker_metric_flag(plan):
    _container(plan, "Deployment", PICKER)["args"] += ["--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc"]


def _picker_config(plan, mutate):
    cm = _kube(plan, "ConfigMap", PICKER)
    config = yaml.safe_load(cm.props["data"]["default-plugins.yaml"])
    mutate(config)
    cm.props["data"]["default-plugins.yaml"] = yaml.safe_dump(config)


def _picker_role_without_llm_d(plan):
    role = _kube(plan, "Role", "llama-8b-epp").props
    role["rules"] = [r for r in role["rules"] if "llm-d.ai" not in r["apiGroups"]]


def _prefix_to_the_picker(plan):
    rule = next(r for r in _kube(plan, "HTTPRoute", "llama-8b.search").props["spec"]["rules"] if r.get("backendRefs"))
    rule["matches"][0]["path"] = {"type": "PathPrefix", "value": "/search/llama-8b/v1"}


def _objective_not_required(plan):
    for rule in _kube(plan, "HTTPRoute", "llama-8b.search").props["spec"]["rules"]:
        for m in rule["matches"]:
            m["headers"] = [h for h in m.get("headers", []) if h["name"] != OBJECTIVE_HEADER]


def _guard_trusts(plan, peers):
    import json

    env = next(e for e in _container(plan, "Deployment", "qwen-7b-short")["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG")
    cfg = json.loads(env["value"])
    cfg["trustedPeers"] = peers
    env["value"] = json.dumps(cfg)


def _classic_sidecar_default(plan):
    pod = _kube(plan, "Deployment", "qwen-7b-short").props["spec"]["template"]
    del pod["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"]
    pod["metadata"]["annotations"]["proxy.istio.io/config"] = '{"holdApplicationUntilProxyStarts": true}'


def _fuse_through_envoy(plan):
    ann = _kube(plan, "Deployment", "mistral-7b-short").props["spec"]["template"]["metadata"]["annotations"]
    del ann["traffic.sidecar.istio.io/excludeOutboundIPRanges"]


def _persistent_redis(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap" and "redis.conf" in r.props.get("data", {}))
    cm.props["data"]["redis.conf"] = cm.props["data"]["redis.conf"].replace('save ""', "save 60 1")


def _kubectl_without_cache(plan):
    for c in _kube(plan, "Job", "mesh-ready").props["spec"]["template"]["spec"]["containers"]:
        c["env"] = []


def _claim_without_cpu_request(plan):
    claim = next(r for r in plan.resources if r.props.get("kind") == "PersistentVolumeClaim"
                 and (r.props["spec"].get("dataSourceRef") or {}).get("kind") == "GCPDataSource")
    claim.props["metadata"]["annotations"] = {}


def _objective_elsewhere(plan):
    _kube(plan, "InferenceObjective", "search.llama-8b").props["spec"]["poolRef"]["name"] = "other"


def _dashboard_reads_a_gone_gauge(plan):
    plan.platform.observability.dashboard_definition = {"q": "vllm:gpu_cache_usage_perc{}"}


def _writable_root_without_tmp(plan):
    c = _container(plan, "Deployment", "qwen-7b-short")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/tmp"]


def _loader_reads_every_format(plan):
    argv = _container(plan, "Job", "load-mistral-7b")["command"]
    argv[argv.index("--reads") + 1] = "hf"


def _loader_home_on_the_root_filesystem(plan):
    mounts = _container(plan, "Job", "load-qwen-7b")["volumeMounts"]
    mounts[:] = [m for m in mounts if m["name"] != "home"]


def _init_container_reads_the_bucket(plan):
    pod = _kube(plan, "Deployment", "mistral-7b-short").props["spec"]["template"]["spec"]
    pod["initContainers"] = [{"name": "wait-for-weights", "volumeMounts": [{"name": "weights", "mountPath": "/models"}]}]


def _ttft_buckets_without_the_slo(plan):
    args = _container(plan, "Deployment", "qwen-7b-short")["args"]
    i = args.index("--custom-histogram-buckets")
    args[i + 1] = '{"time_to_first_token":[0.5,1.0,5.0]}'


def _several_api_servers(plan):
    _container(plan, "Deployment", "qwen-7b-short")["args"] += ["-dp=2"]


def _six_budget_channels(plan):
    budget = next(r for r in plan.resources if r.type == "gcp:billing/budget:Budget")
    budget.props["allUpdatesRule"]["monitoringNotificationChannels"] = [f"projects/p/notificationChannels/{i}"
                                                                        for i in range(6)]


def _traces_over_grpc(plan):
    env = _container(plan, "Deployment", "qwen-7b-short")["env"]
    env[:] = [e for e in env if e["name"] != "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]


def _collector_on_localhost(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap" and "collector.yaml" in r.props["data"])
    cm.props["data"]["collector.yaml"] = cm.props["data"]["collector.yaml"].replace("0.0.0.0:4318", "localhost:4318")


def _load_test_with_v1(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap"
              and r.props["metadata"]["name"] == "loadtest-search-llama-8b")
    cm.props["data"]["mixed.yaml"] = cm.props["data"]["mixed.yaml"].replace(
        "base_url: https://llm.acme.example/llama-8b", "base_url: https://llm.acme.example/llama-8b/v1")


def _load_test_on_default_percentiles(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap"
              and r.props["metadata"]["name"] == "loadtest-search-llama-8b")
    config = yaml.safe_load(cm.props["data"]["mixed.yaml"])
    del config["report"]["request_lifecycle"]["percentiles"]
    cm.props["data"]["mixed.yaml"] = yaml.safe_dump(config)


def _seed_without_the_ttft_histogram(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap" and "seed.json" in r.props["data"])
    config = json.loads(cm.props["data"]["seed.json"])
    config["metrics"] = [m for m in config["metrics"] if not m["type"].endswith("/histogram")]
    cm.props["data"]["seed.json"] = json.dumps(config)


def _seed_ttft_with_only_inf(plan):
    """The seed as it was: the TTFT histogram with no finite bucket."""
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap" and "seed.json" in r.props["data"])
    config = json.loads(cm.props["data"]["seed.json"])
    for m in config["metrics"]:
        if m["type"].endswith("/histogram"):
            m["text"] = "\n".join(line for line in m["text"].splitlines() if "_bucket" not in line or "+Inf" in line)
    cm.props["data"]["seed.json"] = json.dumps(config)


def _gateway_slo_on_the_global_count(plan):
    slo = next(r for r in plan.resources if r.type == "gcp:monitoring/slo:Slo" and r.props["service"].endswith("-gateway-lb"))
    slo.props["requestBasedSli"] = json.loads(json.dumps(slo.props["requestBasedSli"]).replace(
        "https/external/regional/request_count", "https/request_count"))


def _lws(plan, prefix: str) -> dict[str, Any]:
    return next(r.props for r in plan.resources if r.props.get("kind") == "LeaderWorkerSet"
                and r.props["metadata"]["name"].startswith(prefix))


def _service_named_as_the_group(plan):
    svc = next(r for r in plan.resources if r.props.get("kind") == "Service"
               and r.props["metadata"]["name"] == "llama-405b-short")
    svc.props["metadata"]["name"] = "llama-405b-short-group"


def _leader_address_by_a_made_up_name(plan):
    worker = _lws(plan, "llama-405b")["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    worker["args"] = [("$(LWS_LEADER_NAME)" if a == "$(LWS_LEADER_ADDRESS)" else a) for a in worker["args"]]


def _scaled_on_every_pod_of_the_group(plan):
    so = next(r.props for r in plan.resources if r.props.get("kind") == "ScaledObject"
              and r.props["metadata"]["name"] == "llama-405b-short")
    for t in so["spec"]["triggers"]:
        t["metadata"]["query"] = t["metadata"]["query"].replace('-group-[0-9]+"', '-group-.+"')


def _no_lws_firewall(plan):
    """Neither the controller's rule nor KEDA's (which opens 9443 for its own webhook too)."""
    plan.resources[:] = [r for r in plan.resources if not (
        r.type == "gcp:compute/firewall:Firewall" and "9443" in str(r.props.get("allows")))]


def _serving_worker(plan):
    worker = _lws(plan, "llama-405b")["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    worker["args"] = [a for a in worker["args"] if a != "--headless"]


def _gpudirect_networks(plan):
    (pool,) = [r for r in plan.of_type("gcp:container/nodePool:NodePool") if r.props["name"] == "h100-hosts"]
    pool.props["networkConfig"] = {"additionalNodeNetworkConfigs": [{"network": "gpu-nic-1", "subnetwork": "gpu-1"}]}


def _tpu_worker_alone(plan):
    worker = _lws(plan, "llama-70b-tpu")["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    worker["env"] = [e for e in worker["env"] if e["name"] != "TPU_MULTIHOST_BACKEND"]


def _tpu_leader(plan) -> dict[str, Any]:
    return _lws(plan, "llama-70b-tpu")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]


def _privileged_tpu(plan):
    _tpu_leader(plan)["containers"][0]["securityContext"]["privileged"] = True


def _xla_cache_in_the_pod(plan):
    pod = _tpu_leader(plan)
    pod["volumes"] = [{"name": v["name"], "emptyDir": {}} if "hostPath" in v else v for v in pod["volumes"]]


def _xla_cache_unbounded(plan):
    c = _tpu_leader(plan)["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != "JAX_COMPILATION_CACHE_MAX_SIZE"]


def _ray_default_health_checks(plan):
    c = _tpu_leader(plan)["containers"][0]
    c["env"] = [e for e in c["env"] if not e["name"].startswith("RAY_health_check")]


def _any_google_identity(plan):
    """dev's tenant admitted as every subject of accounts.google.com (anyone with a Google token)."""
    allow = _kube(plan, "AuthorizationPolicy", "allow-dev-team-qwen-7b")
    allow.props["spec"]["rules"][0]["from"] = [{"source": {"requestPrincipals": ["https://accounts.google.com/*"]}}]


def _picker_rolls_surge_only(plan):
    _kube(plan, "Deployment", PICKER).props["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = 0


def _picker_grace_of_the_chart(plan):
    _kube(plan, "Deployment", PICKER).props["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 130


def _picker_checked_at_the_default_interval(plan):
    _kube(plan, "HealthCheckPolicy", "llama-8b-epp").props["spec"]["default"]["checkIntervalSec"] = 5


def _global_gateway(plan):
    _kube(plan, "Gateway", "vllm").props["spec"]["gatewayClassName"] = "gke-l7-global-external-managed"


def _route_rewrites_the_path(plan):
    """dev's route as it was: /qwen-7b/v1 rewritten to /v1 by the load balancer."""
    for rule in _kube(plan, "HTTPRoute", "qwen-7b").props["spec"]["rules"]:
        rule["filters"].insert(0, {"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}})


def _bucket_read_unconditioned(plan):
    """staging's servers as they were: objectViewer on the whole weights bucket."""
    plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "weights-reader-serving").props.pop("condition")


def _flagger_values(plan) -> dict[str, Any]:
    return next(r for r in plan.resources if r.type == "kubernetes:helm.sh/v3:Release"
                and r.props.get("chart") == "flagger").props["values"]


def _canary_spec(plan, name: str = "llama-70b-short") -> dict[str, Any]:
    return _kube(plan, "Canary", name).props["spec"]


def _service_for_a_flagger_pool(plan):
    plan.resources.append(PlannedResource("kubernetes:core/v1:Service", "x", "urn:x", None, True, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama-70b-short-canary", "namespace": "vllm"},
        "spec": {"selector": {"vllm-gke.io/workload": "llama-70b-short"}, "ports": [{"port": 8000}]}}))


def _template_on_a_prometheus_of_its_own(plan):
    template = _kube(plan, "MetricTemplate", "vllm-ttft-p99-ratio").props["spec"]
    template["provider"]["address"] = "http://prometheus.istio-system:9090"


def _rollback_alert_by_namespace(plan):
    policy = next(r for r in plan.of_type("gcp:monitoring/alertPolicy:AlertPolicy")
                  if "flagger_canary_status" in json.dumps(r.props.get("conditions")))
    condition = policy.props["conditions"][0]["conditionPrometheusQueryLanguage"]
    condition["query"] = condition["query"].replace("exported_namespace", "namespace")



def _pd_vllm(plan):
    """The vLLM container of the tuned stack's disaggregated decode pool (beside the routing sidecar)."""
    spec = _kube(plan, "Deployment", "llama-70b-pd-short").props["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "vllm")


def _decode_kv(plan, update):
    """Its --kv-transfer-config updated."""
    args = _pd_vllm(plan)["args"]
    i = args.index("--kv-transfer-config") + 1
    args[i] = json.dumps({**json.loads(args[i]), **update})


def _side_channel_on_localhost(plan):
    c = _pd_vllm(plan)
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_NIXL_SIDE_CHANNEL_HOST"]


def _offload_vllm(plan):
    """The vLLM container and pod spec of the tuned stack's KV-offload variant."""
    spec = _kube(plan, "Deployment", "llama-70b-offload-short").props["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "vllm"), spec


def _set_arg(args, flag, value):
    args[args.index(flag) + 1] = value


def _swap_vllm(plan):
    """The vLLM container and pod spec of one of the tuned stack's models swapping on the shared L4."""
    spec = _kube(plan, "Deployment", "qwen-7b-short").props["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "vllm"), spec


def _store_library_calls_set(plan):
    cm = next(r for r in plan.resources if r.props.get("kind") == "ConfigMap" and "limits.lua" in r.props.get("data", {}))
    cm.props["data"]["limits.lua"] += "\nlocal function f() return redis.call('SET', 'rl:x', 1) end\n"


def _spec_vllm(plan):
    """The vLLM container and pod spec of the tuned stack's speculative variant (an EAGLE-3 draft)."""
    spec = _kube(plan, "Deployment", "llama-70b-spec-short").props["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "vllm"), spec


def _spec_json(plan, **update):
    args = _spec_vllm(plan)[0]["args"]
    i = args.index("--speculative-config") + 1
    args[i] = json.dumps({**json.loads(args[i]), **update})


def _no_draft_wait(plan):
    for init in _spec_vllm(plan)[1].get("initContainers") or []:
        init["command"] = [part.replace("/.drafts/", "/.gone/") for part in init["command"]]


PD = "llama-70b-pd"  # tuned's disaggregated model


def _pd_template(plan, pool):
    return _kube(plan, "Deployment", f"{PD}-{pool}").props["spec"]["template"]


def _pd_sidecar_tls(plan):
    (sidecar,) = [c for c in _pd_template(plan, "short")["spec"]["initContainers"] if c["name"] == "routing-sidecar"]
    sidecar["args"] = [a for a in sidecar["args"] if not a.startswith("--secure-proxy")]


def _pd_decider_off(plan):
    cm = _kube(plan, "ConfigMap", f"{PD}-router-epp")
    config = yaml.safe_load(cm.props["data"]["default-plugins.yaml"])
    next(p for p in config["plugins"] if p["type"] == "prefix-based-pd-decider")["parameters"]["nonCachedTokens"] = 0
    cm.props["data"]["default-plugins.yaml"] = yaml.safe_dump(config)


def _pd_identity_keeps_prefill_header(plan):
    cm = _kube(plan, "ConfigMap", "vllm-gke-identity")
    config = json.loads(cm.props["data"]["identity.json"])
    config["headers"]["strip"].remove("x-prefiller-host-port")
    cm.props["data"]["identity.json"] = json.dumps(config)


def _pd_decode_trusts_envoy(plan):
    (vllm,) = _pd_template(plan, "short")["spec"]["containers"]
    env = next(e for e in vllm["env"] if e["name"] == "GKE_LLM_GUARD_CONFIG")
    env["value"] = json.dumps({**json.loads(env["value"]), "trustedPeers": ["127.0.0.1", "127.0.0.6"]})


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): _camel(v) for k, v in value.items()}
    return [_camel(v) for v in value] if isinstance(value, list) else value


def _invoker_off_without_armor(plan: Any) -> None:
    """Staging's Cloud Run service with the invoker check off, its backend without a Cloud Armor policy."""
    _cloud_run_props(plan, "gcp:cloudrunv2/service:Service").update(invokerIamDisabled=True)
    _cloud_run_props(plan, "gcp:compute/regionBackendService:RegionBackendService").pop("securityPolicy", None)


def _armor_default_allows(plan):
    """Staging's Cloud Run backend given a Cloud Armor policy (staging's model is auth iam, which has
    none) whose default rule allows: a request without a token would reach Cloud Run."""
    from vllm_gke.components.model.cloud_run_gateway import ArmorPolicy

    backend = _cloud_run_props(plan, "gcp:compute/regionBackendService:RegionBackendService")
    rules = _camel(ArmorPolicy(str(backend["name"]), 600).rules())
    rules[-1]["action"] = "allow"
    plan.resources.append(PlannedResource("gcp:compute/regionSecurityPolicy:RegionSecurityPolicy", "armor", "urn:armor",
                                          None, True, {"name": "armor", "type": "CLOUD_ARMOR", "rules": rules}))
    backend["securityPolicy"] = "armor-id"


def _cloud_run_props(plan, type_):
    """The props of the staging stack's one resource of a type (its Cloud Run model's)."""
    (resource,) = plan.of_type(type_)
    return resource.props


def _cloud_run_container(plan):
    (service,) = [r for r in plan.resources if r.type == "gcp:cloudrunv2/service:Service"]
    return service.props["template"], service.props["template"]["containers"][0]


def _cloud_run_guard_trusts_envoy(plan):
    env = next(e for e in _cloud_run_container(plan)[1]["envs"] if e["name"] == "GKE_LLM_GUARD_CONFIG")
    env["value"] = json.dumps({**json.loads(env["value"]), "trustedPeers": ["127.0.0.6"]})


def _cloud_run_zonal_redundancy_unpriced(plan):
    _cloud_run_container(plan)[0]["gpuZonalRedundancyDisabled"] = False


def _cloud_run_probe_past_the_limit(plan):
    _cloud_run_container(plan)[1]["startupProbe"]["failureThreshold"] = 200


def _cloud_run_concurrency_of_its_own(plan):
    _cloud_run_container(plan)[0]["maxInstanceRequestConcurrency"] = 80


def _store_lb(plan):
    (lb,) = [d for d in _k8s_docs(plan, "Service") if d["metadata"]["name"] == "limits-cloud-run"]
    return lb


def _k8s_docs(plan, kind):
    return [r.props for r in plan.kubernetes() if r.props.get("kind") == kind]


def _store_conf(plan, old, new):
    (cm,) = [d for d in _k8s_docs(plan, "ConfigMap") if "redis.conf" in (d.get("data") or {})]
    cm["data"]["redis.conf"] = cm["data"]["redis.conf"].replace(old, new)


def _run_slo(plan, slo_id):
    """The staging Cloud Run model's SLO of that id."""
    (slo,) = [r for r in plan.of_type("gcp:monitoring/slo:Slo") if r.name.endswith(f"-run-qwen-1-5b-{slo_id}")]
    return slo.props["requestBasedSli"]


def _run_availability_counts_lb_codes(plan):
    ratio = _run_slo(plan, "availability")["goodTotalRatio"]
    ratio["badServiceFilter"] = ratio["badServiceFilter"].replace('"5xx"', '"500"')


def _run_ttft_on_the_gke_namespace(plan):
    cut = _run_slo(plan, "ttft")["distributionCut"]
    cut["distributionFilter"] = cut["distributionFilter"].replace('"namespace"="vllm-qwen-1-5b"', '"namespace"="vllm"')


def _run_sidecar_config_elsewhere(plan):
    volume = next(v for v in _cloud_run_container(plan)[0]["volumes"] if v.get("secret"))
    volume["secret"]["items"][0]["path"] = "config.yml"


BREAKS: dict[str, tuple[str, Callable[[Any], None], str]] = {
    # infra/contracts/cloud_run_store.py (staging's limit store, reached from Cloud Run)
    "store_lb_internal_on_its_address_from_the_subnet": ("staging", lambda p: _store_lb(p)["spec"].update(
        loadBalancerSourceRanges=["0.0.0.0/0"]), "not the Cloud Run egress subnet"),
    "redis_tls_port_requires_the_certificate": ("staging", lambda p: _store_conf(
        p, "tls-auth-clients yes", "tls-auth-clients no"), "without a client certificate"),
    # infra/contracts/cloud_run_monitoring.py (staging's Cloud Run model's sidecar, SLOs and dashboard)
    "sidecar_pinned_and_reads_its_config": ("staging", _run_sidecar_config_elsewhere, "falls back to scraping port 8080"),
    "slos_and_dashboard_select_the_sidecars_series": ("staging", _run_ttft_on_the_gke_namespace,
                                                      "the series the sidecar writes"),
    "slos_and_dashboard_read_cloud_runs_metrics": ("staging", _run_availability_counts_lb_codes,
                                                   "counts response_code_class ['500']"),
    "usage_report_prices_what_cloud_run_bills": ("staging", lambda p: _cloud_run_props(
        p, "gcp:cloudrunv2/service:Service").update(name="qwen-1-5b"), "the usage report does not read"),
    # infra/contracts/cloud_run_identity.py (staging's Cloud Run model, auth iam)
    "cloud_run_iam_identity_is_the_checked_token": ("staging", lambda p: _cloud_run_props(
        p, "gcp:cloudrunv2/service:Service").update(invokerIamDisabled=True), "nothing verified it"),
    "cloud_run_guard_trusts_no_peer": ("staging", _cloud_run_guard_trusts_envoy, "but Cloud Run's front end"),
    "cloud_run_iam_audience_is_the_tenants": ("staging", lambda p: _cloud_run_props(
        p, "gcp:cloudrunv2/service:Service").update(customAudiences=["https://llm.staging.acme.example"]),
        "Cloud Run refuses them"),
    # infra/contracts/cloud_run_service.py (staging's Cloud Run model)
    "gpu_service_is_instance_billed": ("staging", lambda p: _cloud_run_container(p)[1]["resources"].update(
        cpuIdle=True), "instance-based billing"),
    "gpu_driver_runs_the_images_cuda": ("staging", lambda p: _cloud_run_container(p)[1].update(envs=[
        e for e in _cloud_run_container(p)[1]["envs"] if e["name"] != "VLLM_ENABLE_CUDA_COMPATIBILITY"]), "set it to 1"),
    "startup_probe_within_cloud_runs_limits": ("staging", lambda p: _cloud_run_container(p)[1]["startupProbe"].update(
        initialDelaySeconds=600), "over Cloud Run's 240 s"),
    "weights_volume_is_the_bucket_read_only": ("staging", lambda p: _cloud_run_container(p)[0]["volumes"][0]["gcs"].update(
        readOnly=False), "mounted writable"),
    "invoker_check_off_only_behind_the_load_balancer": ("staging", lambda p: _cloud_run_props(
        p, "gcp:cloudrunv2/service:Service").update(ingress="INGRESS_TRAFFIC_ALL", invokerIamDisabled=True),
        "served unauthenticated"),
    "invoker_off_backends_carry_a_cloud_armor_policy": ("staging", _invoker_off_without_armor, "no Cloud Armor policy"),
    "armor_rules_pass_only_whole_bearer_jwts": ("staging", _armor_default_allows, "must deny"),
    "serverless_negs_behind_an_application_lb": ("staging", lambda p: _cloud_run_props(
        p, "gcp:compute/regionNetworkEndpointGroup:RegionNetworkEndpointGroup").update(region="europe-west4"),
        "not in its load balancer's region"),
    "serverless_backends_without_health_check_or_timeout": ("staging", lambda p: _cloud_run_props(
        p, "gcp:compute/regionBackendService:RegionBackendService").update(timeoutSec=600), "sets timeoutSec"),
    "cloud_run_ingress_admits_the_load_balancer": ("staging", lambda p: _cloud_run_props(
        p, "gcp:cloudrunv2/service:Service").update(ingress="INGRESS_TRAFFIC_INTERNAL_ONLY"), "does not admit"),
    "keda_owns_external_metrics": ("dev", _add_external_apiservice, "second owner"),
    "keda_ports_open_on_private_clusters": ("prod", _no_firewall, "tcp:6443, 9443"),
    "keda_operator_identity": ("dev", _no_pod_identity, "podIdentity.gcp is off"),
    "keda_queries_one_series_of_exported_metrics": ("dev", _unsummed_query, "may return several series"),
    "keda_scales_every_pool": ("dev", lambda p: _drop(p, "ScaledObject", "qwen-7b-short"), "has no ScaledObject"),
    "keda_admits_the_scaled_objects": ("dev", _cooldown_on_a_floor, "cooldownPeriod with minReplicaCount > 0"),
    "keda_cooldown_outlasts_the_wake": ("frontier", _short_cooldown, "would scale it back to zero while it loads"),
    "picker_reads_exported_metrics": ("staging", _picker_metric_flag, "exits at start"),
    "picker_rolls_and_drains_with_one_ready_pod": ("staging", _picker_rolls_surge_only, "could not scale down"),
    "picker_stops_within_its_grace": ("staging", _picker_grace_of_the_chart, "terminationGracePeriodSeconds 130"),
    "picker_leaves_the_load_balancer_fast": ("staging", _picker_checked_at_the_default_interval,
                                             "stays in the load balancer 10 s"),
    "regex_matches_on_a_regional_class": ("dev", _global_gateway, "whose load balancer has no regexMatch"),
    "gateway_rewrites_no_path": ("dev", _route_rewrites_the_path, "HTTPRoutePathRewrite exempt"),
    "picker_without_pprof": ("staging", lambda p: _drop_arg(
        p, "Deployment", PICKER, "--enable-pprof=false", with_value=False), "pprof on"),
    "picker_config_is_strictly_decodable": ("staging", lambda p: _picker_config(
        p, lambda c: c["flowControl"].update(maxQueue=1)), "maxQueue is not a field of FlowControlConfig"),
    "picker_flow_control_bands": ("staging", lambda p: _picker_config(
        p, lambda c: c["flowControl"].update(defaultRequestTTL="900s")), "is not below the pool's backend timeout"),
    "picker_reads_llm_d_objectives": ("staging", _picker_role_without_llm_d, "cannot list inferenceobjectives"),
    "picker_highly_available": ("staging", _single_picker, "one replica without leader election"),
    "picker_ports": ("staging", _picker_port, "not the picker's defaults"),
    "picker_gets_what_it_parses": ("staging", _prefix_to_the_picker, "reaches the picker, which parses"),
    "picker_objective_is_the_tenants": ("staging", _objective_not_required, "client-chosen objective"),
    "vllm_drains_on_stop": ("dev", lambda p: _drop_arg(p, "Deployment", "qwen-7b-short", "--shutdown-timeout"),
                            "aborts what it is generating"),
    "vllm_health_and_guard": ("dev", lambda p: _drop_arg(p, "Deployment", "qwen-7b-short", "--middleware"),
                              "not loaded as vLLM middleware"),
    "vllm_writes_only_to_volumes": ("dev", _writable_root_without_tmp, "must be writable volumes"),
    "istio_peer_and_claim_header": ("dev", lambda p: _guard_trusts(p, ["127.0.0.1"]), "not the sidecar's 127.0.0.6"),
    "istio_sidecar_outlives_vllm": ("dev", _classic_sidecar_default, "may exit before vLLM"),
    "istio_principals_are_the_tenants": ("dev", _any_google_identity, "not tenant 'dev-team's"),
    "gcsfuse_sidecar_with_the_mesh": ("staging", _fuse_through_envoy, "metadata-server calls go through Envoy"),
    "bucket_readers_list_and_open_only_their_folders": ("staging", _bucket_read_unconditioned,
                                                        "without a condition on objects: reads every model's files"),
    "redis_writes_nothing_and_scripts_obey_the_acl": ("prod", _persistent_redis, "keeps persistence on"),
    "kubectl_cache_is_writable": ("dev", _kubectl_without_cache, "not on a writable volume"),
    "loader_copies_what_vllm_opens": ("staging", _loader_reads_every_format, "opens by mistral-first"),
    "loader_writes_only_to_volumes": ("dev", _loader_home_on_the_root_filesystem, "HOME is not a writable volume"),
    "fuse_pods_start_under_any_sidecar_mode": ("staging", _init_container_reads_the_bucket,
                                               "reads the bucket before the mesh proxy serves (classic sidecar)"),
    "populator_inputs": ("hyperdisk", _claim_without_cpu_request, "volume-populator.datalayer.gke.io/cpu-request"),
    "picker_finds_the_objectives": ("staging", _objective_elsewhere, "names no InferencePool"),
    "picker_wake_reads_what_the_picker_exports": ("frontier", _wake_on_a_made_up_label,
                                                  "is not a series the picker exports"),
    "vllm_exports_what_monitoring_reads": ("dev", _dashboard_reads_a_gone_gauge, "vllm:gpu_cache_usage_perc"),
    "vllm_ttft_buckets_cut_at_the_slo": ("prod", _ttft_buckets_without_the_slo, "no TTFT bucket bound"),
    "guard_reads_queue_series_vllm_exports": ("prod", _several_api_servers, "-dp 2: several API servers"),
    "vllm_applies_no_adapter_by_itself": ("prod", _adapter_named_image, "is a content part type"),
    "vllm_usage_reaches_the_guard": ("prod", lambda p: _drop_arg(p, "Deployment", "qwen-7b-short", "--middleware"),
                                     "cannot read vLLM's final usage"),
    "budget_api_accepts_the_budget": ("prod", _six_budget_channels, "the API takes at most 5"),
    "vllm_exports_traces_as_configured": ("prod", _traces_over_grpc, "the exporter is grpc"),
    "collector_listens_and_writes_to_trace": ("prod", _collector_on_localhost, "the OTLP receiver listens on localhost"),
    "inference_perf_runs_as_the_tenant": ("prod", _load_test_with_v1, "appends /v1/completions to it as given"),
    "inference_perf_reports_the_verdicts_percentiles": ("prod", _load_test_on_default_percentiles,
                                                        "no report.request_lifecycle.percentiles"),
    "slos_wait_for_their_metrics": ("prod", _seed_without_the_ttft_histogram, "the SLO API refuses it"),
    "seeded_histograms_have_the_servers_buckets": ("prod", _seed_ttft_with_only_inf, "has no finite bucket"),
    "gateway_slo_reads_its_load_balancer": ("prod", _gateway_slo_on_the_global_count, "which a gke-l7-regional"),
    "lws_headless_service_is_its_own": ("frontier", _service_named_as_the_group, "reuse it as the group's headless"),
    "lws_env_is_what_the_webhook_injects": ("frontier", _leader_address_by_a_made_up_name, "$(LWS_LEADER_NAME)"),
    "lws_scales_groups_by_their_leaders": ("frontier", _scaled_on_every_pod_of_the_group, "are not the leaders"),
    "lws_webhook_reachable": ("frontier", _no_lws_firewall, "webhooks fail closed"),
    "vllm_group_launch": ("frontier", _serving_worker, "a worker must be headless"),
    "vllm_tpu_spans_hosts_through_ray": ("frontier", _tpu_worker_alone, "TPU_MULTIHOST_BACKEND is not ray"),
    "gpu_groups_talk_over_the_primary_nic": ("frontier", _gpudirect_networks, "count TCP on the primary NIC"),
    "tpu_containers_reach_the_chips": ("frontier", _privileged_tpu, "privileged, which GKE needs for TPUs only"),
    "vllm_tpu_keeps_its_xla_cache": ("frontier", _xla_cache_in_the_pod, "a recreated group compiles every program"),
    "ray_health_checks_outlast_a_compile": ("frontier", _ray_default_health_checks, "would call a host dead after 15 s"),
    "jax_bounds_and_locks_the_xla_cache": ("frontier", _xla_cache_unbounded, "no eviction, no file lock"),
    "flagger_rewrites_only_the_workload_label": ("prod", lambda p: _flagger_values(p).update(
        selectorLabels="app,name,app.kubernetes.io/name"), "not vllm-gke.io/workload alone"),
    "flagger_owns_the_services_and_the_route": ("prod", _service_for_a_flagger_pool, "is declared: Flagger owns it"),
    "flagger_queries_the_frontend": ("prod", _template_on_a_prometheus_of_its_own, "is not the PromQL frontend's Service"),
    "flagger_scales_the_primary_by_named_triggers": ("prod", lambda p: _canary_spec(p)["autoscalerRef"][
        "primaryScalerQueries"].pop("keep"), "are not the ScaledObject's trigger names"),
    "flagger_deadline_outlasts_the_wake": ("prod", lambda p: _canary_spec(p).update(progressDeadlineSeconds=600),
                                           "Flagger would roll a waking canary back"),
    "flagger_webhooks_reach_the_loadtester": ("prod", lambda p: _canary_spec(p)["analysis"]["webhooks"][0].update(
        url="http://flagger-loadtester.test/"), "not the planned loadtester"),
    "flagger_webhooks_start_the_load_test": ("prod", lambda p: _drop(p, "Role", "flagger-loadtester"),
                                             "lets the loadtester get"),
    "flagger_tracks_no_config": ("prod", lambda p: _flagger_values(p).update(configTracking={"enabled": True}),
                                 "config tracking is on"),
    "flagger_alert_reads_its_metrics": ("prod", _rollback_alert_by_namespace, "reads the Canary's namespace from `namespace`"),
    "offload_flags_are_the_replicas_tier": ("tuned", lambda p: _set_arg(_offload_vllm(p)[0]["args"],
                                                                         "--kv-offloading-size", "27"),
                                            "the capacity table says"),
    "offload_pods_fit_the_node": ("tuned", lambda p: _offload_vllm(p)[0]["resources"]["requests"].update(
        memory="900Gi"), "the last stays Pending"),
    "offload_buffer_in_shm_and_the_memory_limit": ("tuned", lambda p: next(
        v for v in _offload_vllm(p)[1]["volumes"] if v["name"] == "dshm")["emptyDir"].update(sizeLimit="16Gi"),
        "/dev/shm is smaller"),
    "offload_does_not_raise_the_batch": ("tuned", lambda p: _set_arg(_offload_vllm(p)[0]["args"], "--max-num-seqs",
                                                                      "400"), "runs 400 sequences"),
    "offload_takes_the_kv_connector": ("tuned", lambda p: _set_arg(_offload_vllm(p)[0]["args"],
                                                                    "--kv-offloading-backend", "lmcache"),
                                       "separate LMCache server"),
    "nixl_role_per_pod": ("tuned", lambda p: _decode_kv(p, {"kv_role": "kv_both"}), "kv_both is deprecated"),
    "nixl_side_channel_on_the_pod_ip": ("tuned", _side_channel_on_localhost, "cannot reach the prefill engine"),
    "nixl_connector_not_replaced": ("tuned", lambda p: _pd_vllm(p)["args"].extend(
        ["--kv-offloading-size", "40"]), "replaces NixlConnector"),
    "nixl_ucx_ports_cover_the_agents": ("tuned", lambda p: _pd_vllm(p)["env"].append(
        {"name": "UCX_TCP_PORT_RANGE", "value": "40000-40002"}), "the agents without a port never start"),
    "speculative_config_is_the_models": ("tuned", lambda p: _spec_json(
        p, model="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"), "the draft named by the share's copy"),
    "draft_waited_for_before_vllm_starts": ("tuned", _no_draft_wait, "before the draft's ready marker"),
    "draft_sharded_as_counted": ("tuned", lambda p: _spec_json(p, draft_tensor_parallel_size=1),
                                 "fewer GPUs than the capacity check counts"),
    "lora_steps_hold_every_proposal": ("tuned", lambda p: _spec_vllm(p)[0]["args"].extend(
        ["--enable-lora", "--max-num-batched-tokens", "128"]), "needs --max-num-batched-tokens of at least 256, not 128"),
    "ngram_window_ordered": ("tuned", lambda p: _spec_json(p, method="ngram", prompt_lookup_min=6,
                                                           prompt_lookup_max=3), "vLLM refuses a minimum above"),
    "sidecar_fronts_decode_vllm": ("tuned", _pd_sidecar_tls, "self-signed certificate"),
    "picker_schedules_prefill_and_decode": ("tuned", _pd_decider_off, "nonCachedTokens 0 turns P/D off"),
    "pool_pods_carry_their_role": ("tuned", lambda p: _pd_template(p, "prefill")["metadata"]["labels"].pop("llm-d.ai/role"),
                                   "has no llm-d.ai/role label"),
    "client_cannot_route_the_sidecar": ("tuned", _pd_identity_keeps_prefill_header, "does not strip x-prefiller-host-port"),
    "prefill_pods_admit_their_decoders": ("tuned", lambda p: _drop(p, "NetworkPolicy", f"{PD}-prefill-ingress"),
                                          "no NetworkPolicy on the prefill pods"),
    "guard_admits_only_the_sidecars_kv_params": ("tuned", _pd_decode_trusts_envoy, "would pass with kv_transfer_params"),
    "sleep_mode_driven_by_the_guard": ("tuned", lambda p: _swap_vllm(p)[0]["args"].remove("--enable-sleep-mode"),
                                       "started without --enable-sleep-mode"),
    "sleep_routes_unreachable": ("tuned", lambda p: _swap_vllm(p)[0]["env"].append(
        {"name": "VLLM_SERVER_DEV_MODE", "value": "1"}), "registers /sleep and /wake_up"),
    "awake_model_passes_the_startup_check": ("tuned", lambda p: _set_arg(_swap_vllm(p)[0]["args"],
                                                                          "--gpu-memory-utilization", "0.95"),
                                             "is more than is free beside"),
    "time_shared_pools_and_their_pods": ("tuned", lambda p: _swap_vllm(p)[1]["nodeSelector"].pop(
        "cloud.google.com/gke-gpu-sharing-strategy"), "not the time-shared nodes' labels"),
    "lease_commands_within_the_acl": ("tuned", _store_library_calls_set, "which the guards' ACL refuses"),
    "cloud_run_gpu_billed_as_priced": ("staging", _cloud_run_zonal_redundancy_unpriced,
                                       "the cost report priced gpuZonalRedundancy False"),
    "cloud_run_startup_probe_within_limits": ("staging", _cloud_run_probe_past_the_limit, "exceeds 480 s"),
    "cloud_run_concurrency_is_the_capacity_models": ("staging", _cloud_run_concurrency_of_its_own,
                                                     "not the capacity model's 32"),
}


def test_every_row_has_a_break():
    assert sorted(c.check.__name__ for c in CONTRACTS) == sorted(BREAKS)


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.check.__name__ for c in CONTRACTS])
def test_each_row_catches_its_break(any_plan, contract):
    stack, mutate, message = BREAKS[contract.check.__name__]
    original = any_plan(stack)
    platform = copy.copy(original.platform)  # the component object; its observability copied to mutate
    platform.observability = copy.copy(original.platform.observability)
    plan = dataclasses.replace(original, resources=copy.deepcopy(original.resources), platform=platform)
    assert contract.check(plan) == []
    mutate(plan)
    found = contract.check(plan)
    assert any(message in p for p in found), found


def test_the_injection_order_is_the_webhooks():
    """The simulated order, as the two webhooks' sources give it, in either admission order."""
    from vllm_gke.infra.contracts import injected_init_order

    for fuse_first in (True, False):
        assert injected_init_order(["wait"], True, fuse_first) == ["istio-init", "istio-proxy", "gke-gcsfuse-sidecar",
                                                                    "wait"]
        assert injected_init_order(["wait"], False, fuse_first) == ["gke-gcsfuse-sidecar", "wait", "istio-init"]


def test_the_tpu_builds_metrics_count_where_models_run_on_tpus(plans, monkeypatch):
    """A metric the dashboards, KEDA or the guard read must be one the TPU build exports too."""
    from vllm_gke.infra.contracts import base, keda_queries_one_series_of_exported_metrics

    real = base.load_snapshot

    def without_the_queue(name: str):
        snap = real(name)
        if not name.startswith("tpu-"):
            return snap
        return {**snap, "metrics": [m for m in snap["metrics"] if m["name"] != "vllm:num_requests_waiting"]}

    monkeypatch.setattr(base, "load_snapshot", without_the_queue)
    assert keda_queries_one_series_of_exported_metrics(plans["frontier"])
    assert keda_queries_one_series_of_exported_metrics(plans["prod"]) == []
