"""LimitStore: the shared store of the tenants' rate-limit windows (an in-cluster Redis).

The guard in every vLLM replica records each admitted request (and the tokens it may generate)
here, in one atomic function call per request, so a tenant's limits hold across all replicas. Nothing
is persisted: the windows are a minute long, and a restarted store starts empty (for at most a
minute a tenant may get up to twice its limit).

Who may connect is decided by the mesh, not a password: the namespace is STRICT mTLS and one
AuthorizationPolicy admits only the service accounts the vLLM pods run as. So no credential
exists to leak, rotate or keep out of Pulumi state (a Memorystore instance would need an AUTH
string in state, which the no-secret-literals policy refuses). Redis' own ACL narrows what any
client can do to FCALL of the guards' function (and the few commands it calls), on the `rl:` keys
only: no EVAL, no FUNCTION, so no client runs code of its own. The function library
(scripts/limit_store.lua) is loaded when the container starts, by a user with a random password
made there and deleted once the library is in; only then is the pod ready.

If the store is down, each guard falls back to its own per-replica window (see the guard).

With Cloud Run models (cloud_run), their guards reach it too, on Redis' TLS port through an internal
passthrough load balancer open to the Cloud Run egress subnet alone, with a client certificate the
operator keeps in Secret Manager (components/model/cloud_run_store.py says why not a password).
Without them nothing of that exists and the store is as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .mesh_namespace import ISTIO_API, mesh_lock
from .model.cloud_run_store import PEM_FILE, STORE_MOUNT, TLS_PORT, CloudRunAccess, redis_tls_conf
from .model.config_rules.components import check_limit_store
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.mesh_identity import client_principal
from .model.specs import ImageRef
from .options import child_opts
from .project_apis import ProjectApis
from .workload_identity import workload_principal

NAMESPACE = "vllm-gke-limits"
NAME = "limits"
PORT = 6379
# The store's own Kubernetes service account (with cloud_run: it reads the TLS secret by Workload Identity).
SERVICE_ACCOUNT = "limits"
SECRET_API = "secretmanager.googleapis.com"
REDIS_UID = 999  # the redis user of the official image
# The guards' function library: registers vllm_gke_take_v1 (the guard's store.FUNCTION).
LIBRARY_PROGRAM = Path(__file__).with_name("scripts") / "limit_store.lua"
LIBRARY = LIBRARY_PROGRAM.read_text()
LIBRARY_NAME = "vllm_gke_limits_v1"
CONF_DIR, DATA_DIR = "/etc/redis", "/data"
# Written once the library is loaded: the readiness probe waits for it.
LOADED = "functions-loaded"
LABELS = {"app.kubernetes.io/name": "vllm-gke-limits"}
# What the guard's function needs and nothing else; keys under rl: only. Every window key expires
# by itself, so memory is never full for long; if it is, a write fails and the guards fall back
# (counted, alerted) rather than Redis evicting tenants' windows, which would reset their limits
# silently. Each replica holds at most 16 connections (SharedLimiter.connect): 4,096 clients is
# 256 replicas, about 115 MB of client state within maxmemory.
REDIS_CONF = f"""\
port {PORT}
bind * -::*
protected-mode no
save ""
appendonly no
maxclients 4096
maxmemory 256mb
maxmemory-policy noeviction
user default on nopass resetkeys ~rl:* resetchannels -@all +ping +hello +fcall +hmget +hset +hincrby +hdel +del +pexpire +time
"""


def startup(conf_dir: str = CONF_DIR, data_dir: str = DATA_DIR, port: int = PORT) -> str:
    """The container's command (sh -c): redis-server with the store's config, plus a user that may
    only load functions, its password random and made here (never in state), which loads the
    library, deletes itself and marks the store ready. Functions live in memory (and in RDB or
    AOF files, which the store keeps none of): every start loads them anew."""
    cli = f'redis-cli -p {port} --user loader --pass "$pw" --no-auth-warning'
    return (f"rm -f {data_dir}/{LOADED}; "
            "pw=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n'); "
            f"(until {cli} ping >/dev/null 2>&1; do sleep 0.2; done; "
            f"{cli} -x FUNCTION LOAD REPLACE < {conf_dir}/limits.lua >/dev/null && "
            f"{cli} ACL DELUSER loader >/dev/null && touch {data_dir}/{LOADED}) & "
            f"exec redis-server {conf_dir}/redis.conf --user loader on \">$pw\" +ping '+function|load' '+acl|deluser'")


def host() -> str:
    """Where the guards reach the store."""
    return f"{NAME}.{NAMESPACE}.svc.cluster.local"


def redis_conf(cloud_run: bool = False) -> str:
    """The store's config; with Cloud Run guards, the TLS port they reach it on."""
    return REDIS_CONF + (redis_tls_conf() if cloud_run else "")


@dataclass
class CloudRunStoreArgs:
    """The Cloud Run guards' way in: the model layer's plan (access) and where it is declared."""

    access: CloudRunAccess
    project: str
    region: str
    # The cluster's node subnet: the load balancer's reserved address is in it.
    subnetwork: pulumi.Input[str]
    workload_pool: pulumi.Input[str]
    apis: Optional[ProjectApis] = None


@dataclass
class LimitStoreArgs:
    provider: k8s.Provider
    # Namespaces whose vLLM servers (service account vllm-server) may use the store.
    client_namespaces: Sequence[str]
    image: ImageRef
    # The Cloud Run models' guards too (None: the store admits the mesh clients alone).
    cloud_run: Optional[CloudRunStoreArgs] = None


class LimitStore(pulumi.ComponentResource):
    namespace: k8s.core.v1.Namespace
    host: str

    def __init__(self, name: str, args: LimitStoreArgs, opts: Optional[pulumi.ResourceOptions] = None):
        check_limit_store(args.client_namespaces)
        super().__init__("vllm-gke:index:LimitStore", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.host = host()
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=meta(NAMESPACE, labels={"istio-injection": "enabled"}), opts=k8s_opts)
        ns = self.namespace.metadata.name
        in_ns = child_opts(self, opts, provider=args.provider, depends_on=[self.namespace])

        def md(obj: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(obj, labels=LABELS), "namespace": ns}

        mesh_lock(name, md, LABELS, ("allow-guards", "allow-vllm-guards"),
                  [client_principal(n) for n in args.client_namespaces], {"ports": [str(PORT)]}, in_ns)
        cloud_run = args.cloud_run is not None
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=md(NAME),
                                       data={"redis.conf": redis_conf(cloud_run), "limits.lua": LIBRARY}, opts=in_ns)
        ready: list[pulumi.Resource] = [config, self.namespace]
        if args.cloud_run is not None:
            ready += self._cloud_run(name, args.cloud_run, md, in_ns, opts)
        k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata=md(NAME), spec=api_body(deployment_spec(args.image.uri, cloud_run)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=ready))
        k8s.core.v1.Service(
            f"{name}-svc", metadata=md(NAME),
            # tcp- name: the mesh treats it as opaque TCP (Istio protocol selection by port name).
            spec=api_body({"type": "ClusterIP", "selector": LABELS,
                           "ports": [{"name": "tcp-redis", "port": PORT, "targetPort": "tcp-redis"}]}),
            opts=in_ns)
        self.register_outputs({"host": self.host, "port": PORT, "clients": sorted(args.client_namespaces),
                               **({"cloudRunAddress": args.cloud_run.access.address} if args.cloud_run else {})})

    def _cloud_run(self, name: str, cr: CloudRunStoreArgs, md: Any, in_ns: pulumi.ResourceOptions,
                   opts: Optional[pulumi.ResourceOptions]) -> list[pulumi.Resource]:
        """The TLS port for the Cloud Run guards: reachable from their egress subnet alone (load
        balancer firewall, mesh, NetworkPolicy), the secret the store reads at start. Returns what
        the pod waits for (its account, its grant on the secret, its SecretProviderClass)."""
        access = cr.access

        def gcp_opts(*apis: str) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=cr.apis.needs(*apis) if cr.apis else [])

        number = gcp.organizations.get_project_output(project_id=cr.project).number
        grant = gcp.secretmanager.SecretIamMember(
            f"{name}-cloud-run-tls-reader", project=cr.project, secret_id=access.secret_id,
            role="roles/secretmanager.secretAccessor",
            member=workload_principal(number, cr.workload_pool, NAMESPACE, SERVICE_ACCOUNT), opts=gcp_opts(SECRET_API))
        address = gcp.compute.Address(
            f"{name}-cloud-run-address", name=access.address_name, project=cr.project, region=cr.region,
            subnetwork=cr.subnetwork, address_type="INTERNAL", address=access.address,
            description="vllm-gke limit store, for the Cloud Run guards", opts=gcp_opts("compute.googleapis.com"))
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=md(SERVICE_ACCOUNT),
                                        automount_service_account_token=False, opts=in_ns)
        spc = custom_resource(
            f"{name}-cloud-run-tls", "secrets-store.csi.x-k8s.io/v1", "SecretProviderClass", md("cloud-run-tls"),
            {"provider": "gke", "parameters": {"secrets": (
                f'- resourceName: "projects/{cr.project}/secrets/{access.secret_id}/versions/latest"\n'
                f'  path: "{PEM_FILE}"\n')}}, in_ns)
        lock = cloud_run_lock(access.source_cidr)
        for kind, obj, spec in lock:
            api = "networking.k8s.io/v1" if kind == "NetworkPolicy" else ISTIO_API
            custom_resource(f"{name}-{obj}", api, kind, md(obj), spec, in_ns)
        k8s.core.v1.Service(
            f"{name}-cloud-run-svc", metadata={**meta(f"{NAME}-cloud-run", labels=LABELS, annotations=lb_annotations(access)),
                                               "namespace": self.namespace.metadata.name},
            spec=api_body(lb_service_spec(access)), opts=child_opts(self, in_ns, depends_on=[address]))
        return [grant, sa, spc]


def lb_annotations(access: CloudRunAccess) -> dict[str, str]:
    """An internal passthrough Network Load Balancer on the reserved address (GKE's Service parameters)."""
    return {"networking.gke.io/load-balancer-type": "Internal",
            "networking.gke.io/load-balancer-ip-addresses": access.address_name}


def lb_service_spec(access: CloudRunAccess) -> dict[str, Any]:
    """The TLS port alone, its firewall open to the egress subnet alone; Local keeps the client's
    address (no hop through another node's SNAT), so the mesh and NetworkPolicy see the subnet."""
    return {"type": "LoadBalancer", "selector": LABELS, "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": [access.source_cidr],
            # tcp- name: the mesh passes the client's TLS through as opaque TCP to Redis.
            "ports": [{"name": "tcp-redis-tls", "port": TLS_PORT, "targetPort": "tcp-redis-tls", "protocol": "TCP"}]}


def cloud_run_lock(source_cidr: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, name, spec) of what admits the egress subnet to the TLS port and nothing else: the
    pod's mTLS stays STRICT but on that port (the Cloud Run guards have no mesh identity; Redis
    requires their certificate there), one ALLOW for that port from that subnet, and a NetworkPolicy
    refusing that port to every other source below the mesh (other ports: left to the mesh)."""
    port = str(TLS_PORT)
    return [
        ("PeerAuthentication", "strict-but-cloud-run-tls", {
            "selector": {"matchLabels": dict(LABELS)}, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {port: {"mode": "DISABLE"}}}),
        ("AuthorizationPolicy", "allow-cloud-run-guards", {
            "action": "ALLOW", "selector": {"matchLabels": dict(LABELS)},
            "rules": [{"from": [{"source": {"ipBlocks": [source_cidr]}}], "to": [{"operation": {"ports": [port]}}]}]}),
        ("NetworkPolicy", "cloud-run-tls-from-egress-subnet", {
            "podSelector": {"matchLabels": dict(LABELS)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": source_cidr}}], "ports": [{"protocol": "TCP", "port": TLS_PORT}]},
                        {"ports": [{"protocol": "TCP", "port": 1, "endPort": TLS_PORT - 1},
                                   {"protocol": "TCP", "port": TLS_PORT + 1, "endPort": 65535}]}]}),
    ]


def cloud_run_reader(name: str, project: str, access: CloudRunAccess, member: pulumi.Input[str],
                     opts: Optional[pulumi.ResourceOptions] = None) -> gcp.secretmanager.SecretIamMember:
    """A Cloud Run service's account may read the client certificate (its secret env var)."""
    return gcp.secretmanager.SecretIamMember(
        name, project=project, secret_id=access.secret_id, role="roles/secretmanager.secretAccessor",
        member=member, opts=opts)


def deployment_spec(image: str, cloud_run: bool = False) -> dict[str, Any]:
    """The store's Deployment: one Redis, its config and the guards' library from the ConfigMap
    (with cloud_run: the TLS secret mounted from Secret Manager, the pod as its own account)."""
    ping = {"exec": {"command": ["redis-cli", "-p", str(PORT), "ping"]}}
    # Ready once the guards' function is loaded (until then an FCALL finds no function).
    loaded = {"exec": {"command": ["sh", "-c", f"test -f {DATA_DIR}/{LOADED} && redis-cli -p {PORT} ping"]}}
    return {
        "replicas": 1, "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": LABELS},
        "template": {
            # Redis reads its config once, at start: a changed config must roll the pod.
            "metadata": {"labels": LABELS, "annotations": {
                "vllm-gke.io/config-sha256": content_digest(redis_conf(cloud_run) + LIBRARY + startup())}},
            "spec": {
                **({"serviceAccountName": SERVICE_ACCOUNT} if cloud_run else {}),
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": REDIS_UID, "runAsGroup": REDIS_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "redis", "image": image,
                    "command": ["sh", "-c", startup()],
                    "ports": [{"name": "tcp-redis", "containerPort": PORT},
                              *([{"name": "tcp-redis-tls", "containerPort": TLS_PORT}] if cloud_run else [])],
                    "readinessProbe": {**loaded, "periodSeconds": 5},
                    "livenessProbe": {**ping, "periodSeconds": 10, "failureThreshold": 3},
                    "resources": {"requests": {"cpu": "250m", "memory": "320Mi"},
                                  "limits": {"cpu": "1", "memory": "384Mi"}},
                    "securityContext": CONTAINER_SECURITY,
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/redis", "readOnly": True},
                                     {"name": "data", "mountPath": "/data"},
                                     *([{"name": "cloud-run-tls", "mountPath": STORE_MOUNT, "readOnly": True}]
                                       if cloud_run else [])],
                }],
                "volumes": [{"name": "config", "configMap": {"name": NAME}},
                            {"name": "data", "emptyDir": {"sizeLimit": "64Mi"}},
                            # Secret Manager CSI add-on: the pod starts only once the secret is read.
                            *([{"name": "cloud-run-tls", "csi": {
                                "driver": "secrets-store-gke.csi.k8s.io", "readOnly": True,
                                "volumeAttributes": {"secretProviderClass": "cloud-run-tls"}}}] if cloud_run else [])],
            },
        },
    }
