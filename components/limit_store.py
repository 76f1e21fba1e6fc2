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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, meta
from .mesh_namespace import mesh_lock
from .model.config_rules.components import check_limit_store
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.mesh_identity import client_principal
from .model.specs import ImageRef
from .options import child_opts

NAMESPACE = "vllm-gke-limits"
NAME = "limits"
PORT = 6379
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


@dataclass
class LimitStoreArgs:
    provider: k8s.Provider
    # Namespaces whose vLLM servers (service account vllm-server) may use the store.
    client_namespaces: Sequence[str]
    image: ImageRef


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
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=md(NAME),
                                       data={"redis.conf": REDIS_CONF, "limits.lua": LIBRARY}, opts=in_ns)
        k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata=md(NAME), spec=api_body(deployment_spec(args.image.uri)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, self.namespace]))
        k8s.core.v1.Service(
            f"{name}-svc", metadata=md(NAME),
            # tcp- name: the mesh treats it as opaque TCP (Istio protocol selection by port name).
            spec=api_body({"type": "ClusterIP", "selector": LABELS,
                           "ports": [{"name": "tcp-redis", "port": PORT, "targetPort": "tcp-redis"}]}),
            opts=in_ns)
        self.register_outputs({"host": self.host, "port": PORT, "clients": sorted(args.client_namespaces)})


def deployment_spec(image: str) -> dict[str, Any]:
    """The store's Deployment: one Redis, its config and the guards' library from the ConfigMap."""
    ping = {"exec": {"command": ["redis-cli", "-p", str(PORT), "ping"]}}
    # Ready once the guards' function is loaded (until then an FCALL finds no function).
    loaded = {"exec": {"command": ["sh", "-c", f"test -f {DATA_DIR}/{LOADED} && redis-cli -p {PORT} ping"]}}
    return {
        "replicas": 1, "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": LABELS},
        "template": {
            # Redis reads its config once, at start: a changed config must roll the pod.
            "metadata": {"labels": LABELS, "annotations": {
                "vllm-gke.io/config-sha256": content_digest(REDIS_CONF + LIBRARY + startup())}},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": REDIS_UID, "runAsGroup": REDIS_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "redis", "image": image,
                    "command": ["sh", "-c", startup()],
                    "ports": [{"name": "tcp-redis", "containerPort": PORT}],
                    "readinessProbe": {**loaded, "periodSeconds": 5},
                    "livenessProbe": {**ping, "periodSeconds": 10, "failureThreshold": 3},
                    "resources": {"requests": {"cpu": "250m", "memory": "320Mi"},
                                  "limits": {"cpu": "1", "memory": "384Mi"}},
                    "securityContext": CONTAINER_SECURITY,
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/redis", "readOnly": True},
                                     {"name": "data", "mountPath": "/data"}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": NAME}},
                            {"name": "data", "emptyDir": {"sizeLimit": "64Mi"}}],
            },
        },
    }
