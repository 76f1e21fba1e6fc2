"""What every workload must be: hardened, pinned, limited, and free of secret literals (nor may
the plan or state hold a secret anywhere else)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Iterator, Mapping, Optional, Sequence

from .base import Finding, Resource, containers, env_of, kube, vllm_servers, where, workloads

SECRETISH = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL", re.I)


def _seccomp(pod: Mapping[str, Any], c: Mapping[str, Any]) -> Optional[str]:
    profile = ((c.get("securityContext") or {}).get("seccompProfile")
               or (pod.get("securityContext") or {}).get("seccompProfile") or {})
    return profile.get("type")


# The one exception to non-root: a container that holds TPU chips runs as root, as GKE's TPU examples
# do (libtpu opens root's device nodes), never privileged, and mounts its pool's directory of the
# node's XLA compilation cache (components/model/vllm_server.py tpu_pod) - the only hostPath any workload
# may mount: <root>/<its own namespace>/<model>-<pool>, each a DNS label, so no pod reaches (or
# plants executables in) another namespace's or pool's directory, nor the root itself.
TPU_RESOURCE = "google.com/tpu"
XLA_CACHE_HOST_ROOT = "/var/lib/vllm-gke/xla-cache"
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
XLA_CACHE_SHAPE = re.compile(rf"{re.escape(XLA_CACHE_HOST_ROOT)}/(?P<namespace>{_LABEL})/{_LABEL}")


_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?")
_SUFFIXES = {None: Decimal(1), "m": Decimal("0.001"), **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
             **{s + "i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")}}


def _quantity(value: Any) -> Optional[Decimal]:
    """A Kubernetes quantity ("4", "0", "1k", "2e0"); None if it is not one."""
    if (m := _QUANTITY.fullmatch(str(value).strip())) is None:
        return None
    number, exponent, suffix = m.groups()
    return Decimal(number) * (Decimal(10) ** int(exponent) if exponent else _SUFFIXES[suffix])


def _holds_tpu(c: Mapping[str, Any]) -> bool:
    """A limit of google.com/tpu above zero: "0" (or 0) holds no chip, so earns no root or hostPath."""
    limit = ((c.get("resources") or {}).get("limits") or {}).get(TPU_RESOURCE)
    return limit is not None and (_quantity(limit) or 0) > 0


def _host_paths(pod: Mapping[str, Any], namespace: Optional[str]) -> Iterator[str]:
    """Why each hostPath volume of a pod is refused: any but its own namespace's directory of the XLA
    cache, in a pod whose mounting containers all hold TPU chips."""
    for v in pod.get("volumes") or []:
        if (host := v.get("hostPath")) is None:
            continue
        users = [c for c in containers(pod) if any(m.get("name") == v.get("name") for m in c.get("volumeMounts") or [])]
        shape = XLA_CACHE_SHAPE.fullmatch(str(host.get("path") or ""))
        if shape is None or shape["namespace"] != namespace or not users or not all(map(_holds_tpu, users)):
            yield (f"volume '{v.get('name')}' mounts the node's {host.get('path')}: only TPU containers may mount a "
                   f"node directory, their own pool's XLA compilation cache, {XLA_CACHE_HOST_ROOT}/<namespace>/"
                   f"<model>-<pool> in the pod's namespace ({namespace})")


def pods_hardened(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod in workloads(resources):
        for why in _host_paths(pod, (r.props.get("metadata") or {}).get("namespace")):
            yield r, f"{where(r)}: {why}"
        for c in containers(pod):
            sc = c.get("securityContext") or {}
            problems = []
            if sc.get("privileged"):
                problems.append("privileged (GKE needs it for TPUs only before 1.28)")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append("allowPrivilegeEscalation is not false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                problems.append("capabilities are not dropped (drop: [ALL])")
            if _seccomp(pod, c) not in ("RuntimeDefault", "Localhost"):
                problems.append("no RuntimeDefault seccomp profile")
            if problems:
                yield r, f"{where(r)}: container '{c.get('name')}': {'; '.join(problems)}"
    for r, pod, c in vllm_servers(resources):
        run_as_non_root = (c.get("securityContext") or {}).get("runAsNonRoot",
                                                               (pod.get("securityContext") or {}).get("runAsNonRoot"))
        if run_as_non_root is not True and not _holds_tpu(c):
            yield r, f"{where(r)}: the vLLM server may run as root; set runAsNonRoot (root is for TPU containers only)"
        if pod.get("automountServiceAccountToken") is not False:
            yield r, f"{where(r)}: the vLLM server mounts a service-account token it never uses"


def image_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


def images_pinned(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod in workloads(resources):
        for c in containers(pod):
            image = str(c.get("image", ""))
            if not image_pinned(image):
                yield r, f"{where(r)}: container '{c.get('name')}' image '{image}' is not pinned to a tag or digest"


def resource_limits(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod in workloads(resources):
        for c in containers(pod):
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            missing = [k for k in ("cpu", "memory") if k not in limits]
            if missing:
                yield r, f"{where(r)}: container '{c.get('name')}' has no {'/'.join(missing)} limit"
            if "nvidia.com/gpu" in requests and limits.get("nvidia.com/gpu") != requests["nvidia.com/gpu"]:
                yield r, f"{where(r)}: container '{c.get('name')}' must limit nvidia.com/gpu to what it requests"


def no_secret_literals(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in kube(resources, "Secret"):
        if r.props.get("data") or r.props.get("stringData"):
            yield r, f"{where(r)} carries secret data in the plan (and in state); sync it from Secret Manager"
    for r in resources:
        if r.type == "gcp:secretmanager/secretVersion:SecretVersion" and r.props.get("secretData"):
            yield r, f"secret version '{r.name}' puts the secret's value in Pulumi state; add versions out of band"
        if r.type == "pulumi:providers:kubernetes":
            kubeconfig = str(r.props.get("kubeconfig", ""))
            if re.search(r'"(token|client-key-data|password)"\s*:', kubeconfig):
                yield r, "the Kubernetes provider's kubeconfig embeds a static credential; use gke-gcloud-auth-plugin"
    for r, pod in workloads(resources):
        for c in containers(pod):
            for name, e in env_of(c).items():
                if SECRETISH.search(name) and "value" in e:
                    yield r, f"{where(r)}: env {name} of container '{c.get('name')}' is a literal; use a secret reference"
