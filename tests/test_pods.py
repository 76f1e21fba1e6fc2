"""The pods of a serving pool and its standby, and the pool's numbers and checks, built from typed
facts with no Pulumi (components/model/pods/, components/model/serving_pool.py)."""

from __future__ import annotations

import json
from typing import Any

from vllm_gke.components.model.k8s_objects import BASE_LABELS, MODEL_LABEL, POOL_LABEL, TENANT_LABEL, content_digest
from vllm_gke.components.model.pods.server import (
    GROUP_WORKER_LABEL,
    LEADER_SERVES,
    ServerPod,
    leader_pod,
    server_pod,
    worker_pod,
)
from vllm_gke.components.model.pods.standby import (
    RETRY_AFTER_S,
    STANDBY_LABEL,
    UID,
    StandbyPod,
    ready_service_spec,
    standby_deployment_spec,
    standby_labels,
)
from vllm_gke.components.model.serving_pool import (
    LWS_NAME_LABEL,
    SERVER_LABELS,
    budget_spec,
    check_callers,
    check_pool,
    grace_seconds,
    pool_identity,
    rollout,
    service_spec,
    startup_failure_threshold,
)
from vllm_gke.components.model.specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec, TenantSpec
from vllm_gke.components.model.vllm_server import (
    GUARD_CONFIG_ENV,
    STARTUP_WINDOW_ENV,
    WEIGHTS_MARKERS_ENV,
    XLA_CACHE_DIR,
)
from vllm_gke.components.model.vllm_versions import TPU_RELEASES, release
from vllm_gke.components.model.weights_mount import WeightsMount, claim_mount

GUARD = {"issuers": [{"issuer": "https://i.example", "tenant": "t"}], "routes": []}
SMALL = ModelSpec(name="qwen-7b", source="hf://Qwen/Qwen2.5-7B-Instruct", shape="qwen2.5-7b", node_pool="l4",
                  revision="abc/def", short={"max_num_seqs": 8}, long={"max_num_seqs": 2})
L4 = NodePoolSpec(name="l4", machine_type="g2-standard-8", max_nodes=3)
# Two a3 hosts a replica: a LeaderWorkerSet group of a leader and one worker.
BIG = ModelSpec(name="llama-405b", source="hf://meta-llama/Llama-3.1-405B-Instruct-FP8", shape="llama-3.1-405b",
                node_pool="a3", dtype="fp8", tensor_parallel_size=8, pipeline_parallel_size=2, multi_host=True)
A3 = NodePoolSpec(name="a3", machine_type="a3-highgpu-8g", max_nodes=2)
TPU_MODEL = ModelSpec(name="qwen-7b", source="hf://Qwen/Qwen2.5-7B-Instruct", shape="qwen2.5-7b", node_pool="v6e")
V6E = NodePoolSpec(name="v6e", machine_type="ct6e-standard-1t")


def facts(model: ModelSpec = SMALL, node_pool: NodePoolSpec = L4, weights: WeightsMount | None = None,
          **changes: Any) -> ServerPod:
    who = pool_identity(model, "short")
    rel = TPU_RELEASES["0.32.0"] if node_pool.is_tpu else release("0.34.0")
    args: dict[str, Any] = dict(
        model=model, pool=model.short, node_pool=node_pool, image_uri="r/vllm:v0.34.0-gke.1", release=rel,
        guard_config=GUARD, weights=weights or claim_mount("weights-claim"), labels=who.labels,
        selector=who.selector, service_name=who.service_name, grace_seconds=650, load_seconds=900.0,
        pods_cidr="10.20.0.0/14")
    return ServerPod(**{**args, **changes})


def vllm(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    assert container["name"] == "vllm"
    return container


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_a_server_pod_carries_the_guard_config_and_reads_the_weights_read_only():
    template = server_pod(facts())
    c = vllm(template)
    assert json.loads(env(c)[GUARD_CONFIG_ENV]) == GUARD
    # 900 s to load: 1.5x is under 30 minutes, so the probe allows 30 and the entrypoint waits as long.
    assert c["startupProbe"]["failureThreshold"] == 180 == startup_failure_threshold(900)
    assert env(c)[STARTUP_WINDOW_ENV] == "1800"
    assert {"name": "weights", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert {"name": "weights", "persistentVolumeClaim": {"claimName": "weights-claim", "readOnly": True}} \
        in template["spec"]["volumes"]
    # Not through FUSE: an init container waits for the weights on the same read-only mount.
    (init,) = template["spec"]["initContainers"]
    assert init["name"] == "wait-for-weights" and init["image"] == "r/vllm:v0.34.0-gke.1"
    assert init["volumeMounts"] == [{"name": "weights", "mountPath": "/models", "readOnly": True}]
    assert WEIGHTS_MARKERS_ENV not in env(c)
    spec = template["spec"]
    assert spec["terminationGracePeriodSeconds"] == 650 and spec["serviceAccountName"] == "vllm-server"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and "runAsUser" not in c["securityContext"]
    assert spec["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert template["metadata"]["labels"] == {**BASE_LABELS, MODEL_LABEL: "qwen-7b", POOL_LABEL: "short",
                                              **SERVER_LABELS, "vllm-gke.io/revision": "abc-def"}
    assert c["ports"] == [{"name": "http", "containerPort": 8000}]
    assert "--nnodes" not in c["args"]


def test_through_fuse_the_entrypoint_waits_for_the_weights_instead_of_an_init_container():
    mount = WeightsMount(volumes=({"name": "weights", "csi": {"driver": "gcsfuse.csi.storage.gke.io"}},),
                         mounts=({"name": "weights", "mountPath": "/models", "readOnly": True},),
                         annotations={"gke-gcsfuse/volumes": "true"}, through_fuse=True)
    template = server_pod(facts(weights=mount))
    assert template["spec"]["initContainers"] == []
    assert env(vllm(template))[WEIGHTS_MARKERS_ENV]
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    assert template["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_a_groups_worker_serves_nothing_and_is_ready_while_its_leader_serves():
    a = facts(BIG, A3)
    assert a.hosts == 2
    worker = worker_pod(a)
    c = vllm(worker)
    assert GUARD_CONFIG_ENV not in env(c)
    assert "ports" not in c and "startupProbe" not in c and "livenessProbe" not in c
    assert c["readinessProbe"]["exec"]["command"] == ["python3", "-c", LEADER_SERVES]
    assert "LWS_LEADER_ADDRESS" in LEADER_SERVES and ":8000/metrics" in LEADER_SERVES
    # Not the pool's labels (the Service, budget and scrape select leaders) and no mesh sidecar.
    assert worker["metadata"]["labels"] == {**BASE_LABELS, GROUP_WORKER_LABEL: "llama-405b-short"}
    assert worker["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false",
                                                 "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert c["args"][-3:] == ["--master-addr", "$(LWS_LEADER_ADDRESS)", "--headless"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # its own node's GPUs


def test_a_groups_leader_serves_and_its_sidecar_leaves_the_group_traffic_alone():
    leader = leader_pod(facts(BIG, A3))
    c = vllm(leader)
    assert json.loads(env(c)[GUARD_CONFIG_ENV]) == GUARD and c["startupProbe"] and c["livenessProbe"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    annotations = leader["metadata"]["annotations"]
    assert annotations["traffic.sidecar.istio.io/includeInboundPorts"] == "8000"
    assert annotations["traffic.sidecar.istio.io/excludeOutboundIPRanges"] == "10.20.0.0/14"
    args = c["args"]
    assert args[args.index("--node-rank") + 1] == "0" and args[args.index("--nnodes") + 1] == "2"
    assert "--headless" not in args
    assert leader["metadata"]["labels"][MODEL_LABEL] == "llama-405b"


def test_a_tpu_pod_runs_as_root_without_privilege_and_places_its_cache_path_untouched():
    cache_path = object()  # a Pulumi output in the component: placed, never read
    template = server_pod(facts(TPU_MODEL, V6E, xla_cache_path=cache_path))
    c = vllm(template)
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                    "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    (cache,) = [v for v in template["spec"]["volumes"] if v["name"] == "xla-cache"]
    assert cache["hostPath"]["path"] is cache_path and cache["hostPath"]["type"] == "DirectoryOrCreate"
    assert {"name": "xla-cache", "mountPath": XLA_CACHE_DIR} in c["volumeMounts"]
    assert template["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert c["resources"]["limits"]["google.com/tpu"] == "1"


def test_the_standby_is_selected_by_the_pools_service_but_not_as_a_vllm_pod():
    who = pool_identity(SMALL, "short", tenant="search")
    host = object()
    pod = StandbyPod(name="qwen-7b-short-standby", model="qwen-7b", pool_selector=who.selector,
                     image_uri="python:3.12", program_name="standby.py", program_source="print('hi')\n",
                     ready_host=host, policy_labels=who.policy_labels, expected_seconds=1200,
                     service_account="vllm-standby")
    spec = standby_deployment_spec(pod)
    labels = spec["template"]["metadata"]["labels"]
    assert labels == {**BASE_LABELS, **standby_labels(who.selector, who.policy_labels)}
    assert service_spec(who.selector)["selector"].items() <= labels.items()  # the pool's Service selects it
    assert labels[TENANT_LABEL] == "search" and labels[STANDBY_LABEL] == "true"
    assert not SERVER_LABELS.items() <= labels.items()
    # ... and the ready Service (the pool's vLLM pods only) does not.
    assert not ready_service_spec(who.selector, SERVER_LABELS, 8000)["selector"].items() <= labels.items()
    assert spec["selector"]["matchLabels"] == {STANDBY_LABEL: "true", MODEL_LABEL: "qwen-7b", POOL_LABEL: "short"}
    (c,) = spec["template"]["spec"]["containers"]
    command = c["command"]
    assert command[:2] == ["python3", "/opt/standby/standby.py"] and command[command.index("--ready-host") + 1] is host
    assert command[command.index("--expected-seconds") + 1] == "1200"
    assert command[command.index("--retry-after") + 1] == str(RETRY_AFTER_S)
    assert spec["template"]["metadata"]["annotations"]["vllm-gke.io/program-sha256"] == content_digest("print('hi')\n")
    pod_spec = spec["template"]["spec"]
    assert pod_spec["securityContext"]["runAsUser"] == UID == 65534 and pod_spec["serviceAccountName"] == "vllm-standby"
    assert pod_spec["volumes"] == [{"name": "program", "configMap": {"name": "qwen-7b-short-standby"}}]


def test_a_canary_pool_is_labelled_apart_from_the_stable_one():
    stable, canary = pool_identity(SMALL, "long"), pool_identity(SMALL, "long", canary=True)
    assert canary.service_name == "qwen-7b-canary-long" and canary.selector[POOL_LABEL] == "long-canary"
    assert stable.selector == {MODEL_LABEL: "qwen-7b", POOL_LABEL: "long"} and stable.policy_labels == {}


def test_the_budget_counts_vllm_pods_or_a_whole_group():
    selector = {MODEL_LABEL: "m", POOL_LABEL: "short"}
    assert budget_spec(selector) == {"maxUnavailable": 1, "selector": {"matchLabels": {**selector, **SERVER_LABELS}}}
    assert budget_spec(selector, "m-short-group")["selector"] == {"matchLabels": {LWS_NAME_LABEL: "m-short-group"}}


def test_rollout_timings_surge_where_the_node_pool_has_room_else_replace_in_place():
    pool = ServingPoolSpec(min_replicas=1, max_replicas=2)
    grace = grace_seconds(600)
    assert grace == 650  # preStop 20 s, a 600 s request, 30 s of teardown
    surge = rollout(pool, L4, 1, 600.0, grace)
    assert surge.surge and dict(surge.rolling) == {"maxSurge": 1, "maxUnavailable": 0}
    # A node (300 s) and the startup window (30 minutes); create: a node, the load and 10 minutes.
    assert (surge.progress_deadline_seconds, surge.create_minutes) == (2100, 25)
    assert surge.update_minutes == 62  # two replicas of 300 + 600 + 650 s, and 10 minutes
    full = rollout(pool, L4.model_copy(update={"max_nodes": 2}), 1, 600.0, grace, wait_behind_seconds=1000)
    assert not full.surge and dict(full.rolling) == {"maxSurge": 0, "maxUnavailable": 1}
    # In place: the old replica's grace and the wait behind the node pool's other rollouts too.
    assert full.progress_deadline_seconds == 300 + 650 + 1000 + 1800
    assert full.update_minutes == 79
    given = rollout(pool, L4, 1, 600.0, grace, rolling={"maxSurge": 1, "maxUnavailable": "50%"})
    assert not given.surge and given.rolling["maxUnavailable"] == "50%"


def test_the_pools_checks_name_the_package_inputs():
    found: dict[str, str] = {}

    def add(key: str, problem: str) -> None:
        found[key] = problem

    image = ImageRef(repository="r", tag="v0.11.0")
    check_pool(add, BIG, "short", A3, image, release("0.34.0"), None, 7200)
    assert "spans hosts" in found["podsCidr"]
    assert "not an image of vLLM 0.34.0" in found["image.tag"]
    assert "30-3600" in found["requestTimeoutSeconds"]
    found.clear()
    check_pool(add, SMALL, "short", L4, ImageRef(repository="r", tag="v0.34.0-gke.1"), release("0.34.0"), None, 600)
    assert found == {}


def test_the_callers_checks_find_the_owner_among_the_tenants():
    jwt = {"issuer": "https://i.example", "jwks_uri": "https://i.example/jwks", "audiences": ["a"]}
    owner = TenantSpec(name="search", jwt=jwt, models=["qwen-7b"], max_tokens=1024,
                       rate_limit={"requests_per_minute": 60},
                       dedicated={"models": ["qwen-7b"], "node_pool": "search-l4"})
    found: dict[str, str] = {}

    def add(key: str, problem: str) -> None:
        found[key] = problem

    check_callers(add, SMALL, L4, [owner], "search", False)
    assert found == {"tenants[search].dedicated.nodePool": "'search-l4' is not nodePool.name 'l4': give the node "
                                                           "pool it names"}
    found.clear()
    check_callers(add, SMALL, L4, [owner], "ads", False)
    assert "not among tenants" in found["tenant"]
