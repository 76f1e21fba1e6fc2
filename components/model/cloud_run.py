"""A model on Cloud Run with a GPU (vllm-gke:cloudRun), as plain values: the GPUs Cloud Run offers and
where, the server's command line and environment, its startup probe and concurrency, and the
service's settings as the provider's cloudrunv2.Service takes them. components/cloud_run.py declares
the resources from these; the config rules (config_rules/cloud_run.py) and the plan read them too.

Every behaviour relied on is a row of infra/contracts/cloud_run_service.py, with Google's page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from .cloud_run_capacity import (
    GPU_MIN_RESOURCES,
    billed_cpu,
    billed_memory_gib,
    concurrency,
    instance_cpu,
    instance_memory_gib,
    probe_window_seconds,
)
from .cloud_run_capacity import startup_probe as capacity_probe
from .cloud_run_tenancy import cloud_run_guard_config, id_token_audience
from .gcs_weights import reader_prefixes
from .specs import CLOUD_RUN_POOL, CloudRunModelSpec, ModelSpec
from .vllm_server import (
    GUARD_CONFIG_ENV,
    PORT,
    STARTUP_WINDOW_ENV,
    WARM_MARKER,
    WARM_MARKER_ENV,
    WEIGHTS_MARKERS_ENV,
    vllm_args,
    weights_markers,
)
from .vllm_versions import VllmRelease
from .weights_layout import MOUNT_PATH, SERVER_UID

if TYPE_CHECKING:
    from .stack_config import StackConfig

GPU_DOCS = "https://cloud.google.com/run/docs/configuring/services/gpu"
# The guard's answer to Cloud Run's startup probe: 503 until the entrypoint has warmed the server
# (images/vllm_gke_guard/warm.py WARM_PATH; the model layer does not import the image's code).
WARM_PATH = "/vllm-gke/warm"


@dataclass(frozen=True)
class CloudRunGpu:
    """A GPU Cloud Run attaches to an instance (one a instance), from Google's GPU page (GPU_DOCS)."""

    # node_selector.accelerator's value.
    accelerator: str
    memory_gb: int
    # The instance's least vCPUs and GiB of memory with this GPU.
    min_cpu: int
    min_memory_gib: int
    # Regions Cloud Run offers it in (some by invitation only: Google's page names them).
    regions: tuple[str, ...]
    # The GKE accelerator of the same chip (components/model/catalog.py), whose memory and roofline
    # the capacity model reads; None where the catalog has none.
    catalog_accelerator: Optional[str] = None
    # The NVIDIA driver Cloud Run preinstalls with it and the CUDA version that driver runs (GPU_DOCS,
    # "Supported GPU types": L4 535.216.03, CUDA 12.2; RTX PRO 6000 580.x.x, CUDA 13.0).
    driver: str = ""
    driver_cuda: tuple[int, int] = (0, 0)


CLOUD_RUN_GPUS: Mapping[str, CloudRunGpu] = {
    "nvidia-l4": CloudRunGpu("nvidia-l4", 24, *GPU_MIN_RESOURCES["nvidia-l4"], (
        "asia-south1", "asia-southeast1", "europe-west1", "europe-west4", "us-central1", "us-east4"), "nvidia-l4",
        "535.216.03", (12, 2)),
    "nvidia-rtx-pro-6000": CloudRunGpu("nvidia-rtx-pro-6000", 96, *GPU_MIN_RESOURCES["nvidia-rtx-pro-6000"], (
        "asia-south2", "asia-southeast1", "europe-west4", "us-central1"), None, "580.x.x", (13, 0)),
}

# The CUDA each server image's vLLM is built on: vllm/vllm-openai:v0.34.0 ships torch 2.14.0+cu130
# (torch/version.py cuda = '13.0' in vLLM 0.34.0's wheel set), v0.11.0 torch 2.8.0+cu128.
IMAGE_CUDA: Mapping[str, tuple[int, int]] = {"0.34.0": (13, 0), "0.11.0": (12, 8)}
# vLLM's switch (vllm-project/vllm@v0.34.0: vllm/envs.py:2326, read by vllm/env_override.py:51-99 on
# `import vllm`, before torch loads CUDA): it puts the image's CUDA forward-compatibility libraries
# (VLLM_CUDA_COMPATIBILITY_PATH, else $CONDA_PREFIX/cuda-compat, else /usr/local/cuda-<torch's>/compat)
# first on LD_LIBRARY_PATH, so a CUDA 13 build runs on a datacenter GPU's older driver. Where no such
# folder exists it does nothing, and CUDA fails to initialise on the old driver.
CUDA_COMPAT_ENV = "VLLM_ENABLE_CUDA_COMPATIBILITY"

# The most vCPUs and GiB an instance may have with the GPU (none known: not checked): Cloud Run's 8 vCPUs
# and 32 GiB a instance (https://cloud.google.com/run/quotas, "per container instance"), which the
# containers of an instance share (https://cloud.google.com/run/docs/deploying#sidecars: not confirmed
# there in so many words; counted so here either way, as the price counts every container).
MAX_CPU: Mapping[str, int] = {"nvidia-l4": 8}
MAX_MEMORY_GIB: Mapping[str, int] = {"nvidia-l4": 32}
# The vCPUs a container may have from 1 to 8 (https://cloud.google.com/run/docs/configuring/services/cpu:
# values over 1 are integers of its table; below 1 needs request-based billing, which a GPU service cannot use),
# and the most GiB a vCPU may carry there (the same table: 4 vCPUs up to 16 GiB, 6 up to 24, 8 up to 32).
CPU_VALUES_UP_TO_8 = (1, 2, 4, 6, 8)
GIB_PER_CPU = 4
# Cloud Run sends SIGTERM and kills the instance 10 s later
# (https://cloud.google.com/run/docs/container-contract#instance-shutdown): vLLM's drain fits inside it.
SHUTDOWN_S = 8

# Cloud Run's request timeout ceiling for a service (60 minutes).
MAX_TIMEOUT_S = 3600
# The container Cloud Run sends requests to (vLLM's port, as in a GKE pod); the entrypoint reads it
# from the argv's --port, and Cloud Run sets $PORT to the same value.
CONTAINER_NAME = "vllm"
WEIGHTS_VOLUME = "weights"
# gcsfuse flags for a read-only weights mount (no leading dashes, as the volume takes them): the
# same unbounded metadata cache the GKE mounts use (the files under a revision never change), the
# server's uid and gid so the files read as its own.
MOUNT_OPTIONS = ("implicit-dirs", "metadata-cache-ttl-secs=-1", "stat-cache-max-size-mb=-1",
                 "type-cache-max-size-mb=-1", f"uid={SERVER_UID}", f"gid={SERVER_UID}")


def gpu_of(model: CloudRunModelSpec) -> CloudRunGpu:
    return CLOUD_RUN_GPUS[model.gpu]


def service_name(model: CloudRunModelSpec) -> str:
    """The Cloud Run service's name: the model's (names are lowercase letters, digits and '-')."""
    return f"vllm-{model.name}"[:49]


def weights_models(cfg: "StackConfig") -> list[ModelSpec]:
    """What the loaders write: every GKE model and every Cloud Run model, in the one layout."""
    return [*cfg.models, *(m.as_model() for m in cfg.cloud_run_models)]


def server_args(cfg: "StackConfig", model: CloudRunModelSpec, rel: VllmRelease) -> list[str]:
    """`vllm serve`'s argv: the GKE servers' (vllm_args of as_model()), on Cloud Run's port."""
    spec = model.as_model()
    # With SLOs on, the TTFT objective is one of the histogram's bounds, as on the GKE servers (platform.py).
    ttft = cfg.monitoring.ttft_slo_seconds if cfg.monitoring.slos.enabled else None
    return _cloud_run_shutdown(vllm_args(spec, spec.short, rel, request_timeout_seconds=cfg.gateway.request_timeout_seconds,
                                         ttft_slo_seconds=ttft), rel)


def _cloud_run_shutdown(args: list[str], rel: VllmRelease) -> list[str]:
    """The drain on SIGTERM within Cloud Run's 10 s (SHUTDOWN_S), not the GKE pods' request timeout: past
    it Cloud Run kills the instance anyway, mid-drain."""
    if rel.shutdown_timeout_flag in args:
        i = args.index(rel.shutdown_timeout_flag)
        return [*args[:i + 1], str(SHUTDOWN_S), *args[i + 2:]]
    return args


def startup_probe(model: CloudRunModelSpec) -> dict[str, Any]:
    """The guard's WARM_PATH on the serving port, timed by the capacity model's cold-start estimate
    (cloud_run_capacity.py). Cloud Run probes HTTP, TCP or gRPC only (no exec probe of the warm marker as
    on GKE), and routes requests to an instance once its probe passes: vLLM's /health answers before the
    entrypoint's warm-up, the warm path only after it."""
    return {"http_get": {"path": WARM_PATH, "port": PORT}, **capacity_probe(model)}


def startup_window_seconds(probe: Mapping[str, Any]) -> int:
    """How long the probe lets the instance take to start: the entrypoint waits for vLLM that long too."""
    return probe_window_seconds(probe)


def cpu_of(model: CloudRunModelSpec) -> int:
    """The server container's vCPUs: the config's, at least the GPU's minimum (the rules refuse less); what
    the capacity model prices (one function for the declared and the billed size)."""
    return instance_cpu(model)


def memory_gib_of(model: CloudRunModelSpec) -> int:
    return instance_memory_gib(model)


def instance_totals(model: CloudRunModelSpec) -> tuple[float, float]:
    """(vCPUs, GiB) of the whole instance: the server's and the metrics sidecar's, what Cloud Run's
    per-instance maximum and its bill count."""
    return billed_cpu(model), billed_memory_gib(model)


def needs_cuda_compat(model: CloudRunModelSpec, rel: VllmRelease) -> bool:
    """The GPU's driver runs an older CUDA major than the image's vLLM is built on (CUDA's minor-version
    compatibility covers an older minor of the same major): vLLM must load the image's compat libraries."""
    image = IMAGE_CUDA.get(rel.version)
    return rel.platform == "cuda" and image is not None and gpu_of(model).driver_cuda[0] < image[0]


def cuda_compat_env(model: CloudRunModelSpec, rel: VllmRelease) -> list[dict[str, str]]:
    return [{"name": CUDA_COMPAT_ENV, "value": "1"}] if needs_cuda_compat(model, rel) else []


def server_env(model: CloudRunModelSpec, guard_config: Mapping[str, Any], window_s: int) -> list[dict[str, str]]:
    """The server container's environment: the GKE servers' less what only a pod has."""
    return [
        {"name": WEIGHTS_MARKERS_ENV, "value": ":".join(weights_markers(model.as_model()))},
        {"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": WARM_MARKER_ENV, "value": WARM_MARKER},
        {"name": STARTUP_WINDOW_ENV, "value": str(window_s)},
        {"name": GUARD_CONFIG_ENV, "value": json.dumps(dict(guard_config), sort_keys=True)},
    ]


def weights_volume(bucket: Any) -> dict[str, Any]:
    """The stack's bucket as a read-only Cloud Storage volume (Cloud Run's gcsfuse)."""
    return {"name": WEIGHTS_VOLUME, "gcs": {"bucket": bucket, "read_only": True, "mount_options": list(MOUNT_OPTIONS)}}


def reads(model: CloudRunModelSpec) -> list[str]:
    """The bucket folders the service may open (its model's, adapters', draft's)."""
    return reader_prefixes([model.as_model()])


@dataclass(frozen=True)
class CloudRunService:
    """One Cloud Run model's service, in the provider's input names (cloudrunv2.Service)."""

    model: CloudRunModelSpec
    region: str
    image: str
    args: list[str]
    env: list[dict[str, str]]
    probe: dict[str, Any]
    request_timeout_seconds: int
    # The service's custom audiences: under auth iam the one its tenants' ID tokens are minted for
    # (cloud_run_tenancy.id_token_audience); none under jwt.
    custom_audiences: tuple[str, ...] = ()
    # Direct VPC egress: what leaves through the VPC (egress_of).
    egress: str = "PRIVATE_RANGES_ONLY"

    @property
    def name(self) -> str:
        return service_name(self.model)

    def template(self, bucket: Any, service_account: Any, subnetwork: Any,
                 extra_containers: Sequence[Mapping[str, Any]] = (), extra_volumes: Sequence[Mapping[str, Any]] = (),
                 secret_env: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """The revision template: one GPU instance, CPU always allocated, the weights volume, Direct VPC egress."""
        m, gpu = self.model, gpu_of(self.model)
        server = {
            "name": CONTAINER_NAME, "image": self.image, "commands": ["python3", "/opt/vllm-gke/serve.py"],
            "args": self.args, "ports": {"container_port": PORT, "name": "http1"},
            "envs": [*self.env, *(dict(e) for e in secret_env)],
            "resources": {"limits": {"cpu": str(cpu_of(m)), "memory": f"{memory_gib_of(m)}Gi", "nvidia.com/gpu": "1"},
                          "cpu_idle": False, "startup_cpu_boost": True},
            "startup_probe": self.probe,
            "volume_mounts": [{"name": WEIGHTS_VOLUME, "mount_path": MOUNT_PATH}],
        }
        return {
            "containers": [server, *(dict(c) for c in extra_containers)],
            "node_selector": {"accelerator": gpu.accelerator},
            "gpu_zonal_redundancy_disabled": not m.gpu_zonal_redundancy,
            "scaling": {"min_instance_count": m.min_instances, "max_instance_count": m.max_instances},
            "max_instance_request_concurrency": concurrency(m),  # the capacity model's (cloud_run_capacity.py)
            "timeout": f"{self.request_timeout_seconds}s",
            "service_account": service_account,
            "execution_environment": "EXECUTION_ENVIRONMENT_GEN2",
            "volumes": [weights_volume(bucket), *(dict(v) for v in extra_volumes)],
            "vpc_access": {"network_interfaces": [{"subnetwork": subnetwork}], "egress": self.egress},
        }

    @property
    def ingress(self) -> str:
        """Both modes: only the stack's load balancer (and internal sources) reach it, so every request
        goes through the load balancer's routes (and, under iam, Cloud Run's invoker check too)."""
        return "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"

    @property
    def invoker_iam_disabled(self) -> bool:
        return self.model.auth == "jwt"

    @property
    def default_uri_disabled(self) -> bool:
        """Both modes: no run.app URL (the load balancer's serverless NEG needs none)."""
        return True

    @property
    def launch_stage(self) -> str:
        """The RTX PRO 6000 on Cloud Run is a Preview: the service declares BETA to use it."""
        return "BETA" if self.model.gpu == "nvidia-rtx-pro-6000" else "GA"

    @property
    def reads(self) -> list[str]:
        return reads(self.model)


def cloud_run_service(cfg: "StackConfig", model: CloudRunModelSpec, rel: VllmRelease,
                      guard_config: Mapping[str, Any]) -> CloudRunService:
    probe = startup_probe(model)
    timeout = min(cfg.gateway.request_timeout_seconds, MAX_TIMEOUT_S)
    audience = id_token_audience(cfg, model)
    return CloudRunService(model, cfg.cloud_run_region(model), cfg.server_image.uri, server_args(cfg, model, rel),
                           [*server_env(model, guard_config, startup_window_seconds(probe)), *cuda_compat_env(model, rel)],
                           probe, timeout, (audience,) if audience else (), egress_of(cfg, model))


def egress_of(cfg: "StackConfig", model: CloudRunModelSpec) -> str:
    """ALL_TRAFFIC in the stack's region: the weights volume reads Cloud Storage through the VPC's Private Google
    Access, Google's network optimisation for it (https://cloud.google.com/run/docs/configuring/services/gpu-best-practices),
    and the cluster's Cloud NAT (every subnet of that region: gpu_cluster.py) carries the rest, the guard's JWKS
    fetches among it. Elsewhere no NAT serves the subnet, so only private ranges go through the VPC."""
    return "ALL_TRAFFIC" if cfg.cloud_run_region(model) == cfg.region else "PRIVATE_RANGES_ONLY"


def guard_config(cfg: "StackConfig", model: CloudRunModelSpec, rel: VllmRelease) -> dict[str, Any]:
    """The guard's config for the model's instances (cloud_run_tenancy.py: the tenants that list it, verified
    by the guard itself, and the shared store over the VPC)."""
    return cloud_run_guard_config(cfg, model, rel)


def cloud_run_egress_region(cfg: "StackConfig") -> str:
    """The egress subnet's region: the Cloud Run models' (config_rules/cloud_run.py makes them one)."""
    return cfg.cloud_run_region(cfg.cloud_run_models[0])


def cloud_run_services(cfg: "StackConfig") -> list[CloudRunService]:
    rel = cfg.release_for(CLOUD_RUN_POOL)
    return [cloud_run_service(cfg, m, rel, guard_config(cfg, m, rel)) for m in cfg.cloud_run_models]
