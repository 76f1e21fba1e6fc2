"""The vllm-gke policies: the table of every policy, its default level, and the evaluation.

Each policy takes every resource of a plan (type token, name, input/output properties in
Pulumi's camelCase wire form) and yields (resource, message) for each violation. The
CrossGuard pack (policies/pack.py) and the offline plan both call these, so
`pulumi preview --policy-pack policies` and `vllm-gke plan` give the same verdicts.
The checks live in modules by what they protect; this one lists them in their order and
re-exports what callers import from here. Only the standard library and the hardware catalog:
the pack must stay light.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .availability import STANDBY_LABEL, scale_to_zero_answered, vllm_autoscaled, vllm_backends_resilient
from .base import (
    LEVELS,
    NODE_POOL,
    POD_TEMPLATE_KINDS,
    VLLM_ENTRYPOINTS,
    Finding,
    Level,
    Policy,
    Resource,
    Violation,
    containers,
    env_of,
    is_vllm_server,
    kube,
    meta,
    namespace_of,
    pod_spec,
    selects,
    template_labels,
    vllm_servers,
    where,
    workloads,
)
from .cloud_run import (
    cloud_run_gpu_cpu_allocated,
    cloud_run_invoker_check_guarded,
    cloud_run_invokers_authenticated,
    cloud_run_max_tokens_cap,
    cloud_run_secrets_referenced,
    images_pinned_everywhere,
)
from .cluster import control_plane_restricted, gpu_node_pools_tainted, mig_partition_valid
from .inference_gateway import (
    GLOBAL_GATEWAY,
    OBJECTIVE_HEADER,
    PICKER_SETS,
    REFUSED_AT_THE_PICKER,
    inference_pools_served,
    tenant_priorities_bound,
)
from .kv_events import kv_events_private
from .multi_host import group_workers_closed
from .operations import load_tests_on_demand, serving_held_to_slos
from .rollouts import prod_rollouts_gated, rollout_gates_hold_slos
from .tenant_access import (
    INTERNAL_GATEWAY,
    INTERNET_PROBE_IP,
    SERVING_PROBE_PATHS,
    external_gateway_authenticated,
    external_gateway_https_only,
    public_issuers_pinned_to_subjects,
    serving_paths_authenticated,
    tenant_namespaces_authenticated,
)
from .tenant_limits import GUARD_MIDDLEWARE, limit_store_mesh_only, lora_adapters_scoped, max_tokens_cap
from .traces import traces_private
from .weights import hyperdisk_weights_populated, weights_read_only
from .workloads import SECRETISH, images_pinned, no_secret_literals, pods_hardened, resource_limits

__all__ = [
    # The policy model (policies/base.py).
    "Level", "LEVELS", "Resource", "Finding", "Policy", "Violation",
    "NODE_POOL", "POD_TEMPLATE_KINDS", "VLLM_ENTRYPOINTS",
    "kube", "meta", "namespace_of", "pod_spec", "containers", "workloads", "is_vllm_server", "vllm_servers",
    "template_labels", "selects", "env_of", "where",
    # The rules' own constants.
    "SECRETISH", "INTERNAL_GATEWAY", "SERVING_PROBE_PATHS", "INTERNET_PROBE_IP", "GUARD_MIDDLEWARE",
    "STANDBY_LABEL", "OBJECTIVE_HEADER", "PICKER_SETS", "REFUSED_AT_THE_PICKER", "GLOBAL_GATEWAY",
    # The checks, in the table's order.
    "gpu_node_pools_tainted", "mig_partition_valid", "weights_read_only", "tenant_namespaces_authenticated",
    "external_gateway_authenticated", "external_gateway_https_only", "serving_paths_authenticated",
    "public_issuers_pinned_to_subjects",
    "pods_hardened", "control_plane_restricted", "images_pinned", "resource_limits", "no_secret_literals",
    "max_tokens_cap", "vllm_autoscaled", "inference_pools_served", "tenant_priorities_bound",
    "lora_adapters_scoped", "limit_store_mesh_only", "scale_to_zero_answered", "hyperdisk_weights_populated",
    "vllm_backends_resilient", "serving_held_to_slos", "traces_private", "load_tests_on_demand",
    "group_workers_closed", "prod_rollouts_gated", "rollout_gates_hold_slos",
    # The table and its evaluation.
    "POLICIES", "POLICY_NAMES", "resolve_levels", "evaluate",
]


POLICIES: tuple[Policy, ...] = (
    Policy("gpu-node-pools-tainted", "GPU node pools carry the nvidia.com/gpu NoSchedule taint."
           " Rejects a GPU node pool without the `nvidia.com/gpu` NoSchedule taint.",
           "mandatory", gpu_node_pools_tainted),
    Policy("mig-partition-valid", "gpu_partition_size is a MIG profile of the pool's accelerator."
           " Rejects a `gpu_partition_size` that is not a MIG profile of the accelerator (A100 40GB: 1g.5gb, "
           "2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; A100 80GB: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; H100 "
           "80GB: those plus 1g.20gb).",
           "mandatory", mig_partition_valid),
    Policy("weights-read-only", "vLLM pods mount the shared weights read-only and never download weights."
           " Rejects a vLLM pod whose weights volume is writable, whose model is not a local path, without "
           "`HF_HUB_OFFLINE=1`, holding an HF token, or with `--download-dir`.",
           "mandatory", weights_read_only),
    Policy("tenant-namespaces-authenticated",
           "Every tenant namespace has a RequestAuthentication and an AuthorizationPolicy."
           " Rejects a tenant namespace without both a RequestAuthentication and an AuthorizationPolicy.",
           "mandatory", tenant_namespaces_authenticated),
    Policy("external-gateway-authenticated",
           "Routes on an external Gateway sit behind JWT auth and a default deny."
           " Rejects a route on an external Gateway whose namespace lacks JWT auth or a deny-all.",
           "mandatory", external_gateway_authenticated),
    Policy("external-gateway-https-only",
           "External Gateways serve over HTTPS only; plain HTTP carries nothing but a redirect."
           " Rejects an external Gateway without an HTTPS listener, a plain HTTP listener that admits other "
           "namespaces' routes, or a route with backends on a plain HTTP listener.",
           "mandatory", external_gateway_https_only),
    Policy("serving-paths-authenticated",
           "No request reaches a vLLM serving path without a verified JWT, from any source."
           " Rejects a vLLM workload that the emitted Istio policies would let serve `/v1/*`, unprefixed or under "
           "any prefix a route forwards (`/<model>/v1/*`: no path rewrite), without a verified JWT, from any "
           "address the policies name or the internet (evaluated by `policies/mesh_authz.py`).",
           "mandatory", serving_paths_authenticated),
    Policy("public-issuers-pinned-to-subjects",
           "An issuer anyone can get tokens from (accounts.google.com, Microsoft's common endpoints, GitHub Actions...) "
           "admits only the subjects a tenant lists."
           " Rejects an ALLOW AuthorizationPolicy whose requestPrincipals admit any subject, or a prefix or suffix of "
           "subjects, of such an issuer (`https://accounts.google.com/*`), or any issuer (`*`, `*/...`) in a namespace "
           "that trusts one.",
           "mandatory", public_issuers_pinned_to_subjects),
    Policy("pods-hardened",
           "Containers drop all capabilities, never escalate, use seccomp; vLLM runs non-root with no token."
           " Rejects a container that is privileged, may escalate privileges, keeps capabilities or has no seccomp "
           "profile; a vLLM server that may run as root (unless it holds TPU chips, as GKE's TPU examples run) or "
           "mounts a service-account token; a hostPath volume other than a TPU container's own pool's directory of "
           "the XLA compilation cache (/var/lib/vllm-gke/xla-cache/<namespace>/<model>-<pool>, in its pod's "
           "namespace).",
           "mandatory", pods_hardened),
    Policy("control-plane-restricted",
           "The cluster's control plane is private or limited to authorized networks."
           " Rejects a cluster whose public control-plane endpoint has no authorized networks.",
           "advisory", control_plane_restricted),
    Policy("images-pinned", "Every container image is pinned to a tag (not latest) or a digest."
           " Rejects an image with no tag, `:latest`, and no digest, in a Kubernetes workload or a Cloud Run service.",
           "mandatory", images_pinned_everywhere),
    Policy("resource-limits", "Every container sets CPU and memory limits; GPU limits match requests."
           " Rejects a container without CPU and memory limits, or whose GPU limit differs from its request.",
           "mandatory", resource_limits),
    Policy("no-secret-literals", "No secret value appears in the plan or in state."
           " Rejects Kubernetes Secrets with data in the plan, Secret Manager versions with data in state, "
           "secret-looking env vars with literal values, a kubeconfig with static credentials.",
           "mandatory", no_secret_literals),
    Policy("max-tokens-cap", "Every vLLM server enforces a max_tokens cap for each tenant."
           " Rejects a vLLM server without the guard middleware, or a tenant without a positive `maxTokens`.",
           "mandatory", max_tokens_cap),
    Policy("vllm-autoscaled",
           "Every vLLM Deployment is scaled by a KEDA ScaledObject (KEDA installed) and has a PodDisruptionBudget."
           " Rejects a vLLM Deployment without a KEDA ScaledObject or a PodDisruptionBudget; ScaledObjects "
           "without KEDA's chart; an HPA on a custom metric with no custom metrics API in the plan.",
           "advisory", vllm_autoscaled),
    Policy("inference-pools-served",
           "InferencePools have a running endpoint picker, fail closed, are health-checked and sit behind a regional "
           "Gateway with a proxy-only subnet."
           " Rejects an InferencePool whose endpoint picker Service or Deployment is missing, that fails open, "
           "has no HealthCheckPolicy, sits behind a global Gateway, or a plan with pools and no proxy-only "
           "subnet.",
           "mandatory", inference_pools_served),
    Policy("tenant-priorities-bound",
           "Routes to InferencePools set each tenant's objective themselves, and the mesh admits only that tenant's "
           "tokens under it."
           " Rejects a route to an InferencePool that does not require and set the tenant's objective, lets a "
           "request carrying the picker's other control headers reach the pool (the route evaluated as the "
           "Gateway API ranks matches, `policies/route_match.py`) or the replica, or names an objective that "
           "does not exist; an objective under which the mesh admits more than one issuer's tokens (evaluated by"
           " `policies/mesh_authz.py`).",
           "mandatory", tenant_priorities_bound),
    Policy("kv-events-private",
           "vLLM's KV-cache events (every tenant's prompt tokens, unauthenticated) reach the endpoint picker's pods "
           "alone."
           " Rejects a vLLM server with `--kv-events-config` whose pods no NetworkPolicy selects, whose events' "
           "ports a NetworkPolicy opens to anything but the picker's pods in one namespace (another pod, an IP "
           "block, every namespace), or that runs on a cluster without Dataplane V2.",
           "mandatory", kv_events_private),
    Policy("lora-adapters-scoped",
           "Servers with LoRA adapters load them from the read-only share and admit each tenant only to its own."
           " Rejects a vLLM server with `--lora-modules` whose adapters are not on a read-only weights mount, or"
           " whose guard lets a tenant send any `model`.",
           "mandatory", lora_adapters_scoped),
    Policy("limit-store-mesh-only",
           "The shared limit store admits only mesh identities over STRICT mTLS."
           " Rejects a shared limit store (named by a guard's `globalLimits`) whose namespace lacks STRICT mTLS "
           "or a deny-all, or admits clients by anything but their mesh identities, but for address ranges on a "
           "Redis TLS port that requires a client certificate (the Cloud Run guards'), the only port mTLS may skip.",
           "mandatory", limit_store_mesh_only),
    Policy("scale-to-zero-answered",
           "Pools that scale to zero have a standby that answers 503 with Retry-After and wakes them, or "
           "wait in an endpoint picker's queue that wakes them."
           " Rejects a ScaledObject that may take a pool to zero with no standby behind the pool's Service, or "
           "without a trigger on the standby's requests; where it wakes on a picker's queue instead "
           "(`llm_d_epp_flow_control_queue_size` for an InferencePool selecting the pool), an InferencePool "
           "that selects a standby too.",
           "mandatory", scale_to_zero_answered),
    Policy("hyperdisk-weights-populated",
           "Hyperdisk ML weight disks are read-only, filled by GKE Volume Populator with their own identity, on transfer nodes."
           " Rejects a claim of a `hyperdisk-ml` StorageClass that is not ReadOnlyMany or has no `GCPDataSource`"
           " beside it, a data source that reads the bucket as the namespace's `default` account, a "
           "`hyperdisk-ml` class that binds WaitForFirstConsumer, or claims with no `gcs-to-hdml-compute-class` "
           "node pool and ComputeClass for the transfer.",
           "mandatory", hyperdisk_weights_populated),
    Policy("vllm-backends-resilient",
           "Every vLLM Service behind the Gateway has a load balancer health check, so failing replicas leave rotation."
           " Rejects a Gateway backend of vLLM pods without a HealthCheckPolicy; a GCPBackendPolicy whose "
           "connection draining is shorter than its request timeout.",
           "advisory", vllm_backends_resilient),
    Policy("serving-held-to-slos",
           "Served models have SLOs, and each SLO fast- and slow-burn alerts that notify someone."
           " Rejects a plan with vLLM servers and no Cloud Monitoring SLO; an SLO without a burn-rate alert "
           "over an hour at most, or without one over six hours or more, sent to a notification channel.",
           "advisory", serving_held_to_slos),
    Policy("traces-private",
           "Servers that export traces sample them by ratio and send them only to the cluster's collector, "
           "which admits the servers by mesh identity."
           " Rejects a vLLM server whose `--otlp-traces-endpoint` is not a Service in the cluster, or that samples "
           "other than parent-based by ratio; a collector namespace without STRICT mTLS or a deny-all, or that "
           "admits clients by anything but their mesh identities.",
           "mandatory", traces_private),
    Policy("load-tests-on-demand",
           "Load tests run when someone asks, once at a time, never retried."
           " Rejects a load-test Job (which would run at every `pulumi up`), or a load-test CronJob that is not "
           "suspended, may run concurrently, or retries a failure.",
           "mandatory", load_tests_on_demand),
    Policy("group-workers-closed",
           "A multi-host replica serves through its leader only; its workers are open to their own group alone."
           " Rejects a LeaderWorkerSet whose worker runs an API server (not vLLM --headless or a Ray worker) or "
           "declares ports, or whose pods have no NetworkPolicy admitting only the group on their unmeshed ports.",
           "mandatory", group_workers_closed),
    Policy("prod-rollouts-gated",
           "In prod, every serving pool rolls out as a Flagger canary, which its gates roll back."
           " Rejects, in a stack whose cluster is labelled `environment: prod`, a vLLM server Deployment or "
           "LeaderWorkerSet that no Flagger Canary targets, with why it rolls in place where the plan shows it "
           "cannot be a canary (a replica across hosts, behind the endpoint picker, a floor of zero) and the fix "
           "otherwise (`rollouts.enabled`; a manual canary split replaced by a revision; with rollouts on, room "
           "on its node pool). Advisory: such pools exist by design (frontier's).",
           "advisory", prod_rollouts_gated),
    Policy("rollout-gates-hold-slos",
           "A canary's gates are no looser than the SLOs they guard, and it can fail before it is promoted."
           " Rejects a Flagger Canary that skips its analysis or has no metric with a thresholdRange; with a metric "
           "whose thresholdRange has no max; where the plan has SLOs, with no gate, read from its MetricTemplate's "
           "query (not its name), on the canary's own (`{{ target }}`) time to first token at the TTFT SLO's "
           "percentile or above (histogram_quantile's first argument) with a max at most the SLO's seconds, or none "
           "on its error share with a max at most the availability SLO's error budget (1 - goal); or whose "
           "threshold of failed checks exceeds the checks it passes before promotion (maxWeight / stepWeight), so "
           "a canary failing every other check is promoted.",
           "advisory", rollout_gates_hold_slos),
    Policy("cloud-run-invokers-authenticated", "No one may invoke a Cloud Run model unauthenticated."
           " Rejects an IAM member, binding or policy on a Cloud Run service (cloudrunv2 or cloudrun) that grants a "
           "role to `allUsers` or `allAuthenticatedUsers`, and an IAM policy whose `policyData` cannot be read.",
           "mandatory", cloud_run_invokers_authenticated),
    Policy("cloud-run-invoker-check-guarded",
           "A Cloud Run model's service is reached through the load balancer alone, and its guard knows each "
           "caller's tenant from a verified identity."
           " Rejects a Cloud Run service with a GPU or with `invokerIamDisabled` whose ingress is not "
           "`INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER`, whose run.app URL is on (`defaultUriDisabled` unset), or whose "
           "guard config (`GKE_LLM_GUARD_CONFIG`, a literal in the GPU container's env) is missing, trusts identity "
           "headers from peers, is in the `iam` identity mode with the invoker check off or no account mapped, or in "
           "the `jwt` mode lacks a tenant's issuer or JWKS; and a GPU service of the v1 API (`gcp:cloudrun`).",
           "mandatory", cloud_run_invoker_check_guarded),
    Policy("cloud-run-max-tokens-cap", "Every Cloud Run model's server loads the guard, which caps each tenant's "
           "max_tokens. Rejects a Cloud Run service whose GPU container's args do not load "
           "`vllm_gke_guard.GuardMiddleware` (`--middleware`), or whose guard config has a tenant (issuer) without a "
           "positive `maxTokens`.",
           "mandatory", cloud_run_max_tokens_cap),
    Policy("cloud-run-gpu-cpu-allocated", "A Cloud Run GPU instance keeps its CPU allocated while it is up."
           " Rejects a Cloud Run service whose GPU container (or, with an accelerator and no GPU limit named, its "
           "first container) sets `resources.cpuIdle` true, or leaves it and `resources` unset.",
           "mandatory", cloud_run_gpu_cpu_allocated),
    Policy("cloud-run-secrets-referenced", "A Cloud Run container takes its secrets from Secret Manager."
           " Rejects a Cloud Run container env var (v2 or v1 API) with a secret-looking name and a literal value.",
           "mandatory", cloud_run_secrets_referenced),
)
POLICY_NAMES = tuple(p.name for p in POLICIES)


def resolve_levels(config: Optional[Mapping[str, Any]] = None) -> dict[str, Level]:
    """Enforcement levels from a config in `pulumi --policy-pack-config` form:
    {"all": "advisory", "<policy>": "mandatory" | {"enforcementLevel": "disabled"}}."""
    config = dict(config or {})
    unknown = set(config) - {"all", *POLICY_NAMES}
    if unknown:
        raise ValueError(f"unknown policies in policy config: {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(POLICY_NAMES)}")

    def level(value: Any, key: str) -> Level:
        value = value.get("enforcementLevel") if isinstance(value, dict) else value
        if value not in LEVELS:
            raise ValueError(f"policy config '{key}': enforcement level '{value}' is not one of {', '.join(LEVELS)}")
        return value

    default = level(config["all"], "all") if "all" in config else None
    return {p.name: level(config[p.name], p.name) if p.name in config else (default or p.level)
            for p in POLICIES}


def evaluate(resources: Sequence[Resource], config: Optional[Mapping[str, Any]] = None) -> list[Violation]:
    levels = resolve_levels(config)
    out = []
    for policy in POLICIES:
        if levels[policy.name] == "disabled":
            continue
        for resource, message in policy.check(resources):
            out.append(Violation(policy.name, levels[policy.name], resource.name if resource else "<stack>",
                                 resource.urn if resource else "", message))
    return out
