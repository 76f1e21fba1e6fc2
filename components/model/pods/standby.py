"""The standby of a serving pool scaled to zero (components/standby.py declares it): a small CPU pod
carrying the pool's Service labels but not the vLLM pods' own, ready only while the pool is not.
Where a pool has one: picker_wake.keeps_standby.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..k8s_objects import BASE_LABELS, CONTAINER_SECURITY, MODEL_LABEL, POOL_LABEL, content_digest

STANDBY_LABEL = "vllm-gke.io/standby"
UID = 65534  # nobody
RETRY_AFTER_S = 30
PROGRAM_DIR = "/opt/standby"


def standby_name(service_name: str) -> str:
    """The standby's Deployment and program ConfigMap, beside the pool's Service."""
    return f"{service_name}-standby"


def ready_service_name(service_name: str) -> str:
    """The headless Service that resolves only while a vLLM replica of the pool is ready."""
    return f"{service_name}-ready"


def standby_labels(pool_selector: Mapping[str, str], policy_labels: Mapping[str, str]) -> dict[str, str]:
    """The pool's Service selector (so the Service selects it) and its mesh policies' labels."""
    return {**pool_selector, **policy_labels, STANDBY_LABEL: "true", "app.kubernetes.io/name": "vllm-gke-standby"}


def ready_service_spec(pool_selector: Mapping[str, str], vllm_only_labels: Mapping[str, str],
                       port: int) -> dict[str, Any]:
    """Headless, ready addresses only, of the pool's vLLM pods."""
    return {"clusterIP": "None", "publishNotReadyAddresses": False,
            "selector": {**pool_selector, **vllm_only_labels},
            "ports": [{"name": "http", "port": port, "targetPort": port}]}


@dataclass(frozen=True)
class StandbyPod:
    # The Deployment's name (standby_name), which its program's ConfigMap shares.
    name: str
    model: str
    # The pool's Service selector, and more labels its mesh policies select on (a dedicated pool's tenant).
    pool_selector: Mapping[str, str]
    image_uri: str
    # The program's file name and text (components/scripts/standby.py): read once, at start.
    program_name: str
    program_source: str
    # The ready Service's fully qualified name (a Pulumi output where the namespace is one).
    ready_host: Any
    policy_labels: Mapping[str, str] = field(default_factory=dict[str, str])
    port: int = 8000
    # What it tells callers a wake takes.
    expected_seconds: int = 600
    # Its own identity; "" keeps the namespace's default.
    service_account: str = ""


def standby_deployment_spec(a: StandbyPod) -> dict[str, Any]:
    """One pod, replaced in place: ready only while the pool is not, so a rollout may not wait for
    it to be ready."""
    return {
        "replicas": 1,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "selector": {"matchLabels": {STANDBY_LABEL: "true", MODEL_LABEL: a.pool_selector[MODEL_LABEL],
                                     POOL_LABEL: a.pool_selector[POOL_LABEL]}},
        "template": standby_pod(a),
    }


def standby_pod(a: StandbyPod) -> dict[str, Any]:
    return {
        # The program's digest: a changed program rolls the pod (it is read once, at start).
        "metadata": {"labels": {**BASE_LABELS, **standby_labels(a.pool_selector, a.policy_labels)},
                     "annotations": {"proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}',
                                     "vllm-gke.io/program-sha256": content_digest(a.program_source)}},
        "spec": {
            **({"serviceAccountName": a.service_account} if a.service_account else {}),
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [_container(a)],
            "volumes": [{"name": "program", "configMap": {"name": a.name}}],
        },
    }


def _container(a: StandbyPod) -> dict[str, Any]:
    # /health answers from the program's last definite DNS answer, at once; two misses in a row
    # before it leaves rotation, and an explicit timeout (the default is 1 s).
    health = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 3, "timeoutSeconds": 2,
              "failureThreshold": 2, "successThreshold": 1}
    return {
        "name": "standby", "image": a.image_uri,
        "command": ["python3", f"{PROGRAM_DIR}/{a.program_name}", "--model", a.model,
                    "--ready-host", a.ready_host, "--port", str(a.port),
                    "--retry-after", str(RETRY_AFTER_S),
                    "--expected-seconds", str(a.expected_seconds)],
        "ports": [{"name": "http", "containerPort": a.port}],
        # Ready only while the pool is not: the load balancer follows readiness.
        "readinessProbe": health,
        # Alive whatever the pool does: /metrics answers while the server runs.
        "livenessProbe": {"httpGet": {"path": "/metrics", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 2, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "program", "mountPath": PROGRAM_DIR, "readOnly": True}],
    }
