"""The Kubernetes API over HTTPS with the control plane's admin kubeconfig (tests/k8s_cluster.py):
get, create, replace (PUT, with the object's resourceVersion: a stale one is a 409, as client-go's
Update gets) and merge patch, as a controller's typed client calls them. Standard library only."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

# Where each kind this suite touches lives: (group/version path prefix, plural).
RESOURCES = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "Secret": ("/api/v1", "secrets"),
    "Canary": ("/apis/flagger.app/v1beta1", "canaries"),
    "MetricTemplate": ("/apis/flagger.app/v1beta1", "metrictemplates"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    "ScaledObject": ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    "PodMonitoring": ("/apis/monitoring.googleapis.com/v1", "podmonitorings"),
}


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class KubeApi:
    def __init__(self, kubeconfig: Path):
        cfg = json.loads(kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server = cluster["server"]
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])

    @staticmethod
    def path(kind: str, namespace: str, name: str = "", sub: str = "") -> str:
        prefix, plural = RESOURCES[kind]
        return "/".join(p for p in (prefix, "namespaces", namespace, plural, name, sub) if p)

    def call(self, method: str, path: str, body: Optional[dict[str, Any]] = None,
             content_type: str = "application/json") -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"content-type": content_type, "accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None

    def get(self, kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        """The object, or None where it does not exist (IsNotFound)."""
        try:
            return self.call("GET", self.path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        return self.call("GET", self.path(kind, namespace))["items"]

    def create(self, kind: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        prefix = RESOURCES[kind][0]
        return self.call("POST", self.path(kind, namespace), {"apiVersion": prefix.removeprefix("/apis/").removeprefix("/api/"),
                                                               "kind": kind, **obj})

    def replace(self, kind: str, obj: dict[str, Any], sub: str = "") -> dict[str, Any]:
        meta = obj["metadata"]
        return self.call("PUT", self.path(kind, meta["namespace"], meta["name"], sub), obj)

    def merge_patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.call("PATCH", self.path(kind, namespace, name), patch, "application/merge-patch+json")
