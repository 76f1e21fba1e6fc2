"""What the platform relies on in the third-party workloads the stacks run, and a check of each.

One row per behaviour: the component and version the plan pins, what it does at run time, where
upstream says so (repository@tag:path:lines, read at that tag, or the vendor's page for what is
GKE-managed and published nowhere else), and a check that the plan honours it. `vllm-gke plan`
runs every check; the tests run them on every stack and break each one; docs/contracts.md is
generated from this table (`python -m vllm_gke.infra.contracts`).

The rows and their checks live by upstream component: keda.py, picker.py (the endpoint picker),
gateway.py (the GKE Gateway's load balancers, and the HTTPRoute filters it claims),
vllm.py, istio.py, gcsfuse.py (the Cloud Storage FUSE CSI driver), limit_store.py (Redis),
kubectl.py, loader.py (weight loading: vLLM's rule, huggingface_hub), populator.py (GKE Volume
Populator), billing.py (the Cloud Billing Budget API), collector.py (traces: vLLM's exporter, the
OpenTelemetry Collector), load_test.py (inference-perf), lws.py (LeaderWorkerSet, vLLM across
hosts), gpu_network.py (Compute Engine's network between GPU hosts), disaggregation.py (vLLM's NIXL
connector between prefill and decode pods), kv_offload.py (vLLM's KV-cache offload to host
memory), speculative.py (vLLM's speculative decoding: --speculative-config, the draft), cloud_run_capacity.py
(Cloud Run GPU services as the plan prices and sizes them) and flagger.py (Flagger, its
PromQL frontend and loadtester, the canaries' rollouts), cloud_run_gateway.py (the Cloud Run models' load
balancer: serverless NEGs, Cloud Run's ingress), cloud_run_monitoring.py (the Managed Prometheus
sidecar on Cloud Run, Cloud Run's request metrics), cloud_run_identity.py (who a request on a Cloud Run
model is: the invoker check, its custom audiences); base.py holds the Contract row and the
plan helpers they share. This module assembles the table in that order.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ..plan import Plan
from . import (
    billing,
    cloud_run_capacity,
    cloud_run_gateway,
    cloud_run_identity,
    cloud_run_monitoring,
    cloud_run_service,
    cloud_run_store,
    collector,
    disaggregation,
    disaggregation_cluster,
    flagger,
    gateway,
    gcsfuse,
    gpu_network,
    istio,
    keda,
    kubectl,
    kv_offload,
    limit_store,
    load_test,
    loader,
    lws,
    monitoring,
    picker,
    populator,
    sleep_mode,
    speculative,
    vllm,
)
from .base import Check, Contract
from .billing import budget_api_accepts_the_budget
from .cloud_run_capacity import (
    cloud_run_concurrency_is_the_capacity_models,
    cloud_run_gpu_billed_as_priced,
    cloud_run_startup_probe_within_limits,
)
from .cloud_run_gateway import (
    cloud_run_ingress_admits_the_load_balancer,
    serverless_backends_without_health_check_or_timeout,
    serverless_negs_behind_an_application_lb,
)
from .cloud_run_identity import (
    cloud_run_guard_trusts_no_peer,
    cloud_run_iam_audience_is_the_tenants,
    cloud_run_iam_identity_is_the_checked_token,
)
from .cloud_run_monitoring import (
    sidecar_pinned_and_reads_its_config,
    slos_and_dashboard_read_cloud_runs_metrics,
    slos_and_dashboard_select_the_sidecars_series,
    usage_report_prices_what_cloud_run_bills,
)
from .cloud_run_service import (
    gpu_service_is_instance_billed,
    invoker_check_off_only_behind_the_load_balancer,
    startup_probe_within_cloud_runs_limits,
    weights_volume_is_the_bucket_read_only,
)
from .cloud_run_store import redis_tls_port_requires_the_certificate, store_lb_internal_on_its_address_from_the_subnet
from .collector import collector_listens_and_writes_to_trace, vllm_exports_traces_as_configured
from .disaggregation import (
    nixl_connector_not_replaced,
    nixl_role_per_pod,
    nixl_side_channel_on_the_pod_ip,
    nixl_ucx_ports_cover_the_agents,
)
from .flagger import (
    flagger_alert_reads_its_metrics,
    flagger_deadline_outlasts_the_wake,
    flagger_owns_the_services_and_the_route,
    flagger_queries_the_frontend,
    flagger_rewrites_only_the_workload_label,
    flagger_scales_the_primary_by_named_triggers,
    flagger_tracks_no_config,
    flagger_webhooks_reach_the_loadtester,
    flagger_webhooks_start_the_load_test,
)
from .gateway import gateway_rewrites_no_path, regex_matches_on_a_regional_class
from .gcsfuse import (
    FUSE_SIDECAR,
    ISTIO_INIT,
    PROXY,
    fuse_pods_start_under_any_sidecar_mode,
    gcsfuse_sidecar_with_the_mesh,
    injected_init_order,
)
from .gpu_network import gpu_groups_talk_over_the_primary_nic
from .istio import ISTIO, istio_peer_and_claim_header, istio_principals_are_the_tenants, istio_sidecar_outlives_vllm
from .keda import (
    keda_admits_the_scaled_objects,
    keda_cooldown_only_for_zero,
    keda_names_fit,
    keda_operator_identity,
    keda_owns_external_metrics,
    keda_ports_open_on_private_clusters,
    keda_queries_one_series_of_exported_metrics,
    keda_scales_every_pool,
)
from .kubectl import kubectl_cache_is_writable
from .kv_offload import (
    offload_buffer_in_shm_and_the_memory_limit,
    offload_does_not_raise_the_batch,
    offload_flags_are_the_replicas_tier,
    offload_pods_fit_the_node,
    offload_takes_the_kv_connector,
)
from .limit_store import redis_writes_nothing_and_scripts_obey_the_acl
from .load_test import inference_perf_runs_as_the_tenant
from .loader import loader_copies_what_vllm_opens, loader_writes_only_to_volumes
from .lws import (
    jax_bounds_and_locks_the_xla_cache,
    lws_env_is_what_the_webhook_injects,
    lws_headless_service_is_its_own,
    lws_scales_groups_by_their_leaders,
    lws_webhook_reachable,
    ray_health_checks_outlast_a_compile,
    tpu_containers_reach_the_chips,
    vllm_group_launch,
    vllm_tpu_keeps_its_xla_cache,
    vllm_tpu_spans_hosts_through_ray,
)
from .picker import (
    picker_finds_the_objectives,
    picker_gets_what_it_parses,
    picker_highly_available,
    picker_objective_is_the_tenants,
    picker_ports,
    picker_reads_exported_metrics,
    picker_rolls_and_drains_with_one_ready_pod,
    picker_stops_within_its_grace,
    picker_without_pprof,
)
from .populator import populator_inputs
from .sleep_mode import (
    awake_model_passes_the_startup_check,
    lease_commands_within_the_acl,
    sleep_mode_driven_by_the_guard,
    sleep_routes_unreachable,
    time_shared_pools_and_their_pods,
)
from .speculative import (
    draft_sharded_as_counted,
    draft_waited_for_before_vllm_starts,
    lora_steps_hold_every_proposal,
    ngram_window_ordered,
    speculative_config_is_the_models,
)
from .vllm import (
    guard_reads_queue_series_vllm_exports,
    vllm_applies_no_adapter_by_itself,
    vllm_drains_on_stop,
    vllm_exports_what_monitoring_reads,
    vllm_health_and_guard,
    vllm_ttft_buckets_cut_at_the_slo,
    vllm_usage_reaches_the_guard,
    vllm_writes_only_to_volumes,
)

__all__ = [
    "CONTRACTS", "DOC", "FUSE_SIDECAR", "ISTIO", "ISTIO_INIT", "PROXY", "Check", "Contract",
    "budget_api_accepts_the_budget", "collector_listens_and_writes_to_trace", "guard_reads_queue_series_vllm_exports",
    "vllm_exports_traces_as_configured", "inference_perf_runs_as_the_tenant",
    "fuse_pods_start_under_any_sidecar_mode", "gateway_rewrites_no_path", "gcsfuse_sidecar_with_the_mesh",
    "injected_init_order",
    "istio_peer_and_claim_header", "istio_principals_are_the_tenants", "istio_sidecar_outlives_vllm",
    "keda_admits_the_scaled_objects",
    "keda_cooldown_only_for_zero", "keda_names_fit", "keda_operator_identity", "keda_owns_external_metrics",
    "keda_ports_open_on_private_clusters", "keda_queries_one_series_of_exported_metrics", "keda_scales_every_pool",
    "kubectl_cache_is_writable", "loader_copies_what_vllm_opens", "loader_writes_only_to_volumes", "main", "markdown",
    "picker_finds_the_objectives", "picker_gets_what_it_parses", "picker_highly_available",
    "picker_objective_is_the_tenants", "picker_ports", "picker_reads_exported_metrics", "picker_without_pprof",
    "picker_rolls_and_drains_with_one_ready_pod", "picker_stops_within_its_grace", "regex_matches_on_a_regional_class",
    "populator_inputs", "problems", "redis_writes_nothing_and_scripts_obey_the_acl", "vllm_drains_on_stop",
    "vllm_exports_what_monitoring_reads", "vllm_health_and_guard", "vllm_ttft_buckets_cut_at_the_slo",
    "vllm_usage_reaches_the_guard", "vllm_applies_no_adapter_by_itself", "vllm_writes_only_to_volumes",
    "lws_env_is_what_the_webhook_injects",
    "lws_headless_service_is_its_own", "lws_scales_groups_by_their_leaders", "lws_webhook_reachable",
    "vllm_group_launch", "vllm_tpu_spans_hosts_through_ray", "gpu_groups_talk_over_the_primary_nic",
    "tpu_containers_reach_the_chips",
    "vllm_tpu_keeps_its_xla_cache", "ray_health_checks_outlast_a_compile", "jax_bounds_and_locks_the_xla_cache",
    "flagger_alert_reads_its_metrics", "flagger_deadline_outlasts_the_wake", "flagger_owns_the_services_and_the_route",
    "flagger_queries_the_frontend", "flagger_rewrites_only_the_workload_label",
    "flagger_scales_the_primary_by_named_triggers", "flagger_tracks_no_config", "flagger_webhooks_reach_the_loadtester",
    "flagger_webhooks_start_the_load_test",
    "offload_buffer_in_shm_and_the_memory_limit", "offload_does_not_raise_the_batch",
    "offload_flags_are_the_replicas_tier", "offload_pods_fit_the_node", "offload_takes_the_kv_connector",
    "nixl_connector_not_replaced", "nixl_role_per_pod", "nixl_side_channel_on_the_pod_ip",
    "nixl_ucx_ports_cover_the_agents",
    "draft_sharded_as_counted", "draft_waited_for_before_vllm_starts", "lora_steps_hold_every_proposal",
    "ngram_window_ordered", "speculative_config_is_the_models",
    "awake_model_passes_the_startup_check", "lease_commands_within_the_acl", "sleep_mode_driven_by_the_guard",
    "sleep_routes_unreachable", "time_shared_pools_and_their_pods",
    "cloud_run_ingress_admits_the_load_balancer", "serverless_backends_without_health_check_or_timeout",
    "serverless_negs_behind_an_application_lb",
    "gpu_service_is_instance_billed", "startup_probe_within_cloud_runs_limits",
    "weights_volume_is_the_bucket_read_only", "invoker_check_off_only_behind_the_load_balancer",
    "redis_tls_port_requires_the_certificate", "store_lb_internal_on_its_address_from_the_subnet",
    "cloud_run_concurrency_is_the_capacity_models", "cloud_run_gpu_billed_as_priced",
    "cloud_run_startup_probe_within_limits",
    "cloud_run_guard_trusts_no_peer", "cloud_run_iam_audience_is_the_tenants", "cloud_run_iam_identity_is_the_checked_token",
    "sidecar_pinned_and_reads_its_config", "slos_and_dashboard_read_cloud_runs_metrics",
    "slos_and_dashboard_select_the_sidecars_series", "usage_report_prices_what_cloud_run_bills",
]

CONTRACTS: tuple[Contract, ...] = (
    *keda.ROWS, *picker.ROWS, *gateway.ROWS, *vllm.ROWS, *istio.ROWS, *gcsfuse.ROWS, *limit_store.ROWS, *kubectl.ROWS,
    *loader.ROWS, *populator.ROWS, *billing.ROWS,
    *collector.ROWS, *load_test.ROWS, *lws.ROWS, *gpu_network.ROWS,
    *monitoring.ROWS, *flagger.ROWS, *disaggregation.ROWS, *disaggregation_cluster.ROWS,
    *kv_offload.ROWS, *speculative.ROWS,
    *sleep_mode.ROWS,
    *cloud_run_gateway.ROWS,
    *cloud_run_service.ROWS,
    *cloud_run_store.ROWS,
    *cloud_run_capacity.ROWS,
    *cloud_run_monitoring.ROWS,
    *cloud_run_identity.ROWS,
)


def problems(plan: Plan) -> list[tuple[Contract, str]]:
    """Every row the plan breaks, with what breaks it."""
    return [(c, p) for c in CONTRACTS for p in c.check(plan)]


def markdown() -> str:
    rows = ["# Component contracts", "",
            "Generated from `infra/contracts/` (`python -m vllm_gke.infra.contracts`): what the platform relies on",
            "in each third-party workload it runs, where upstream says so at the pinned version, and what the",
            "plan does about it. `vllm-gke plan` checks every row; the tests check every stack and break each row.",
            "", "| component | version | behaviour | upstream source | honoured by |", "|---|---|---|---|---|"]
    for c in CONTRACTS:
        rows.append(f"| {c.component} | {c.version} | {c.behaviour} | {c.source} | {c.honoured_by} |")
    return "\n".join(rows) + "\n"


DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "contracts.md"


def main(argv: Optional[list[str]] = None) -> int:
    target = Path((argv or sys.argv[1:] or [str(DOC)])[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markdown())
    print(f"wrote {target}: {len(CONTRACTS)} contracts")
    return 0
