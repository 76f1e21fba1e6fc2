"""Replicas across hosts: a LeaderWorkerSet group per replica, the leader serving behind the guard
and the mesh, the workers running their ranks (vLLM --headless on GPUs, Ray workers on a TPU slice),
scaled, budgeted and probed per group."""

from __future__ import annotations

import copy
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT, manifests_of
from tests.test_config import issues
from vllm_gke.components.model.cold_start import cold_start_seconds
from vllm_gke.components.model.serving_pool import group_can_surge, startup_failure_threshold
from vllm_gke.components.model.specs import NodePoolSpec, ServingPoolSpec
from vllm_gke.components.model.vllm_argv import check_argv, load_snapshot
from vllm_gke.infra.config import parse
from vllm_gke.policies.rules import Resource, evaluate

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def _group(plan, prefix: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests_of(plan, "LeaderWorkerSet") if d["metadata"]["name"].startswith(prefix)]
    return doc


def _templates(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    lwt = doc["spec"]["leaderWorkerTemplate"]
    return lwt["leaderTemplate"], lwt["workerTemplate"]


def _vllm(template: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return c


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_a_replica_across_two_h100_hosts_is_one_group(plans):
    doc = _group(plans["frontier"], "llama-405b")
    assert doc["metadata"]["name"] == "llama-405b-short-group"
    spec = doc["spec"]
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["startupPolicy"] == "LeaderCreated"
    # Two hosts at most in the pool, one group: no room for a surge group, so a rollout replaces it in
    # place (a surge group with nowhere to land would hold the rollout forever); KEDA owns the count.
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert spec["replicas"] == 0
    leader, worker = (_vllm(t) for t in _templates(doc))
    for c in (leader, worker):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # each pod a whole a3-highgpu-8g
        args = c["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--distributed-executor-backend") + 1] == "mp"
        # Both parse with the release's real parser once the kubelet has put the values in.
        assert check_argv(args, load_snapshot("0.34.0")) == []
    assert leader["args"][leader["args"].index("--node-rank") + 1] == "0" and "--headless" not in leader["args"]
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "--headless" in worker["args"]


def test_only_the_leader_serves_and_the_workers_are_closed(plans):
    plan = plans["frontier"]
    doc = _group(plan, "llama-405b")
    leader_t, worker_t = _templates(doc)
    leader, worker = _vllm(leader_t), _vllm(worker_t)
    # The leader is a replica like any other: guard config, probes, serving port, mesh sidecar.
    assert "GKE_LLM_GUARD_CONFIG" in _env(leader) and leader["ports"][0]["containerPort"] == 8000
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert leader_t["metadata"]["annotations"]["traffic.sidecar.istio.io/includeInboundPorts"] == "8000"
    assert leader_t["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeOutboundIPRanges"] == \
        plan.config.cluster.pods_cidr
    # The worker: no API, no guard config, no ports, no sidecar, not selected as a server; ready only
    # while its leader's server answers (so a reloading group counts as unavailable to the PDB), and
    # no liveness probe (a restart recreates the whole group).
    assert "GKE_LLM_GUARD_CONFIG" not in _env(worker) and "ports" not in worker
    assert not {"startupProbe", "livenessProbe"} & set(worker)
    ready = worker["readinessProbe"]["exec"]["command"]
    assert ready[:2] == ["python3", "-c"] and "LWS_LEADER_ADDRESS" in ready[2] and ":8000/metrics" in ready[2]
    assert worker_t["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    (svc,) = [s for s in manifests_of(plan, "Service") if s["metadata"]["name"] == "llama-405b-short"]
    selector = svc["spec"]["selector"]
    assert all(leader_t["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert not all(worker_t["metadata"]["labels"].get(k) == v for k, v in selector.items())
    # Not the LWS's name: its controller takes that one for the group's headless Service.
    assert svc["metadata"]["name"] != doc["metadata"]["name"]
    (pool,) = [p for p in manifests_of(plan, "InferencePool") if p["metadata"]["name"] == "llama-405b"]
    picked = pool["spec"]["selector"]["matchLabels"]
    assert all(leader_t["metadata"]["labels"].get(k) == v for k, v in picked.items())
    assert not all(worker_t["metadata"]["labels"].get(k) == v for k, v in picked.items())
    # The group's own ports (torch.distributed, NCCL) admit the group alone.
    (netpol,) = [n for n in manifests_of(plan, "NetworkPolicy")
                 if n["spec"]["podSelector"].get("matchLabels", {}).get(LWS_NAME) == doc["metadata"]["name"]]
    open_rules = [r for r in netpol["spec"]["ingress"] if not r.get("ports")]
    assert open_rules == [{"from": [{"podSelector": {"matchLabels": {LWS_NAME: doc["metadata"]["name"]}}}]}]


def test_keda_scales_groups_on_the_leaders_metrics(plans):
    plan = plans["frontier"]
    doc = _group(plan, "llama-405b")
    (so,) = [s for s in manifests_of(plan, "ScaledObject") if s["metadata"]["name"] == "llama-405b-short"]
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                            "name": doc["metadata"]["name"]}
    query = next(t["metadata"]["query"] for t in so["spec"]["triggers"] if "num_requests_waiting" in t["metadata"]["query"])
    pattern = re.search(r'pod=~"([^"]+)"', query)
    assert pattern is not None
    # Leaders are <group>-<index>; workers <group>-<index>-<n> (no vLLM metrics) are not matched.
    assert re.fullmatch(pattern[1], "llama-405b-short-group-0")
    assert not re.fullmatch(pattern[1], "llama-405b-short-group-0-1")


def test_a_rollout_surges_a_group_only_where_the_pool_has_its_hosts():
    pool = ServingPoolSpec(min_replicas=1, max_replicas=2)
    a3 = NodePoolSpec(name="p", machine_type="a3-highgpu-8g", max_nodes=4)
    assert not group_can_surge(pool, 2, a3)  # 2 groups of 2 fill 4 nodes
    assert group_can_surge(pool, 2, a3.model_copy(update={"max_nodes": 6}))
    spot = NodePoolSpec(name="p", machine_type="a3-highgpu-8g", max_nodes=3, spot=True)
    assert group_can_surge(pool, 2, spot)  # its on-demand twin has 3 more
    slice_ = NodePoolSpec(name="p", machine_type="ct6e-standard-4t", tpu_topology="2x4", max_nodes=2)
    assert not group_can_surge(ServingPoolSpec(min_replicas=0, max_replicas=1), 2, slice_)
    # Not with an on-demand twin either: the surge group lands on the twin only while the group runs on spot.
    twin = slice_.model_copy(update={"spot": True})
    assert twin.has_fallback_pool and not group_can_surge(ServingPoolSpec(min_replicas=0, max_replicas=1), 2, twin)


def test_a_group_is_the_unit_of_disruption_and_startup(plans):
    plan = plans["frontier"]
    doc = _group(plan, "llama-405b")
    (pdb,) = [p for p in manifests_of(plan, "PodDisruptionBudget") if p["metadata"]["name"] == "llama-405b-short"]
    assert pdb["spec"]["selector"]["matchLabels"] == {LWS_NAME: doc["metadata"]["name"]}
    # One pod, so one group, at a time, whatever the floor: a drain is never held.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    # 810 GB from the share: the probe waits 1.5x the estimate, and never under 30 minutes.
    leader = _vllm(_templates(doc)[0])
    threshold = leader["startupProbe"]["failureThreshold"]
    load = cold_start_seconds(plan.config, plan.config.model("llama-405b"))
    assert load > 900 and threshold == startup_failure_threshold(load) and threshold * 10 >= max(1800, 1.5 * load)


def test_a_tpu_slice_group_runs_a_ray_cluster_of_its_hosts(plans):
    doc = _group(plans["frontier"], "llama-70b-tpu")
    assert doc["spec"]["leaderWorkerTemplate"]["size"] == 4  # a 4x4 slice of 4-chip hosts
    # One group to a slice, the slice's node pool all of it.
    assert doc["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == \
        "cloud.google.com/gke-nodepool"
    leader, worker = (_vllm(t) for t in _templates(doc))
    assert _env(leader)["TPU_MULTIHOST_BACKEND"] == _env(worker)["TPU_MULTIHOST_BACKEND"] == "ray"
    assert _env(leader)["GKE_LLM_RAY_HEAD_NODES"] == "4"
    assert _env(worker)["GKE_LLM_RAY_JOIN"] == "$(LWS_LEADER_ADDRESS):6379"
    for c in (leader, worker):
        assert c["resources"]["limits"]["google.com/tpu"] == "4"
        assert "--nnodes" not in c["args"]  # vLLM's TPU build spans hosts through Ray only
    assert leader["args"][leader["args"].index("--tensor-parallel-size") + 1] == "16"


def test_the_controller_comes_with_the_first_multi_host_model(plans):
    def installed(plan) -> bool:
        return any(r.type == "vllm-gke:index:LeaderWorkerSetController" for r in plan.resources)

    assert installed(plans["frontier"]) and not installed(plans["prod"])
    # Its webhooks serve before any set is created: a Job dry-runs one through them, allowed to
    # create (dry-run) sets in the controller's namespace and nothing else.
    (job,) = [j for j in manifests_of(plans["frontier"], "Job") if j["metadata"]["name"] == "lws-webhook-ready"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["create", "--dry-run=server", "-f", "/probe/probe.json"]
    (role,) = [r for r in manifests_of(plans["frontier"], "Role") if r["metadata"]["name"] == "lws-webhook-ready"]
    assert role["rules"] == [{"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"],
                              "verbs": ["create"]}]
    firewalls = [r.props for r in plans["frontier"].of_type("gcp:compute/firewall:Firewall")]
    assert any(f["allows"] == [{"protocol": "tcp", "ports": ["9443"]}] and "LeaderWorkerSet" in f["description"]
               for f in firewalls)


def test_a_gpu_group_takes_whole_nodes(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-405b")
    model["tensorParallelSize"], model["pipelineParallelSize"] = 4, 3  # 12 GPUs: a node and a half
    found = issues(values)
    assert any(i.startswith("vllm-gke:models[llama-405b].tensorParallelSize:") and "not a multiple of them" in i
               and "use a multiple of 8" in i for i in found), found


def test_a_gpu_group_pool_upgrades_a_group_at_once_and_names_fit(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    next(p for p in values["vllm-gke:nodePools"] if p["name"] == "h100-hosts")["upgrade"] = {"maxSurge": 1}
    found = issues(values)
    assert any(i.startswith("vllm-gke:nodePools[h100-hosts].upgrade.maxSurge:") and "set maxSurge to 2" in i
               for i in found), found
    values = copy.deepcopy(stack_values["frontier"])
    model = next(m for m in values["vllm-gke:models"] if m["name"] == "llama-405b")
    # The longest name a model may have, with a canary: its canary's set would name pods whose
    # revision label (<set>-<index>-<hash>) passes 63 characters.
    name = "l" * 32
    model.update(name=name, routing="length", canary={"revision": "abc123", "weight": 10},
                 long={"minReplicas": 0, "maxReplicas": 1, "maxNumSeqs": 8})
    for t in values["vllm-gke:tenants"]:
        t["models"] = [name if m == "llama-405b" else m for m in t["models"]]
    found = issues(values)
    assert any(f"vllm-gke:models[{name}].name:" in i and "63 characters" in i for i in found), found


def test_policies_hold_group_workers_closed(plans):
    resources = list(plans["frontier"].policy_resources())
    assert not [v for v in evaluate(resources) if v.policy == "group-workers-closed"]

    def mutated(change) -> list[str]:
        out: list[Resource] = []
        for r in resources:
            if r.props.get("kind") == "LeaderWorkerSet" and str((r.props.get("metadata") or {}).get("name")).startswith(
                    "llama-405b"):
                props = copy.deepcopy(dict(r.props))
                change(props)
                r = Resource(r.type, r.name, props, r.urn)
            out.append(r)
        return [v.message for v in evaluate(out) if v.policy == "group-workers-closed"]

    def serving_worker(props):
        worker = props["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        worker["args"] = [a for a in worker["args"] if a != "--headless"]
        worker["ports"] = [{"containerPort": 8000}]

    found = mutated(serving_worker)
    assert any("not a group worker" in m for m in found) and any("declares ports" in m for m in found)

    def renamed(props):
        props["metadata"]["name"] = "elsewhere"

    assert any("NetworkPolicy" in m for m in mutated(renamed))


def _fake_bin(tmp_path: Path, name: str, script: str) -> None:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_entrypoint(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", **env}
    return subprocess.run([sys.executable, str(REPO_ROOT / "images" / "serve.py"), *args], env=full,
                          capture_output=True, text=True, timeout=60)


def test_a_headless_worker_runs_vllm_without_a_warm_up(tmp_path):
    """The entrypoint starts `vllm serve --headless` and waits on it: no /health to poll, no warm
    marker (a worker has no startup probe)."""
    _fake_bin(tmp_path, "vllm", f'echo "$@" > {tmp_path}/argv\nexit 3\n')
    marker = tmp_path / "warm"
    done = _run_entrypoint(tmp_path, ["/models/m", "--nnodes", "2", "--node-rank", "1", "--headless"],
                           {"GKE_LLM_WARM_MARKER": str(marker)})
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "argv").read_text().split() == ["serve", "/models/m", "--nnodes", "2", "--node-rank", "1",
                                                        "--headless"]
    assert not marker.exists()


def test_a_tpu_worker_joins_the_leaders_ray_cluster_and_runs_no_vllm(tmp_path):
    _fake_bin(tmp_path, "ray", f'echo "$@" > {tmp_path}/ray-argv\n')
    _fake_bin(tmp_path, "vllm", f'touch {tmp_path}/vllm-ran\n')
    done = _run_entrypoint(tmp_path, ["/models/m", "--tensor-parallel-size", "8"],
                           {"GKE_LLM_RAY_JOIN": "leader.group.ns:6379"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ray-argv").read_text().split() == ["start", "--address=leader.group.ns:6379", "--block"]
    assert not (tmp_path / "vllm-ran").exists()


def test_a_tpu_worker_retries_until_the_head_is_up(tmp_path):
    """The group's pods start together: a worker that finds no head yet tries again."""
    tries = tmp_path / "tries"
    _fake_bin(tmp_path, "ray", f'echo x >> {tries}\n[ $(wc -l < {tries}) -ge 3 ]\n')
    sys.path.insert(0, str(REPO_ROOT / "images"))
    try:
        import serve  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        assert serve.join_ray("leader:6379", stopped=lambda: False, sleep=lambda _s: None) == 0
    finally:
        os.environ["PATH"] = old
    assert len(tries.read_text().split()) == 3
    ticks = iter([0.0, 700.0])
    _fake_bin(tmp_path, "ray", "exit 1\n")
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        assert serve.join_ray("leader:6379", stopped=lambda: False, sleep=lambda _s: None,
                              clock=lambda: next(ticks)) == 1  # gives up after its timeout
    finally:
        os.environ["PATH"] = old


def test_a_stopped_tpu_worker_is_not_joined_again(tmp_path):
    """SIGTERM ends `ray start --block`; the entrypoint forwards it and exits, not retrying."""
    import signal
    import time

    _fake_bin(tmp_path, "ray", f'echo x >> {tmp_path}/tries\ntrap "exit 1" TERM\nsleep 30 & wait\n')
    full = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "GKE_LLM_RAY_JOIN": "leader:6379"}
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "images" / "serve.py"), "/models/m"], env=full)
    for _ in range(100):
        if (tmp_path / "tries").exists():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 1
    assert (tmp_path / "tries").read_text().split() == ["x"]


def test_a_tpu_leader_waits_for_every_host_before_vllm_starts():
    sys.path.insert(0, str(REPO_ROOT / "images"))
    try:
        import serve  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    started: list[list[str]] = []
    joined = iter([1, 1, 2])
    original = serve.subprocess.run
    serve.subprocess.run = lambda argv, **_kw: started.append(list(argv))  # type: ignore[assignment]
    try:
        assert serve.start_ray_head(2, stopped=lambda: False, alive=lambda: next(joined), sleep=lambda _s: None)
    finally:
        serve.subprocess.run = original  # type: ignore[assignment]
    assert started == [["ray", "start", "--head", "--port=6379", "--disable-usage-stats"]]
    assert next(joined, None) is None  # polled until both hosts were in


def _l4_tensor_parallel_2(values: dict[str, Any]) -> dict[str, Any]:
    """The mistake of issue 35: tensorParallelSize 2 on a pool of one-L4 g2-standard-8 nodes."""
    values["vllm-gke:nodePools"][0].update(machineType="g2-standard-8", minNodes=0, maxNodes=2,
                                           upgrade={"maxSurge": 2})
    values["vllm-gke:nodePools"][0].pop("gpuPartitionSize")
    values["vllm-gke:models"][0].update(tensorParallelSize=2)
    values["vllm-gke:models"][0]["short"].update(minReplicas=0)
    values["vllm-gke:models"][0]["long"].update(minReplicas=0)
    return values


def test_spanning_hosts_is_a_choice_named_by_its_key(dev_values):
    found = issues(_l4_tensor_parallel_2(dev_values))
    (problem,) = [i for i in found if "multiHost" in i]
    assert problem.startswith("vllm-gke:models[qwen-7b].multiHost: is not set")
    assert "g2-standard-8's 1 GPU(s) per node" in problem and "over TCP at 16 Gbps (no GPUDirect" in problem
    assert "set multiHost: true" in problem and "lower tensorParallelSize x pipelineParallelSize to 1" in problem


def test_a_tpu_slice_across_hosts_is_a_choice_too(stack_values):
    values = copy.deepcopy(stack_values["frontier"])
    next(m for m in values["vllm-gke:models"] if m["name"] == "llama-70b-tpu").pop("multiHost")
    (problem,) = issues(values)
    assert problem.startswith("vllm-gke:models[llama-70b-tpu].multiHost: is not set, but pool 'v6e-4x4' is a 4x4 "
                              "slice of 4 ct6e-standard-4t hosts")


def test_a_chosen_replica_over_tcp_is_warned_with_its_cost(dev_values):
    from vllm_gke.infra.advice import plan_warnings
    from vllm_gke.infra.config import parse

    values = _l4_tensor_parallel_2(dev_values)
    values["vllm-gke:models"][0]["multiHost"] = True
    (warning,) = [w for w in plan_warnings(parse(values), "BASIC_HDD") if "over TCP" in w]
    assert warning.startswith("qwen-7b: a replica spans 2 g2-standard-8 hosts, and its tensor-parallel all-reduces")
    assert "at 16 Gbps" in warning and "% below the same GPUs on one fabric" in warning
    assert "g2-standard-8 has no GPUDirect interconnect" in warning


def test_pipeline_stages_on_gpudirect_hosts_are_not_warned(plans):
    """405B's stages pass a few MB a step over a3-highgpu-8g's 200 Gbps: under the warning's 5%."""
    from vllm_gke.infra.advice import plan_warnings

    plan = plans["frontier"]
    assert not [w for w in plan_warnings(plan.config, plan.platform.store.tier) if "over TCP" in w]


def test_a_gpu_group_stays_in_one_zone(stack_values):
    """A GPU pool spreads its nodes over cluster.zones: a group's hosts could land apart. Refused,
    not pinned (a group's zone cannot be told to its workers' affinity before it is scheduled)."""
    values = copy.deepcopy(stack_values["frontier"])
    values["vllm-gke:cluster"]["zones"] = ["us-east5-b", "us-east5-c"]
    found = issues(values)
    assert any(i.startswith("vllm-gke:cluster.zones: lists 2 zones, over which GPU pool 'h100-hosts' spreads its "
                            "nodes, but a replica on it spans 2 hosts") and "list one zone" in i for i in found), found
    # A TPU slice is zonal by itself (tpuZone): only the GPU pool is named.
    assert not any("v6e-4x4" in i and "cluster.zones" in i for i in found)


def test_groups_across_hosts_need_an_enforced_network_policy(stack_values):
    """Without Dataplane V2 GKE enforces no NetworkPolicy, and a group's is the only lock on its Ray and
    torch.distributed ports: refused, naming the key and that only a new cluster can have it."""
    values = copy.deepcopy(stack_values["frontier"])
    values["vllm-gke:cluster"]["dataplaneV2"] = False
    found = [i for i in issues(values) if i.startswith("vllm-gke:cluster.dataplaneV2:")]
    assert len(found) == 1 and "llama-405b, llama-70b-tpu span hosts" in found[0]
    assert "recreates the cluster" in found[0] and "keep each replica within one node" in found[0]
    # a stack of single-node replicas keeps its warning only
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:cluster"]["dataplaneV2"] = False
    assert parse(values).cluster.dataplane_v2 is False
