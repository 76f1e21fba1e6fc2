"""The Cloud Run models themselves (components/model/cloud_run.py): they read the weights bucket, run
where Cloud Run offers their GPU with at least the instance it needs, share one region (the egress
subnet's, and the stack's where they reach the limit store) and a name space with the GKE models, their
egress subnet overlaps nothing of the cluster's, and no load test names them. Their load balancer's rules
are cloud_run_gateway.py's, their tenants' cloud_run_tenants.py's."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from ..cloud_run import (
    CLOUD_RUN_GPUS,
    CPU_VALUES_UP_TO_8,
    GIB_PER_CPU,
    GPU_DOCS,
    MAX_CPU,
    MAX_MEMORY_GIB,
    cpu_of,
    instance_totals,
    memory_gib_of,
)
from ..cloud_run_monitoring import SIDECAR_LIMITS, SIDECAR_NAME
from ..cloud_run_store import reaches_store
from ..specs.base import item_key
from .base import Add

if TYPE_CHECKING:
    from ..specs import CloudRunModelSpec
    from ..stack_config import StackConfig


def cloud_run_models(cfg: "StackConfig", add: Add) -> None:
    if cfg.cloud_run is None:
        return
    if cfg.weights.backend != "gcs":
        add("weights.backend", f"is {cfg.weights.backend}, but the Cloud Run models (cloudRun.models) mount the "
            "weights bucket as a Cloud Storage volume (Cloud Run mounts no Filestore share or Hyperdisk): set it to gcs")
    gke = {m.name for m in cfg.models}
    models = cfg.cloud_run.models
    seen: set[str] = set()
    for i, model in enumerate(models):
        key = f"cloudRun.{item_key('models', models, i)}"
        if model.name in gke or model.name in seen:
            add(f"{key}.name", f"'{model.name}' is already a model's name (models[] or cloudRun.models[]): a name is "
                "one route (/<name>/v1) and one served model; rename one")
        seen.add(model.name)
        _gpu(cfg, key, i, add)
    _one_region(cfg, add)
    _store_region(cfg, add)
    _egress_subnet(cfg, add)
    _load_tests(cfg, add)


def _store_region(cfg: "StackConfig", add: Add) -> None:
    """With globalLimits the instances reach the limit store at an internal passthrough load balancer in
    the cluster's region, without global access (cloud_run_store.py): only from that region."""
    if not reaches_store(cfg):
        return
    models = cfg.cloud_run_models
    for i, model in enumerate(models):
        if (region := cfg.cloud_run_region(model)) != cfg.region:
            add(f"cloudRun.{item_key('models', models, i)}.region",
                f"'{region}' is not the stack's region ({cfg.region}): with globalLimits on, its instances count "
                "their tenants' limits in the cluster's limit store, whose internal load balancer takes clients from "
                f"its own region only; leave region unset (or set {cfg.region}), or turn globalLimits off")


def _load_tests(cfg: "StackConfig", add: Add) -> None:
    """A load test runs in the cluster, in the GKE model's serving namespace, against the gateway's
    hostname: none of that is a Cloud Run model's."""
    names = {m.name for m in cfg.cloud_run_models}
    for i, spec in enumerate(cfg.load_tests):
        if spec.model in names:
            add(f"{item_key('loadTests', cfg.load_tests, i)}.model",
                f"'{spec.model}' is on Cloud Run (cloudRun.models): a load test runs in the cluster, in a GKE model's "
                "serving namespace, against gateway.hostname; name a GKE model here, and load-test the Cloud Run model "
                f"from outside against https://<cloudRun.hostname>/{spec.tenant}/{spec.model}/v1")


def _gpu(cfg: "StackConfig", key: str, i: int, add: Add) -> None:
    """The region offers the GPU; the instance has at least the vCPUs and memory Cloud Run requires with it."""
    assert cfg.cloud_run is not None
    model = cfg.cloud_run.models[i]
    gpu, region = CLOUD_RUN_GPUS[model.gpu], cfg.cloud_run_region(model)
    if region not in gpu.regions:
        where = "region" if model.region else "region (unset: the stack's gcp:region)"
        add(f"{key}.region", f"{where} '{region}' has no Cloud Run {model.gpu} GPU ({GPU_DOCS}); set region to one "
            f"of {', '.join(gpu.regions)} (with a regional gateway class, the stack's region must be one), or "
            f"another gpu")
    if model.cpu < gpu.min_cpu or model.memory_gib < gpu.min_memory_gib:
        add(f"{key}.cpu", f"{model.cpu} vCPUs and memoryGib {model.memory_gib}: Cloud Run requires at least "
            f"{gpu.min_cpu} vCPUs and {gpu.min_memory_gib} GiB with a {model.gpu} ({GPU_DOCS}); set cpu: "
            f"{max(model.cpu, gpu.min_cpu)} and memoryGib: {max(model.memory_gib, gpu.min_memory_gib)}")
    _instance_max(key, model, add)
    _container_sizes(key, model, add)


def _instance_max(key: str, model: "CloudRunModelSpec", add: Add) -> None:
    """The server and the metrics sidecar together within the instance's maximum with the GPU."""
    cap_cpu, cap_mem = MAX_CPU.get(model.gpu), MAX_MEMORY_GIB.get(model.gpu)
    cpu, memory = instance_totals(model)
    if (cap_cpu is not None and cpu > cap_cpu) or (cap_mem is not None and memory > cap_mem):
        sidecar_cpu, sidecar_mem = cpu - cpu_of(model), memory - memory_gib_of(model)
        fit_cpu = max((v for v in CPU_VALUES_UP_TO_8 if v <= (cap_cpu or 8) - sidecar_cpu), default=1)
        fit_mem = min(int((cap_mem or 32) - sidecar_mem), GIB_PER_CPU * fit_cpu)
        add(f"{key}.cpu", f"{model.cpu} vCPUs and memoryGib {model.memory_gib} for the server, plus {sidecar_cpu:g} and "
            f"{sidecar_mem:g} GiB for the metrics sidecar, make {cpu:g} vCPUs and {memory:g} GiB: a Cloud Run instance "
            f"with a {model.gpu} has at most {cap_cpu} vCPUs and {cap_mem} GiB in all its containers; set cpu: "
            f"{fit_cpu} and memoryGib: {fit_mem} at most")


def _nearest_cpu(model: "CloudRunModelSpec", cpu: float) -> int:
    """The value Cloud Run takes nearest above `cpu` that still fits the instance beside the sidecar, else below."""
    room = MAX_CPU.get(model.gpu, 8) - _sidecar_size()[0]
    fits = [v for v in CPU_VALUES_UP_TO_8 if v <= room] or [min(CPU_VALUES_UP_TO_8)]
    return next((v for v in fits if v > cpu), fits[-1])


def _container_sizes(key: str, model: "CloudRunModelSpec", add: Add) -> None:
    """Each container's vCPUs a value Cloud Run takes, and its memory within what they allow."""
    containers = {"server": (model.cpu, model.memory_gib), SIDECAR_NAME: _sidecar_size()}
    for name, (cpu, memory) in containers.items():
        where = f"{key}.cpu" if name == "server" else f"{key} (the {name} sidecar)"
        if cpu <= 8 and cpu not in CPU_VALUES_UP_TO_8:
            add(where, f"{cpu:g}: Cloud Run takes {', '.join(map(str, CPU_VALUES_UP_TO_8))} vCPUs a container (up to "
                f"8) with CPU always allocated; set {_nearest_cpu(model, cpu) if name == 'server' else 1}")
        elif cpu <= 8 and memory > GIB_PER_CPU * cpu:
            add(where, f"{memory:g} GiB on {cpu:g} vCPUs: Cloud Run allows at most {GIB_PER_CPU} GiB a vCPU in a "
                f"container; lower memoryGib to {GIB_PER_CPU * cpu:g} or raise cpu")


def _sidecar_size() -> tuple[float, float]:
    """(vCPUs, GiB) of cloud_run_monitoring.SIDECAR_LIMITS ("1", "512Mi")."""
    memory = SIDECAR_LIMITS["memory"]
    gib = float(memory.removesuffix("Mi")) / 1024 if memory.endswith("Mi") else float(memory.removesuffix("Gi"))
    return float(SIDECAR_LIMITS["cpu"]), gib


def _one_region(cfg: "StackConfig", add: Add) -> None:
    """One egress subnet serves them all: Direct VPC egress takes a subnet in the service's region."""
    regions = sorted({cfg.cloud_run_region(m) for m in cfg.cloud_run_models})
    if len(regions) > 1:
        add("cloudRun.models", f"the Cloud Run models run in {', '.join(regions)}, but their instances reach the "
            "VPC (the limit store) through one egress subnet (cloudRun.egressSubnetCidr) in one region; give them "
            "one region")


def _egress_subnet(cfg: "StackConfig", add: Add) -> None:
    assert cfg.cloud_run is not None
    egress = ipaddress.ip_network(cfg.cloud_run.egress_subnet_cidr)
    ranges = {"cluster.subnetCidr": cfg.cluster.subnet_cidr, "cluster.podsCidr": cfg.cluster.pods_cidr,
              "cluster.servicesCidr": cfg.cluster.services_cidr, "cluster.proxyOnlyCidr": cfg.cluster.proxy_only_cidr,
              "cluster.masterCidr": cfg.cluster.master_cidr}
    for name, cidr in ranges.items():
        if cidr and egress.overlaps(ipaddress.ip_network(cidr)):
            add("cloudRun.egressSubnetCidr", f"{egress} overlaps {name} ({cidr}): the Cloud Run instances' egress "
                "subnet is a subnet of the cluster's VPC of its own; pick a free range (e.g. 10.30.0.0/24)")
