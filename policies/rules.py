"""The vllm-gke policies as plain functions over planned resources.

Each policy takes every resource of a plan (type token, name, input/output properties in
Pulumi's camelCase wire form) and yields (resource, message) for each violation. The
CrossGuard pack (policies/pack.py) and the offline plan both call these, so
`pulumi preview --policy-pack policies` and `vllm-gke plan` give the same verdicts.
Only the standard library and the hardware catalog: the pack must stay light.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Sequence

from ..components.catalog import ACCELERATORS
from ..components.hyperdisk_weights import TRANSFER_COMPUTE_CLASS
from ..components.k8s_meta import COMPUTE_CLASS_LABEL
from .mesh_authz import Request, applicable, decide, for_token
from .route_match import reach, sample_request

Level = Literal["advisory", "mandatory", "disabled"]
LEVELS: tuple[Level, ...] = ("advisory", "mandatory", "disabled")


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""


Finding = tuple[Optional[Resource], str]


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    level: Level
    check: Callable[[Sequence[Resource]], Iterable[Finding]]


@dataclass(frozen=True)
class Violation:
    policy: str
    level: Level
    resource: str
    urn: str
    message: str


# --- helpers over the plan ---------------------------------------------------------------

NODE_POOL = "gcp:container/nodePool:NodePool"
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
SECRETISH = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL", re.I)
INTERNAL_GATEWAY = re.compile(r"rilb|internal")
# What an unauthenticated caller is tried on: the OpenAI paths that make the GPU work.
SERVING_PROBE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/responses")
INTERNET_PROBE_IP = "203.0.113.1"
GUARD_MIDDLEWARE = "vllm_gke_guard.GuardMiddleware"
VLLM_ENTRYPOINTS = ("vllm serve", "vllm.entrypoints.openai.api_server", "/opt/vllm-gke/serve.py")


def kube(resources: Sequence[Resource], kind: str) -> list[Resource]:
    return [r for r in resources if r.type.startswith("kubernetes:") and r.props.get("kind") == kind]


def meta(r: Resource) -> Mapping[str, Any]:
    return r.props.get("metadata") or {}


def namespace_of(r: Resource) -> str:
    return meta(r).get("namespace") or "default"


def pod_spec(r: Resource) -> Optional[Mapping[str, Any]]:
    kind = r.props.get("kind")
    spec = r.props.get("spec") or {}
    if kind in POD_TEMPLATE_KINDS:
        return (spec.get("template") or {}).get("spec")
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec")
    if kind == "Pod":
        return spec
    return None


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(pod.get("initContainers") or []) + list(pod.get("containers") or [])


def workloads(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    for r in resources:
        if r.type.startswith("kubernetes:") and (pod := pod_spec(r)) is not None:
            yield r, pod


def is_vllm_server(container: Mapping[str, Any]) -> bool:
    line = " ".join(str(x) for x in (container.get("command") or []) + (container.get("args") or []))
    return any(e in line for e in VLLM_ENTRYPOINTS)


def vllm_servers(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any], Mapping[str, Any]]]:
    for r, pod in workloads(resources):
        for c in pod.get("containers") or []:
            if is_vllm_server(c):
                yield r, pod, c


def template_labels(r: Resource) -> Mapping[str, Any]:
    """The labels of a workload's pod template."""
    return (((r.props.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A non-empty equality selector matches these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env_of(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e.get("name", ""): e for e in container.get("env") or []}


def where(r: Resource) -> str:
    return f"{r.props.get('kind', r.type.split(':')[-1])} {namespace_of(r)}/{meta(r).get('name', r.name)}" \
        if r.type.startswith("kubernetes:") else f"{r.type.split(':')[-1]} {r.name}"


# --- the policies ------------------------------------------------------------------------

def gpu_node_pools_tainted(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != NODE_POOL:
            continue
        config = r.props.get("nodeConfig") or {}
        if not config.get("guestAccelerators"):
            continue
        taints = config.get("taints") or []
        if not any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NO_SCHEDULE" for t in taints):
            yield r, (f"GPU node pool '{r.props.get('name', r.name)}' has no nvidia.com/gpu NO_SCHEDULE taint: "
                      "CPU pods would land on (and block) GPU nodes")


def mig_partition_valid(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != NODE_POOL:
            continue
        for acc in (r.props.get("nodeConfig") or {}).get("guestAccelerators") or []:
            size = acc.get("gpuPartitionSize")
            if not size:
                continue
            known = ACCELERATORS.get(acc.get("type", ""))
            if known is None:
                yield r, f"gpuPartitionSize '{size}' on unknown accelerator '{acc.get('type')}'"
            elif size not in known.mig_profiles:
                valid = ", ".join(known.mig_profiles) or "none: it has no MIG"
                yield r, f"gpuPartitionSize '{size}' is not a MIG profile of {known.gke_type}; valid: {valid}"


def _model_ref(container: Mapping[str, Any]) -> Optional[str]:
    words = [str(x) for x in (container.get("command") or []) + (container.get("args") or [])]
    if "--model" in words and words.index("--model") + 1 < len(words):
        return words[words.index("--model") + 1]
    for entry in ("serve", "/opt/vllm-gke/serve.py"):
        if entry in words and words.index(entry) + 1 < len(words):
            return words[words.index(entry) + 1]
    return None


def weights_read_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod, c in vllm_servers(resources):
        shared = {v["name"]: v for v in pod.get("volumes") or []
                  if "persistentVolumeClaim" in v or "nfs" in v or "csi" in v}
        mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") in shared]
        if not mounts:
            yield r, f"{where(r)}: the vLLM container mounts no shared weights volume"
        for m in mounts:
            volume = shared[m["name"]]
            source = volume.get("persistentVolumeClaim") or volume.get("nfs") or volume.get("csi") or {}
            if not m.get("readOnly") or not source.get("readOnly"):
                yield r, f"{where(r)}: weights volume '{m['name']}' must be mounted readOnly (mount and volume)"
        model = _model_ref(c)
        if not model or not model.startswith("/"):
            yield r, f"{where(r)}: model '{model}' is not a local path on the shared volume; replicas must not download"
        env = env_of(c)
        if env.get("HF_HUB_OFFLINE", {}).get("value") != "1":
            yield r, f"{where(r)}: HF_HUB_OFFLINE=1 must be set so the server can never fetch weights"
        if "HF_TOKEN" in env or "HUGGING_FACE_HUB_TOKEN" in env:
            yield r, f"{where(r)}: the server holds a Hugging Face token; only the loader Job may"
        if any(str(a).startswith("--download-dir") for a in c.get("args") or []):
            yield r, f"{where(r)}: --download-dir makes replicas download their own copy"


def _mesh_policies(resources: Sequence[Resource]) -> tuple[dict[str, list[Resource]], dict[str, list[Resource]]]:
    authn: dict[str, list[Resource]] = {}
    authz: dict[str, list[Resource]] = {}
    for r in kube(resources, "RequestAuthentication"):
        authn.setdefault(namespace_of(r), []).append(r)
    for r in kube(resources, "AuthorizationPolicy"):
        authz.setdefault(namespace_of(r), []).append(r)
    return authn, authz


def tenant_namespaces_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    authn, authz = _mesh_policies(resources)
    for ns in kube(resources, "Namespace"):
        labels = meta(ns).get("labels") or {}
        if "vllm-gke.io/tenant" not in labels:
            continue
        name = meta(ns).get("name", ns.name)
        missing = [k for k, found in (("RequestAuthentication", authn), ("AuthorizationPolicy", authz))
                   if not found.get(name)]
        if missing:
            yield ns, f"tenant namespace '{name}' has no {' and no '.join(missing)}"


def _is_deny_all(policy: Resource) -> bool:
    spec = policy.props.get("spec") or {}
    return spec.get("action", "ALLOW") == "ALLOW" and not spec.get("rules")


def _external_gateways(resources: Sequence[Resource]) -> dict[tuple[str, Any], Resource]:
    return {(namespace_of(g), meta(g).get("name")): g for g in kube(resources, "Gateway")
            if not INTERNAL_GATEWAY.search((g.props.get("spec") or {}).get("gatewayClassName", ""))}


def _parent_gateways(route: Resource, gateways: Mapping[tuple[str, Any], Resource]) -> list[tuple[dict, Resource]]:
    ns = namespace_of(route)
    parents = (route.props.get("spec") or {}).get("parentRefs") or []
    return [(p, gateways[key]) for p in parents if (key := (p.get("namespace") or ns, p.get("name"))) in gateways]


def external_gateway_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    external = _external_gateways(resources)
    if not external:
        return
    authn, authz = _mesh_policies(resources)
    for route in kube(resources, "HTTPRoute"):
        if not _parent_gateways(route, external) or not _backends(route):
            continue
        ns = namespace_of(route)
        if not authn.get(ns):
            yield route, f"{where(route)} is exposed on an external Gateway but namespace '{ns}' has no RequestAuthentication"
        if not any(_is_deny_all(p) for p in authz.get(ns, [])):
            yield route, f"{where(route)} is exposed on an external Gateway but namespace '{ns}' has no deny-all AuthorizationPolicy"


def _backends(route: Resource) -> list[Any]:
    return [b for rule in (route.props.get("spec") or {}).get("rules") or [] for b in rule.get("backendRefs") or []]


def external_gateway_https_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    external = _external_gateways(resources)
    for gw in external.values():
        listeners = (gw.props.get("spec") or {}).get("listeners") or []
        if not any(l.get("protocol") == "HTTPS" for l in listeners):
            yield gw, f"{where(gw)} is external but has no HTTPS listener: bearer tokens would cross the internet in clear"
        for l in listeners:
            admits = ((l.get("allowedRoutes") or {}).get("namespaces") or {}).get("from", "Same")
            if l.get("protocol") == "HTTP" and admits != "Same":
                yield gw, (f"{where(gw)} listener '{l.get('name')}' is plain HTTP and admits routes from "
                           f"'{admits}' namespaces; admit only the gateway's own redirect (from: Same)")
    for route in kube(resources, "HTTPRoute"):
        for ref, gw in _parent_gateways(route, external):
            listeners = {l.get("name"): l for l in (gw.props.get("spec") or {}).get("listeners") or []}
            section = ref.get("sectionName")
            targets = [listeners[section]] if section in listeners else list(listeners.values())
            if any(l.get("protocol") == "HTTP" for l in targets) and _backends(route):
                yield route, (f"{where(route)} sends traffic to backends through a plain HTTP listener of external "
                              f"{where(gw)}; attach it to the HTTPS listener (sectionName)")


def _probe_sources(resources: Sequence[Resource]) -> list[str]:
    """One address inside every range any AuthorizationPolicy names, plus one on the internet."""
    import ipaddress

    ips = {INTERNET_PROBE_IP}
    for p in kube(resources, "AuthorizationPolicy"):
        for rule in (p.props.get("spec") or {}).get("rules") or []:
            for f in rule.get("from") or []:
                src = f.get("source") or {}
                for block in (src.get("ipBlocks") or []) + (src.get("remoteIpBlocks") or []):
                    net = ipaddress.ip_network(block, strict=False)
                    ips.add(str(next(iter(net.hosts()), net.network_address)))
    return sorted(ips)


def _forged_claim_headers(docs: list[Mapping[str, Any]], namespace: str) -> list[dict[str, str]]:
    """What a client without a token can send: nothing, or any header a RequestAuthentication
    writes from a claim, set to each issuer it knows (only a verified token's claim replaces it)."""
    out: list[dict[str, str]] = [{}]
    for d in docs:
        if d.get("kind") != "RequestAuthentication" or (d.get("metadata") or {}).get("namespace") != namespace:
            continue
        for rule in (d.get("spec") or {}).get("jwtRules") or []:
            for o in rule.get("outputClaimToHeaders") or []:
                if o.get("claim") == "iss" and rule.get("issuer"):
                    out.append({o["header"].lower(): rule["issuer"]})
    return out


def _open_probe(docs: list[Mapping[str, Any]], namespace: str, labels: Mapping[str, str],
                sources: Sequence[str]) -> Optional[str]:
    """The first unauthenticated request to a serving path the mesh would let through, if any."""
    forged = _forged_claim_headers(docs, namespace)
    for path in SERVING_PROBE_PATHS:
        for ip in sources:
            for method in ("GET", "POST"):
                for headers in forged:
                    decision = decide(docs, Request(namespace, path, method, labels, ip, headers=headers))
                    if decision.allowed:
                        return f"{method} {path} from {ip} ({decision.reason})"
    return None


def serving_paths_authenticated(resources: Sequence[Resource]) -> Iterator[Finding]:
    docs = [r.props for r in resources if r.type.startswith("kubernetes:")]
    sources = _probe_sources(resources)
    seen = set()
    for r, _pod, _c in vllm_servers(resources):
        if r.urn in seen:
            continue
        seen.add(r.urn)
        labels = template_labels(r)
        if probe := _open_probe(applicable(docs, namespace_of(r), labels), namespace_of(r), labels, sources):
            yield r, f"{where(r)}: {probe} is allowed without a JWT; only /health and /metrics may be"


def _seccomp(pod: Mapping[str, Any], c: Mapping[str, Any]) -> Optional[str]:
    profile = ((c.get("securityContext") or {}).get("seccompProfile")
               or (pod.get("securityContext") or {}).get("seccompProfile") or {})
    return profile.get("type")


def pods_hardened(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod in workloads(resources):
        for c in containers(pod):
            sc = c.get("securityContext") or {}
            problems = []
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
        if run_as_non_root is not True:
            yield r, f"{where(r)}: the vLLM server may run as root; set runAsNonRoot"
        if pod.get("automountServiceAccountToken") is not False:
            yield r, f"{where(r)}: the vLLM server mounts a service-account token it never uses"


def control_plane_restricted(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r in resources:
        if r.type != "gcp:container/cluster:Cluster":
            continue
        private = (r.props.get("privateClusterConfig") or {}).get("enablePrivateEndpoint")
        blocks = (r.props.get("masterAuthorizedNetworksConfig") or {}).get("cidrBlocks")
        if not private and not blocks:
            yield r, (f"cluster '{r.props.get('name', r.name)}': the control plane's public endpoint accepts any "
                      "source address; set authorized networks or a private endpoint")


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


def images_pinned(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, pod in workloads(resources):
        for c in containers(pod):
            image = str(c.get("image", ""))
            if not _pinned(image):
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


def max_tokens_cap(resources: Sequence[Resource]) -> Iterator[Finding]:
    for r, _pod, c in vllm_servers(resources):
        args = [str(a) for a in c.get("args") or []]
        if not any(args[i] == "--middleware" and args[i + 1] == GUARD_MIDDLEWARE for i in range(len(args) - 1)):
            yield r, f"{where(r)}: the server does not load {GUARD_MIDDLEWARE}, so no max_tokens cap applies"
            continue
        raw = env_of(c).get("GKE_LLM_GUARD_CONFIG", {}).get("value")
        try:
            issuers = json.loads(raw or "").get("issuers", {})
        except (ValueError, AttributeError):
            yield r, f"{where(r)}: GKE_LLM_GUARD_CONFIG is missing or not JSON"
            continue
        for issuer, entry in issuers.items():
            cap = entry.get("maxTokens") if isinstance(entry, dict) else None
            # The engine hands numbers over as doubles; a cap is a whole number of at least one.
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 1 or cap != int(cap):
                yield r, f"{where(r)}: tenant issuer {issuer} has no positive maxTokens cap"


def vllm_autoscaled(resources: Sequence[Resource]) -> Iterator[Finding]:
    """Every vLLM Deployment is scaled by a KEDA ScaledObject (with KEDA's chart in the plan to
    act on it) and covered by a PodDisruptionBudget. An HPA on a custom metric needs a custom
    metrics API the platform no longer runs (KEDA's metrics server is the external one)."""
    scaled = {(namespace_of(h), (h.props.get("spec") or {}).get("scaleTargetRef", {}).get("name"))
              for h in kube(resources, "ScaledObject")}
    pdbs = [(namespace_of(p), ((p.props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})
            for p in kube(resources, "PodDisruptionBudget")]
    keda = any(r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("chart") == "keda" for r in resources)
    custom_api = any((a.props.get("spec") or {}).get("group") == "custom.metrics.k8s.io"
                     for a in kube(resources, "APIService"))
    for h in kube(resources, "HorizontalPodAutoscaler"):
        metrics = (h.props.get("spec") or {}).get("metrics") or []
        if not custom_api and any(m.get("type") in ("Pods", "Object") for m in metrics):
            yield h, (f"{where(h)} scales on a custom metric but the plan serves no custom.metrics.k8s.io "
                      "API, so it would never scale")
    if scaled and not keda:
        yield next(iter(kube(resources, "ScaledObject"))), \
            "ScaledObjects are declared but no KEDA chart is installed to act on them"
    seen = set()
    for r, _pod, _c in vllm_servers(resources):
        if r.props.get("kind") != "Deployment" or r.urn in seen:
            continue
        seen.add(r.urn)
        ns, name = namespace_of(r), meta(r).get("name")
        if (ns, name) not in scaled:
            yield r, f"{where(r)} has no KEDA ScaledObject: fixed replicas idle GPUs or drop load"
        labels = template_labels(r)
        if not any(pns == ns and selects(sel, labels) for pns, sel in pdbs):
            yield r, f"{where(r)} has no PodDisruptionBudget: node upgrades could take every replica at once"


def hyperdisk_weights_populated(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A Hyperdisk ML claim serves weights only if GKE Volume Populator fills it: read-only for
    many nodes, a GCPDataSource beside it naming an identity other than the servers' own (that
    one would hand every vLLM pod the bucket), and transfer nodes for the populator's Jobs."""
    classes = {meta(c).get("name"): c for c in kube(resources, "StorageClass")
               if (c.props.get("parameters") or {}).get("type") == "hyperdisk-ml"}
    sources = {(namespace_of(d), meta(d).get("name")): d for d in kube(resources, "GCPDataSource")}
    claims = [c for c in kube(resources, "PersistentVolumeClaim")
              if (c.props.get("spec") or {}).get("storageClassName") in classes]
    for claim in claims:
        spec = claim.props.get("spec") or {}
        if spec.get("accessModes") != ["ReadOnlyMany"]:
            yield claim, (f"{where(claim)} is not ReadOnlyMany: a Hyperdisk ML disk serves many nodes only "
                          "read-only, and the weights must never be written by a server")
        ref = spec.get("dataSourceRef") or {}
        source = sources.get((namespace_of(claim), ref.get("name"))) \
            if ref.get("kind") == "GCPDataSource" and ref.get("apiGroup") == "datalayer.gke.io" else None
        if source is None:
            yield claim, f"{where(claim)} has no GCPDataSource to fill it: the disk would be empty"
            continue
        account = ((source.props.get("spec") or {}).get("cloudStorage") or {}).get("serviceAccountName")
        if account in (None, "", "default"):
            yield source, (f"{where(source)} reads the bucket as the namespace's default service account: every "
                           "vLLM pod there would hold read access to all the weights; give it its own")
    for c in classes.values():
        if c.props.get("volumeBindingMode") != "Immediate":
            yield c, (f"{where(c)} binds WaitForFirstConsumer: the copy would start only when a replica is "
                      "scheduled, and the replica would wait for the whole copy; bind Immediate")
    if claims:
        pools = [r for r in resources if r.type == NODE_POOL and
                 ((r.props.get("nodeConfig") or {}).get("labels") or {}).get(COMPUTE_CLASS_LABEL)
                 == TRANSFER_COMPUTE_CLASS]
        compute_classes = [c for c in kube(resources, "ComputeClass") if meta(c).get("name") == TRANSFER_COMPUTE_CLASS]
        if not pools or not compute_classes:
            yield None, (f"Hyperdisk ML claims are populated by Jobs that run only on nodes of the "
                         f"{TRANSFER_COMPUTE_CLASS} compute class, and the plan has no such "
                         f"{'node pool' if not pools else 'ComputeClass'}: the transfer would never start")


STANDBY_LABEL = "vllm-gke.io/standby"


def scale_to_zero_answered(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A pool that KEDA may take to zero replicas needs its standby: without one, requests at zero
    get the load balancer's bare 503 and nothing counts them, so the pool never wakes."""
    deployments = {(namespace_of(d), meta(d).get("name")): d for d in kube(resources, "Deployment")}
    standbys = [(namespace_of(d), template_labels(d)) for d in deployments.values()
                if template_labels(d).get(STANDBY_LABEL) == "true"]
    services = kube(resources, "Service")
    for so in kube(resources, "ScaledObject"):
        spec = so.props.get("spec") or {}
        if spec.get("minReplicaCount", 0) != 0:
            continue
        ns = namespace_of(so)
        target = deployments.get((ns, (spec.get("scaleTargetRef") or {}).get("name")))
        if target is None:
            continue
        labels = template_labels(target)
        fronts = [s for s in services if namespace_of(s) == ns and (s.props.get("spec") or {}).get("clusterIP") != "None"
                  and selects((s.props.get("spec") or {}).get("selector") or {}, labels)]
        answered = any(selects((f.props.get("spec") or {}).get("selector") or {}, sl)
                       for f in fronts for sns, sl in standbys if sns == ns)
        if not answered:
            yield so, f"{where(so)} may scale {where(target)} to zero but no standby sits behind its Service"
        queries = " ".join(str((t.get("metadata") or {}).get("query", "")) for t in spec.get("triggers") or [])
        if "vllm_gke_standby_requests_total" not in queries:
            yield so, f"{where(so)} has no trigger on the standby's requests: at zero nothing wakes the pool"


def vllm_backends_resilient(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A failing vLLM replica must leave the load balancer's rotation: a HealthCheckPolicy on every
    Service the Gateway sends to (else GKE probes '/', which vLLM answers 404); a stopping one must
    keep its connections as long as a request may run (connection draining >= the timeout). The load balancer
    and the endpoint picker call the pods from outside the mesh, so a DestinationRule (outlier
    detection, connection limits) would apply to no caller: it is no substitute."""
    pods = [(namespace_of(r), template_labels(r))
            for r, _pod, _c in vllm_servers(resources) if r.props.get("kind") == "Deployment"]
    checked = {(namespace_of(h), ((h.props.get("spec") or {}).get("targetRef") or {}).get("name"))
               for h in kube(resources, "HealthCheckPolicy")}
    routed = {(b.get("namespace") or namespace_of(route), b.get("name")) for route in kube(resources, "HTTPRoute") for b in _backends(route)
              if b.get("kind", "Service") == "Service"}
    for svc in kube(resources, "Service"):
        ns, name = namespace_of(svc), meta(svc).get("name")
        selector = (svc.props.get("spec") or {}).get("selector") or {}
        if (ns, name) not in routed or not any(pns == ns and selects(selector, labels) for pns, labels in pods):
            continue
        if (ns, name) not in checked:
            yield svc, (f"{where(svc)} is a Gateway backend without a HealthCheckPolicy: the load balancer probes "
                        "'/' (404 on vLLM) and never takes a failing replica out")
    for policy in kube(resources, "GCPBackendPolicy"):
        default = (policy.props.get("spec") or {}).get("default") or {}
        # Numbers reach the pack as doubles from the engine.
        timeout = int(default.get("timeoutSec") or 30)
        draining = int((default.get("connectionDraining") or {}).get("drainingTimeoutSec") or 0)
        if draining < min(3600, timeout):
            yield policy, (f"{where(policy)} drains a detached endpoint for {draining} s but lets a request run "
                           f"{timeout} s: a scale-down or drain cuts the requests a stopping replica still serves")


# The endpoint picker's request headers (gateway-api-inference-extension pkg/epp/metadata); the
# same names as components/serving_api.py, repeated so the pack stays light (a test ties them).
OBJECTIVE_HEADER = "x-gateway-inference-objective"
PICKER_SETS = ("x-gateway-destination-endpoint",)
REFUSED_AT_THE_PICKER = ("x-gateway-model-name-rewrite", "x-llm-d-inference-objective")
GLOBAL_GATEWAY = re.compile(r"global|gxlb")


def _to_pool(backend: Mapping[str, Any]) -> bool:
    return backend.get("kind") == "InferencePool" and backend.get("group") == "inference.networking.k8s.io"


def _pool_rules(route: Resource) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    for rule in (route.props.get("spec") or {}).get("rules") or []:
        pools = [b for b in rule.get("backendRefs") or [] if _to_pool(b)]
        if pools:
            yield rule, pools


def _header_changes(rule: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """What a rule's RequestHeaderModifier filters set (name -> value) and remove, names lowercase."""
    sets: dict[str, str] = {}
    removes: set[str] = set()
    for f in rule.get("filters") or []:
        if f.get("type") == "RequestHeaderModifier":
            mod = f.get("requestHeaderModifier") or {}
            sets.update({str(h.get("name", "")).lower(): str(h.get("value", "")) for h in mod.get("set") or []})
            removes.update(str(h).lower() for h in mod.get("remove") or [])
    return sets, removes


def inference_pools_served(resources: Sequence[Resource]) -> Iterator[Finding]:
    """An InferencePool serves only with its endpoint picker running, failing closed, health-checked
    by the load balancer, behind a regional Gateway in a VPC with a proxy-only subnet."""
    pools = kube(resources, "InferencePool")
    if not pools:
        return
    services = {(namespace_of(s), meta(s).get("name")): s for s in kube(resources, "Service")}
    deployments = [(namespace_of(d), template_labels(d)) for d in kube(resources, "Deployment")]
    checked = {(namespace_of(h), ref.get("name")) for h in kube(resources, "HealthCheckPolicy")
               if (ref := (h.props.get("spec") or {}).get("targetRef") or {}).get("kind") == "InferencePool"}
    for pool in pools:
        ns, name = namespace_of(pool), meta(pool).get("name")
        ref = (pool.props.get("spec") or {}).get("endpointPickerRef") or {}
        if ref.get("failureMode") == "FailOpen":
            yield pool, f"{where(pool)} fails open: with its picker down, requests skip priorities and load awareness"
        svc = services.get((ns, ref.get("name")))
        if svc is None:
            yield pool, f"{where(pool)}: its endpoint picker Service '{ref.get('name')}' is not declared in '{ns}'"
        elif not any(dns == ns and selects((svc.props.get("spec") or {}).get("selector") or {}, labels)
                     for dns, labels in deployments):
            yield pool, f"{where(pool)}: no Deployment runs behind its endpoint picker Service '{ref.get('name')}'"
        if (ns, name) not in checked:
            yield pool, (f"{where(pool)} has no HealthCheckPolicy: the load balancer probes '/' (404 on vLLM) and "
                         "marks every replica unhealthy")
    if not any(r.type == "gcp:compute/subnetwork:Subnetwork" and r.props.get("purpose") == "REGIONAL_MANAGED_PROXY"
               for r in resources):
        yield None, "InferencePools are served by a regional load balancer, which needs a proxy-only subnet; none is declared"
    gateways = {(namespace_of(g), meta(g).get("name")): g for g in kube(resources, "Gateway")}
    for route in kube(resources, "HTTPRoute"):
        if not any(True for _ in _pool_rules(route)):
            continue
        for _ref, gw in _parent_gateways(route, gateways):
            cls = (gw.props.get("spec") or {}).get("gatewayClassName", "")
            if GLOBAL_GATEWAY.search(cls):
                yield route, f"{where(route)} sends to an InferencePool through {cls}: only regional classes serve pools"


def tenant_priorities_bound(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A tenant's priority is its own. The picker reads a request as the client sent it (route
    header changes apply after ext_proc, envoy#15012), so a route to a pool must only admit
    requests that already carry the objective it sets, refuse those carrying the picker's other
    control headers, and strip them for the replica; every objective must exist, and the mesh
    must admit at most one tenant's tokens under each."""
    docs = [r.props for r in resources if r.type.startswith("kubernetes:")]
    objectives = {(namespace_of(o), meta(o).get("name")) for o in kube(resources, "InferenceObjective")}
    pools = {(namespace_of(p), meta(p).get("name")): p for p in kube(resources, "InferencePool")}
    deployments = kube(resources, "Deployment")
    routes = [r.props for r in kube(resources, "HTTPRoute")]
    issuers_by_ns: dict[str, set[str]] = {}
    for ra in kube(resources, "RequestAuthentication"):
        issuers_by_ns.setdefault(namespace_of(ra), set()).update(
            str(rule.get("issuer")) for rule in (ra.props.get("spec") or {}).get("jwtRules") or [])
    # Per pool: the objectives its routes set, and where its policies apply.
    pool_objectives: dict[tuple[str, Any], list[tuple[Resource, str]]] = {}
    for route in kube(resources, "HTTPRoute"):
        ns = namespace_of(route)
        for rule, backends in _pool_rules(route):
            sets, removes = _header_changes(rule)
            objective = sets.get(OBJECTIVE_HEADER)
            if objective is None:
                yield route, (f"{where(route)} routes to an InferencePool without setting {OBJECTIVE_HEADER}: "
                              "clients would choose their own priority")
                continue
            required = {"type": "Exact", "name": OBJECTIVE_HEADER, "value": objective}
            if not all(required in (m.get("headers") or []) for m in rule.get("matches") or [{}]):
                yield route, (f"{where(route)} routes to an InferencePool without requiring {OBJECTIVE_HEADER}: "
                              f"{objective}: the picker reads the client's value (route header changes come after "
                              "ext_proc), so clients would choose their own priority")
            if missing := [h for h in REFUSED_AT_THE_PICKER if h not in removes]:
                yield route, f"{where(route)} passes the client's {', '.join(missing)} to the replica"
            if stripped := [h for h in PICKER_SETS if h in removes or any(
                    str(x.get("name", "")).lower() == h for m in rule.get("matches") or [] for x in m.get("headers") or [])]:
                yield route, (f"{where(route)} matches on or strips {', '.join(stripped)}, which the picker sets: "
                              "applied after ext_proc it would drop or redirect the picker's choice")
            for match in rule.get("matches") or [{}]:
                for header in REFUSED_AT_THE_PICKER:
                    reached = reach(routes, sample_request(match, {header: "x"}))
                    if reached is not None and any(_to_pool(b) for b in reached.backends):
                        yield route, f"{where(route)} passes the client's {header} to the endpoint picker"
            if (ns, objective) not in objectives:
                yield route, f"{where(route)} sets objective '{objective}' but no InferenceObjective of that name exists"
            for b in backends:
                pool_objectives.setdefault((b.get("namespace") or ns, b.get("name")), []).append((route, objective))
    for (ns, pool_name), routed in pool_objectives.items():
        pool = pools.get((ns, pool_name))
        selector = (((pool.props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}) if pool else {}
        pods = [template_labels(d) for d in deployments if namespace_of(d) == ns and selects(selector, template_labels(d))]
        if not pods:
            continue
        labels = pods[0]
        policies = applicable(docs, ns, labels)
        # Each issuer against each objective, on only the policies that can bear on its token.
        per_issuer = {iss: for_token(policies, iss, "policy-probe") for iss in sorted(issuers_by_ns.get(ns, set()))}
        for route, objective in routed:
            admitted = [iss for iss, mine in per_issuer.items() if decide(mine, Request(
                ns, "/v1/completions", "POST", labels, token=(iss, "policy-probe"),
                headers={OBJECTIVE_HEADER: objective})).allowed]
            if len(admitted) > 1:
                yield route, (f"{where(route)}: objective '{objective}' admits the tokens of {len(admitted)} "
                              f"issuers ({', '.join(admitted)}); a tenant could take another's priority")


def _guard_configs(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    for r, _pod, c in vllm_servers(resources):
        raw = (env_of(c).get("GKE_LLM_GUARD_CONFIG") or {}).get("value")
        try:
            yield r, json.loads(raw) if isinstance(raw, str) else {}
        except ValueError:
            yield r, {}


def _flag_values(args: Sequence[Any], flag: str) -> list[str]:
    """The values after `flag` up to the next option (nargs='+')."""
    out: list[str] = []
    items = [str(a) for a in args]
    for i, a in enumerate(items):
        if a == flag:
            for v in items[i + 1:]:
                if v.startswith("--"):
                    break
                out.append(v)
    return out


def lora_adapters_scoped(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A server with LoRA adapters serves several models in one process: the guard must hold a
    per-tenant list of the `model` values each tenant may send, and every adapter must come
    from the read-only weights mount (never fetched from a hub at run time)."""
    configs = {r.urn: cfg for r, cfg in _guard_configs(resources)}
    for r, pod, c in vllm_servers(resources):
        modules = _flag_values(list(c.get("command") or []) + list(c.get("args") or []), "--lora-modules")
        if not modules:
            continue
        mounts = [m.get("mountPath", "") for m in c.get("volumeMounts") or [] if m.get("readOnly")]
        for module in modules:
            path = module.split("=", 1)[1] if "=" in module else module
            # Under a read-only mount, or a mount of its own (Hyperdisk ML: a disk per adapter).
            if not any(path == m.rstrip("/") or path.startswith(m.rstrip("/") + "/") for m in mounts):
                yield r, f"{where(r)}: LoRA adapter '{module}' is not on a read-only mount of the weights"
        issuers = (configs.get(r.urn) or {}).get("issuers") or {}
        unscoped = sorted(e.get("tenant", i) for i, e in issuers.items() if not isinstance(e.get("models"), list))
        if unscoped:
            yield r, (f"{where(r)} serves LoRA adapters but its guard lets {', '.join(unscoped)} send any `model`: "
                      "every tenant could use every adapter")


def limit_store_mesh_only(resources: Sequence[Resource]) -> Iterator[Finding]:
    """The shared limit store has no password: the mesh is its only lock. Its namespace must
    refuse plaintext (STRICT mTLS) and admit peers by identity alone, on the store's port."""
    stores = {str(cfg["globalLimits"].get("host", "")) for _r, cfg in _guard_configs(resources)
              if isinstance(cfg.get("globalLimits"), dict)}
    for store in sorted(stores):
        parts = store.split(".")
        ns = parts[1] if len(parts) > 1 else "default"
        strict = [p for p in kube(resources, "PeerAuthentication") if namespace_of(p) == ns
                  and ((p.props.get("spec") or {}).get("mtls") or {}).get("mode") == "STRICT"
                  and not (p.props.get("spec") or {}).get("portLevelMtls")]
        if not strict:
            yield None, f"the limit store {store} has no STRICT PeerAuthentication in '{ns}': plaintext clients get in"
        allows = [p for p in kube(resources, "AuthorizationPolicy") if namespace_of(p) == ns
                  and (p.props.get("spec") or {}).get("action", "ALLOW") == "ALLOW"]
        if not any(_is_deny_all(p) for p in allows):
            yield None, f"the limit store's namespace '{ns}' has no deny-all AuthorizationPolicy"
        for p in allows:
            for rule in (p.props.get("spec") or {}).get("rules") or []:
                sources = [f.get("source") or {} for f in rule.get("from") or []]
                if not sources or any(set(src) != {"principals"} or "*" in src["principals"] for src in sources):
                    yield p, (f"{where(p)} admits clients of the limit store by something other than their mesh "
                              "identity (principals); any pod could spend or reset a tenant's limits")


POLICIES: tuple[Policy, ...] = (
    Policy("gpu-node-pools-tainted", "GPU node pools carry the nvidia.com/gpu NoSchedule taint.",
           "mandatory", gpu_node_pools_tainted),
    Policy("mig-partition-valid", "gpu_partition_size is a MIG profile of the pool's accelerator.",
           "mandatory", mig_partition_valid),
    Policy("weights-read-only", "vLLM pods mount the shared weights read-only and never download weights.",
           "mandatory", weights_read_only),
    Policy("tenant-namespaces-authenticated",
           "Every tenant namespace has a RequestAuthentication and an AuthorizationPolicy.",
           "mandatory", tenant_namespaces_authenticated),
    Policy("external-gateway-authenticated",
           "Routes on an external Gateway sit behind JWT auth and a default deny.",
           "mandatory", external_gateway_authenticated),
    Policy("external-gateway-https-only",
           "External Gateways serve over HTTPS only; plain HTTP carries nothing but a redirect.",
           "mandatory", external_gateway_https_only),
    Policy("serving-paths-authenticated",
           "No request reaches a vLLM serving path without a verified JWT, from any source.",
           "mandatory", serving_paths_authenticated),
    Policy("pods-hardened",
           "Containers drop all capabilities, never escalate, use seccomp; vLLM runs non-root with no token.",
           "mandatory", pods_hardened),
    Policy("control-plane-restricted",
           "The cluster's control plane is private or limited to authorized networks.",
           "advisory", control_plane_restricted),
    Policy("images-pinned", "Every container image is pinned to a tag (not latest) or a digest.",
           "mandatory", images_pinned),
    Policy("resource-limits", "Every container sets CPU and memory limits; GPU limits match requests.",
           "mandatory", resource_limits),
    Policy("no-secret-literals", "No secret value appears in the plan or in state.",
           "mandatory", no_secret_literals),
    Policy("max-tokens-cap", "Every vLLM server enforces a max_tokens cap for each tenant.",
           "mandatory", max_tokens_cap),
    Policy("vllm-autoscaled",
           "Every vLLM Deployment is scaled by a KEDA ScaledObject (KEDA installed) and has a PodDisruptionBudget.",
           "advisory", vllm_autoscaled),
    Policy("inference-pools-served",
           "InferencePools have a running endpoint picker, fail closed, are health-checked and sit behind a regional Gateway with a proxy-only subnet.",
           "mandatory", inference_pools_served),
    Policy("tenant-priorities-bound",
           "Routes to InferencePools set each tenant's objective themselves, and the mesh admits only that tenant's tokens under it.",
           "mandatory", tenant_priorities_bound),
    Policy("lora-adapters-scoped",
           "Servers with LoRA adapters load them from the read-only share and admit each tenant only to its own.",
           "mandatory", lora_adapters_scoped),
    Policy("limit-store-mesh-only",
           "The shared limit store admits only mesh identities over STRICT mTLS.",
           "mandatory", limit_store_mesh_only),
    Policy("scale-to-zero-answered",
           "Pools that scale to zero have a standby that answers 503 with Retry-After and wakes them.",
           "mandatory", scale_to_zero_answered),
    Policy("hyperdisk-weights-populated",
           "Hyperdisk ML weight disks are read-only, filled by GKE Volume Populator with their own identity, on transfer nodes.",
           "mandatory", hyperdisk_weights_populated),
    Policy("vllm-backends-resilient",
           "Every vLLM Service behind the Gateway has a load balancer health check, so failing replicas leave rotation.",
           "advisory", vllm_backends_resilient),
)
POLICY_NAMES = tuple(p.name for p in POLICIES)


def resolve_levels(config: Optional[Mapping[str, Any]] = None) -> dict[str, Level]:
    """Enforcement levels from a config in `pulumi --policy-pack-config` form:
    {"all": "advisory", "<policy>": "mandatory" | {"enforcementLevel": "disabled"}}."""
    config = dict(config or {})
    unknown = set(config) - {"all", *POLICY_NAMES}
    if unknown:
        raise ValueError(f"unknown policies in policy config: {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(POLICY_NAMES)}")

    def level(value: Any, key: str) -> Level:
        value = value.get("enforcementLevel") if isinstance(value, dict) else value
        if value not in LEVELS:
            raise ValueError(f"policy config '{key}': enforcement level '{value}' is not one of {', '.join(LEVELS)}")
        return value

    default = level(config["all"], "all") if "all" in config else None
    return {p.name: level(config[p.name], p.name) if p.name in config else (default or p.level)
            for p in POLICIES}


def evaluate(resources: Sequence[Resource], config: Optional[Mapping[str, Any]] = None) -> list[Violation]:
    levels = resolve_levels(config)
    out = []
    for policy in POLICIES:
        if levels[policy.name] == "disabled":
            continue
        for resource, message in policy.check(resources):
            out.append(Violation(policy.name, levels[policy.name], resource.name if resource else "<stack>",
                                 resource.urn if resource else "", message))
    return out
