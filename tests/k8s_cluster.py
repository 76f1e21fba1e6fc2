"""A stack's manifests on the real Kubernetes control plane in ../shared/k8s (its README): nodes
shaped as GKE shapes each planned node pool, the upstream CRDs, and stand-ins for what Helm
charts run (their pods' requests), so the scheduler, the Deployment, Job and disruption
controllers act on what `pulumi up` would apply."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from vllm_gke.components.model.catalog import MACHINE_TYPES
from vllm_gke.components.model.node_shapes import (
    GKE_PER_CLUSTER_CPU_M,
    GKE_PER_CLUSTER_MEMORY_MI,
    GKE_PER_NODE_CPU_M,
    GKE_PER_NODE_MEMORY_MI,
    MAX_PODS,
    node_shape,
)
from vllm_gke.infra.manifests import unpublished
from vllm_gke.infra.plan import REPO_ROOT, Plan
from vllm_gke.infra.system_pool import FLAGGER_PODS, KEDA_PODS, LWS_PODS

SHARED = REPO_ROOT.parent / "shared"
CONTROL_PLANE = SHARED / "k8s" / "controlplane.py"
CRDS = SHARED / "upstream-crds"
# One CRD file per kind: the versions the stacks pin (gie v1.5.0's InferencePool, which llm-d-router
# v0.10.0 deploys with, and its llm-d.ai kinds: the picker's; v1.2.0's objective CRD, which the stack keeps).
CRD_FILES = (
    "gwapi-v1.6.1-gateways.yaml", "gwapi-v1.6.1-httproutes.yaml", "istio-1.30.3-crds.yaml",
    "gmp-v0.17.2-podmonitorings.yaml", "gke-gcpbackendpolicy-v1-from-datree-bb63420.yaml",
    "gke-healthcheckpolicy-v1-from-datree-bb63420.yaml", "sscsi-v1.6.0-spc.yaml",
    "gke-computeclass-v1-from-datree-77e4983.yaml", "gke-gcpdatasource-v1-from-datree-bc448ef.yaml",
    "keda-chart-v2.20.2-scaledobjects.yaml", "keda-chart-v2.20.2-clustertriggerauthentications.yaml",
    "gie-v1.5.0-inferencepools.yaml", "gie-v1.2.0-inferenceobjectives.yaml", "llmd-router-v0.10.0-inferenceobjectives.yaml",
    "llmd-router-v0.10.0-inferencemodelrewrites.yaml", "lws-v0.10.0-leaderworkersets.yaml",
    "flagger-v1.44.0-crds.yaml",
)
# KEDA holds a paused ScaledObject's target at this count (Flagger pauses a canary's between rollouts).
PAUSED = "autoscaling.keda.sh/paused-replicas"
FAKE_NODE = {"kwok.x-k8s.io/node": "fake"}
TAINT_EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


class ControlPlane:
    """kube-apiserver, controller-manager, scheduler and the node simulator, on loopback."""

    def __init__(self, directory: Path):
        self.dir = directory
        out = subprocess.run(["python3", str(CONTROL_PLANE), "up", str(directory)], check=True,
                             capture_output=True, text=True).stdout
        env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines()
                   if line.startswith("export "))
        self.env = {**os.environ, **env}
        self.kubectl_bin = str(Path(env["K8S_BIN"]) / "kubectl")

    def down(self) -> None:
        subprocess.run(["python3", str(CONTROL_PLANE), "down", str(self.dir)], capture_output=True)

    def kubectl(self, *args: str, stdin: Optional[str] = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.kubectl_bin, *args], input=stdin, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr or done.stdout}")
        return done

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, docs: Iterable[dict[str, Any]], *extra: str) -> None:
        docs = list(docs)
        if not docs:
            return
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": docs}, f)
        self.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pulumi", "-f", f.name,
                     *extra, timeout=300)

    def rules(self, rules: list[dict[str, Any]]) -> None:
        """The node simulator's per-pod behaviour (ConfigMap kube-system/nodesim)."""
        self.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nodesim", "namespace": "kube-system"},
                     "data": {"rules.json": json.dumps(rules)}}])
        time.sleep(1.0)  # read every half second

    def wait_until(self, what: str, check: Any, timeout: float = 120, every: float = 1.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(every)


# --- nodes shaped as GKE shapes each pool --------------------------------------------------------

def _zones(plan: Plan) -> list[str]:
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    return list(cluster.props["nodeLocations"])


def pool_reach(props: dict[str, Any], zones: int) -> tuple[int, int]:
    """(min, max) nodes of a planned node pool: totals, or per zone times its zones."""
    auto = props.get("autoscaling") or {}
    if "totalMaxNodeCount" in auto:
        return int(auto.get("totalMinNodeCount", 0)), int(auto["totalMaxNodeCount"])
    if "maxNodeCount" in auto:
        return int(auto.get("minNodeCount", 0)) * zones, int(auto["maxNodeCount"]) * zones
    count = int(props.get("nodeCount") or props.get("initialNodeCount") or 0)
    return count, count


def gke_node(plan: Plan, pool: dict[str, Any], index: int, zone: str) -> dict[str, Any]:
    """One Node of a planned node pool, with the labels, taints, capacity and allocatable GKE gives it."""
    config = pool["nodeConfig"]
    region = zone.rsplit("-", 1)[0]
    machine = MACHINE_TYPES[config["machineType"]]
    accelerators = config.get("guestAccelerators") or []
    partition = accelerators[0].get("gpuPartitionSize") if accelerators else None
    # A time-shared GPU is offered as maxSharedClientsPerGpu units (GKE's device plugin).
    sharing = (accelerators[0].get("gpuSharingConfig") if accelerators else None) or {}
    shared = int(sharing.get("maxSharedClientsPerGpu", 1))
    acc = machine.accelerator
    shape = node_shape(machine.name, int(config.get("diskSizeGb", 100)),
                       acc.slices_per_gpu(partition) * shared if acc is not None and not acc.is_tpu else 1)
    name = f"gke-{pool['name']}-{zone[-1]}-{index}"
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region,
        "node.kubernetes.io/instance-type": machine.name, "cloud.google.com/gke-nodepool": pool["name"],
        "cloud.google.com/machine-family": machine.name.split("-")[0],
        "cloud.google.com/gke-boot-disk": config.get("diskType", "pd-balanced"),
        "iam.gke.io/gke-metadata-server-enabled": "true", "vllm-gke.io/test": "1",
        **(config.get("labels") or {}),
    }
    if config.get("spot"):
        labels["cloud.google.com/gke-spot"] = "true"
    if acc is not None and acc.is_tpu:
        labels["cloud.google.com/gke-tpu-accelerator"] = acc.gke_type
        topology = (pool.get("placementPolicy") or {}).get("tpuTopology") or machine.tpu_topologies[0]
        labels["cloud.google.com/gke-tpu-topology"] = topology
    elif acc is not None:
        labels["cloud.google.com/gke-accelerator"] = acc.gke_type
        if partition:
            labels["cloud.google.com/gke-gpu-partition-size"] = partition
        if sharing:  # the labels GKE puts on time-shared nodes
            labels["cloud.google.com/gke-gpu-sharing-strategy"] = "time-sharing"
            labels["cloud.google.com/gke-max-shared-clients-per-gpu"] = str(shared)
    taints = [{"key": t["key"], "value": t["value"], "effect": TAINT_EFFECT[t["effect"]]}
              for t in config.get("taints") or []]
    if acc is not None and not any(t["key"] == acc.resource for t in taints):
        taints.append({"key": acc.resource, "value": "present", "effect": "NoSchedule"})  # GKE adds it
    resources = {"cpu": f"{shape.cpu_m}m", "memory": f"{shape.memory_mi}Mi",
                 "ephemeral-storage": f"{shape.disk_gib}Gi", "pods": str(MAX_PODS)}
    allocatable = {"cpu": f"{shape.alloc_cpu_m}m", "memory": f"{shape.alloc_memory_mi}Mi",
                   "ephemeral-storage": f"{int(shape.alloc_disk_gib * 1024)}Mi", "pods": str(MAX_PODS)}
    if shape.device_resource:
        resources[shape.device_resource] = allocatable[shape.device_resource] = str(shape.devices)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": dict(FAKE_NODE)},
            "spec": {"taints": taints, "podCIDR": f"10.{64 + index // 256}.{index % 256}.0/24"},
            "status": {"capacity": resources, "allocatable": allocatable}}


def gke_nodes(plan: Plan, counts: Optional[dict[str, int]] = None) -> list[dict[str, Any]]:
    """Every node pool's nodes, spread over its zones: `counts` per pool, else the most each may
    reach (there is no cluster autoscaler here to add them)."""
    zones = _zones(plan)
    out: list[dict[str, Any]] = []
    serial = 0
    for r in plan.of_type("gcp:container/nodePool:NodePool"):
        pool = r.props
        pool_zones = list(pool.get("nodeLocations") or zones)
        want = (counts or {}).get(pool["name"], pool_reach(pool, len(pool_zones))[1])
        for i in range(want):
            out.append(gke_node(plan, pool, serial, pool_zones[i % len(pool_zones)]))
            serial += 1
    return out



# --- a stack applied ------------------------------------------------------------------------------

TEST_LABEL = {"vllm-gke.io/test": "1"}


def _labelled(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    doc["metadata"].setdefault("labels", {}).update(TEST_LABEL)
    return doc


def chart_stand_ins(plan: Plan) -> list[dict[str, Any]]:
    """Pods with the requests of what GKE itself, the Helm charts and release manifests run (no
    images run here; the scheduler and the room each pool leaves are what matter)."""
    uses_lws = any(d["kind"] == "LeaderWorkerSet" for d in plan.manifests())
    # GKE's own pods: its agents on every node (they tolerate every taint), and the cluster's
    # (kube-dns, konnectivity, metrics-server) on the system pool, as two pods.
    def pause(cpu: int, mem: int) -> dict[str, Any]:
        return {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": f"{cpu}m", "memory": f"{mem}Mi"}}}]}

    out: list[dict[str, Any]] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gke-node-agents", "namespace": "kube-system"},
         "spec": {"selector": {"matchLabels": {"stand-in": "gke-node-agents"}},
                  "template": {"metadata": {"labels": {"stand-in": "gke-node-agents"}},
                               "spec": {**pause(GKE_PER_NODE_CPU_M, GKE_PER_NODE_MEMORY_MI),
                                        "tolerations": [{"operator": "Exists"}]}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gke-cluster-pods", "namespace": "kube-system"},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"stand-in": "gke-cluster-pods"}},
                  "template": {"metadata": {"labels": {"stand-in": "gke-cluster-pods"}},
                               "spec": pause(GKE_PER_CLUSTER_CPU_M // 2, GKE_PER_CLUSTER_MEMORY_MI // 2)}}}]
    uses_flagger = any(d["kind"] == "Canary" for d in plan.manifests())
    for namespace, pods in (("keda", KEDA_PODS), ("lws-system", LWS_PODS if uses_lws else ()),
                            ("flagger-system", FLAGGER_PODS if uses_flagger else ())):
        for what, replicas, cpu, mem in pods:
            name = what.lower().replace(" ", "-")
            spec = pause(cpu, mem)
            out.append({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"replicas": replicas, "selector": {"matchLabels": {"stand-in": name}},
                                 "template": {"metadata": {"labels": {"stand-in": name}}, "spec": spec}}})
    return out


def apply_stack(cp: ControlPlane, plan: Plan, counts: Optional[dict[str, int]] = None) -> list[dict[str, Any]]:
    """Nodes, namespaces, then every manifest of the plan (server-side, as pulumi-kubernetes
    applies), then KEDA's part: each scaled workload raised to its floor. Returns the manifests."""
    docs = [_labelled(d) for d in plan.manifests()]
    cp.apply(gke_nodes(plan, counts))
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    extra = {"keda", "lws-system"} - {d["metadata"]["name"] for d in namespaces}
    namespaces += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": dict(TEST_LABEL)}}
                   for n in sorted(extra)]
    cp.apply(namespaces)
    rest = [d for d in docs if d["kind"] != "Namespace"]
    stand_ins = unpublished_crds(rest)
    if stand_ins:
        cp.apply(stand_ins)
        crds_established(cp)
    flagger = [_labelled(d) for d in flagger_stand_ins(rest)]
    cp.apply(rest + [_labelled(d) for d in chart_stand_ins(plan)] + flagger)
    docs = [_paused(d, rest) for d in docs] + [d for d in flagger if d["kind"] == "ScaledObject"]
    keda_floor(cp, docs)
    return docs


def unpublished_crds(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A CRD that admits any spec for each kind no CRD is published for (infra/manifests.UNPUBLISHED_CRDS):
    so the API server stores them; their fields are checked elsewhere (the plan says where)."""
    kinds = {(d["apiVersion"], d["kind"]) for d in docs if unpublished(d)}
    out = []
    for api_version, kind in sorted(kinds):
        group, version = api_version.split("/")
        plural = kind.lower() + "s"
        out.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": f"{plural}.{group}"},
                    "spec": {"group": group, "scope": "Namespaced",
                             "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                             "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                                 "type": "object", "properties": {"spec": {
                                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}})
    return out


def crds_established(cp: "ControlPlane") -> None:
    """Every CRD Established. A CRD the API server has not yet given a status makes `kubectl wait`
    fail at once (its .status.conditions is nil) rather than wait: until then, ask again."""
    def established() -> bool:
        crds = cp.get("crds")["items"]
        return all(any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []) for crd in crds)

    cp.wait_until("every CRD Established", established, 120)


def _paused(doc: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """A Flagger target's ScaledObject as Flagger leaves it once the primary serves: paused at 0."""
    targets = {(c["metadata"]["namespace"], c["spec"]["autoscalerRef"]["name"]) for c in docs if c["kind"] == "Canary"}
    if doc["kind"] != "ScaledObject" or (doc["metadata"]["namespace"], doc["metadata"]["name"]) not in targets:
        return doc
    doc = json.loads(json.dumps(doc))
    doc["metadata"].setdefault("annotations", {})[PAUSED] = "0"
    return doc


def flagger_stand_ins(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Flagger v1.44.0 makes of each Canary once initialised (no Flagger runs here): the primary
    Deployment, a copy of the target whose selector label is suffixed -primary
    (pkg/canary/deployment_controller.go createPrimaryDeployment:234-318, makePrimaryLabels), its
    ScaledObject with the Canary's primary queries and replicas (pkg/canary/scaled_object_reconciler.go
    reconcilePrimaryScaler:38-110), and the Services and HTTPRoute (policies/flagger_objects.py)."""
    from vllm_gke.policies.flagger_objects import flagger_objects, selector_label

    found = {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["metadata"].get("namespace")}
    canaries = [d for d in docs if d["kind"] == "Canary"]
    out: list[dict[str, Any]] = flagger_objects(canaries, [d for d in docs if d["kind"] == "Deployment"])
    for c in canaries:
        ns, spec = c["metadata"]["namespace"], c["spec"]
        target = json.loads(json.dumps(found[("Deployment", ns, spec["targetRef"]["name"])]))
        label, value = selector_label(target) or ("", "")
        primary = f"{target['metadata']['name']}-primary"
        target["metadata"] = {"name": primary, "namespace": ns, "labels": {**target["metadata"].get("labels", {}),
                                                                            label: f"{value}-primary"}}
        target["spec"]["selector"] = {"matchLabels": {label: f"{value}-primary"}}
        target["spec"]["template"]["metadata"]["labels"][label] = f"{value}-primary"
        target["spec"]["replicas"] = 1
        out.append(target)
        if ("ScaledObject", ns, f"{spec['autoscalerRef']['name']}-primary") in found:
            continue  # the plan declares the primary's ScaledObject as Flagger computes it
        so = json.loads(json.dumps(found[("ScaledObject", ns, spec["autoscalerRef"]["name"])]))
        replicas = spec["autoscalerRef"].get("primaryScalerReplicas") or {}
        so["metadata"] = {"name": f"{so['metadata']['name']}-primary", "namespace": ns}
        so["spec"]["scaleTargetRef"]["name"] = primary
        so["spec"]["minReplicaCount"] = replicas.get("minReplicas", so["spec"]["minReplicaCount"])
        so["spec"]["maxReplicaCount"] = replicas.get("maxReplicas", so["spec"]["maxReplicaCount"])
        for trigger in so["spec"]["triggers"]:
            if trigger.get("name") in (spec["autoscalerRef"].get("primaryScalerQueries") or {}):
                trigger["metadata"]["query"] = spec["autoscalerRef"]["primaryScalerQueries"][trigger["name"]]
        out.append(so)
    return out


def keda_floor(cp: ControlPlane, docs: list[dict[str, Any]], bound: str = "minReplicaCount") -> None:
    """What KEDA's operator does with each ScaledObject: its target scaled to its floor (or, with
    bound maxReplicaCount, to its ceiling)."""
    for so in (d for d in docs if d["kind"] == "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]
        kind = target.get("kind", "Deployment").lower()
        count = so["spec"].get(bound, 0 if bound == "minReplicaCount" else 1)
        paused = (so["metadata"].get("annotations") or {}).get(PAUSED)
        count = int(paused) if paused is not None else count
        cp.kubectl("scale", kind, target["name"], "-n", so["metadata"]["namespace"], f"--replicas={count}")


def unscheduled(cp: ControlPlane) -> list[str]:
    pods = cp.get("pods", "-A")["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
            if not p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"]


def failed_scheduling(cp: ControlPlane) -> list[str]:
    events = cp.get("events", "-A", "--field-selector", "reason=FailedScheduling")["items"]
    return [f"{e['involvedObject'].get('namespace')}/{e['involvedObject']['name']}: {e['message']}" for e in events]


def workloads_settled(cp: ControlPlane) -> Optional[str]:
    """None once every Deployment is rolled out and available and every Job complete; else what is not."""
    for d in cp.get("deployments", "-A")["items"]:
        want = d["spec"].get("replicas", 1)
        st = d.get("status") or {}
        if (st.get("updatedReplicas", 0) < want or st.get("availableReplicas", 0) < want
                or st.get("replicas", 0) > want or st.get("observedGeneration", 0) < d["metadata"]["generation"]):
            return f"deployment {d['metadata']['namespace']}/{d['metadata']['name']}: {st}"
    for t in cp.get("statefulsets", "-A")["items"]:
        if (t.get("status") or {}).get("readyReplicas", 0) < t["spec"].get("replicas", 1):
            return f"statefulset {t['metadata']['namespace']}/{t['metadata']['name']}: {t.get('status')}"
    for j in cp.get("jobs", "-A")["items"]:
        if not (j.get("status") or {}).get("succeeded"):
            return f"job {j['metadata']['namespace']}/{j['metadata']['name']}: {j.get('status')}"
    return None


def settle(cp: ControlPlane, timeout: float = 120) -> None:
    def done() -> bool:
        return workloads_settled(cp) is None

    try:
        cp.wait_until("every Deployment available and every Job complete", done, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {workloads_settled(cp)}; pending {unscheduled(cp)}; "
                             f"{failed_scheduling(cp)[-5:]}") from None


__all__ = ["ControlPlane", "apply_stack", "gke_nodes", "keda_floor", "pool_reach", "settle", "unscheduled"]


def group_stand_ins(lws: dict[str, Any], groups: int) -> list[dict[str, Any]]:
    """What LeaderWorkerSet v0.10.0's controller makes of a set (no controller runs here): a
    StatefulSet of leaders `<set>-<i>` and, per group, one of workers `<set>-<i>-<j>`, each pod
    labelled with the set's name, group and worker index (kubernetes-sigs/lws v0.10.0
    pkg/controllers/leaderworkerset_controller.go, pkg/controllers/pod_controller.go)."""
    name, ns = lws["metadata"]["name"], lws["metadata"]["namespace"]
    lwt = lws["spec"]["leaderWorkerTemplate"]

    def stateful_set(set_name: str, template: dict[str, Any], replicas: int, labels: dict[str, str],
                     first: int = 0) -> dict[str, Any]:
        template = json.loads(json.dumps(template))
        template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        return {"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": set_name, "namespace": ns, "labels": dict(TEST_LABEL)},
                "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                         "ordinals": {"start": first}, "selector": {"matchLabels": labels}, "template": template}}

    base = {"leaderworkerset.sigs.k8s.io/name": name}
    out = [stateful_set(name, lwt["leaderTemplate"], groups, {**base, "leaderworkerset.sigs.k8s.io/worker-index": "0"})]
    for group in range(groups):
        out.append(stateful_set(f"{name}-{group}", lwt["workerTemplate"], int(lwt["size"]) - 1,
                                {**base, "leaderworkerset.sigs.k8s.io/group-index": str(group),
                                 "leaderworkerset.sigs.k8s.io/worker-role": "worker"}, first=1))
    return out
