"""Fast cold start: weights in a Cloud Storage bucket (Cloud Storage FUSE CSI with file cache and
parallel downloads), image streaming on every pool, and the time-to-serve estimate and budget."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.conftest import manifests_of
from vllm_gke.components.model.capacity_report import capacity_report
from vllm_gke.components.model.cold_start import ENGINE_START_S, IMAGE_START_S, cold_start_seconds
from vllm_gke.components.model.gcp_apis import required_apis
from vllm_gke.components.model.gcp_names import bucket_name, is_bucket_name
from vllm_gke.components.model.gcs_weights import (
    CACHE_VOLUME,
    CSI_DRIVER,
    TERMS_PER_CONDITION,
    object_condition,
    reader_terms,
    term_chunks,
)
from vllm_gke.infra.advice import plan_warnings
from vllm_gke.infra.config import ConfigError, parse
from vllm_gke.infra.contracts.gcsfuse import bucket_readers_list_and_open_only_their_folders
from vllm_gke.infra.mocks import MOCK_PROJECT_NUMBER
from vllm_gke.infra.plan import read_stack_config, run_program


def props_of(plan, type_):
    return [r.props for r in plan.resources if r.type == type_]


def test_bucket_replaces_the_share(plans):
    plan = plans["staging"]
    assert not props_of(plan, "gcp:filestore/instance:Instance")
    (bucket,) = props_of(plan, "gcp:storage/bucket:Bucket")
    assert bucket["name"] == "acme-llm-staging-vllm-staging-weights"
    assert bucket["location"] == "US-CENTRAL1"
    assert bucket["uniformBucketLevelAccess"] is True and bucket["publicAccessPrevention"] == "enforced"
    assert bucket["hierarchicalNamespace"] == {"enabled": True}
    # One bucket, declared by the store component under its logical name.
    assert plan.named("gcp:storage/bucket:Bucket", "weights-bucket").props == bucket
    assert not manifests_of(plan, "PersistentVolumeClaim")  # no NFS claims
    (cluster,) = props_of(plan, "gcp:container/cluster:Cluster")
    assert cluster["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert "storage.googleapis.com" in required_apis(plan.config)
    assert "storage.googleapis.com" not in required_apis(plans["dev"].config)


def test_serving_pods_mount_the_bucket_read_only_with_parallel_downloads(plans):
    dep = plans["staging"].kube("Deployment", "mistral-7b-long").props["spec"]["template"]
    volumes = {v["name"]: v for v in dep["spec"]["volumes"]}
    csi = volumes["weights"]["csi"]
    assert csi["driver"] == CSI_DRIVER and csi["readOnly"] is True
    options = csi["volumeAttributes"]["mountOptions"].split(",")
    # gcsfuse caps its cache below the emptyDir's limit (16Gi): past that the kubelet evicts the pod.
    assert {"file-cache:enable-parallel-downloads:true", f"file-cache:max-size-mb:{int(16 * 1024 * 0.95)}",
            "metadata-cache:ttl-secs:-1", "uid=1000", "gid=1000"} <= set(options)
    # The file cache: an emptyDir sized to the model (Mistral 7B, 14.5 GB of bf16 weights).
    assert volumes[CACHE_VOLUME] == {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": "16Gi"}}
    annotations = dep["metadata"]["annotations"]
    assert annotations["gke-gcsfuse/volumes"] == "true"
    # Meshed pod: the driver's sidecar reaches the metadata server around Envoy (GKE's guide).
    assert annotations["traffic.sidecar.istio.io/excludeOutboundIPRanges"] == "169.254.169.254/32"
    # ...and Cloud Storage too: with a classic proxy (Istio CNI) the FUSE sidecar starts before any Envoy.
    assert annotations["traffic.sidecar.istio.io/excludeOutboundPorts"] == "443"
    assert "holdApplicationUntilProxyStarts" in annotations["proxy.istio.io/config"]
    for c in dep["spec"]["containers"] + dep["spec"]["initContainers"]:
        assert {"name": "weights", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_loader_writes_the_bucket_and_readers_only_read_it(plans):
    plan = plans["staging"]
    job = plan.kube("Job", "load-mistral-7b").props["spec"]["template"]
    (weights,) = [v for v in job["spec"]["volumes"] if v["name"] == "weights"]
    assert weights["csi"]["readOnly"] is False and "file-cache" not in weights["csi"]["volumeAttributes"]["mountOptions"]
    assert job["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    members = {(m["role"], m["member"]) for m in props_of(plan, "gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert [m for r, m in members if r == "roles/storage.objectUser"] == [
        "serviceAccount:vllm-staging-weights-loader@acme-llm-staging.iam.gserviceaccount.com"]
    readers = sorted(m for r, m in members if r == "roles/storage.objectViewer")
    pool = f"principal://iam.googleapis.com/projects/{MOCK_PROJECT_NUMBER}/locations/global/workloadIdentityPools/" \
           "acme-llm-staging.svc.id.goog/subject/ns"
    # The servers' own account, not the namespace's default; and the picker's tokenizer (staging's
    # prefixCache: precise), its own account reading its model's revision folder alone.
    # ...and the Cloud Run model's service account (reading its own folders alone: tests/test_cloud_run_service.py).
    assert readers == [f"{pool}/vllm/sa/llama-8b-render", f"{pool}/vllm/sa/vllm-server",
                       "serviceAccount:vllm-staging-run-qwen-1-5b@acme-llm-staging.iam.gserviceaccount.com"]
    render = plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "llama-8b-render-weights-reader")
    assert "objects/llama-8b/" in render.props["condition"]["expression"]
    assert "mistral-7b" not in render.props["condition"]["expression"]
    # The identity pool exists once the cluster does: the reader bindings wait for it.
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    reader = plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "weights-reader-serving")
    assert plan.waits_for(reader, cluster)
    # Nothing project-wide: every grant is on this bucket.
    assert not [p for p in props_of(plan, "gcp:projects/iAMMember:IAMMember") if "storage" in p["role"]]


def tenant_values() -> dict:
    """Staging (gcs) with an adapter on Mistral, a tenant serving Mistral in its own namespace, and
    a load test of that tenant's route."""
    values = read_stack_config("staging")
    mistral = next(m for m in values["vllm-gke:models"] if m["name"] == "mistral-7b")
    mistral["adapters"] = [{"name": "tickets", "source": "hf://acme-ml/mistral-tickets-lora", "revision": "v2",
                            "rank": 16, "tenants": ["analytics"]}]
    values["vllm-gke:nodePools"][0]["maxNodes"] = 8
    values["vllm-gke:tenants"].append({
        "name": "analytics", "models": ["mistral-7b"], "maxTokens": 1024, "rateLimit": {"requestsPerMinute": 60},
        "jwt": {"issuer": "https://auth.acme.example/analytics",
                "jwksUri": "https://auth.acme.example/analytics/.well-known/jwks.json",
                "audiences": ["llm.staging.acme.example"]},
        "dedicated": {"models": ["mistral-7b"], "nodePool": "a100-80-mig"}})
    values["vllm-gke:loadTests"] = [{"name": "analytics-mistral", "tenant": "analytics", "model": "mistral-7b"}]
    return values


@pytest.fixture(scope="module")
def tenant_plan():
    return run_program("staging", tenant_values())


def grants_to(plan, principal_suffix):
    return [m for m in props_of(plan, "gcp:storage/bucketIAMMember:BucketIAMMember")
            if m["member"].endswith(principal_suffix)]


OBJECTS = 'resource.name.startsWith("projects/_/buckets/acme-llm-staging-vllm-staging-weights/objects/'


def test_readers_list_the_bucket_and_open_only_what_they_serve(tenant_plan):
    (role,) = props_of(tenant_plan, "gcp:projects/iAMCustomRole:IAMCustomRole")
    # names and folders, not contents: what the mount needs on a hierarchical-namespace bucket
    assert "storage.objects.list" in role["permissions"]
    assert not [p for p in role["permissions"] if p.startswith("storage.objects.") and p != "storage.objects.list"]
    lister = f"projects/acme-llm-staging/roles/{role['roleId']}"
    # The dedicated tenant's servers: no unconditional read, only Mistral's folder and its adapter's.
    grants = grants_to(tenant_plan, "/ns/tenant-analytics/sa/vllm-server")
    assert sorted(g["role"] for g in grants) == [lister, "roles/storage.objectViewer"]
    (viewer,) = [g for g in grants if g["role"] == "roles/storage.objectViewer"]
    # The folders, and the names above them Cloud Storage FUSE looks up on the way (a 403 there
    # fails the lookup): names, never another model's bytes.
    exact = OBJECTS.replace(".startsWith(", " == ")
    assert viewer["condition"]["expression"] == " || ".join([
        f'{exact}.adapters"', f'{exact}.adapters/"', f'{exact}.adapters/mistral-7b"', f'{exact}.adapters/mistral-7b/"',
        f'{exact}.adapters/mistral-7b/tickets"', f'{OBJECTS}.adapters/mistral-7b/tickets/")',
        f'{exact}mistral-7b"', f'{OBJECTS}mistral-7b/")'])
    assert "llama-8b" not in viewer["condition"]["expression"]
    assert not [g for g in grants if g["role"] == lister and g.get("condition")]
    # The shared namespace serves both models (and the adapter); the load test its model's folder alone.
    (shared,) = [g for g in grants_to(tenant_plan, "/ns/vllm/sa/vllm-server") if g["role"] == "roles/storage.objectViewer"]
    assert f'{OBJECTS}llama-8b/")' in shared["condition"]["expression"]
    assert f'{exact}llama-8b"' in shared["condition"]["expression"]
    (test,) = [g for g in grants_to(tenant_plan, "/ns/tenant-analytics/sa/vllm-loadtest-analytics-mistral")
               if g["role"] == "roles/storage.objectViewer"]
    assert test["condition"]["expression"] == f'{exact}mistral-7b" || {OBJECTS}mistral-7b/")'
    # Nowhere an unconditional read of the bucket's objects.
    assert not [m for m in props_of(tenant_plan, "gcp:storage/bucketIAMMember:BucketIAMMember")
                if m["role"] == "roles/storage.objectViewer" and not m.get("condition")]
    # Conditions on a bucket need uniform bucket-level access.
    assert props_of(tenant_plan, "gcp:storage/bucket:Bucket")[0]["uniformBucketLevelAccess"] is True


def test_many_folders_split_into_conditions_iam_accepts():
    prefixes = [f"m{i:02d}/" for i in range(8)]
    terms = reader_terms(prefixes)
    assert len(terms) == 16  # each folder and its name as a path component
    chunks = term_chunks(terms)
    assert [len(c) for c in chunks] == [TERMS_PER_CONDITION, 3] and sum(chunks, []) == terms
    # At most 12 logical operators in one condition.
    assert object_condition("b", chunks[0]).count("||") == 12
    # Names above a folder once, however many folders share them.
    assert reader_terms([".adapters/m/a/", ".adapters/m/b/"]).count(("==", ".adapters")) == 1


def test_bucket_names_are_valid_and_derived_when_long():
    assert bucket_name("p", "x") == "p-x"
    long = bucket_name("a" * 30, "b" * 40)
    assert is_bucket_name(long) and len(long) <= 63
    assert long != bucket_name("a" * 30, "b" * 39 + "c")
    assert not is_bucket_name("goog-weights") and not is_bucket_name("my.google.weights")


def test_bad_bucket_name_is_a_config_error(stack_values):
    values = copy.deepcopy(stack_values["staging"])
    values["vllm-gke:weights"]["bucket"] = "Weights_Bucket"
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert any(str(i).startswith("vllm-gke:weights.bucket:") for i in exc.value.issues)


def test_every_gpu_pool_streams_its_image(plans):
    for plan in plans.values():
        for pool in props_of(plan, "gcp:container/nodePool:NodePool"):
            assert pool["nodeConfig"]["gcfsConfig"] == {"enabled": True}, pool["name"]


# --- time from node ready to serving -----------------------------------------------------------

def test_cold_start_is_weights_over_throughput_plus_start(plans):
    cfg = plans["dev"].config  # qwen-7b, 15.2 GB, on a 1 TiB BASIC_HDD share: 100 MiB/s
    model = cfg.model("qwen-7b")
    expected = IMAGE_START_S + model.weights_gb * 1e9 / (100 * 1024 ** 2) + ENGINE_START_S
    assert cold_start_seconds(cfg, model) == pytest.approx(expected)
    rows = capacity_report(cfg)
    assert all(r.cold_start_s == pytest.approx(expected) for r in rows)
    # A measured throughput overrides the table.
    faster = cfg.model_copy(update={"weights": cfg.weights.model_copy(update={"read_throughput_mib_s": 1000})})
    saved = model.weights_gb * 1e9 / 1024 ** 2 * (1 / 100 - 1 / 1000)
    assert cold_start_seconds(faster, model) == pytest.approx(expected - saved)


def test_plan_warns_above_the_cold_start_budget(plans):
    cfg = plans["dev"].config
    tight = cfg.model_copy(update={"weights": cfg.weights.model_copy(update={"cold_start_budget_seconds": 120})})
    warnings = plan_warnings(tight, "BASIC_HDD")
    assert any(w.startswith("qwen-7b: a new replica needs about 5 min") and "2 min budget" in w for w in warnings)
    assert not any("budget" in w for w in plan_warnings(cfg, "BASIC_HDD"))


def test_the_documented_throughput_key_is_the_one_parsed(stack_values):
    """README's `readThroughputMiBps` (the alias generator alone would have made it readThroughputMibS,
    and the documented key was refused as unknown)."""
    values = copy.deepcopy(stack_values["staging"])
    values["vllm-gke:weights"]["readThroughputMiBps"] = 640
    cfg = parse(values)
    assert cfg.weights.read_throughput_mib_s == 640
    model = cfg.model("mistral-7b")
    assert cold_start_seconds(cfg, model) == pytest.approx(
        IMAGE_START_S + model.weights_gb * 1e9 / (640 * 1024 ** 2) + ENGINE_START_S)


def test_bucket_backed_replicas_request_the_node_disk_their_file_cache_takes(plans):
    """The file cache (1.1x the model) is an emptyDir on the node's boot disk: requested, so a
    dense MIG node is never packed past its disk (DiskPressure would evict loaded replicas)."""
    from vllm_gke.components.model.gcs_weights import cache_gi

    plan = plans["staging"]
    model = plan.config.model("mistral-7b")
    dep = plan.kube("Deployment", "mistral-7b-short", "vllm").props
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    assert c["resources"]["requests"]["ephemeral-storage"] == f"{4 + cache_gi(model.weights_gb + model.lora_gb())}Gi"


def test_the_file_cache_holds_the_files_the_server_reads(plan_variant):
    """Sized from diskGb (what the loader measured), not the dtype estimate: Mistral 7B served as fp8
    from its bf16 checkpoint reads 16 GB through the cache, not 8."""
    def fp8_checkpoint(values):
        model = next(m for m in values["vllm-gke:models"] if m["name"] == "mistral-7b")
        model.update({"dtype": "fp8", "diskGb": 16})
    dep = plan_variant("staging", fp8_checkpoint).kube("Deployment", "mistral-7b-long").props["spec"]["template"]
    volumes = {v["name"]: v for v in dep["spec"]["volumes"]}
    assert volumes[CACHE_VOLUME]["emptyDir"]["sizeLimit"] == "18Gi"
    assert f"file-cache:max-size-mb:{int(18 * 1024 * 0.95)}" in volumes["weights"]["csi"]["volumeAttributes"]["mountOptions"]
    vllm = next(c for c in dep["spec"]["containers"] if c["name"] == "vllm")
    assert int(vllm["resources"]["requests"]["ephemeral-storage"].removesuffix("Gi")) >= 18


def test_the_contract_catches_a_folder_no_condition_admits_and_a_missing_list(tenant_plan):
    assert bucket_readers_list_and_open_only_their_folders(tenant_plan) == []
    plan = dataclasses.replace(tenant_plan, resources=copy.deepcopy(tenant_plan.resources))
    reader = plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "weights-reader-analytics")
    reader.props["condition"]["expression"] = f'{OBJECTS}mistral-7b/")'  # the adapter's folder left out
    plan.resources.remove(plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "weights-reader-analytics-list"))
    found = bucket_readers_list_and_open_only_their_folders(plan)
    assert "ns/tenant-analytics/sa/vllm-server: no unconditional storage.objects.list on the bucket: " \
           "Cloud Storage FUSE cannot mount it" in found
    assert [f for f in found if f.startswith("tenant-analytics/mistral-7b-short: opens /models/.adapters/mistral-7b/tickets/")]
    assert not [f for f in found if f.startswith("vllm/")]


def test_the_contract_catches_a_grant_without_the_names_fuse_looks_up_on_the_way(tenant_plan):
    """Cloud Storage FUSE looks `mistral-7b` up (as an object and a folder) before the files under
    it; a 403 there is no "not found" and fails the open (gcsfuse internal/fs/inode/dir.go)."""
    import copy

    from vllm_gke.infra.contracts.gcsfuse import bucket_readers_list_and_open_only_their_folders as check

    assert check(tenant_plan) == []
    grants = tenant_plan.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    saved = [copy.deepcopy(g.props.get("condition")) for g in grants]
    try:
        for grant in grants:
            if condition := grant.props.get("condition"):
                condition["expression"] = " || ".join(t for t in condition["expression"].split(" || ")
                                                      if "startsWith" in t)
        assert any("may not look up mistral-7b on the way" in p for p in check(tenant_plan))
    finally:
        for grant, condition in zip(grants, saved):
            if condition is not None:
                grant.props["condition"] = condition
