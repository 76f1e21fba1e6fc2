"""A model on Cloud Run with a GPU (cloudRun.models[]): its config rules, the service the model layer
plans (components/model/cloud_run.py), the resources CloudRunServices declares under the mocks, the
server's argv against the real vLLM parser's snapshot, and the entrypoint's Cloud Run paths."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, props_of
from tests.test_vllm_flags import pinned_version
from vllm_gke.components.model import cloud_run_capacity as cr
from vllm_gke.components.model.cloud_run import (
    CLOUD_RUN_GPUS,
    MAX_CPU,
    MAX_MEMORY_GIB,
    MOUNT_OPTIONS,
    SHUTDOWN_S,
    WARM_PATH,
    cloud_run_services,
    cuda_compat_env,
    egress_of,
    guard_config,
    weights_models,
)
from vllm_gke.components.model.cloud_run_capacity import STARTUP_PROBE_LIMIT_S, cold_start, startup_probe, startup_problem
from vllm_gke.components.model.cloud_run_tenancy import REFUSED_HEADERS
from vllm_gke.components.model.hf_config import shape_from_config
from vllm_gke.components.model.specs import CLOUD_RUN_POOL
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.components.model.vllm_server import PORT
from vllm_gke.components.model.vllm_versions import RELEASES
from vllm_gke.components.model.weights_layout import MOUNT_PATH, model_dir
from vllm_gke.images import serve
from vllm_gke.images.vllm_gke_guard import GuardMiddleware, warm
from vllm_gke.infra import model_configs
from vllm_gke.infra.advice import uncalled_models
from vllm_gke.infra.cloud_run_plan import _egress_line, cloud_run_lines
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.model_configs import with_model_configs, with_stack_model_configs
from vllm_gke.infra.plan import run_program

SERVICE = "gcp:cloudrunv2/service:Service"
HF_CONFIGS = REPO_ROOT / "tests" / "fixtures" / "hf-configs"


def staging(stack_values: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(stack_values["staging"])


def cloud_run(values: dict[str, Any]) -> dict[str, Any]:
    return values["vllm-gke:cloudRun"]["models"][0]


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


# --- config rules ------------------------------------------------------------------------------

def test_staging_declares_a_cloud_run_model_that_passes_every_rule(stack_values):
    cfg = parse(staging(stack_values))
    assert [m.name for m in cfg.cloud_run_models] == ["qwen-1-5b"]


def test_a_backend_other_than_the_bucket_is_refused(stack_values):
    values = staging(stack_values)
    values["vllm-gke:weights"] = {"backend": "filestore"}
    assert any(p.startswith("vllm-gke:weights.backend:") and "set it to gcs" in p for p in problems(values))


def test_a_region_without_the_gpu_is_refused_naming_where_it_is(stack_values):
    values = staging(stack_values)
    cloud_run(values)["region"] = "us-west1"
    (problem,) = [p for p in problems(values) if "has no Cloud Run nvidia-l4 GPU" in p]
    assert problem.startswith("vllm-gke:cloudRun.models[qwen-1-5b].region:") and "europe-west4" in problem


def test_a_stack_region_without_the_rtx_pro_6000_is_refused(stack_values):
    values = staging(stack_values)
    values["gcp:region"] = "us-east4"
    values["vllm-gke:cluster"]["zones"] = ["us-east4-a", "us-east4-c"]
    cloud_run(values).update(gpu="nvidia-rtx-pro-6000", cpu=20, memoryGib=80)
    assert any(p.startswith("vllm-gke:cloudRun.models[qwen-1-5b].region: region (unset: the stack's gcp:region) 'us-east4'")
               for p in problems(values))


def test_an_instance_below_the_gpus_minimum_is_refused_with_the_minimum(stack_values):
    values = staging(stack_values)
    cloud_run(values)["gpu"] = "nvidia-rtx-pro-6000"
    (problem,) = [p for p in problems(values) if ".cpu:" in p]
    assert "set cpu: 20 and memoryGib: 80" in problem


def test_a_cpu_count_cloud_run_does_not_offer_is_refused(stack_values):
    values = staging(stack_values)
    cloud_run(values)["cpu"] = 5
    assert any(p.startswith("vllm-gke:cloudRun.models[qwen-1-5b].cpu: 5") and "set 6" in p for p in problems(values))
    cloud_run(values)["cpu"] = 12
    assert any("at most 8 vCPUs" in p for p in problems(values))
    # 7 on an L4: 8 is the next value Cloud Run takes, but beside the sidecar's vCPU it would not fit: 6 is offered.
    cloud_run(values)["cpu"] = 7
    (problem,) = [p for p in problems(values) if p.startswith("vllm-gke:cloudRun.models[qwen-1-5b].cpu: 7")]
    assert problem.endswith("set 6")
    cloud_run(values)["cpu"] = 6
    parse(values)


def test_the_server_and_the_sidecar_together_fit_the_instances_maximum(stack_values):
    """Cloud Run's 8 vCPUs and 32 GiB with an L4 hold every container: the server's 8 and 32 GiB plus the
    metrics sidecar's 1 and 0.5 GiB are refused, naming both and what fits."""
    values = staging(stack_values)
    cloud_run(values).update(cpu=8, memoryGib=32)
    (problem,) = [p for p in problems(values) if ".cpu:" in p]
    assert problem.startswith("vllm-gke:cloudRun.models[qwen-1-5b].cpu: 8 vCPUs and memoryGib 32 for the server, plus "
                              "1 and 0.5 GiB for the metrics sidecar, make 9 vCPUs and 32.5 GiB")
    assert "set cpu: 6 and memoryGib: 24 at most" in problem
    cloud_run(values).update(cpu=6, memoryGib=31)  # 7 vCPUs, 31.5 GiB in all, but 31 GiB on 6 vCPUs
    (problem,) = [p for p in problems(values) if ".cpu:" in p]
    assert "31 GiB on 6 vCPUs" in problem and "lower memoryGib to 24" in problem


def test_the_planned_containers_are_what_the_rule_and_the_price_count(stack_values, staging_plan):
    """The revision's containers (server and sidecar) sum within the L4's 8 vCPUs and 32 GiB, and to what
    the price bills."""
    cfg = parse(staging(stack_values))
    (service,) = props_of(staging_plan, SERVICE)
    limits = [c["resources"]["limits"] for c in service["template"]["containers"]]
    assert len(limits) == 2
    cpu = sum(float(x["cpu"]) for x in limits)
    gib = sum(float(x["memory"][:-2]) / (1024 if x["memory"].endswith("Mi") else 1) for x in limits)
    (m,) = cfg.cloud_run_models
    assert (cpu, gib) == (7, 24.5) == (cr.billed_cpu(m), cr.billed_memory_gib(m))
    assert cpu <= MAX_CPU["nvidia-l4"] and gib <= MAX_MEMORY_GIB["nvidia-l4"]


def test_an_l4_service_loads_the_images_cuda_compat_libraries(stack_values):
    """Cloud Run's L4 driver runs CUDA 12.2, older than vLLM 0.34.0's CUDA 13 build: vLLM's switch is set; not on
    the RTX PRO 6000 (its driver runs CUDA 13.0), nor for vLLM 0.11.0 (CUDA 12.8: minor-version compatible)."""
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    assert {"name": "VLLM_ENABLE_CUDA_COMPATIBILITY", "value": "1"} in svc.env
    (m,) = cfg.cloud_run_models
    rtx = m.model_copy(update={"gpu": "nvidia-rtx-pro-6000", "cpu": 20, "memory_gib": 80})
    assert cuda_compat_env(rtx, cfg.release_for(CLOUD_RUN_POOL)) == []
    assert cuda_compat_env(m, RELEASES["0.11.0"]) == []
    assert cuda_compat_env(m, RELEASES["0.34.0"]) == [{"name": "VLLM_ENABLE_CUDA_COMPATIBILITY", "value": "1"}]


def test_the_argvs_drain_fits_cloud_runs_ten_seconds(stack_values):
    """Cloud Run kills an instance 10 s after SIGTERM: vLLM drains for SHUTDOWN_S, not the request timeout."""
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    i = svc.args.index("--shutdown-timeout")
    assert svc.args[i + 1] == str(SHUTDOWN_S) and SHUTDOWN_S < 10
    assert svc.args.count("--shutdown-timeout") == 1


def test_egress_takes_all_traffic_only_where_the_clusters_nat_is(stack_values):
    """In the stack's region the weights volume reads through Private Google Access and the NAT carries the rest;
    in another region (no NAT there) private ranges only, and the plan says the cold start may be slower."""
    values = staging(stack_values)
    (svc,) = cloud_run_services(parse(values))
    assert svc.egress == "ALL_TRAFFIC" and svc.template("b", "sa", "s")["vpc_access"]["egress"] == "ALL_TRAFFIC"
    cfg = parse(values)
    (m,) = cfg.cloud_run_models
    away = m.model_copy(update={"region": "europe-west4"})  # a global gateway class and no globalLimits allow it
    assert egress_of(cfg, away) == "PRIVATE_RANGES_ONLY"
    assert "outside the cluster's region and its Cloud NAT" in str(_egress_line(cfg, away))
    assert _egress_line(cfg, m) is None


def test_a_cloud_run_model_no_tenant_calls_is_warned(stack_values):
    values = staging(stack_values)
    for tenant in values["vllm-gke:tenants"]:
        tenant["models"] = [m for m in tenant["models"] if m != "qwen-1-5b"]
        tenant.pop("cloudRunInvokers", None)
    (warning,) = [w for w in uncalled_models(parse(values)) if "qwen-1-5b" in w]
    assert warning.startswith("cloudRun.models[qwen-1-5b]: no tenant lists it")


def test_the_plan_says_what_a_deploy_needs_and_does(stack_values):
    """The GPU quota (zero until requested), the store's secret first, a cold start each new revision, the drain."""
    (line,) = [x for x in cloud_run_lines(parse(staging(stack_values))) if x.startswith("Cloud Run deploys:")]
    assert "quota is zero until requested" in line and "vllm-staging-limits-cloud-run-tls" in line
    assert "a new tenant" in line and "GPU cold start inside `pulumi up`" in line


def test_a_name_taken_by_a_gke_model_is_refused(stack_values):
    values = staging(stack_values)
    cloud_run(values)["name"] = "mistral-7b"
    assert any(p.startswith("vllm-gke:cloudRun.models[mistral-7b].name:") and "rename one" in p for p in problems(values))


def test_an_egress_subnet_over_the_clusters_ranges_is_refused(stack_values):
    values = staging(stack_values)
    values["vllm-gke:cloudRun"]["egressSubnetCidr"] = "10.21.0.0/24"
    assert any(p.startswith("vllm-gke:cloudRun.egressSubnetCidr:") and "cluster.podsCidr" in p for p in problems(values))


def test_models_in_two_regions_are_refused(stack_values):
    values = staging(stack_values)
    values["vllm-gke:gateway"]["className"] = "gke-l7-global-external-managed"
    other = {**cloud_run(values), "name": "qwen-eu", "region": "europe-west4"}
    values["vllm-gke:cloudRun"]["models"].append(other)
    assert any(p.startswith("vllm-gke:cloudRun.models:") and "one region" in p for p in problems(values))


# --- the planned service ----------------------------------------------------------------------

def test_the_service_runs_one_gpu_with_cpu_always_allocated(stack_values):
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    template = svc.template("bucket", "sa@x", "subnet")
    server = template["containers"][0]
    assert server["resources"] == {"limits": {"cpu": "6", "memory": "24Gi", "nvidia.com/gpu": "1"},
                                   "cpu_idle": False, "startup_cpu_boost": True}
    assert template["node_selector"] == {"accelerator": CLOUD_RUN_GPUS["nvidia-l4"].accelerator}
    assert template["gpu_zonal_redundancy_disabled"] is True
    assert template["scaling"] == {"min_instance_count": 0, "max_instance_count": 2}
    assert 1 <= template["max_instance_request_concurrency"] <= 1000


def test_the_weights_are_the_bucket_read_only_where_the_argv_reads_them(stack_values):
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    template = svc.template("bucket", "sa@x", "subnet")
    (volume,) = template["volumes"]
    assert volume["gcs"] == {"bucket": "bucket", "read_only": True, "mount_options": list(MOUNT_OPTIONS)}
    assert template["containers"][0]["volume_mounts"] == [{"name": volume["name"], "mount_path": MOUNT_PATH}]
    model = cfg.cloud_run_models[0].as_model()
    assert svc.args[0] == model_dir(model) and svc.args[0].startswith(MOUNT_PATH + "/")
    assert model.name in {m.name for m in weights_models(cfg)}  # the loaders write its folder


def test_the_container_port_is_the_one_the_entrypoint_and_the_probe_use(stack_values):
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    server = svc.template("b", "s", "n")["containers"][0]
    assert server["ports"]["container_port"] == PORT == int(serve.flag(svc.args, "--port", "0"))
    assert server["startup_probe"]["http_get"]["port"] == PORT
    assert server["startup_probe"]["http_get"]["path"] == WARM_PATH == warm.WARM_PATH
    env = {e["name"]: e["value"] for e in svc.env}
    # The marker the entrypoint writes once warm is the one the guard's warm path reads.
    assert env[serve.WARM_MARKER_ENV] == env[warm.WARM_MARKER_ENV]


def _get(guard: GuardMiddleware, path: str, method: str = "GET") -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": [],
             "client": ("169.254.1.1", 40000), "query_string": b""}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def _vllm(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"vllm"})


def test_the_probes_path_answers_only_once_the_entrypoint_has_warmed_the_server(stack_values, tmp_path, monkeypatch):
    cfg = parse(staging(stack_values))
    config = guard_config(cfg, cfg.cloud_run_models[0], cfg.release_for(CLOUD_RUN_POOL))
    config.pop("globalLimits", None)  # no store here
    marker = tmp_path / "warm"
    monkeypatch.setenv(warm.WARM_MARKER_ENV, str(marker))
    guard = GuardMiddleware(_vllm, config)
    assert _get(guard, WARM_PATH) == (503, b'{"status":"warming up"}')
    assert _get(guard, "/health") == (200, b"vllm")  # vLLM's own: up before the warm-up
    marker.write_text("1")  # what serve.py writes once a warm-up request was served
    assert _get(guard, WARM_PATH) == (200, b'{"status":"warm"}')
    assert _get(guard, WARM_PATH, "POST")[0] == 405
    # No tenant route leads to it (the load balancer forwards /<model>/v1 paths; a prefix is stripped only
    # before /v1), and vLLM never sees it.
    for path in (f"/qwen-1-5b{WARM_PATH}", f"/qwen-1-5b/v1{WARM_PATH}", WARM_PATH + "/"):
        status, body = _get(guard, path)
        assert status in (401, 404) and body != b"vllm", path
    # A GKE guard (no cloudRun) has no such path: the pods' exec probe reads the marker.
    gke = GuardMiddleware(_vllm, {k: v for k, v in config.items() if k != "cloudRun"} | {"trustedPeers": ["127.0.0.6"]})
    assert _get(gke, WARM_PATH)[0] == 404


def test_the_startup_probe_is_within_a_services_limits_and_covers_the_estimate(stack_values):
    """A service's probe: failureThreshold x periodSeconds and the initial delay at most 240 s each (Google's
    services page; the 1,800 s of the jobs page is not a service's); twice the estimate where that fits."""
    cfg = parse(staging(stack_values))
    (svc,) = cloud_run_services(cfg)
    probe, estimate = svc.probe, cold_start(cfg.cloud_run_models[0]).total_s
    assert probe["period_seconds"] * probe["failure_threshold"] <= 240 and probe["initial_delay_seconds"] <= 240
    window = probe["initial_delay_seconds"] + probe["period_seconds"] * probe["failure_threshold"]
    assert 2 * estimate <= window <= 480 and probe["initial_delay_seconds"] <= estimate
    env = {e["name"]: e["value"] for e in svc.env}
    assert env[serve.STARTUP_WINDOW_ENV] == str(window)  # the entrypoint waits as long as the probe


def test_a_cold_start_past_the_probes_limit_is_said_in_the_plan(stack_values):
    values = staging(stack_values)
    cloud_run(values).update(shape={"paramsBillion": 1000, "layers": 80, "kvHeads": 8, "headDim": 128}, diskGb=2000)
    m = parse(values).cloud_run_models[0]
    probe = startup_probe(m)
    assert probe["initial_delay_seconds"] == 240 and probe["period_seconds"] * probe["failure_threshold"] == 240
    problem = startup_problem(m)
    assert problem is not None and "480 s" in problem and "shut each new instance down" in problem


def test_jwt_models_take_traffic_from_the_load_balancer_alone(stack_values):
    values = staging(stack_values)
    cloud_run(values)["auth"] = "jwt"
    for t in values["vllm-gke:tenants"]:  # jwt: no account is granted anything
        t.pop("cloudRunInvokers", None)
    (svc,) = cloud_run_services(parse(values))
    assert (svc.ingress, svc.invoker_iam_disabled, svc.default_uri_disabled, svc.custom_audiences) == (
        "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", True, True, ())


def test_iam_models_keep_cloud_runs_invoker_check_behind_the_load_balancer(stack_values):
    cfg = parse(staging(stack_values))  # staging's model: auth iam, the default
    (svc,) = cloud_run_services(cfg)
    assert cfg.cloud_run_models[0].auth == "iam"
    assert (svc.ingress, svc.invoker_iam_disabled, svc.default_uri_disabled, svc.custom_audiences) == (
        "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", False, True, ("https://run.llm.staging.acme.example/qwen-1-5b",))


# --- the argv against vLLM 0.34.0's parser, the resources under the mocks ----------------------

@pytest.fixture(scope="module")
def staging_plan(stack_values):
    return run_program("staging", staging(stack_values))


def test_every_cloud_run_argv_parses_with_the_real_parser(staging_plan):
    snap = load_snapshot(pinned_version())
    services = props_of(staging_plan, SERVICE)
    assert services
    for service in services:
        server = service["template"]["containers"][0]
        assert check_argv(server["args"], snap) == [], service["name"]
        assert "--middleware" in server["args"]  # the tenant guard is in the server


def test_the_declared_service_is_the_planned_one(staging_plan):
    (service,) = props_of(staging_plan, SERVICE)
    assert service["location"] == "us-central1" and service["ingress"] == "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
    assert service["invokerIamDisabled"] is False and service["defaultUriDisabled"] is True
    assert service["customAudiences"] == ["https://run.llm.staging.acme.example/qwen-1-5b"]
    template = service["template"]
    assert template["vpcAccess"]["egress"] == "ALL_TRAFFIC"  # the stack's region: its Cloud NAT covers the subnet
    assert template["containers"][0]["commands"] == ["python3", "/opt/vllm-gke/serve.py"]
    (subnet,) = [s for s in props_of(staging_plan, "gcp:compute/subnetwork:Subnetwork") if s["name"].endswith("-run-egress")]
    assert subnet["ipCidrRange"] == "10.30.0.0/24" and subnet["region"] == "us-central1"


def test_the_service_account_reads_its_models_folders_alone(staging_plan):
    grants = [g for g in props_of(staging_plan, "gcp:storage/bucketIAMMember:BucketIAMMember")
              if "run-qwen" in str(g.get("member", "")) or "qwen-1-5b-reads" in str(g.get("condition", {}).get("title", ""))]
    viewers = [g for g in grants if g["role"] == "roles/storage.objectViewer"]
    assert viewers and all("qwen-1-5b/" in g["condition"]["expression"] for g in viewers)
    assert all("mistral-7b" not in g["condition"]["expression"] for g in viewers)


def test_the_loader_writes_the_cloud_run_models_folder(staging_plan):
    assert any("qwen-1-5b" in r.name for r in staging_plan.of_type("kubernetes:batch/v1:Job"))


# --- the entrypoint on Cloud Run -------------------------------------------------------------

def test_the_entrypoint_waits_for_weights_on_the_volume_and_warms_on_the_argvs_port(tmp_path):
    marker = tmp_path / "weights-ready"
    marker.write_text("")
    assert serve.wait_for_files([str(marker)]) is True
    argv = ["/models/x", "--served-model-name", "x", "--port", str(PORT)]
    assert serve.flag(argv, "--port", "8000") == str(PORT) and serve.flag(argv, "--served-model-name", "") == "x"


def test_the_metrics_sidecar_runs_beside_the_server_after_it(staging_plan):
    (service,) = props_of(staging_plan, SERVICE)
    server, sidecar = service["template"]["containers"]
    assert sidecar["dependsOns"] == [server["name"]] and "ports" not in sidecar  # one ingress container
    assert {v["name"] for v in service["template"]["volumes"]} >= {"weights", sidecar["volumeMounts"][0]["name"]}


def test_every_cloud_run_resource_waits_for_the_apis_it_calls(staging_plan):
    """On an empty project the first `pulumi up` enables Cloud Run's, Secret Manager's and Certificate
    Manager's APIs before anything calls them (an API not in the stack's list is waited for by nobody)."""
    apis = {r.props["service"]: r for r in staging_plan.of_type("gcp:projects/service:Service")}
    assert {"run.googleapis.com", "secretmanager.googleapis.com", "certificatemanager.googleapis.com"} <= set(apis)
    waits = [("gcp:cloudrunv2/service:Service", "run.googleapis.com"),
             ("gcp:secretmanager/secretVersion:SecretVersion", "secretmanager.googleapis.com"),
             ("gcp:certificatemanager/certificate:Certificate", "certificatemanager.googleapis.com")]
    for type_, api in waits:
        resources = staging_plan.of_type(type_)
        assert resources, type_
        assert all(staging_plan.waits_for(r, apis[api]) for r in resources), (type_, api)


# --- a Cloud Run model given by its id alone (infra/model_configs.py) ---------------------------

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"


def _cache_qwen(folder: Path) -> dict[str, Any]:
    """Qwen2.5-7B-Instruct's config.json (the fixture), cached as the plan caches it."""
    config = json.loads((HF_CONFIGS / QWEN_7B.replace("/", "--") / "config.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Qwen--Qwen2.5-7B-Instruct@main.json").write_text(json.dumps(
        {"source": f"hf://{QWEN_7B}", "revision": "main", "commit": "c0ffee", "config": config}))
    return config


def test_a_shapeless_cloud_run_model_reads_its_config_json_as_models_do(stack_values, tmp_path):
    values = staging(stack_values)
    model = cloud_run(values)
    model.pop("shape")
    model.pop("maxModelLen", None)
    model["source"] = f"hf://{QWEN_7B}"
    config = _cache_qwen(tmp_path)
    cfg = parse(with_stack_model_configs(values, "staging", lambda: tmp_path))
    (m,) = cfg.cloud_run_models
    facts = shape_from_config(config)
    assert m.as_model().model_shape.params_billion == pytest.approx(round(facts.params_billion, 2))
    assert m.max_model_len == min(8192, facts.max_context)
    # A program of one's own: the Platform's settings, resolved alike.
    out = with_model_configs({"cloudRun": {"models": [{"name": "q", "source": f"hf://{QWEN_7B}"}]}}, tmp_path)
    assert out["cloudRun"]["models"][0]["shape"] == facts.custom_shape()


def test_a_shapeless_cloud_run_model_without_its_config_names_the_key(stack_values, tmp_path, monkeypatch):
    values = staging(stack_values)
    cloud_run(values).pop("shape")
    monkeypatch.setattr(model_configs, "_fetch_hub", _offline)
    with pytest.raises(ConfigError) as exc:
        with_stack_model_configs(values, "staging", lambda: tmp_path)
    (issue,) = exc.value.issues
    assert issue.key == "vllm-gke:cloudRun.models[qwen-1-5b].shape" and "give shape" in issue.problem


def _offline(*_: Any) -> Any:
    raise model_configs._Unreachable("offline")  # pyright: ignore[reportPrivateUsage]


def test_a_load_test_of_a_cloud_run_model_is_refused_saying_why_and_the_fix(stack_values):
    values = staging(stack_values)
    tenant = values["vllm-gke:tenants"][0]
    if "qwen-1-5b" not in tenant["models"]:
        tenant["models"] = [*tenant["models"], "qwen-1-5b"]
    values["vllm-gke:loadTests"] = [{"name": "run-load", "tenant": tenant["name"], "model": "qwen-1-5b"}]
    (problem,) = [p for p in problems(values) if "loadTests" in p]
    assert problem.startswith("vllm-gke:loadTests[run-load].model: 'qwen-1-5b' is on Cloud Run")
    assert "name a GKE model" in problem and f"/{tenant['name']}/qwen-1-5b/v1" in problem


def test_a_model_outside_the_stacks_region_cannot_reach_the_limit_store(stack_values):
    values = staging(stack_values)
    cloud_run(values)["region"] = "europe-west4"  # offers the L4
    assert values["vllm-gke:globalLimits"]["enabled"] is True
    (problem,) = [p for p in problems(values) if "limit store" in p]
    assert problem.startswith("vllm-gke:cloudRun.models[qwen-1-5b].region: 'europe-west4' is not the stack's region "
                              f"({values['gcp:region']})") and "turn globalLimits off" in problem
    values["vllm-gke:globalLimits"]["enabled"] = False  # each instance's own windows: no store to reach
    assert not [p for p in problems(values) if "limit store" in p]


def test_the_guide_says_what_the_code_does():
    """docs/guides/cloud-run.md: the probe's path and limits, the headers refused, every engineer's section,
    the pointer to how the limit store admits the instances (tests/test_docs.py checks the anchor resolves)."""
    guide = (REPO_ROOT / "docs" / "guides" / "cloud-run.md").read_text()
    flat = " ".join(guide.split())
    assert f"`{WARM_PATH}`" in flat and f"at most {STARTUP_PROBE_LIMIT_S} s" in flat
    assert flat.count("1,800") == 1 and "the 1,800 s that Cloud Run's page for jobs allows a GPU is a job task's" in flat
    assert all(f"`{h}`" in flat for h in REFUSED_HEADERS)
    assert "from `X-Serverless-Authorization` when the request has one, else from `Authorization`" in flat
    for heading in ("## Tenants", "## Capacity, cost and cold start", "## Monitoring, SLOs and policies", "## Limits"):
        assert f"\n{heading}\n" in guide, heading
    assert "(limits-across-replicas.md#from-cloud-run-models)" in flat
