"""LimitStore: the shared store of the tenants' rate-limit windows (an in-cluster Redis).

The guard in every vLLM replica records each admitted request (and the tokens it may generate)
here, in one atomic script per request, so a tenant's limits hold across all replicas. Nothing
is persisted: the windows are a minute long, and a restarted store starts empty (for at most a
minute a tenant may get up to twice its limit).

Who may connect is decided by the mesh, not a password: the namespace is STRICT mTLS and one
AuthorizationPolicy admits only the service accounts the vLLM pods run as. So no credential
exists to leak, rotate or keep out of Pulumi state (a Memorystore instance would need an AUTH
string in state, which the no-secret-literals policy refuses). Redis' own ACL narrows what any
client can do to the few commands of the script, on the `rl:` keys only.

If the store is down, each guard falls back to its own per-replica window (see the guard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import CONTAINER_SECURITY, api_body, content_digest, meta
from .mesh_namespace import mesh_lock
from .options import child_opts
from .specs import ImageRef
from .weights_layout import SERVER_SA

NAMESPACE = "vllm-gke-limits"
NAME = "limits"
PORT = 6379
REDIS_UID = 999  # the redis user of the official image
# What the guard's script needs and nothing else; keys under rl: only. Every window key expires
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
user default on nopass resetkeys ~rl:* resetchannels -@all +ping +hello +evalsha +eval +script|load +script|exists +hmget +hset +hincrby +hdel +del +pexpire +time
"""


def host() -> str:
    """Where the guards reach the store."""
    return f"{NAME}.{NAMESPACE}.svc.cluster.local"


def client_principal(namespace: str, service_account: str = SERVER_SA) -> str:
    """The mesh identity of pods in `namespace` running as `service_account`, in any trust domain
    (Cloud Service Mesh's is <project>.svc.id.goog)."""
    return f"*/ns/{namespace}/sa/{service_account}"


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
        super().__init__("vllm-gke:index:LimitStore", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.host = host()
        labels = {"app.kubernetes.io/name": "vllm-gke-limits"}
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=meta(NAMESPACE, labels={"istio-injection": "enabled"}), opts=k8s_opts)
        ns = self.namespace.metadata.name
        in_ns = child_opts(self, opts, provider=args.provider, depends_on=[self.namespace])

        def md(obj: str) -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(obj, labels=labels), "namespace": ns}

        mesh_lock(name, md, labels, ("allow-guards", "allow-vllm-guards"),
                  [client_principal(n) for n in args.client_namespaces], {"ports": [str(PORT)]}, in_ns)
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=md(NAME), data={"redis.conf": REDIS_CONF},
                                       opts=in_ns)
        ping = {"exec": {"command": ["redis-cli", "-p", str(PORT), "ping"]}}
        k8s.apps.v1.Deployment(
            f"{name}-deploy", metadata=md(NAME),
            spec=api_body({
                "replicas": 1, "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    # Redis reads its config once, at start: a changed config must roll the pod.
                    "metadata": {"labels": labels, "annotations": {
                        "vllm-gke.io/config-sha256": content_digest(REDIS_CONF)}},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": REDIS_UID, "runAsGroup": REDIS_UID,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "redis", "image": args.image.uri,
                            "command": ["redis-server", "/etc/redis/redis.conf"],
                            "ports": [{"name": "tcp-redis", "containerPort": PORT}],
                            "readinessProbe": {**ping, "periodSeconds": 5},
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
            }),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, self.namespace]))
        k8s.core.v1.Service(
            f"{name}-svc", metadata=md(NAME),
            # tcp- name: the mesh treats it as opaque TCP (Istio protocol selection by port name).
            spec=api_body({"type": "ClusterIP", "selector": labels,
                           "ports": [{"name": "tcp-redis", "port": PORT, "targetPort": "tcp-redis"}]}),
            opts=in_ns)
        self.register_outputs({"host": self.host, "port": PORT, "clients": sorted(args.client_namespaces)})
