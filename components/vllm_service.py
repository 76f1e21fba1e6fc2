"""VllmService: one serving pool (short or long requests) of one model.

Declares the Deployment running vLLM's OpenAI server from the pinned image (its command line,
environment and resources: components/model/vllm_server.py), its Service, a PodDisruptionBudget, a KEDA
ScaledObject on queue depth (vllm:num_requests_waiting, read from Managed Prometheus;
components/model/keda_scaling.py) and a PodMonitoring for scraping.

Every pool is scaled by KEDA, whatever its floor: one autoscaling path, one external metrics
server (KEDA's), and a floor raised from 0 is a ScaledObject update that KEDA's operator acts on
at once (it scales a target below minReplicaCount up to it; an HPA never scales from zero).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, custom_resource, meta
from .model.capacity import hosts_per_replica, rollout_strategy
from .model.cold_start import NODE_PROVISION_S, rollout_seconds
from .model.k8s_objects import (
    BASE_LABELS,
    CONTAINER_SECURITY,
    MODEL_LABEL,
    POOL_LABEL,
    TENANT_LABEL,
    group_name_of,
    service_name_of,
)
from .model.keda_scaling import KedaScaling, scaled_object
from .model.node_pools import placement_for
from .model.specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec
from .model.vllm_server import (
    GUARD_CONFIG_ENV,
    HOME,
    HOME_GI,
    NON_ROOT,
    PORT,
    RUNTIME_ENV,
    STARTUP_WINDOW_ENV,
    TMP_GI,
    WARM_MARKER,
    WARM_MARKER_ENV,
    WEIGHTS_MARKERS_ENV,
    container_resources,
    drain_seconds,
    group_args,
    group_env,
    pre_stop_seconds,
    scratch_gi,
    sidecar_config,
    tpu_pod,
    trace_env,
    vllm_args,
    wait_for_weights,
    weights_markers,
    xla_cache_host_path,
)
from .model.vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .model.weights_layout import SERVER_SA
from .model.weights_mount import WeightsMount
from .options import child_opts

PoolName = Literal["short", "long"]
# Carried by vLLM pods only: a pool's standby shares its model and pool labels (so the Service
# selects it) but not this one.
SERVER_LABELS = {"app.kubernetes.io/name": "vllm"}


def startup_failure_threshold(load_seconds: float) -> int:
    """Startup probe periods (10 s each) before the kubelet gives up on a replica: 30 minutes at
    least, 1.5x the estimated load and warm-up where that is longer."""
    return max(180, math.ceil(1.5 * load_seconds / 10))


def startup_window_seconds(load_seconds: float) -> int:
    """The startup probe's window (periods of 10 s): the entrypoint waits for vLLM that long too."""
    return 10 * startup_failure_threshold(load_seconds)


def disruption_budget() -> dict[str, Any]:
    """One replica (or, for a multi-host group, one pod and so its group) down at a time, never
    none: a budget that allows no disruption holds every drain of its node (node upgrades, repairs,
    autoscaler consolidation) until GKE's one-hour limit forces it, and the replica goes all the
    same. So a pool at one replica is taken down by a drain and reloads elsewhere (the plan says so
    and how long); with more, the next eviction waits until the replacement is Ready. A group's
    pods are Ready only while their leader serves, so a reloading group counts as down."""
    return {"maxUnavailable": 1}


def progress_deadline_seconds(load_seconds: float, grace_seconds: int = 0, behind_seconds: float = 0) -> int:
    """A rollout's progress deadline: a node to come up (cold_start.NODE_PROVISION_S), the old
    replica's grace period where one is taken first, and the new replica's startup probe budget,
    so only a replica the kubelet gives up on fails it; `behind_seconds` more where the step may
    wait behind other pools' rollouts on a full node pool (a device it freed taken by their pods)."""
    return int(NODE_PROVISION_S + grace_seconds + behind_seconds) + startup_window_seconds(load_seconds)


# LeaderWorkerSet v0.10.0 (kubernetes-sigs/lws; components/leader_worker_set.py installs it).
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# On a group's workers instead of the pool's labels (which select leaders: they serve).
GROUP_WORKER_LABEL = "vllm-gke.io/group-worker-of"
# A worker's readiness: its leader's server answers (/metrics: no tenant token, open to scrapers).
LEADER_SERVES = ("import os, urllib.request; urllib.request.urlopen("
                 f"'http://' + os.environ['LWS_LEADER_ADDRESS'] + ':{PORT}/metrics', timeout=4)")


def group_can_surge(pool: ServingPoolSpec, hosts: int, node_pool: NodePoolSpec) -> bool:
    """The node pool reaches the hosts of one group more than the pool's most (its own maxNodes,
    and an on-demand twin's). A multi-host TPU slice pool is one slice: never (its twin holds the
    second slice only while the group runs on spot)."""
    if node_pool.is_tpu and hosts > 1:
        return False  # the surge slice would be the twin's only if the group runs on spot: not known
    reach = node_pool.max_nodes * (2 if node_pool.has_fallback_pool else 1)
    return reach >= (pool.max_replicas + 1) * hosts


def leader_worker_set(pool: ServingPoolSpec, hosts: int, leader: dict[str, Any],
                      worker: dict[str, Any], surge: bool = True) -> dict[str, Any]:
    """A pool of multi-host replicas: each group a leader (the API server, the guard, rank 0) and
    hosts-1 workers. A failed pod recreates its group (a torch.distributed or Ray world cannot take
    a member back); groups start together (the leader's engine waits for its workers). A rollout
    adds a new group before it takes an old one (maxSurge 1, maxUnavailable 0), as the Deployments
    do, where the node pool has the hosts for one more group (`surge`); else it replaces a group in
    place (maxSurge 0, maxUnavailable 1: that group's capacity is gone until its successor loads),
    since a surge group with no nodes to land on would hold the rollout forever. KEDA owns
    `replicas` (the scale subresource counts groups)."""
    rolling = {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    return {
        **({"replicas": 0} if pool.min_replicas == 0 else {}),
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling},
        "leaderWorkerTemplate": {"size": hosts, "restartPolicy": "RecreateGroupOnPodRestart",
                                 "leaderTemplate": leader, "workerTemplate": worker},
    }


def group_network_policy(group: str) -> dict[str, Any]:
    """A group's pods talk among themselves on any port (outside the mesh: torch.distributed, NCCL,
    Ray); from elsewhere only the serving port and the leader's sidecar ports are open."""
    members = {"podSelector": {"matchLabels": {LWS_NAME_LABEL: group}}}
    return {"podSelector": {"matchLabels": {LWS_NAME_LABEL: group}}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [members]},
                        {"ports": [{"protocol": "TCP", "port": p} for p in (PORT, 15006, 15020, 15021, 15090)]}]}


@dataclass
class VllmServiceArgs:
    model: ModelSpec
    pool_name: PoolName
    pool: ServingPoolSpec
    node_pool: NodePoolSpec
    namespace: pulumi.Input[str]
    image: ImageRef
    # How the pods read the weights (ModelStore.mount_for: the backend's volumes, mounts and annotations).
    weights: WeightsMount
    provider: k8s.Provider
    # What the in-server guard admits: serving_api.guard_config(tenants, routes, ...). Required: a
    # guard without tenants refuses every request.
    guard_config: Mapping[str, Any]
    # Per-issuer max_tokens caps and rate limits the in-server guard enforces.
    tenant: Optional[str] = None
    release: VllmRelease = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION))
    # A canary of another revision runs as its own pool beside the stable one.
    canary: bool = False
    # KEDA scales every pool (Keda installed; for minReplicas 0, with the standby's name).
    scaling: Optional[KedaScaling] = None
    # The load balancer's backend timeout (GatewaySpec.request_timeout_seconds): how long a
    # stopping replica keeps finishing the requests it accepted.
    request_timeout_seconds: int = 600
    # The servers' Kubernetes service account (MeshNamespace service_accounts creates it); None:
    # the namespace's default.
    service_account: Optional[str] = SERVER_SA
    # The TTFT SLO's threshold (monitoring.ttftSloSeconds, where SLOs are kept): added to vLLM's
    # TTFT buckets where it is not a bound, so the SLO counts exactly.
    ttft_slo_seconds: Optional[float] = None
    # Seconds a replica takes from start to warm (components/model/cold_start.py): its startup probe
    # allows half as long again.
    load_seconds: float = 0.0
    # The cluster's pod range (cluster.podsCidr): a multi-host group's leader reaches its workers
    # there outside the mesh.
    pods_cidr: Optional[str] = None
    # Where the servers send traces (TraceCollector.endpoint) and the share of tenant requests
    # traced; None: no traces.
    traces_endpoint: Optional[str] = None
    trace_sample_ratio: float = 0.01
    # The rolling update (capacity.rollout_strategy, from the room the node pool has with its other
    # pools at their ceilings); None: from this pool's own room on the node pool.
    rolling: Optional[Mapping[str, int | str]] = None
    # Where the pool replaces replicas in place on a full node pool: how long a step may wait behind
    # the other pools' rollouts there (their pending pods may take each device it frees).
    wait_behind_seconds: float = 0.0


class VllmService(pulumi.ComponentResource):
    # One node a replica: a Deployment; across hosts: a LeaderWorkerSet (`workload` either way).
    deployment: Optional[k8s.apps.v1.Deployment] = None
    group_name: Optional[str] = None
    service: k8s.core.v1.Service
    service_name: str

    def __init__(self, name: str, args: VllmServiceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if "issuers" not in (args.guard_config or {}):
            raise ValueError(f"VllmService {name}: guard_config has no issuers, so the guard would refuse every "
                             "request; build it with serving_api.guard_config(tenants, tenant_routes(), ...)")
        super().__init__("vllm-gke:index:VllmService", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        model, pool = args.model, args.pool
        # A canary's pool label differs, so the stable Service never selects canary pods (and the
        # stable Deployment's immutable selector stays as it was).
        pool_label = f"{args.pool_name}-canary" if args.canary else args.pool_name
        self.service_name = service_name_of(model.name, args.pool_name, args.canary)
        labels = {MODEL_LABEL: model.name, POOL_LABEL: pool_label, **SERVER_LABELS,
                  "vllm-gke.io/revision": model.revision.replace("/", "-")[:63].rstrip("-._")}
        if args.tenant:
            labels[TENANT_LABEL] = args.tenant
        selector = {MODEL_LABEL: model.name, POOL_LABEL: pool_label}
        placement = placement_for(args.node_pool)
        # One MIG slice is one nvidia.com/gpu; parallelism needs that many whole GPUs (or TPU chips).
        gpus = model.devices_per_replica
        shm = "16Gi" if gpus > 1 else "2Gi"
        weights_mounts = [dict(m) for m in args.weights.mounts]
        weights_volumes = [dict(v) for v in args.weights.volumes]
        # Reading a bucket mount needs the network: an init container would read it before the
        # mesh sidecar serves whenever the sidecar is a classic one (managed Cloud Service Mesh
        # lists no nativeSidecar annotation) and Istio CNI captures the pod's traffic from the
        # start, so the FUSE sidecar's calls go nowhere and the pod never starts. The entrypoint
        # waits instead, after the proxy (holdApplicationUntilProxyStarts).
        fuse = args.weights.through_fuse
        init_containers = [] if fuse else [{
            "name": "wait-for-weights",
            "image": args.image.uri,
            "command": ["/bin/sh", "-c", wait_for_weights(model)],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                          "limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": weights_mounts,
        }]
        wait_env = [{"name": WEIGHTS_MARKERS_ENV, "value": ":".join(weights_markers(model))}] if fuse else []

        hosts = hosts_per_replica(model, args.node_pool)
        # A replica on one node takes its devices; across hosts each pod takes its node's.
        pod_devices = min(gpus, args.node_pool.slices_per_node)
        rel = args.release

        # preStop, then vLLM finishing what it accepted, then its own teardown.
        grace = drain_seconds(args.request_timeout_seconds) + 30

        # The pool's own XLA cache directory on its TPU nodes (the namespace may be another resource's output).
        xla_cache_path = pulumi.Output.from_input(args.namespace).apply(
            lambda ns: xla_cache_host_path(ns, self.service_name)) if args.node_pool.is_tpu else None

        def pod_template(role: str) -> dict[str, Any]:
            """The pod of a replica (role "server"), or of a multi-host group's leader or worker: a
            worker serves no HTTP (no guard, probes or mesh sidecar) and only runs its share."""
            serving = role != "worker"
            template: dict[str, Any] = {
                "metadata": {"labels": {**BASE_LABELS, **labels},
                             "annotations": {
                                 **sidecar_config(),
                                 # A warm replica is minutes of weight loading: the cluster
                                 # autoscaler must not evict it to consolidate nodes.
                                 "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                                 **args.weights.annotations}},
                "spec": {
                    # Its own identity: the weights bucket and the limit store grant to it
                    # alone (MeshNamespace creates it), not to the namespace's default.
                    **({"serviceAccountName": args.service_account} if args.service_account else {}),
                    "terminationGracePeriodSeconds": grace,
                    # The server calls no Kubernetes API: no token to steal.
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(placement.node_selector),
                    "tolerations": [dict(t) for t in placement.tolerations],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": selector}}}]}},
                    "securityContext": {**NON_ROOT, "seccompProfile": {"type": "RuntimeDefault"}},
                    "initContainers": init_containers,
                    "containers": [{
                        "name": "vllm",
                        "image": args.image.uri,
                        "command": ["python3", "/opt/vllm-gke/serve.py"],
                        "args": vllm_args(model, pool, args.release, args.request_timeout_seconds,
                                         args.ttft_slo_seconds, args.traces_endpoint),
                        "ports": [{"name": "http", "containerPort": PORT}],
                        "env": [
                            *RUNTIME_ENV,
                            *wait_env,
                            {"name": "HF_HUB_OFFLINE", "value": "1"},
                            {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
                            {"name": WARM_MARKER_ENV, "value": WARM_MARKER},
                            {"name": STARTUP_WINDOW_ENV, "value": str(startup_window_seconds(args.load_seconds))},
                            {"name": GUARD_CONFIG_ENV,
                             "value": json.dumps(dict(args.guard_config), sort_keys=True)},
                            *(trace_env(args.trace_sample_ratio, self.service_name)
                              if args.traces_endpoint else []),
                        ],
                        "resources": container_resources(
                            args.node_pool, pod_devices, scratch_gi(model, args.weights.through_fuse)),
                        "securityContext": CONTAINER_SECURITY,
                        # Model load plus warm-up can take many minutes: allow 30, or half as
                        # long again as the plan's estimate where that is more (a 405B from a
                        # share), or the kubelet restarts a replica that was still loading.
                        "startupProbe": {"exec": {"command": ["test", "-f", WARM_MARKER]},
                                         "periodSeconds": 10,
                                         "failureThreshold": startup_failure_threshold(args.load_seconds)},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                                           "periodSeconds": 5, "timeoutSeconds": 3,
                                           "failureThreshold": 3},
                        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"},
                                          "periodSeconds": 15, "timeoutSeconds": 5,
                                          "failureThreshold": 6},
                        # Let the load balancer drop the endpoint before vLLM stops.
                        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(pre_stop_seconds(args.node_pool))]}}},
                        "volumeMounts": [*weights_mounts, {"name": "dshm", "mountPath": "/dev/shm"},
                                         {"name": "tmp", "mountPath": "/tmp"},
                                         {"name": "home", "mountPath": HOME}],
                    }],
                    "volumes": [
                        *weights_volumes,
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
                        # Compile caches (torch.compile, Triton, FlashInfer JIT) and scratch.
                        {"name": "tmp", "emptyDir": {"sizeLimit": f"{TMP_GI}Gi"}},
                        {"name": "home", "emptyDir": {"sizeLimit": f"{HOME_GI}Gi"}},
                    ],
                },
            }
            pod = template["spec"]
            container = pod["containers"][0]
            container["args"] = [*container["args"], *group_args(hosts, rel, role)]
            container["env"] = [*group_env(hosts, rel, role), *container["env"]]
            if args.node_pool.is_tpu:  # root for the chips, the node's XLA cache, Ray's health checks
                tpu_pod(template, hosts, xla_cache_path)
            if role == "server":
                return template
            # The group's own traffic (torch.distributed / NCCL, or Ray) goes pod to pod on ports
            # the mesh cannot list: the leader's sidecar takes only the serving port inbound and
            # leaves the pod range outbound; workers have no sidecar. The group's NetworkPolicy
            # admits only its own pods there.
            annotations = template["metadata"]["annotations"]
            if serving:
                annotations["traffic.sidecar.istio.io/includeInboundPorts"] = str(PORT)
                if args.pods_cidr:
                    annotations["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = args.pods_cidr
                return template
            annotations.clear()
            annotations.update({"sidecar.istio.io/inject": "false",
                                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                                **args.weights.annotations})
            # Not the pool's model/pool labels: the Service, PDB and scrape select leaders only.
            template["metadata"]["labels"] = {**BASE_LABELS, GROUP_WORKER_LABEL: self.service_name}
            container["env"] = [e for e in container["env"] if e["name"] != GUARD_CONFIG_ENV]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                container.pop(probe, None)
            container.pop("ports", None)
            # Ready while its leader serves: a recreated group's workers are not counted available
            # (by the PodDisruptionBudget) before the group can answer. No liveness probe: a restart
            # recreates the whole group, and the leader's own probes already watch it.
            container["readinessProbe"] = {"exec": {"command": ["python3", "-c", LEADER_SERVES]},
                                           "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
            return template

        # Pulumi's wait: one replica's load on create (KEDA raises the count later), and at the
        # ceiling a rollout one replica at a time on update; the default 45 min fails a 70B pool of
        # two replicas or more while its rollout still goes well.
        rolling = args.rolling or rollout_strategy(
            None if group_can_surge(pool, hosts, args.node_pool) else 1)
        in_place = rolling["maxUnavailable"] != 0
        behind = args.wait_behind_seconds if in_place else 0.0
        deadline = progress_deadline_seconds(args.load_seconds, grace if in_place else 0, behind)
        update_s = rollout_seconds(pool.max_replicas, args.load_seconds, grace) + behind + 600
        timeouts = pulumi.CustomTimeouts(
            create=f"{math.ceil((NODE_PROVISION_S + args.load_seconds + 600) / 60)}m",
            update=f"{math.ceil(update_s / 60)}m")
        if hosts == 1:
            self.deployment = k8s.apps.v1.Deployment(
                f"{name}-deploy",
                metadata={**meta(self.service_name, labels=labels), "namespace": args.namespace},
                spec=api_body({
                    # KEDA owns the count. A pool that may go to zero starts there (the first `pulumi up`
                    # pays no cold start, and KEDA wakes it on the first request); the others start at
                    # one and KEDA raises them to their floor. ignore_changes below: later updates
                    # never set it back.
                    **({"replicas": 0} if pool.min_replicas == 0 else {}),
                    "selector": {"matchLabels": selector},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(rolling)},
                    # Progress is a new replica Ready: allow for its node and its load, or the
                    # controller reports the rollout failed (and `pulumi up` with it) mid-load.
                    "progressDeadlineSeconds": deadline,
                    "template": pod_template("server"),
                }),
                opts=child_opts(self, opts, provider=args.provider,
                                # A first rollout waits for the weights to load: allow for it.
                                custom_timeouts=timeouts,
                                # With server-side apply, pulumi-kubernetes drops an ignored field that
                                # another manager (KEDA, through the scale subresource) owns, so an
                                # update neither conflicts nor resets the count (pulumi-kubernetes#2566).
                                ignore_changes=["spec.replicas"]))
            self.workload: pulumi.Resource = self.deployment
        else:
            self.group_name = group_name_of(self.service_name)
            self.workload = custom_resource(
                f"{name}-group", LWS_API_VERSION, "LeaderWorkerSet",
                {**meta(self.group_name, labels=labels,
                        # A multi-host TPU slice is a node pool of its own: one group to a slice, all
                        # of it (lws v0.10.0 api/leaderworkerset/v1/leaderworkerset_types.go:29). A GPU
                        # group's pods each take a whole node by their GPU request.
                        annotations={"leaderworkerset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
                        if args.node_pool.is_tpu else None),
                 "namespace": args.namespace},
                leader_worker_set(pool, hosts, pod_template("leader"), pod_template("worker"),
                                  surge=rolling["maxUnavailable"] == 0),
                child_opts(self, opts, provider=args.provider, custom_timeouts=timeouts,
                           ignore_changes=["spec.replicas"]))
            k8s.networking.v1.NetworkPolicy(
                f"{name}-group-netpol",
                metadata={**meta(f"{self.group_name}-group", labels=labels), "namespace": args.namespace},
                spec=api_body(group_network_policy(self.group_name)), opts=k8s_opts)

        self.service = k8s.core.v1.Service(
            f"{name}-svc",
            # A pool that may go to zero shares its Service with a standby that is never ready
            # while the pool serves: Pulumi's wait for a Service with no unready address would
            # fail every update then.
            metadata={**meta(self.service_name, labels=labels,
                             annotations={"pulumi.com/skipAwait": "true"} if pool.min_replicas == 0 else None),
                      "namespace": args.namespace},
            spec=api_body({"type": "ClusterIP", "selector": selector,
                           "ports": [{"name": "http", "port": PORT, "targetPort": "http", "appProtocol": "http"}]}),
            opts=k8s_opts)

        self.pdb = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata={**meta(self.service_name, labels=labels), "namespace": args.namespace},
            # vLLM pods only: the standby is never Ready while the pool serves, and counted here it
            # would leave no disruption allowed, blocking every node drain and upgrade. A group:
            # every pod of it (one evicted takes its whole group down).
            spec=api_body({**disruption_budget(), "selector": {"matchLabels": (
                {LWS_NAME_LABEL: self.group_name} if hosts > 1 else {**selector, **SERVER_LABELS})}}),
            opts=k8s_opts)

        if args.scaling is None:
            raise ValueError(f"{model.name} {args.pool_name} pool: scaling (KEDA) is required")
        from .keda import gmp_query_url

        scaling = args.scaling
        self.autoscaler = custom_resource(
            f"{name}-scaledobject", "keda.sh/v1alpha1", "ScaledObject",
            {**meta(self.service_name, labels=labels), "namespace": args.namespace},
            pulumi.Output.from_input(args.namespace).apply(lambda ns: scaled_object(
                self.service_name, ns, pool, scaling, gmp_query_url(scaling.project),
                group=self.group_name if hosts > 1 else None)),
            child_opts(self, opts, provider=args.provider, depends_on=[self.workload]))

        custom_resource(
            f"{name}-podmonitoring", "monitoring.googleapis.com/v1", "PodMonitoring",
            {**meta(self.service_name, labels=labels), "namespace": args.namespace},
            {"selector": {"matchLabels": selector},
             "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]},
            k8s_opts)

        self.register_outputs({"serviceName": self.service_name, "hosts": hosts,
                               "deployment": self.service_name if hosts == 1 else None,
                               "leaderWorkerSet": self.group_name if hosts > 1 else None})
