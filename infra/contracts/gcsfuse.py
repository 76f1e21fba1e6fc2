"""The Cloud Storage FUSE CSI driver: its sidecar beside the mesh's, and the init order both webhooks
make."""

from __future__ import annotations

import json

from ..plan import Plan
from .base import Contract, _docs, _vllm_deployments


def gcsfuse_sidecar_with_the_mesh(plan: Plan) -> list[str]:
    out = []
    for d in _vllm_deployments(plan):
        pod = d["spec"]["template"]
        if not any((v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io" for v in pod["spec"]["volumes"]):
            continue
        ann = pod["metadata"].get("annotations") or {}
        proxy = json.loads(ann.get("proxy.istio.io/config") or "{}")
        if ann.get("gke-gcsfuse/volumes") != "true":
            out.append(f"{d['metadata']['name']}: no gke-gcsfuse/volumes annotation: no sidecar mounts the bucket")
        if "169.254.169.254/32" not in ann.get("traffic.sidecar.istio.io/excludeOutboundIPRanges", ""):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar's metadata-server calls go through Envoy")
        if not proxy.get("holdApplicationUntilProxyStarts"):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar may start before the proxy")
        if not any(v["name"] == "gke-gcsfuse-cache" and "emptyDir" in v for v in pod["spec"]["volumes"]):
            out.append(f"{d['metadata']['name']}: no gke-gcsfuse-cache volume: the file cache lands in the driver's default")
    return out


FUSE_SIDECAR, PROXY, ISTIO_INIT = "gke-gcsfuse-sidecar", "istio-proxy", "istio-init"


def injected_init_order(init: list[str], native_proxy: bool, fuse_first: bool) -> list[str]:
    """The init containers after both webhooks, in either order: the FUSE driver puts its (native)
    sidecar right after an istio-proxy init container, else first; Istio's reorderPod puts
    istio-init and a native istio-proxy first, or, with a classic proxy, istio-init last."""
    def fuse(names: list[str]) -> list[str]:
        at = names.index(PROXY) + 1 if PROXY in names else 0
        return [*names[:at], FUSE_SIDECAR, *names[at:]]

    def istio(names: list[str]) -> list[str]:
        rest = [n for n in names if n not in (ISTIO_INIT, PROXY)]
        return [ISTIO_INIT, PROXY, *rest] if native_proxy else [*rest, ISTIO_INIT]
    return istio(fuse(init)) if fuse_first else fuse(istio(init))


def fuse_pods_start_under_any_sidecar_mode(plan: Plan) -> list[str]:
    """An init container reading a bucket mount needs the FUSE sidecar's network before the pod's
    Envoy runs whenever the proxy is classic (Istio CNI captures traffic from the sandbox's start;
    managed Cloud Service Mesh lists no nativeSidecar annotation): the pod would never start."""
    out = []
    for d in _docs(plan, "Deployment"):
        pod = d["spec"]["template"]
        fuse_volumes = {v["name"] for v in pod["spec"].get("volumes") or []
                        if (v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io"}
        if not fuse_volumes or (pod["metadata"].get("annotations") or {}).get("sidecar.istio.io/inject") == "false":
            continue
        if "443" not in (pod["metadata"].get("annotations") or {}).get(
                "traffic.sidecar.istio.io/excludeOutboundPorts", "").split(","):
            out.append(f"{d['metadata']['name']}: the FUSE sidecar's HTTPS to Cloud Storage goes through a proxy "
                       "that a classic sidecar starts only after it (gcsfuse gives up retrying in minutes)")
        init = [c["name"] for c in pod["spec"].get("initContainers") or []]
        readers = {c["name"] for c in pod["spec"].get("initContainers") or []
                   if fuse_volumes & {m["name"] for m in c.get("volumeMounts") or []}}
        for native in (True, False):
            for fuse_first in (True, False):
                order = injected_init_order(init, native, fuse_first)
                proxy_up = order.index(PROXY) if native else len(order)  # a classic proxy: after every init
                if native and order.index(FUSE_SIDECAR) < proxy_up:
                    out.append(f"{d['metadata']['name']}: the FUSE sidecar would start before the proxy")
                for r in readers:
                    if order.index(r) < proxy_up:
                        out.append(f"{d['metadata']['name']}: init container {r} reads the bucket before the "
                                   f"mesh proxy serves ({'native' if native else 'classic'} sidecar)")
    return sorted(set(out))


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Storage FUSE CSI driver", "GKE-managed (v1.24.4 read)",
             "gke-gcsfuse/volumes injects gke-gcsfuse-sidecar after istio-proxy; with Istio the app must wait for "
             "the proxy and the metadata server be excluded from capture; a pod volume named gke-gcsfuse-cache "
             "holds the file cache",
             "GoogleCloudPlatform/gcs-fuse-csi-driver@v1.24.4:pkg/webhook/mutatingwebhook.go:245-259; "
             "pkg/webhook/injection.go:35-41; docs/istio.md:24-61",
             "bucket-backed pods carry the annotations and their own sized cache volume", gcsfuse_sidecar_with_the_mesh),
    Contract("Cloud Storage FUSE CSI driver + Istio injector", "v1.24.4 / 1.24.6, 1.30.3",
             "the FUSE webhook inserts its native sidecar right after an istio-proxy init container, else first; "
             "Istio orders istio-init and a native proxy first, a classic proxy's istio-init last; with Istio CNI "
             "an init container's traffic is captured before any proxy runs",
             "GoogleCloudPlatform/gcs-fuse-csi-driver@v1.24.4:pkg/webhook/injection.go:123,187-193; "
             "istio/istio@1.24.6:pkg/kube/inject/webhook.go:772-815 (1.30.3: 781-824); "
             "https://istio.io/latest/docs/setup/additional-setup/cni/#compatibility-with-application-init-containers",
             "no init container of a meshed pod reads a bucket mount (the entrypoint waits for bucket-backed "
             "weights after the proxy) and the FUSE sidecar's HTTPS bypasses Envoy (excludeOutboundPorts 443), so "
             "pods start with a native or a classic sidecar",
             fuse_pods_start_under_any_sidecar_mode),
)
