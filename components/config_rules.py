"""Checks across config keys: what each key accepts alone is in components/specs.py; what the
keys must agree on - names, references, address ranges, capacity, tenants, the vLLM release -
is here. Every problem names the key to change and how."""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

from pydantic.alias_generators import to_camel

from .capacity import gpu_slots_by_pool, placements, pool_capacity
from .catalog import REGION_ZONES, attaches_hyperdisk_ml
from .hyperdisk_weights import MIN_GKE as VOLUME_POPULATOR_MIN_GKE
from .specs import (
    MANAGED_VLLM_OPTIONS,
    ClusterSpec,
    ImageRef,
    ModelSpec,
    NodePoolSpec,
    TenantSpec,
    gke_version,
    item_key,
)
from .vllm_argv import check_argv, load_snapshot, normalise
from .vllm_service import scratch_gi
from .vllm_versions import release

if TYPE_CHECKING:
    from .stack_config import ConfigIssue, StackConfig

PROJECT = "vllm-gke"
# Namespaces the platform (or Kubernetes, or the mesh) owns.
RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", "istio-system", "gke-managed-system",
                       "gmp-system", "gmp-public", "custom-metrics", "vllm-gke-system", "vllm-gke-mesh-check",
                       "vllm-gke-limits", "keda"}

Add = Callable[[str, str], None]


def cross_field_issues(cfg: "StackConfig") -> list["ConfigIssue"]:
    from .stack_config import ConfigIssue

    issues: list[ConfigIssue] = []

    def add(key: str, problem: str) -> None:
        issues.append(ConfigIssue(f"{PROJECT}:{key}" if ":" not in key else key, problem))

    for check in (_unique_names, _placements, _tenant_models, _gpu_slots, _gateway, _network, _zones,
                  _issuers, _namespaces, _vllm_release, _inference_gateway,
                  _global_limits, _adapters, _scale_to_zero, _hyperdisk_ml, _node_disks, _filestore_size):
        check(cfg, add)
    return issues


def _unique_names(cfg: "StackConfig", add: Add) -> None:
    for field, items in (("nodePools", cfg.node_pools), ("models", cfg.models), ("tenants", cfg.tenants)):
        for name, n in Counter(i.name for i in items).items():
            if n > 1:
                add(field, f"name '{name}' is used {n} times; names must be unique")
    # The serving namespace holds one AuthorizationPolicy allow-<tenant>-<model> per pair: tenant
    # 'a-b' calling 'c' and tenant 'a' calling 'b-c' would name the same object, and one tenant's
    # access would overwrite the other's.
    seen: dict[str, tuple[int, str]] = {}
    for i, tenant in enumerate(cfg.tenants):
        for model in tenant.models:
            name = f"allow-{tenant.name}-{model}"
            if name in seen and seen[name][1] != tenant.name:
                j, other = seen[name]
                add(f"{item_key('tenants', cfg.tenants, i)}.name", f"tenant '{tenant.name}' calling '{model}' and "
                    f"tenant '{other}' ({item_key('tenants', cfg.tenants, j)}) name the same policy '{name}'; rename "
                    "one of the tenants or models")
            seen.setdefault(name, (i, tenant.name))
    # What the program serves is named by a key - a model, its canary (<model>-canary), a tenant's
    # dedicated copy (<tenant>-<model>) and its canary - that names its routes, pools, Services and
    # Pulumi resources: two things under one key would be two owners of each.
    served: dict[str, str] = {}

    def serve(key: str, where: str, what: str, also: str) -> None:
        if key in served:
            add(where, f"{what} is named '{key}', which is also {served[key]}; rename one of them")
        served.setdefault(key, also)

    for m in cfg.models:
        served.setdefault(m.name, "a model's name")
    for i, m in enumerate(cfg.models):
        if m.canary is not None:
            serve(f"{m.name}-canary", f"{item_key('models', cfg.models, i)}.canary", f"model '{m.name}''s canary",
                  f"the name of model '{m.name}''s canary")
    canaries = {m.name for m in cfg.models if m.canary is not None}
    for i, tenant in enumerate(cfg.tenants):
        key = f"{item_key('tenants', cfg.tenants, i)}.dedicated.models"
        for model in tenant.dedicated.models if tenant.dedicated else []:
            copy = f"tenant '{tenant.name}''s dedicated copy of '{model}'"
            serve(f"{tenant.name}-{model}", key, copy, f"the name of {copy}")
            if model in canaries:
                serve(f"{tenant.name}-{model}-canary", key, f"the canary of {copy}", f"the name of the canary of {copy}")
    # A spot pool's on-demand twin is the node pool <pool>-ondemand.
    pools = {p.name for p in cfg.node_pools}
    for i, pool in enumerate(cfg.node_pools):
        if pool.has_fallback_pool and (twin := f"{pool.name}-ondemand") in pools:
            add(f"{item_key('nodePools', cfg.node_pools, i)}.onDemandFallback",
                f"the pool's on-demand twin is the node pool '{twin}', which is also declared; rename that pool or "
                "set onDemandFallback: false")


def _check_placement(cfg: "StackConfig", add: Add, key: str, model: ModelSpec, pool_name: str,
                     model_key: str = "") -> None:
    """`key` names where the placement is chosen (a model's, or a tenant's dedicated.nodePool);
    `model_key` the model, when that is elsewhere."""
    pools = {p.name: p for p in cfg.node_pools}
    pool = pools.get(pool_name)
    if pool is None:
        add(f"{key}.nodePool", f"node pool '{pool_name}' does not exist; use one of "
            f"{', '.join(pools)} or add it under vllm-gke:nodePools")
        return
    if model_key:
        check_fit(lambda _k, problem: add(f"{key}.nodePool", f"{model_key}: {problem}"), model_key, model, pool)
    else:
        check_fit(add, key, model, pool)


def check_fit(add: Add, key: str, model: ModelSpec, pool: NodePoolSpec) -> None:
    """The model on one GPU or slice of `pool`: tensor parallelism the pool can give, and weights
    plus KV cache that fit (components/capacity.py). Also run by the package's VllmService."""
    tp = model.tensor_parallel_size
    if pool.gpu_partition_size and tp > 1:
        add(f"{key}.tensorParallelSize", f"tensorParallelSize is {tp} but pool '{pool.name}' is MIG-partitioned "
            f"({pool.gpu_partition_size}); MIG slices cannot be joined, so set it to 1 or use a pool "
            "without gpuPartitionSize")
    elif pool.machine.gpus % tp:
        add(f"{key}.tensorParallelSize", f"tensorParallelSize is {tp} but {pool.machine_type} has "
            f"{pool.machine.gpus} GPU(s) per node; use a divisor of that, or a larger machine type")
    where = (f"one {pool.gpu_partition_size} MIG slice" if pool.gpu_partition_size
             else f"one {pool.machine_type} GPU")
    for which in model.pool_names:
        row = pool_capacity(model, which, getattr(model, which), pool)
        if row.fits:
            continue
        if row.kv_budget_gb <= 0:  # the weights alone overflow: same for both pools
            add(key, f"model '{model.name}' on {where} of pool '{pool.name}': {row.problem}; {row.fix()}")
            break
        add(f"{key}.{which}" if key.startswith("models") else key,
            f"model '{model.name}' ({which} pool) on {where} of pool '{pool.name}': {row.problem}; {row.fix()}")


def _placements(cfg: "StackConfig", add: Add) -> None:
    for i, model in enumerate(cfg.models):
        key = item_key("models", cfg.models, i)
        _check_placement(cfg, add, key, model, model.node_pool)
        check_pool_lengths(add, key, model)


def check_pool_lengths(add: Add, key: str, model: ModelSpec) -> None:
    """Each pool's context within the model's, and with chunked prefill off, a batch that holds a
    whole prompt (vLLM refuses to start otherwise). Also run by the package's VllmService."""
    for pool_name in model.pool_names:
        pool = getattr(model, pool_name)
        if pool.max_model_len and pool.max_model_len > model.max_model_len:
            add(f"{key}.{pool_name}.maxModelLen", f"{pool.max_model_len} exceeds the model's "
                f"maxModelLen {model.max_model_len}; lower it or raise {key}.maxModelLen")
        length = model.pool_max_model_len(pool)
        if not model.enable_chunked_prefill and pool.max_num_batched_tokens and pool.max_num_batched_tokens < length:
            add(f"{key}.{pool_name}.maxNumBatchedTokens",
                f"{pool.max_num_batched_tokens} is below the pool's maxModelLen {length} with chunked prefill "
                "off: vLLM refuses to start (a prompt must fit one batch); raise it to at least the context "
                "length or set enableChunkedPrefill: true")


def _tenant_models(cfg: "StackConfig", add: Add) -> None:
    models = {m.name: m for m in cfg.models}
    for i, tenant in enumerate(cfg.tenants):
        key = item_key("tenants", cfg.tenants, i)
        for model_name in tenant.models:
            model = models.get(model_name)
            if model is None:
                add(f"{key}.models", f"model '{model_name}' is not declared; use one of "
                    f"{', '.join(models)} or add it under vllm-gke:models")
            else:
                check_tenant_cap(add, key, tenant, model)
        if tenant.dedicated:
            for model_name in tenant.dedicated.models:
                if model_name not in tenant.models:
                    add(f"{key}.dedicated.models", f"'{model_name}' must also be listed in {key}.models")
                elif model_name in models:
                    _check_placement(cfg, add, f"{key}.dedicated", models[model_name], tenant.dedicated.node_pool,
                                     model_key=item_key("models", cfg.models,
                                                        next(j for j, m in enumerate(cfg.models) if m.name == model_name)))


def check_tenant_cap(add: Add, key: str, tenant: TenantSpec, model: ModelSpec) -> None:
    """A tenant's maxTokens within what the model serves. Also run by the package's VllmService."""
    if tenant.max_tokens > (served := model.served_max_model_len):
        where = (f"its one pool behind the endpoint picker (short.maxModelLen {served})"
                 if model.routing == "inference-gateway" else f"maxModelLen {served}")
        add(f"{key}.maxTokens", f"{tenant.max_tokens} exceeds what model '{model.name}' serves, "
            f"{where}: no request could use it; lower it to at most {served} or raise the pool's maxModelLen")


def _gpu_slots(cfg: "StackConfig", add: Add) -> None:
    pools = {p.name: p for p in cfg.node_pools}
    for name, needed in gpu_slots_by_pool(cfg).items():
        pool = pools.get(name)
        if pool is None:
            continue  # reported as an unknown nodePool
        offered = pool.max_nodes * pool.slices_per_node
        if needed > offered:
            idx = cfg.node_pools.index(pool)
            add(f"{item_key('nodePools', cfg.node_pools, idx)}.maxNodes", f"pool '{name}' offers at most {offered} "
                f"GPU slot(s) ({pool.max_nodes} node(s) x {pool.slices_per_node}) but its models' minReplicas need "
                f"{needed}; raise maxNodes or lower minReplicas")


def _gateway(cfg: "StackConfig", add: Add) -> None:
    if cfg.gateway.external and not cfg.tenants:
        add("tenants", "an external Gateway needs at least one tenant: with none, every request is "
            "denied; add a tenant or use gateway.className gke-l7-rilb")


def _network(cfg: "StackConfig", add: Add) -> None:
    check_network(add, cfg.cluster)


def check_network(add: Add, c: ClusterSpec, prefix: str = "cluster") -> None:
    """The cluster's ranges share no address. Also run by the package's GpuCluster."""
    ranges = {"subnetCidr": c.subnet_cidr, "podsCidr": c.pods_cidr, "servicesCidr": c.services_cidr,
              "masterCidr": c.master_cidr, "proxyOnlyCidr": c.proxy_only_cidr}
    nets = {k: ipaddress.ip_network(v) for k, v in ranges.items()}
    set_keys = {to_camel(k) for k in c.model_fields_set}
    keys = list(nets)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if nets[a].overlaps(nets[b]):
                # Named by a key the stack set: a default it never wrote is named as such.
                key, other = (b, a) if b in set_keys or a not in set_keys else (a, b)
                default = "" if other in set_keys else " (its default)"
                add(f"{prefix}.{key}", f"{ranges[key]} overlaps {prefix}.{other} {ranges[other]}{default}; the node, "
                    f"pod, service, control-plane and proxy-only ranges must not share addresses: change "
                    f"{prefix}.{key}{'' if other in set_keys else f' or set {prefix}.{other}'}")


# Of a node's boot disk, what the OS, the kubelet and the images (the multi-GB server image among
# them) keep, before pods' emptyDirs get any: a conservative share.
SYSTEM_DISK_GB = 60


def _node_disks(cfg: "StackConfig", add: Add) -> None:
    """Every replica requests the node disk its emptyDirs may fill (scratch, and on the bucket
    backend the file cache): the replicas a node can hold must fit its boot disk, or the
    scheduler leaves GPU slices idle (and without requests the kubelet would evict them)."""
    pools = {p.name: p for p in cfg.node_pools}
    bucket_cache = cfg.weights.backend == "gcs"
    worst: dict[str, tuple[int, int, str]] = {}  # node pool -> (GiB a full node asks, replicas, model)
    for model, pool_name, _tenant in placements(cfg):
        pool = pools.get(pool_name)
        if pool is None:
            continue
        per_node = pool.slices_per_node // model.tensor_parallel_size
        need = per_node * scratch_gi(model, bucket_cache)
        if per_node and need > worst.get(pool_name, (0, 0, ""))[0]:
            worst[pool_name] = (need, per_node, model.name)
    for pool_name, (need, per_node, model_name) in worst.items():
        pool = pools[pool_name]
        usable = pool.disk_size_gb - SYSTEM_DISK_GB
        if need > usable:
            add(f"{item_key('nodePools', cfg.node_pools, cfg.node_pools.index(pool))}.diskSizeGb",
                f"{pool.disk_size_gb} GB holds {usable} GB for pods, but {per_node} replicas of {model_name} on a "
                f"node ask {need} GiB (compile caches{' and the bucket file cache' if bucket_cache else ''}); raise "
                f"diskSizeGb to {need + SYSTEM_DISK_GB} or more")


def _zones(cfg: "StackConfig", add: Add) -> None:
    check_zones(add, cfg.region, cfg.cluster.zones)


def check_zones(add: Add, region: str, zones: Sequence[str], key: str = "cluster.zones",
                region_key: str = "gcp:region") -> None:
    """Zones that exist, in the region. Also run by the package's GpuCluster."""
    known = REGION_ZONES.get(region)
    for zone in zones:
        if not zone.startswith(f"{region}-"):
            add(key, f"zone '{zone}' is not in region {region} ({region_key}); use zones like "
                f"{region}-a, or change {region_key}")
        elif known is not None and zone.rsplit("-", 1)[1] not in known:
            add(key, f"zone '{zone}' does not exist; {region} has "
                f"{', '.join(f'{region}-{z}' for z in known)}")


def _issuers(cfg: "StackConfig", add: Add) -> None:
    tenants = cfg.tenants
    for i, a in enumerate(tenants):
        for j, b in enumerate(tenants):
            if i >= j:
                continue
            if a.jwt.issuer == b.jwt.issuer:
                add(f"{item_key('tenants', tenants, j)}.jwt.issuer", f"'{b.jwt.issuer}' is also "
                    f"{item_key('tenants', tenants, i)}'s ('{a.name}'): tenants are told apart by issuer, so each "
                    "needs its own")
            for (x, xi), (y, yi) in (((a, i), (b, j)), ((b, j), (a, i))):
                if y.jwt.issuer.startswith(x.jwt.issuer + "/"):
                    add(f"{item_key('tenants', tenants, yi)}.jwt.issuer", f"'{y.jwt.issuer}' lies under "
                        f"{item_key('tenants', tenants, xi)}'s issuer "
                        f"'{x.jwt.issuer}': the mesh admits '{x.jwt.issuer}/*' as '{x.name}', which would match "
                        f"'{y.name}' tokens; use issuers that are not path prefixes of each other")


def _namespaces(cfg: "StackConfig", add: Add) -> None:
    check_serving_namespace(add, "servingNamespace", cfg.serving_namespace, cfg.tenants)


def check_serving_namespace(add: Add, key: str, ns: str, tenants: Sequence[TenantSpec] = ()) -> None:
    """Not a tenant's namespace, nor one the platform or GKE owns. Also run by the package's MeshNamespace."""
    tenant_namespaces = {f"tenant-{t.name}" for t in tenants}
    if ns in tenant_namespaces or ns in RESERVED_NAMESPACES:
        owner = "a tenant's namespace" if ns in tenant_namespaces else "a namespace the platform or GKE owns"
        add(key, f"'{ns}' is {owner}; choose another name (default vllm)")


def _vllm_release(cfg: "StackConfig", add: Add) -> None:
    check_image_tag(add, "serverImage.tag", cfg.server_image, cfg.vllm_version)
    for i, model in enumerate(cfg.models):
        check_extra_args(add, f"{item_key('models', cfg.models, i)}.extraArgs", model, cfg.vllm_version)


def check_image_tag(add: Add, key: str, image: ImageRef, vllm_version: str,
                    version_key: str = "vllm-gke:vllmVersion") -> None:
    """An image tag of the chosen vLLM release. Also run by the package's VllmService."""
    rel = release(vllm_version)
    tag = image.tag
    if tag and not (tag == rel.image_tag or tag.startswith(rel.image_tag + "-")):
        add(key, f"'{tag}' is not an image of vLLM {vllm_version} ({version_key}); build "
            f"one tagged {rel.image_tag}-<suffix> or set {version_key} to the image's release")


def check_extra_args(add: Add, key: str, model: ModelSpec, vllm_version: str) -> None:
    """The model's extraArgs against the release's real parser, and none the platform sets itself.
    Also run by the package's VllmService."""
    snapshot = load_snapshot(vllm_version)
    flags = snapshot["flags"]
    for arg in model.extra_args:
        if not arg.startswith("-"):
            continue
        name = normalise(arg)[0] if arg.startswith("--") else arg.split("=", 1)[0]
        spec = flags.get(name)
        if spec is not None and spec["dest"] in MANAGED_VLLM_OPTIONS:
            add(key, f"may not set {name}: {MANAGED_VLLM_OPTIONS[spec['dest']]}")
    for problem in check_argv(model.extra_args, snapshot) if model.extra_args else []:
        add(key, f"{problem} (checked against vLLM {vllm_version}'s parser)")


def _scale_to_zero(cfg: "StackConfig", add: Add) -> None:
    """A node pool whose every serving pool may scale to zero must itself go to zero nodes, or
    the GPU node stays (and is billed) with nothing on it."""
    from .capacity import placements

    floors: dict[str, list[int]] = {}
    for model, pool_name, _tenant in placements(cfg):
        floors.setdefault(pool_name, []).extend(getattr(model, w).min_replicas for w in model.pool_names)
    for i, pool in enumerate(cfg.node_pools):
        mins = floors.get(pool.name, [])
        if mins and not any(mins) and pool.min_nodes > 0:
            add(f"{item_key('nodePools', cfg.node_pools, i)}.minNodes", f"is {pool.min_nodes}, but every serving "
                f"pool on '{pool.name}' may scale to zero (minReplicas 0): set it to 0 so the GPU node goes too")


def _adapters(cfg: "StackConfig", add: Add) -> None:
    callers: dict[str, set[str]] = {}
    for t in cfg.tenants:
        for m in t.models:
            callers.setdefault(m, set()).add(t.name)
    for i, model in enumerate(cfg.models):
        for j, adapter in enumerate(model.adapters):
            key = f"{item_key('models', cfg.models, i)}.{item_key('adapters', model.adapters, j)}"
            if len(job := f"load-{model.name}-lora-{adapter.name}") > 63:
                add(f"{key}.name", f"the loader Job '{job}' would exceed Kubernetes' 63 characters for a "
                    f"Job's pods; shorten the adapter (or model) name by {len(job) - 63}")
            declared = {t.name for t in cfg.tenants}
            for tenant in adapter.tenants:
                if tenant not in declared:
                    add(f"{key}.tenants", f"tenant '{tenant}' is not declared; use one of "
                        f"{', '.join(sorted(declared)) or '(no tenants)'}")
                elif tenant not in callers.get(model.name, set()):
                    add(f"{key}.tenants", f"tenant '{tenant}' may not call model '{model.name}': list the model "
                        f"under that tenant's models (an adapter runs on the model's replicas), or remove it here")


def _filestore_size(cfg: "StackConfig", add: Add) -> None:
    from .weights_layout import BASIC_TIERS, TIER_MIN_GB, needed_gb

    weights = cfg.weights
    if weights.backend != "filestore" or weights.tier not in BASIC_TIERS:
        return
    size = max(TIER_MIN_GB[weights.tier], weights.capacity_gb or 0)
    if (needed := needed_gb(cfg.models)) > size:
        add("weights.capacityGb", f"the models' weights need a {needed} GiB share (their files plus 30%), but the "
            f"{weights.tier} share is {size} GiB; set weights.capacityGb to {needed} or more. A Basic share only "
            "grows, so its size is this key's, never derived from the models: lowering it later is refused")


def _global_limits(cfg: "StackConfig", add: Add) -> None:
    for i, tenant in enumerate(cfg.tenants):
        check_tenant_limits(add, item_key("tenants", cfg.tenants, i), tenant, cfg.global_limits.enabled)


def check_tenant_limits(add: Add, tenant_key: str, tenant: TenantSpec, shared_store: bool,
                        store_key: str = "vllm-gke:globalLimits.enabled") -> None:
    """tokensPerMinute needs the shared store and room for one capped request. Also run by the
    package's VllmService."""
    tpm = tenant.rate_limit.tokens_per_minute
    if tpm is not None:
        key = f"{tenant_key}.rateLimit.tokensPerMinute"
        if not shared_store:
            add(key, f"counts tokens across all replicas, which needs the shared store: set {store_key}: true, "
                "or remove tokensPerMinute")
        elif tpm < tenant.max_tokens:
            add(key, f"{tpm} is below the tenant's maxTokens {tenant.max_tokens}: a request at the cap could never "
                "be admitted; raise it to at least maxTokens (a few times more lets requests overlap)")


# GKE installs the InferencePool CRD (inference.networking.k8s.io/v1) itself from this version on
# ("Deploy GKE Inference Gateway"; llm-d's GKE guide); before it the CRDs are a manual install.
INFERENCE_GATEWAY_MIN_GKE = "1.34.0-gke.1626000"
# The Inference Gateway serves through the regional Application Load Balancers only (same guide).
INFERENCE_GATEWAY_CLASSES = ("gke-l7-rilb", "gke-l7-regional-external-managed")


def _inference_gateway(cfg: "StackConfig", add: Add) -> None:
    picked = [i for i, m in enumerate(cfg.models) if m.routing == "inference-gateway"]
    if not picked:
        return
    first = f"{item_key('models', cfg.models, picked[0])}.routing is inference-gateway"
    check_inference_gateway_class(add, "gateway.className", cfg.gateway.class_name, first)
    check_inference_gateway_version(add, "cluster.minMasterVersion", cfg.cluster.min_master_version, first)


def check_inference_gateway_class(add: Add, key: str, class_name: str, why: str) -> None:
    """A Gateway class that can route to an InferencePool. Also run by the package's Gateway."""
    if class_name not in INFERENCE_GATEWAY_CLASSES:
        add(key, f"{class_name} cannot route to an InferencePool ({why}); use "
            f"{' or '.join(INFERENCE_GATEWAY_CLASSES)}, or routing: length")


def check_inference_gateway_version(add: Add, key: str, version: str | None, why: str) -> None:
    """A cluster on which GKE provides the InferencePool API. Also run by the package's InferencePool."""
    if _below(version, INFERENCE_GATEWAY_MIN_GKE):
        now = f"is {version}" if version else "is unset"
        add(key, f"{now}, but {why}: GKE provides the InferencePool API from {INFERENCE_GATEWAY_MIN_GKE}; set it to "
            f"1.34 or later (e.g. 1.34, or {INFERENCE_GATEWAY_MIN_GKE})")


def _below(version: str | None, minimum: str) -> bool:
    """Whether the cluster's version floor may resolve below `minimum` (unset or unparsable: yes)."""
    floor = gke_version(minimum)
    parsed = gke_version(version) if version else None
    return parsed is None or floor is None or parsed < floor


def _hyperdisk_ml(cfg: "StackConfig", add: Add) -> None:
    """GKE Volume Populator's requirements (its Hyperdisk ML guide) and the machine series that
    attach Hyperdisk ML: a replica on any other series would never mount its weights."""
    if cfg.weights.backend != "hyperdisk-ml":
        return
    version = cfg.cluster.min_master_version
    if _below(version, VOLUME_POPULATOR_MIN_GKE):
        now = f"is {version}" if version else "is unset"
        add("cluster.minMasterVersion", f"{now}, but weights.backend is hyperdisk-ml: GKE Volume Populator needs "
            f"{VOLUME_POPULATOR_MIN_GKE} or later; set it to 1.34 (or {VOLUME_POPULATOR_MIN_GKE}), or use backend "
            "gcs or filestore")
    for i, pool in enumerate(cfg.node_pools):
        if not attaches_hyperdisk_ml(pool.machine_type):
            add(f"{item_key('nodePools', cfg.node_pools, i)}.machineType", f"{pool.machine_type} cannot attach "
                "Hyperdisk ML (A2 Standard takes Persistent Disk only) and weights.backend is hyperdisk-ml; use "
                "a2-ultragpu, a3 or g2 machines, or backend gcs or filestore")


__all__ = ["cross_field_issues"]
