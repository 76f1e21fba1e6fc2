"""kubectl (the mesh-readiness Job): where it caches discovery."""

from __future__ import annotations

from ..plan import Plan
from .base import Contract, _docs, _env, _writable_mounts


def kubectl_cache_is_writable(plan: Plan) -> list[str]:
    out = []
    for job in _docs(plan, "Job"):
        spec = job["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if c.get("command") != ["kubectl"]:
                continue
            env = _env(c)
            mounts = _writable_mounts(c)
            if env.get("KUBECACHEDIR") not in mounts:
                out.append(f"{job['metadata']['name']}/{c['name']}: kubectl's discovery cache is not on a writable volume")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("kubectl", "v1.33.5",
             "caches discovery in $KUBECACHEDIR, else $HOME/.kube/cache (HOME unset: a relative path); an "
             "unwritable cache is only logged at -v1 and nothing is cached for the Job's retries",
             "kubernetes/cli-runtime@v0.33.5:pkg/genericclioptions/config_flags.go:303-309; "
             "kubernetes/client-go@v0.33.5:util/homedir/homedir.go:91",
             "KUBECACHEDIR on an emptyDir shared by the mesh-readiness Job's containers", kubectl_cache_is_writable),
)
