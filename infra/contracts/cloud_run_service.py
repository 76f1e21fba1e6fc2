"""The Cloud Run models' services (components/cloud_run.py): what Cloud Run takes of a GPU service, its
startup probe, its Cloud Storage volume and its ingress, and a check of each on the plan's resources."""

from __future__ import annotations

from typing import Any, Iterator

from ...components.model.cloud_run import CLOUD_RUN_GPUS, CUDA_COMPAT_ENV, IMAGE_CUDA, WARM_PATH
from ...components.model.cloud_run_capacity import PROBE_INITIAL_DELAY_MAX_S, PROBE_WINDOW_MAX_S
from ...components.model.specs import CLOUD_RUN_POOL
from ...components.model.weights_layout import MOUNT_PATH
from ..plan import Plan
from .base import Contract

GPU = "https://cloud.google.com/run/docs/configuring/services/gpu"
HEALTHCHECKS = "https://cloud.google.com/run/docs/configuring/healthchecks"
GCS_VOLUMES = "https://cloud.google.com/run/docs/configuring/services/cloud-storage-volume-mounts"
INGRESS = "https://cloud.google.com/run/docs/securing/ingress"
INVOKER_CHECK = "https://cloud.google.com/run/docs/securing/managing-access#invoker_check"
SERVICE = "gcp:cloudrunv2/service:Service"


def _services(plan: Plan) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, props, the container with the GPU: the one with ports) of each Cloud Run service."""
    for r in plan.of_type(SERVICE):
        containers = r.props["template"]["containers"]
        yield str(r.props.get("name")), r.props, next(c for c in containers if c.get("ports"))


def gpu_service_is_instance_billed(plan: Plan) -> list[str]:
    """One GPU on the serving container, CPU always allocated (instance-based billing, which Cloud Run
    requires with a GPU), at least the GPU's vCPUs and memory, a GPU the region offers."""
    out = []
    by_accelerator = {g.accelerator: g for g in CLOUD_RUN_GPUS.values()}
    for name, props, server in _services(plan):
        res, template = server.get("resources") or {}, props["template"]
        gpu = by_accelerator.get((template.get("nodeSelector") or {}).get("accelerator", ""))
        if (res.get("limits") or {}).get("nvidia.com/gpu") != "1" or gpu is None:
            out.append(f"{name}: no Cloud Run GPU on its serving container (nvidia.com/gpu 1 and nodeSelector.accelerator)")
            continue
        if res.get("cpuIdle") is not False:
            out.append(f"{name}: cpuIdle is not false: a GPU service must use instance-based billing")
        cpu, memory = int(res["limits"]["cpu"]), int(str(res["limits"]["memory"]).removesuffix("Gi"))
        if cpu < gpu.min_cpu or memory < gpu.min_memory_gib:
            out.append(f"{name}: {cpu} vCPUs and {memory} GiB, below the {gpu.min_cpu} and {gpu.min_memory_gib} a "
                       f"{gpu.accelerator} requires")
        if props.get("location") not in gpu.regions:
            out.append(f"{name}: {props.get('location')} has no Cloud Run {gpu.accelerator}")
    return out


def gpu_driver_runs_the_images_cuda(plan: Plan) -> list[str]:
    """The service sets VLLM_ENABLE_CUDA_COMPATIBILITY=1 exactly where Cloud Run's driver for its GPU runs an older
    CUDA major than the image's vLLM is built on (the table in components/model/cloud_run.py)."""
    out = []
    rel = plan.config.release_for(CLOUD_RUN_POOL)
    by_accelerator = {g.accelerator: g for g in CLOUD_RUN_GPUS.values()}
    for name, props, server in _services(plan):
        gpu = by_accelerator.get((props["template"].get("nodeSelector") or {}).get("accelerator", ""))
        if gpu is None:
            continue
        if (image := IMAGE_CUDA.get(rel.version)) is None:
            out.append(f"{name}: {rel.label}'s image CUDA is not in components/model/cloud_run.py IMAGE_CUDA")
            continue
        needed = gpu.driver_cuda[0] < image[0]
        env = {e.get("name"): e.get("value") for e in server.get("envs") or []}
        if (env.get(CUDA_COMPAT_ENV) == "1") != needed:
            out.append(f"{name}: {CUDA_COMPAT_ENV} {env.get(CUDA_COMPAT_ENV)!r}, but the {gpu.accelerator}'s driver "
                       f"{gpu.driver} runs CUDA {gpu.driver_cuda[0]}.{gpu.driver_cuda[1]} and the image CUDA "
                       f"{image[0]}.{image[1]}: {'set it to 1' if needed else 'leave it unset'}")
    return out


def startup_probe_within_cloud_runs_limits(plan: Plan) -> list[str]:
    """An HTTP GET probe (Cloud Run runs no exec probe) of the guard's warm path on the serving port (Cloud Run
    routes requests once it passes); failureThreshold x periodSeconds
    and the initial delay at most 240 s each (a service's limits: cloud_run_capacity.PROBE_WINDOW_MAX_S),
    period over the timeout."""
    out = []
    for name, _props, server in _services(plan):
        probe = server.get("startupProbe") or {}
        port = server["ports"]["containerPort"]
        http = probe.get("httpGet") or {}
        if http.get("port") != port or http.get("path") != WARM_PATH:
            out.append(f"{name}: its startup probe is no HTTP GET of {WARM_PATH} on the serving port {port} (the "
                       "guard answers it only once the entrypoint has warmed the server)")
        period, delay = probe.get("periodSeconds", 10), probe.get("initialDelaySeconds", 0)
        if period * probe.get("failureThreshold", 3) > PROBE_WINDOW_MAX_S or delay > PROBE_INITIAL_DELAY_MAX_S:
            out.append(f"{name}: startup probe failureThreshold x periodSeconds or initial delay over Cloud Run's "
                       f"{PROBE_WINDOW_MAX_S} s")
        if probe.get("timeoutSeconds", 1) >= period:
            out.append(f"{name}: startup probe timeout not below its period")
    return out


def weights_volume_is_the_bucket_read_only(plan: Plan) -> list[str]:
    """The weights bucket mounted read-only (Cloud Run's Cloud Storage FUSE, a gen2 feature) at the folder
    vLLM's argv reads, its gcsfuse flags without leading dashes."""
    out = []
    for name, props, server in _services(plan):
        volumes = {v["name"]: v for v in props["template"].get("volumes") or [] if v.get("gcs")}
        mounts = [m for m in server.get("volumeMounts") or [] if m["name"] in volumes]
        if not mounts or mounts[0]["mountPath"] != MOUNT_PATH or not str(server["args"][0]).startswith(MOUNT_PATH):
            out.append(f"{name}: the weights bucket is not mounted at {MOUNT_PATH}, where vLLM's argv reads the model")
            continue
        gcs = volumes[mounts[0]["name"]]["gcs"]
        if gcs.get("readOnly") is not True:
            out.append(f"{name}: the weights bucket is mounted writable")
        if any(str(o).startswith("-") for o in gcs.get("mountOptions") or []):
            out.append(f"{name}: a gcsfuse mount option with leading dashes (Cloud Run takes them without)")
        if props["template"].get("executionEnvironment") != "EXECUTION_ENVIRONMENT_GEN2":
            out.append(f"{name}: Cloud Storage volumes need the second generation execution environment")
    return out


def invoker_check_off_only_behind_the_load_balancer(plan: Plan) -> list[str]:
    """The invoker check off (the guard verifies the tenant's JWT) only with ingress from the load
    balancer alone and the run.app URL disabled; on, the service keeps Cloud Run's IAM check."""
    return [f"{name}: invokerIamDisabled with ingress {props.get('ingress')} and defaultUriDisabled "
            f"{props.get('defaultUriDisabled')}: anyone reaching it is served unauthenticated by Cloud Run"
            for name, props, _server in _services(plan)
            if props.get("invokerIamDisabled") and (props.get("ingress") != "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
                                                   or props.get("defaultUriDisabled") is not True)]


ROWS = (
    Contract("Cloud Run GPU services", "docs, 2026", "A GPU service uses instance-based billing (CPU always "
             "allocated), one L4 (4 vCPUs and 16 GiB at least) or RTX PRO 6000 (20 and 80) an instance, in the "
             "regions the page lists", GPU, "cpu_idle false, nvidia.com/gpu 1, the GPU's minimum and region",
             gpu_service_is_instance_billed),
    Contract("Cloud Run GPU drivers", "docs, 2026; vLLM 0.34.0", "Cloud Run preinstalls the GPU's driver: the L4's "
             "535.216.03 (CUDA 12.2), the RTX PRO 6000's 580.x.x (CUDA 13.0); vLLM's VLLM_ENABLE_CUDA_COMPATIBILITY=1 "
             "puts the image's CUDA compat libraries first on LD_LIBRARY_PATH at import (vllm/envs.py:2326, "
             "vllm/env_override.py:51-99); unverified on a real L4", GPU,
             "the env var set exactly where the driver's CUDA major is older than the image's (torch 2.14.0+cu130 in "
             "vLLM 0.34.0)", gpu_driver_runs_the_images_cuda),
    Contract("Cloud Run health checks", "docs, 2026", "A service's instance takes requests once its startup probe "
             "passes; startup probes are HTTP, TCP or gRPC; HTTP GET "
             "answers 200-399; failureThreshold x periodSeconds at most 240 s, then the instance is shut down; period "
             "and initial delay at most 240 s each (pulumi_gcp 10.2.0 cloudrunv2 startup probe args)",
             HEALTHCHECKS, f"HTTP GET {WARM_PATH} on the serving port (the guard's 503 until the entrypoint has warmed "
             "the server), timed by the capacity model",
             startup_probe_within_cloud_runs_limits),
    Contract("Cloud Run Cloud Storage volumes", "docs, 2026", "A bucket mounts through Cloud Storage FUSE "
             "(second generation environment), read-only if asked, with gcsfuse flags given without dashes",
             GCS_VOLUMES, "the weights bucket read-only at /models, the GKE mounts' metadata cache",
             weights_volume_is_the_bucket_read_only),
    Contract("Cloud Run ingress and invoker check", "docs, 2026", "Internal and Cloud Load Balancing ingress "
             "admits the load balancers and internal sources; the run.app URL can be disabled; with the invoker "
             f"check off Cloud Run serves any caller it admits ({INVOKER_CHECK})", INGRESS,
             "auth jwt: ingress INTERNAL_LOAD_BALANCER, run.app URL off, the guard verifies the JWT",
             invoker_check_off_only_behind_the_load_balancer),
)
