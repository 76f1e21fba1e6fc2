"""The cluster under the models: address ranges, zones, and the GKE versions and classes the
Inference Gateway and Hyperdisk ML need."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Sequence

from pydantic.alias_generators import to_camel

from ..catalog import REGION_ZONES, attaches_hyperdisk_ml, region_problem
from ..hyperdisk_ml import MIN_GKE as VOLUME_POPULATOR_MIN_GKE
from ..identity_extension import conditions_problem, identity_config
from ..serving_api import PICKER_PATHS
from ..specs import ClusterSpec, gke_version, item_key
from ..vllm_argv import load_snapshot
from ..weights_backends import backend_of
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def network(cfg: "StackConfig", add: Add) -> None:
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


def zones(cfg: "StackConfig", add: Add) -> None:
    check_zones(add, cfg.region, cfg.cluster.zones)
    for i, pool in enumerate(cfg.node_pools):
        if pool.tpu_zone is not None and pool.tpu_zone not in cfg.cluster.zones:
            add(f"{item_key('nodePools', cfg.node_pools, i)}.tpuZone", f"'{pool.tpu_zone}' is not one of the cluster's "
                f"zones ({', '.join(cfg.cluster.zones)}); use one of them (where {pool.machine_type} is offered) or add "
                "it to cluster.zones")


def check_zones(add: Add, region: str, zones: Sequence[str], key: str = "cluster.zones",
                region_key: str = "gcp:region") -> None:
    """A region that exists (components/model/catalog.py's REGION_ZONES), and zones of it that exist.
    Also run by the package's GpuCluster."""
    known = REGION_ZONES.get(region)
    if known is None:
        add(region_key, region_problem(region, key) or "")
        return
    for zone in zones:
        if not zone.startswith(f"{region}-"):
            add(key, f"zone '{zone}' is not in region {region} ({region_key}); use zones like "
                f"{region}-{known[0]}, or change {region_key}")
        elif zone.rsplit("-", 1)[1] not in known:
            add(key, f"zone '{zone}' does not exist; {region} has "
                f"{', '.join(f'{region}-{z}' for z in known)}")


# GKE installs the InferencePool CRD (inference.networking.k8s.io/v1) itself from this version on
# ("Deploy GKE Inference Gateway"; llm-d's GKE guide); before it the CRDs are a manual install.
INFERENCE_GATEWAY_MIN_GKE = "1.34.0-gke.1626000"


# The Inference Gateway serves through the regional Application Load Balancers only (same guide).
INFERENCE_GATEWAY_CLASSES = ("gke-l7-rilb", "gke-l7-regional-external-managed")


# Length routes split on a RegularExpression match of Content-Length. The URL map's
# HttpHeaderMatch.regexMatch "can only be used when the loadBalancingScheme is set to
# INTERNAL_SELF_MANAGED, EXTERNAL_MANAGED (regional scope) or INTERNAL_MANAGED" (Compute API
# reference, urlMaps): not on the global external load balancer of gke-l7-global-external-managed.
LENGTH_ROUTING_CLASSES = ("gke-l7-rilb", "gke-l7-regional-external-managed")


def inference_gateway(cfg: "StackConfig", add: Add) -> None:
    picked = [i for i, m in enumerate(cfg.models) if m.routing == "inference-gateway"]
    if not picked:
        return
    first = f"{item_key('models', cfg.models, picked[0])}.routing is inference-gateway"
    check_inference_gateway_class(add, "gateway.className", cfg.gateway.class_name, first)
    check_inference_gateway_version(add, "cluster.minMasterVersion", cfg.cluster.min_master_version, first)
    for i in picked:
        # The picker's routes (serving_api.PICKER_PATHS) are the model's: a release that serves
        # fewer would answer some with FastAPI's 404, not OpenAI's error.
        model = cfg.models[i]
        release = cfg.release_for(model.node_pool)
        served = {r["path"] for r in load_snapshot(release.snapshot)["routes"]}
        if missing := [p for p in PICKER_PATHS if p not in served]:
            add(f"{item_key('models', cfg.models, i)}.routing",
                f"is inference-gateway, whose routes include {', '.join(missing)}, which {release.label} does not "
                "serve; use routing: length or a newer vllmVersion")
    identity_fits_gke(cfg, add)
    if cfg.cluster.system_pool_max < 2:
        # The picker's two replicas never share a node (topology spread, minDomains 2): with one
        # node at most the second would wait forever and a drain would take the only one.
        add("cluster.systemMaxNodes", f"is {cfg.cluster.system_pool_max}, but {first}: the endpoint picker's two "
            "replicas run on two system nodes (so one drain never takes both); set it to 2 or more")


def identity_fits_gke(cfg: "StackConfig", add: Add) -> None:
    """The identity extension's body chain names every salted tenant URL in CEL conditions GKE bounds
    (components/model/identity_extension.py body_conditions)."""
    if problem := conditions_problem(identity_config(cfg)):
        add("tenants", problem)


def length_routing(cfg: "StackConfig", add: Add) -> None:
    by_length = [i for i, m in enumerate(cfg.models) if m.routing == "length"]
    if by_length:
        check_length_routing_class(add, "gateway.className", cfg.gateway.class_name,
                                   f"{item_key('models', cfg.models, by_length[0])}.routing is length")


def check_length_routing_class(add: Add, key: str, class_name: str, why: str) -> None:
    """A Gateway class whose load balancer can program the Content-Length routes. Also run by the
    package's Gateway."""
    if class_name not in LENGTH_ROUTING_CLASSES:
        add(key, f"{class_name} cannot program length routes ({why}): its global external load balancer "
            "has no regular-expression header match, which the Content-Length split needs; use "
            f"{' or '.join(LENGTH_ROUTING_CLASSES)} (regional; the picker's routes need one too)")


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


def hyperdisk_ml(cfg: "StackConfig", add: Add) -> None:
    """GKE Volume Populator's requirements (its Hyperdisk ML guide) and the machine series that
    attach Hyperdisk ML: a replica on any other series would never mount its weights."""
    if not backend_of(cfg.weights).needs_volume_populator:
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
