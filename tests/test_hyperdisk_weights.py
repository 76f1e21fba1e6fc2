"""Hyperdisk ML weights: disks GKE Volume Populator fills from the bucket after the loaders, one
per weight set and namespace, read-only in every zone; the requirements checked at plan time."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from tests.conftest import manifests_of, vllm_deployments, without_cloud_run
from vllm_gke.components.hyperdisk_weights import (
    CPU_REQUEST_ANNOTATION,
    POPULATOR_SA,
    STORAGE_CLASS_PREFIX,
    claim_name,
    disk_size_gib,
    transfer_cpu_request,
)
from vllm_gke.components.model.catalog import GPU_MACHINE_TYPES, TPU_MACHINE_TYPES, attaches_hyperdisk_ml, populator_vcpus
from vllm_gke.components.model.cold_start import ENGINE_START_S, IMAGE_START_S, cold_start_seconds
from vllm_gke.components.model.gcp_apis import required_apis
from vllm_gke.components.model.hyperdisk_ml import TRANSFER_COMPUTE_CLASS
from vllm_gke.components.model.weights_layout import WeightCopy, adapter_dir, model_dir
from vllm_gke.infra.advice import hyperdisk_disks, plan_warnings
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.manifests import catalog_or_none, validate
from vllm_gke.infra.mocks import MOCK_PROJECT_NUMBER
from vllm_gke.infra.plan import read_stack_config, run_program
from vllm_gke.policies.rules import Resource, evaluate


def hyperdisk_values(extra: bool = False) -> dict[str, Any]:
    """Staging on Hyperdisk ML; `extra` adds what makes more weight sets: a canary revision, a LoRA
    adapter and a tenant with its own namespace."""
    values = read_stack_config("staging")
    values["vllm-gke:weights"] = {"backend": "hyperdisk-ml"}
    without_cloud_run(values)  # they mount the bucket alone (config_rules/cloud_run.py): none beside Hyperdisk ML
    if extra:
        models = values["vllm-gke:models"]
        mistral = next(m for m in models if m["name"] == "mistral-7b")
        mistral["canary"] = {"revision": "0123456789abcdef0123456789abcdef01234567", "weight": 10, "replicas": 1}
        mistral["adapters"] = [{"name": "tickets", "source": "hf://acme-ml/mistral-tickets-lora", "revision": "v2",
                                "rank": 16, "tenants": ["support"]}]
        values["vllm-gke:nodePools"][0]["maxNodes"] = 8
        values["vllm-gke:tenants"].append({
            "name": "analytics", "models": ["mistral-7b"], "maxTokens": 1024,
            "rateLimit": {"requestsPerMinute": 60},
            "jwt": {"issuer": "https://auth.acme.example/analytics",
                    "jwksUri": "https://auth.acme.example/analytics/.well-known/jwks.json",
                    "audiences": ["llm.staging.acme.example"]},
            "dedicated": {"models": ["mistral-7b"], "nodePool": "a100-80-mig"}})
    return values


@pytest.fixture(scope="module")
def plan():
    return run_program("staging", hyperdisk_values())


@pytest.fixture(scope="module")
def wide_plan():
    return run_program("staging", hyperdisk_values(extra=True))


def props_of(plan, type_):
    return [r.props for r in plan.resources if r.type == type_]


def claims(plan, namespace=None):
    return {c["metadata"]["name"]: c for c in manifests_of(plan, "PersistentVolumeClaim", namespace)}


def claim_of(plan, model: str, namespace: str = "vllm") -> str:
    """The claim name of a model's own weights (a digest follows the set's key)."""
    (name,) = [n for n in claims(plan, namespace) if re.fullmatch(rf"weights-{model}-[0-9a-f]{{10}}", n)]
    return name


def test_disks_in_every_zone_from_the_bucket(plan):
    assert not props_of(plan, "gcp:filestore/instance:Instance")
    (bucket,) = props_of(plan, "gcp:storage/bucket:Bucket")
    (sc,) = manifests_of(plan, "StorageClass")
    assert sc["metadata"]["name"].startswith(STORAGE_CLASS_PREFIX) and sc["provisioner"] == "pd.csi.storage.gke.io"
    assert sc["parameters"] == {"type": "hyperdisk-ml", "provisioned-throughput-on-create": "2400Mi",
                                "enable-multi-zone-provisioning": "true"}
    # Copies in the cluster's zones, copied as soon as the claim exists, never resized.
    zones = sc["allowedTopologies"][0]["matchLabelExpressions"][0]
    assert zones == {"key": "topology.gke.io/zone", "values": ["us-central1-a", "us-central1-c"]}
    assert sc["volumeBindingMode"] == "Immediate" and sc["allowVolumeExpansion"] is False
    # The loaders write the bucket through Cloud Storage FUSE.
    (cluster,) = props_of(plan, "gcp:container/cluster:Cluster")
    assert cluster["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert "storage.googleapis.com" in required_apis(plan.config)
    sources = {s["metadata"]["name"]: s for s in manifests_of(plan, "GCPDataSource", "vllm")}
    assert sources[claim_of(plan, "llama-8b")]["spec"] == {"cloudStorage": {
        "serviceAccountName": POPULATOR_SA,
        "uri": f"gs://{bucket['name']}/{model_dir(plan.config.model('llama-8b')).removeprefix('/models/')}/"}}


def test_one_zone_has_no_multi_zone_parameter(stack_values):
    values = hyperdisk_values()
    values["vllm-gke:cluster"]["zones"] = ["us-central1-a"]
    (sc,) = manifests_of(run_program("staging", values), "StorageClass")
    assert "enable-multi-zone-provisioning" not in sc["parameters"]


def test_claims_are_read_only_and_filled_by_the_populator(plan):
    found = claims(plan, "vllm")
    mistral = claim_of(plan, "mistral-7b")
    assert set(found) == {claim_of(plan, "llama-8b"), mistral}
    claim = found[mistral]
    (sc,) = manifests_of(plan, "StorageClass")
    assert claim["spec"] == {
        "accessModes": ["ReadOnlyMany"], "storageClassName": sc["metadata"]["name"],
        "resources": {"requests": {"storage": "18Gi"}},  # 14.5 GB of bf16 weights plus headroom
        "dataSourceRef": {"apiGroup": "datalayer.gke.io", "kind": "GCPDataSource",
                          "name": mistral}}
    annotations = claim["metadata"]["annotations"]
    # Pulumi awaits the claim until it is Bound - after the copy: hours, not the 5 minute default.
    assert int(annotations["pulumi.com/timeoutSeconds"]) >= 3600
    assert annotations[CPU_REQUEST_ANNOTATION] == "24"


def test_a_claim_waits_for_its_loader_and_servers_wait_for_the_claims(plan):
    mistral = claim_of(plan, "mistral-7b")
    claim = plan.kube("PersistentVolumeClaim", mistral, "vllm")
    assert plan.waits_for(claim, plan.kube("Job", "load-mistral-7b"))
    assert not plan.waits_for(claim, plan.kube("Job", "load-llama-8b"))
    assert plan.waits_for(claim, plan.kube("GCPDataSource", mistral, "vllm"))
    # The transfer Job must have nodes of its compute class to run on.
    assert plan.waits_for(claim, plan.kube("ComputeClass", TRANSFER_COMPUTE_CLASS))
    assert plan.waits_for(claim, plan.named("gcp:container/nodePool:NodePool", "gke-hdml-transfer"))
    deployment = plan.kube("Deployment", "mistral-7b-short", "vllm")
    assert plan.waits_for(deployment, claim)


def test_servers_mount_their_disk_read_only_at_the_model_directory(plan):
    for dep in vllm_deployments(plan, "vllm"):
        pod = dep["spec"]["template"]["spec"]
        model = dep["metadata"]["labels"]["vllm-gke.io/model"]
        (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert volume["persistentVolumeClaim"]["readOnly"] is True
        assert volume["persistentVolumeClaim"]["claimName"].startswith(f"weights-{model}-")
        for c in pod["containers"][:1] + pod["initContainers"]:
            assert {"name": volume["name"], "mountPath": model_dir(plan.config.model(model)), "readOnly": True} \
                in c["volumeMounts"]
        # No bucket mount and no bucket access for the servers: the disk is all they read.
        assert not any("csi" in v for v in pod["volumes"])
        assert "gke-gcsfuse/volumes" not in dep["spec"]["template"]["metadata"]["annotations"]


def test_only_the_populator_identity_reads_the_bucket(plan):
    """No server reads the bucket: the populator fills the disks. The picker's tokenizer (staging's
    prefixCache: precise) runs on the system pool, whose machines attach no Hyperdisk ML: it reads
    its model's folder from the bucket, under its own identity."""
    readers = sorted(m["member"] for m in props_of(plan, "gcp:storage/bucketIAMMember:BucketIAMMember")
                     if m["role"] == "roles/storage.objectViewer")
    pool = (f"principal://iam.googleapis.com/projects/{MOCK_PROJECT_NUMBER}/locations/global/"
            "workloadIdentityPools/acme-llm-staging.svc.id.goog/subject/ns/vllm/sa")
    assert readers == [f"{pool}/llama-8b-render", f"{pool}/{POPULATOR_SA}"]
    (sa,) = [s for s in manifests_of(plan, "ServiceAccount", "vllm") if s["metadata"]["name"] == POPULATOR_SA]
    assert sa["automountServiceAccountToken"] is False


def test_transfer_nodes_scale_from_zero_for_the_populator(plan):
    pool = plan.named("gcp:container/nodePool:NodePool", "gke-hdml-transfer").props
    assert pool["nodeConfig"]["machineType"] == "c3-standard-44"
    assert pool["nodeConfig"]["labels"] == {"cloud.google.com/compute-class": TRANSFER_COMPUTE_CLASS}
    assert pool["nodeConfig"]["taints"] == [{"key": "cloud.google.com/compute-class",
                                             "value": TRANSFER_COMPUTE_CLASS, "effect": "NO_SCHEDULE"}]
    # At most one node in each zone (per-zone counts: a total under location policy ANY could put
    # every node in one zone), none while no disk is being filled.
    assert pool["autoscaling"]["minNodeCount"] == 0 and pool["initialNodeCount"] == 0
    assert pool["autoscaling"]["maxNodeCount"] == 1
    assert "totalMaxNodeCount" not in pool["autoscaling"]
    (cc,) = [c for c in manifests_of(plan, "ComputeClass") if c["metadata"]["name"] == TRANSFER_COMPUTE_CLASS]
    assert cc["spec"]["priorities"] == [{"nodepools": ["hdml-transfer"]}]
    assert cc["spec"]["nodePoolAutoCreation"] == {"enabled": False}


def test_other_backends_have_no_transfer_pool(plans):
    for stack in ("dev", "staging", "prod"):
        assert not [p for p in props_of(plans[stack], "gcp:container/nodePool:NodePool")
                    if p["name"] == "hdml-transfer"], stack
        assert not manifests_of(plans[stack], "GCPDataSource")


def test_each_namespace_gets_the_weight_sets_it_serves(wide_plan):
    shared = claims(wide_plan, "vllm")
    # Both models, Mistral's canary revision, and the adapter.
    assert {n.rsplit("-", 1)[0] for n in shared} == {
        "weights-llama-8b", "weights-mistral-7b", "weights-mistral-7b-canary", "weights-mistral-7b-lora-tickets"}
    dedicated = claims(wide_plan, "tenant-analytics")
    assert {n.rsplit("-", 1)[0] for n in dedicated} == {
        "weights-mistral-7b", "weights-mistral-7b-canary", "weights-mistral-7b-lora-tickets"}
    # Each namespace's claims come with their own data sources and their own populator identity.
    assert set(dedicated) == {s["metadata"]["name"] for s in manifests_of(wide_plan, "GCPDataSource", "tenant-analytics")}
    readers = {m["member"].rsplit("/subject/", 1)[1] for m in props_of(wide_plan, "gcp:storage/bucketIAMMember:BucketIAMMember")
               if m["role"] == "roles/storage.objectViewer"}
    assert readers == {f"ns/vllm/sa/{POPULATOR_SA}", f"ns/tenant-analytics/sa/{POPULATOR_SA}",
                       "ns/vllm/sa/llama-8b-render"}  # the picker's tokenizer, on the system pool
    # The adapter's disk is mounted where --lora-modules points.
    dep = wide_plan.kube("Deployment", "mistral-7b-short", "tenant-analytics").props
    mounts = {m["mountPath"] for m in dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    mistral = wide_plan.config.model("mistral-7b")
    (tickets,) = mistral.adapters
    assert {model_dir(mistral), adapter_dir(mistral, tickets)} <= mounts
    assert f"tickets={adapter_dir(mistral, tickets)}" in json.dumps(dep["spec"]["template"]["spec"]["containers"][0])
    canary = wide_plan.kube("Deployment", "mistral-7b-canary-short", "vllm").props
    canary_mounts = {m["mountPath"] for m in canary["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    canary_model = mistral.canary_model()
    assert canary_model is not None and canary_model.revision == "0123456789abcdef0123456789abcdef01234567"
    assert model_dir(canary_model) in canary_mounts and model_dir(mistral) not in canary_mounts
    assert evaluate([Resource(r.type, r.name, copy.deepcopy(r.props), r.urn) for r in wide_plan.policy_resources()]) == []


def test_a_new_revision_is_a_new_claim_the_servers_roll_onto():
    """A populated disk never changes: a new revision must be a new claim (new name), so the
    Deployment rolls onto it and Pulumi deletes the old one after; other models stay untouched."""
    before = run_program("staging", hyperdisk_values())
    values = hyperdisk_values()
    next(m for m in values["vllm-gke:models"] if m["name"] == "mistral-7b")["revision"] = "v0.3.1"
    after = run_program("staging", values)
    old, new = claims(before, "vllm"), claims(after, "vllm")
    assert {n for n in old if n.startswith("weights-llama-8b-")} == {n for n in new if n.startswith("weights-llama-8b-")}
    (old_mistral,) = [n for n in old if n.startswith("weights-mistral-7b-")]
    (new_mistral,) = [n for n in new if n.startswith("weights-mistral-7b-")]
    assert old_mistral != new_mistral
    dep = after.kube("Deployment", "mistral-7b-short", "vllm").props["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == new_mistral for v in dep["volumes"])


def test_a_new_throughput_or_zone_is_a_new_class_and_new_disks(plan):
    """A StorageClass is immutable, and a populated disk keeps the throughput and zones it was made
    with: changing either must produce a new class and new claims, so the servers roll onto disks
    that match the config."""
    for change in ({"weights": {"backend": "hyperdisk-ml", "hyperdiskThroughputMiBps": 4800}},
                   {"zones": ["us-central1-a", "us-central1-b", "us-central1-c"]}):
        values = hyperdisk_values()
        if "weights" in change:
            values["vllm-gke:weights"] = change["weights"]
        else:
            values["vllm-gke:cluster"]["zones"] = change["zones"]
        other = run_program("staging", values)
        (before,), (after,) = manifests_of(plan, "StorageClass"), manifests_of(other, "StorageClass")
        assert before["metadata"]["name"] != after["metadata"]["name"], change
        assert not set(claims(plan)) & set(claims(other)), change
        assert {c["spec"]["storageClassName"] for c in claims(other).values()} == {after["metadata"]["name"]}


def test_weight_set_names_are_valid_and_sizes_hold_the_data():
    ws = WeightCopy("A_very.Long-model-name-" + "x" * 80, "m", "hf://org/m", "main", "/models/m/main", 141.2)
    name = claim_name(ws, "vllm-gke-hyperdisk-ml-0123abcd", "mistral-first")
    assert len(name) <= 63 and name == name.lower() and name[0].isalpha() and name[-1].isalnum()
    assert disk_size_gib(141.2) >= 141.2 * 1.1
    assert disk_size_gib(0.1) == 8  # Hyperdisk ML's 4 GiB floor, and room
    assert transfer_cpu_request(44) == "24" and transfer_cpu_request(22) == "20"


def test_manifests_validate_the_data_source_included(plan):
    KINDS = ("StorageClass", "PersistentVolumeClaim", "ComputeClass", "GCPDataSource")
    catalog = catalog_or_none()
    if catalog is None:
        pytest.skip("no ../shared/upstream-crds here: custom resources are validated where it is")
    docs = plan.manifests()
    assert {(d["kind"], d["metadata"]["name"]): validate(d, catalog) for d in docs
            if d["kind"] in KINDS} == {k: [] for k in {(d["kind"], d["metadata"]["name"]) for d in docs
                                                       if d["kind"] in KINDS}}
    sources = [d for d in docs if d["kind"] == "GCPDataSource"]
    assert len(sources) == 2
    bad = copy.deepcopy(sources[0])
    bad["spec"]["cloudStorage"]["notAField"] = 1
    assert validate(bad, catalog)


def test_cold_start_reads_at_the_provisioned_throughput():
    values = hyperdisk_values()
    values["vllm-gke:weights"]["hyperdiskThroughputMiBps"] = 4800
    cfg = parse(values)
    model = cfg.model("mistral-7b")
    expected = IMAGE_START_S + model.weights_gb * 1e9 / (4800 * 1024 ** 2) + ENGINE_START_S
    assert cold_start_seconds(cfg, model) == pytest.approx(expected)


def test_plan_warns_of_the_unpriced_disks(wide_plan):
    cfg = parse(hyperdisk_values(extra=True))
    # (2 models + canary + adapter) in the shared namespace, 3 in the tenant's, in each of 2 zones:
    # as many as the plan has claims, times the zones.
    assert hyperdisk_disks(cfg) == (4 + 3) * 2 == len(manifests_of(wide_plan, "PersistentVolumeClaim")) * 2
    assert any("14 Hyperdisk ML disks" in w and "not in the cost figures" in w for w in plan_warnings(cfg, "hyperdisk-ml"))


@pytest.mark.parametrize("mutate, key, words", [
    (lambda v: v["vllm-gke:cluster"].update(minMasterVersion="1.33.1"), "cluster.minMasterVersion",
     "1.33.2-gke.4780000"),
    (lambda v: v["vllm-gke:cluster"].pop("minMasterVersion"), "cluster.minMasterVersion", "is unset"),
    (lambda v: v["vllm-gke:nodePools"][0].update(machineType="a2-highgpu-1g", gpuPartitionSize="3g.20gb"),
     "nodePools[a100-80-mig].machineType", "cannot attach Hyperdisk ML"),
    (lambda v: v["vllm-gke:weights"].update(populatorMachineType="e2-standard-8"), "weights.populatorMachineType",
     "C3 or C3D"),
    (lambda v: v["vllm-gke:weights"].update(hyperdiskThroughputMiBps=100), "weights.hyperdiskThroughputMiBps",
     "400"),
])
def test_requirements_rejected_with_the_key(mutate, key, words):
    values = hyperdisk_values()
    mutate(values)
    with pytest.raises(ConfigError) as exc:
        parse(values)
    text = str(exc.value)
    assert key in text and words in text, text


def test_machine_series_table():
    assert attaches_hyperdisk_ml("a3-highgpu-8g") and attaches_hyperdisk_ml("g2-standard-8")
    assert attaches_hyperdisk_ml("a2-ultragpu-1g")
    assert not attaches_hyperdisk_ml("a2-highgpu-8g") and not attaches_hyperdisk_ml("a2-megagpu-16g")
    # TPU hosts are not on the list this table was read from: the backend is refused for them.
    gpus = [m for m in GPU_MACHINE_TYPES if m not in TPU_MACHINE_TYPES]
    assert {m for m in gpus if not attaches_hyperdisk_ml(m)} == {
        m for m in gpus if m.startswith(("a2-highgpu-", "a2-megagpu-"))}
    assert not any(attaches_hyperdisk_ml(m) for m in TPU_MACHINE_TYPES)
    assert populator_vcpus("c3-standard-44") == 44 and populator_vcpus("c3d-highcpu-30") == 30
    assert populator_vcpus("c3-standard-4") is None and populator_vcpus("n2-standard-32") is None


def test_the_provider_refuses_backends_its_vllm_service_cannot_mount():
    from vllm_gke.components.provider import ModelStore
    from vllm_gke.components.provider.convert import InputError

    values = read_stack_config("dev")
    cfg = parse(values)
    for backend in ("gcs", "hyperdisk-ml"):
        args = {"project": cfg.project, "zone": "us-central1-a", "region": cfg.region, "network_name": "vpc",
                "workload_pool": "p.svc.id.goog", "kubeconfig": "kc",
                "models": [m.model_dump(mode="json", exclude_none=True) for m in cfg.models],
                "weights": {"backend": backend},
                "server_image": cfg.server_image.model_dump(mode="json", exclude_none=True)}
        with pytest.raises(InputError, match=f"backend: '{backend}'"):
            run_program("dev", values, program=lambda _c, a=args: ModelStore("w", a))


def test_a_load_test_reads_the_tokenizer_from_the_bucket_not_the_disks():
    """The load test runs on the system pool, whose machines attach no Hyperdisk ML: it mounts the
    bucket the disks are filled from (read-only, through Cloud Storage FUSE), with a read grant."""
    values = hyperdisk_values()
    values["vllm-gke:loadTests"] = [{"name": "support-mistral", "tenant": "support", "model": "mistral-7b"}]
    plan = run_program("staging", values)
    (cron,) = [r.props for r in plan.resources if r.props.get("kind") == "CronJob"]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    (weights,) = [v for v in pod["volumes"] if v["name"] == "weights"]
    assert weights["csi"]["driver"] == "gcsfuse.csi.storage.gke.io" and weights["csi"]["readOnly"] is True
    grants = [r.props for r in plan.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
              if "loadtest" in str(r.props.get("member")) or (r.name.endswith("-weights-reader")
                                                              and "render" not in r.name)]
    # It lists the bucket (the mount needs it) and opens its model's folder alone (and looks up the
    # folder's own name on the way).
    (viewer,) = [g for g in grants if g["role"] == "roles/storage.objectViewer"]
    objects = "projects/_/buckets/acme-llm-staging-vllm-staging-weights/objects"
    assert viewer["condition"]["expression"] == \
        f'resource.name == "{objects}/mistral-7b" || resource.name.startsWith("{objects}/mistral-7b/")'
    (lister,) = [g for g in grants if g is not viewer]
    assert lister["role"].startswith("projects/acme-llm-staging/roles/") and not lister.get("condition")
