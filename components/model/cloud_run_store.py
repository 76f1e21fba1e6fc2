"""The limit store as the Cloud Run models reach it: over the VPC, from the egress subnet alone.

The store (components/limit_store.py) admits the GKE servers by their mesh identity and has no
password: its clients log in as Redis' `default` user. A Cloud Run instance has no mesh identity,
and a Redis password could not tell it apart: Redis has no per-port or per-source users, every
connection reaches Redis from the store's sidecar, and whoever reaches it may skip AUTH and be
`default`. So the Cloud Run instances reach a port of their own, Redis' TLS port, where Redis
refuses any client without the stack's client certificate before reading a command (tls-auth-clients
yes): that certificate is the credential. Behind it they are `default`, allowed exactly what the
mesh clients are (FCALL of the guards' function, on rl: keys).

The certificate and its key are one PEM in a Secret Manager secret the operator fills (as the HF
token's): never in Pulumi state. The store pod mounts it (Secret Manager CSI add-on) and Redis reads
it at start; each Cloud Run service takes it as a secret env var its guard writes to a private file
for the TLS handshake. The port is exposed by an internal passthrough load balancer on a reserved
address of the node subnet (plain data the guard's config names), its firewall open to the egress
subnet only (loadBalancerSourceRanges); the mesh lets that port in without mTLS, from that subnet
only, and a NetworkPolicy does the same below the mesh. No Cloud Run model: none of it exists.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .stack_config import StackConfig

# Redis' TLS port: the Cloud Run guards' way in (the mesh clients keep the plain port, 6379).
TLS_PORT = 6380
# Where the store pod mounts the secret (one file, the PEM: key and certificate).
STORE_MOUNT = "/var/run/secrets/vllm-gke-limits"
PEM_FILE = "tls.pem"
# The env var the Cloud Run service sets from the secret (the guard reads it, then drops it).
# Not VLLM_*: vLLM warns about every unknown VLLM_ variable, naming it.
GUARD_ENV = "GKE_LLM_LIMITS_TLS_PEM"


def secret_id(cfg: StackConfig) -> str:
    """The Secret Manager secret the operator fills with the PEM (docs/guides/limits-across-replicas.md)."""
    return f"{cfg.cluster.name}-limits-cloud-run-tls"


def address_name(cfg: StackConfig) -> str:
    """The reserved internal address's resource name (the Service's annotation names it)."""
    return f"{cfg.cluster.name}-limits-cloud-run"


def store_address(cfg: StackConfig) -> str:
    """The load balancer's address: the node subnet's last address Google does not reserve (it
    keeps the first two and the last two), far from where node addresses are handed out first."""
    net = ipaddress.ip_network(cfg.cluster.subnet_cidr)
    return str(net.broadcast_address - 2)


def reaches_store(cfg: StackConfig) -> bool:
    """The Cloud Run models count their tenants' limits in the shared store."""
    return cfg.cloud_run is not None and cfg.global_limits.enabled


@dataclass(frozen=True)
class CloudRunAccess:
    """What the store declares for the Cloud Run guards (LimitStoreArgs.cloud_run)."""

    source_cidr: str
    address: str
    address_name: str
    secret_id: str


def cloud_run_access(cfg: StackConfig) -> Optional[CloudRunAccess]:
    if not reaches_store(cfg):
        return None
    assert cfg.cloud_run is not None
    return CloudRunAccess(cfg.cloud_run.egress_subnet_cidr, store_address(cfg), address_name(cfg), secret_id(cfg))


def guard_store_config(cfg: StackConfig) -> Optional[dict[str, Any]]:
    """The guard config's globalLimits for a Cloud Run model (components/model/cloud_run_tenancy.py):
    the store's address and TLS port, and the env var holding the client certificate. None: no
    shared store, each instance counts its own windows."""
    if not reaches_store(cfg):
        return None
    return {"host": store_address(cfg), "port": TLS_PORT, "tlsEnv": GUARD_ENV}


def secret_env(cfg: StackConfig) -> list[dict[str, Any]]:
    """The Cloud Run container's env entry (cloudrunv2 ServiceTemplateContainerEnv) that takes
    the certificate from Secret Manager at instance start; the service's account needs
    roles/secretmanager.secretAccessor on secret_id(cfg) (LimitStore grants it: cloud_run_reader)."""
    if not reaches_store(cfg):
        return []
    return [{"name": GUARD_ENV, "value_source": {"secret_key_ref": {"secret": secret_id(cfg), "version": "latest"}}}]


def redis_tls_conf() -> str:
    """The store's TLS listener: the Cloud Run guards' certificate required before any command."""
    pem = f"{STORE_MOUNT}/{PEM_FILE}"
    return (f"tls-port {TLS_PORT}\n"
            f"tls-cert-file {pem}\n"
            f"tls-key-file {pem}\n"
            # The certificate is its own CA: only a client holding it (and its key) gets in.
            f"tls-ca-cert-file {pem}\n"
            "tls-auth-clients yes\n"
            "tls-protocols \"TLSv1.2 TLSv1.3\"\n")
