"""The limit store as the Cloud Run guards reach it: GKE's internal passthrough load balancer on a
reserved address, open to the egress subnet alone, and Redis' TLS port requiring their certificate."""

from __future__ import annotations

from ..plan import Plan
from .base import Contract, _docs

LB_PAGE = "https://cloud.google.com/kubernetes-engine/docs/concepts/service-load-balancer-parameters"
REDIS_TLS_PAGE = "https://redis.io/docs/latest/operate/oss_and_stack/management/security/encryption/"


def store_lb_internal_on_its_address_from_the_subnet(plan: Plan) -> list[str]:
    from ...components.limit_store import NAMESPACE
    from ...components.model.cloud_run_store import TLS_PORT, cloud_run_access

    access = cloud_run_access(plan.config)
    lbs = [s for s in _docs(plan, "Service") if (s.get("spec") or {}).get("type") == "LoadBalancer"
           and s["metadata"].get("namespace") == NAMESPACE]
    if access is None:
        return [f"the limit store has a LoadBalancer Service with no Cloud Run model: {s['metadata']['name']}" for s in lbs]
    if len(lbs) != 1:
        return [f"the limit store has {len(lbs)} LoadBalancer Services, not the Cloud Run guards' one"]
    (lb,) = lbs
    spec, notes = lb["spec"], lb["metadata"].get("annotations") or {}
    out = []
    if notes.get("networking.gke.io/load-balancer-type") != "Internal":
        out.append("the limit store's LoadBalancer Service is not internal: GKE would make an external load balancer")
    addresses = {r.props.get("name"): r.props.get("address") for r in plan.of_type("gcp:compute/address:Address")}
    name = notes.get("networking.gke.io/load-balancer-ip-addresses")
    if addresses.get(name) != access.address:
        out.append(f"the limit store's load balancer names address {name!r}, not the reserved {access.address} "
                   "the Cloud Run guards' config names")
    if spec.get("loadBalancerSourceRanges") != [access.source_cidr]:
        out.append(f"the limit store's load balancer is open to {spec.get('loadBalancerSourceRanges')}, not the Cloud "
                   f"Run egress subnet {access.source_cidr} alone")
    if spec.get("externalTrafficPolicy") != "Local":
        out.append("the limit store's load balancer SNATs through other nodes (externalTrafficPolicy Cluster): the mesh "
                   "and NetworkPolicy would see a node, not the egress subnet")
    if [p.get("port") for p in spec.get("ports") or []] != [TLS_PORT]:
        out.append(f"the limit store's load balancer exposes {[p.get('port') for p in spec.get('ports') or []]}, "
                   f"not the TLS port {TLS_PORT} alone")
    return out


def redis_tls_port_requires_the_certificate(plan: Plan) -> list[str]:
    from ...components.model.cloud_run_store import STORE_MOUNT, TLS_PORT, cloud_run_access

    out = []
    for cm in _docs(plan, "ConfigMap"):
        conf = (cm.get("data") or {}).get("redis.conf")
        if conf is None:
            continue
        words = {tuple(line.split()) for line in conf.splitlines() if line.strip()}
        tls = any(w[0].startswith("tls-") for w in words)
        if cloud_run_access(plan.config) is None:
            out += ["redis.conf opens a TLS port with no Cloud Run model"] if tls else []
            continue
        if ("tls-port", str(TLS_PORT)) not in words:
            out.append(f"redis.conf has no tls-port {TLS_PORT}: the Cloud Run guards cannot connect")
        if ("tls-auth-clients", "yes") not in words:
            out.append("redis.conf lets TLS clients in without a client certificate: anyone in the egress subnet "
                       "would be Redis' default user")
        files = {w[0]: w[1] for w in words if w[0] in ("tls-cert-file", "tls-key-file", "tls-ca-cert-file") and len(w) == 2}
        if len(files) != 3 or any(not f.startswith(STORE_MOUNT + "/") for f in files.values()):
            out.append(f"redis.conf's certificate, key and CA are not all the secret mounted at {STORE_MOUNT}")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("GKE LoadBalancer Service", "GKE 1.34",
             "networking.gke.io/load-balancer-type: \"Internal\" makes an internal passthrough Network Load Balancer; "
             "networking.gke.io/load-balancer-ip-addresses gives its forwarding rule a reserved static address by name; "
             "spec.loadBalancerSourceRanges become the VPC firewall rule's only sources; externalTrafficPolicy Local "
             "sends packets only to nodes with a serving pod, keeping the client's source address",
             f"{LB_PAGE} (Internal passthrough Network Load Balancer, Static IP addresses, Firewall rules and source IP "
             "address allowlist, External Traffic Policy)",
             "the limit store's TLS port on the address the Cloud Run guards' config names "
             "(components/model/cloud_run_store.py), open to cloudRun.egressSubnetCidr alone; the mesh's ipBlocks and "
             "the NetworkPolicy see that subnet",
             store_lb_internal_on_its_address_from_the_subnet),
    Contract("Redis", "7.4.2",
             "tls-port listens for TLS beside the plain port; with tls-auth-clients yes a client must present a "
             "certificate the tls-ca-cert-file verifies, refused at the handshake before any command; a connection "
             "that sends no AUTH is the default user (so on the plain port, reached through the mesh alone, the "
             "mesh is the lock); the official images are built with TLS (BUILD_TLS=yes)",
             f"{REDIS_TLS_PAGE}; redis/redis@7.4.1:redis.conf (TLS/SSL section: tls-port, tls-auth-clients); "
             "docker-library/redis 7.4 alpine Dockerfile (BUILD_TLS=yes)",
             "the Cloud Run guards reach the TLS port with the stack's client certificate (its own CA), kept in "
             "Secret Manager and mounted by the CSI add-on; tested on a real redis-server (tests/test_cloud_run_store.py)",
             redis_tls_port_requires_the_certificate),
)
