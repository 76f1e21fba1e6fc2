"""Checks across config keys, one module per concern: what each key accepts alone is in
components/model/specs/; what the keys must agree on - names (names.py), where models run
(placement.py), tenants (tenants.py), the cluster (cluster.py), the vLLM release (release.py),
objectives and their alerts (monitoring.py), load tests (load_tests.py), fallback models (fallback.py),
rollouts (rollouts.py) - is here. Every problem names the key to change and how. The `check_*`
functions are also run by the package's components on their own inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..stack_config import ConfigIssue
from .base import PROJECT, Add
from .cloud_run import cloud_run_models
from .cloud_run_gateway import cloud_run_gateway
from .cloud_run_tenants import cloud_run_tenants
from .cluster import (
    INFERENCE_GATEWAY_CLASSES,
    INFERENCE_GATEWAY_MIN_GKE,
    LENGTH_ROUTING_CLASSES,
    check_inference_gateway_class,
    check_inference_gateway_version,
    check_length_routing_class,
    check_network,
    check_zones,
    hyperdisk_ml,
    inference_gateway,
    length_routing,
    network,
    zones,
)
from .disaggregation import disaggregated_models
from .fallback import fallbacks
from .kv_offload import kv_offload
from .load_tests import load_tests
from .monitoring import slo_alerts_reachable, traces_exportable
from .names import RESERVED_NAMESPACES, check_serving_namespace, issuers, namespaces, unique_names
from .picker import picker_queue_within_backend_timeout, precise_prefix_cache
from .placement import (
    SYSTEM_DISK_GB,
    check_fit,
    check_pool_lengths,
    filestore_size,
    gpu_slots,
    model_placements,
    multi_host_groups,
    node_disks,
    scale_to_zero,
)
from .release import check_extra_args, check_image_tag, vllm_release
from .rollouts import rollouts
from .scaling import cooldown_covers_wake
from .sleep_mode import sleep_mode
from .speculative import speculative_decoding
from .tenants import adapters, check_tenant_cap, check_tenant_limits, external_gateway, global_limits, tenant_models

if TYPE_CHECKING:
    from ..stack_config import StackConfig

# In the order problems are reported: names first, then placement, then the rest.
STACK_CHECKS: tuple[Callable[["StackConfig", Add], None], ...] = (
    unique_names, model_placements, tenant_models, gpu_slots, external_gateway, network, zones, issuers,
    namespaces, vllm_release, inference_gateway, length_routing, global_limits, adapters, scale_to_zero,
    hyperdisk_ml, node_disks, filestore_size, slo_alerts_reachable, load_tests,
    traces_exportable, multi_host_groups, cooldown_covers_wake, rollouts, fallbacks, picker_queue_within_backend_timeout,
    precise_prefix_cache, kv_offload,
    sleep_mode,  # models[].sleepMode with nodePools[].gpuSharing
    disaggregated_models,  # models[].disaggregation
    speculative_decoding,  # models[].speculative
    cloud_run_models,  # cloudRun.models: bucket, GPU region and instance, one region, egress subnet
    cloud_run_gateway,  # cloudRun: its load balancer (region, hostname)
    cloud_run_tenants,  # tenants[].models naming cloudRun.models, tenants[].cloudRunInvokers
)


def cross_field_issues(cfg: "StackConfig") -> list["ConfigIssue"]:
    issues: list[ConfigIssue] = []

    def add(key: str, problem: str) -> None:
        issues.append(ConfigIssue(f"{PROJECT}:{key}" if ":" not in key else key, problem))

    for check in STACK_CHECKS:
        check(cfg, add)
    return issues


__all__ = [
    "INFERENCE_GATEWAY_CLASSES",
    "INFERENCE_GATEWAY_MIN_GKE",
    "LENGTH_ROUTING_CLASSES",
    "PROJECT",
    "RESERVED_NAMESPACES",
    "STACK_CHECKS",
    "SYSTEM_DISK_GB",
    "Add",
    "check_extra_args",
    "check_fit",
    "check_image_tag",
    "check_inference_gateway_class",
    "check_inference_gateway_version",
    "check_length_routing_class",
    "check_network",
    "check_pool_lengths",
    "check_serving_namespace",
    "check_tenant_cap",
    "check_tenant_limits",
    "check_zones",
    "cross_field_issues",
]
