"""The Cloud Storage FUSE CSI driver: its sidecar beside the mesh's, and the init order both webhooks
make."""

from __future__ import annotations

import json
import re
from typing import Any

from ...components.model.weights_layout import MOUNT_PATH
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
        # Outside the mesh by annotation or by label (Istio reads both; the picker's is a label).
        if not fuse_volumes or "false" in ((pod["metadata"].get("annotations") or {}).get("sidecar.istio.io/inject"),
                                           (pod["metadata"].get("labels") or {}).get("sidecar.istio.io/inject")):
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


def _fuse_pods(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod spec) of every Deployment and CronJob that mounts a bucket through FUSE."""
    pods = [(d["metadata"].get("namespace", ""), d["spec"]["template"]["spec"]) for d in _docs(plan, "Deployment")]
    pods += [(c["metadata"].get("namespace", ""), c["spec"]["jobTemplate"]["spec"]["template"]["spec"])
             for c in _docs(plan, "CronJob")]
    return [(ns, pod) for ns, pod in pods if any((v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io"
                                                 for v in pod.get("volumes") or [])]


_OBJECT_PREFIX = re.compile(r'resource\.name\.startsWith\("projects/_/buckets/([^/"]+)/objects/([^"]*)"\)')
_OBJECT_NAME = re.compile(r'resource\.name == "projects/_/buckets/([^/"]+)/objects/([^"]*)"')


def bucket_readers_list_and_open_only_their_folders(plan: Plan) -> list[str]:
    """Every identity that mounts a weights bucket through FUSE (servers, load tests) lists it
    unconditionally (the mount needs storage.objects.list) and reads objects only under conditions
    on their resource names, which admit every folder a bucket-backed vLLM server opens (--model,
    --lora-modules)."""
    mounting = {f"ns/{ns}/sa/{pod.get('serviceAccountName')}" for ns, pod in _fuse_pods(plan)}
    buckets = {b.props["name"]: b.props for b in plan.of_type("gcp:storage/bucket:Bucket")}
    roles = {f"projects/{r.props['project']}/roles/{r.props['roleId']}": set(r.props.get("permissions") or [])
             for r in plan.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    grants: dict[str, list[dict[str, Any]]] = {}
    for g in plan.of_type("gcp:storage/bucketIAMMember:BucketIAMMember"):
        if g.props["bucket"] in buckets and str(g.props["member"]).rpartition("/subject/")[2] in mounting:
            grants.setdefault(g.props["member"], []).append(g.props)
    out = []
    readable: dict[str, list[tuple[str, str]]] = {}
    names: dict[str, set[str]] = {}
    for member, held in grants.items():
        who = member.rsplit("/subject/", 1)[1]
        if not any("storage.objects.list" in roles.get(g["role"], ()) and not g.get("condition") for g in held):
            out.append(f"{who}: no unconditional storage.objects.list on the bucket: Cloud Storage FUSE cannot mount it")
        for g in held:
            if g["role"] != "roles/storage.objectViewer":
                continue
            prefixes = _OBJECT_PREFIX.findall((g.get("condition") or {}).get("expression") or "")
            if not prefixes:
                out.append(f"{who}: roles/storage.objectViewer without a condition on objects: reads every model's files")
            if prefixes and not buckets[g["bucket"]].get("uniformBucketLevelAccess"):
                out.append(f"{who}: a condition on a bucket without uniform bucket-level access")
            readable.setdefault(who, []).extend(prefixes)
            names.setdefault(who, set()).update(
                n for _, n in _OBJECT_NAME.findall((g.get("condition") or {}).get("expression") or ""))
    for d in _vllm_deployments(plan):
        pod = d["spec"]["template"]["spec"]
        if not any((v.get("csi") or {}).get("driver") == "gcsfuse.csi.storage.gke.io" for v in pod["volumes"]):
            continue
        who = f"ns/{d['metadata']['namespace']}/sa/{pod.get('serviceAccountName')}"
        (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
        for arg in [*(vllm.get("command") or []), *(vllm.get("args") or [])]:
            path = str(arg).rpartition("=")[2]
            if not path.startswith(f"{MOUNT_PATH}/"):
                continue
            folder = path.removeprefix(f"{MOUNT_PATH}/") + "/"
            if not any(folder.startswith(p) for _, p in readable.get(who, [])):
                out.append(f"{d['metadata']['namespace']}/{d['metadata']['name']}: opens {path}, "
                           f"which no condition of {who}'s read grant admits")
            # FUSE looks each component up on the way (as an object and as a folder): a 403 fails it.
            parts = folder.strip("/").split("/")
            above = [f"{'/'.join(parts[:i])}{tail}" for i in range(1, len(parts)) for tail in ("", "/")]
            if missing := [n for n in above if n not in names.get(who, set())
                           and not any(n.startswith(p) for _, p in readable.get(who, []))]:
                out.append(f"{d['metadata']['namespace']}/{d['metadata']['name']}: opens {path}, but {who} may not "
                           f"look up {', '.join(missing)} on the way (Cloud Storage FUSE fails on a 403)")
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
    Contract("Cloud Storage FUSE + IAM Conditions on Cloud Storage", "Google docs (read 2026-12)",
             "mounting a bucket needs storage.objects.list on it (names, not contents); roles/storage.objectViewer "
             "holds storage.objects.get and .list, no predefined non-legacy role lists alone; a bucket binding's "
             "condition may test resource.name, projects/_/buckets/<bucket>/objects/<object> for an object, with "
             "startsWith (at most 12 logical operators a condition); conditions need uniform bucket-level access",
             "https://cloud.google.com/storage/docs/gcsfuse-mount#before-you-begin; "
             "https://cloud.google.com/storage/docs/access-control/iam-roles; "
             "https://cloud.google.com/storage/docs/samples/storage-add-bucket-conditional-iam-binding; "
             "https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name; "
             "https://cloud.google.com/iam/docs/conditions-overview#limitations; "
             "GoogleCloudPlatform/gcsfuse@v3 internal/fs/inode/dir.go (LookUpChild: a non-NotFound error "
             "fails the lookup)",
             "each bucket reader (a namespace's servers, a load test) gets a custom role that lists (objects, "
             "folders) unconditionally, and objectViewer conditioned on the folders of its models and their "
             "adapters plus the exact names above them that the mount looks up (13 terms a binding); every "
             "folder a bucket-backed server opens, and every name on its way, is admitted",
             bucket_readers_list_and_open_only_their_folders),
)
