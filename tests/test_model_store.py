"""ModelStore: one Filestore share, loaded once per model, mounted read-only everywhere."""

from __future__ import annotations

import re

import pytest

from tests.conftest import manifests_of, props_of, vllm_deployments
from vllm_gke.components.model.specs import AdapterSpec, CanarySpec, ModelSpec, WeightsSpec
from vllm_gke.components.model.weights_layout import adapter_dir, model_dir, plan_filestore, ready_marker


def test_one_filestore_instance_per_stack(plans):
    for stack in ("dev", "prod"):  # staging keeps its weights in a bucket (tests/test_gcs_weights.py)
        plan = plans[stack]
        (fs,) = props_of(plan, "gcp:filestore/instance:Instance")
        assert fs["fileShares"]["name"] == "models"
        assert fs["networks"][0]["network"] == f"vllm-{stack}-vpc"


def test_filestore_tier_sized_to_models(plans):
    (dev,) = props_of(plans["dev"], "gcp:filestore/instance:Instance")
    assert (dev["tier"], dev["fileShares"]["capacityGb"]) == ("BASIC_HDD", 1024)
    assert not props_of(plans["staging"], "gcp:filestore/instance:Instance")
    (prod,) = props_of(plans["prod"], "gcp:filestore/instance:Instance")
    # Three zones of GPU nodes: the share is regional, in the region rather than a zone.
    assert (prod["tier"], prod["location"]) == ("REGIONAL", "us-central1")


def _model(params: float) -> ModelSpec:
    return ModelSpec(name="m", source="hf://a/b", shape={"params_billion": params, "layers": 1,
                                                        "kv_heads": 1, "head_dim": 1}, node_pool="p")


@pytest.mark.parametrize("params,tier,expected", [
    # 1200 GB twice (a new revision loads beside the current copy) x 1.3, in 256 GiB steps.
    (7, None, ("ZONAL", 1024)), (600, None, ("ZONAL", 3328)),
    # The config's tier, whatever the models weigh: a tier that followed their size re-created the share.
    # A Basic share only grows: its size is weights.capacityGb's (the config checks the models fit).
    (7, "BASIC_HDD", ("BASIC_HDD", 1024)), (600, "BASIC_HDD", ("BASIC_HDD", 1024)),
])
def test_plan_filestore(params, tier, expected):
    weights = WeightsSpec() if tier is None else WeightsSpec(tier=tier)
    assert plan_filestore([_model(params)], weights) == expected


def test_a_canary_revision_is_a_second_copy_on_the_share():
    canary = _model(600).model_copy(update={"canary": CanarySpec(revision="v2", weight=10)})
    # (2 x 1200 GB + a third for a new revision) x 1.3, in 256 GiB steps: both revisions are on
    # the share at once, and either may load a new one beside them.
    assert plan_filestore([canary], WeightsSpec()) == ("ZONAL", 4864)
    # Two 50B copies are past what an HDD share loads in reasonable time.
    assert plan_filestore([_model(50).model_copy(update={"canary": CanarySpec(revision="v2", weight=10)})],
                          WeightsSpec())[0] == "ZONAL"


def test_the_folder_and_its_marker_are_keyed_on_source_and_revision():
    """The defect: /models/<name>/<revision> alone, so a changed source at the same revision kept
    the old folder, its marker, and the old weights."""
    model = _model(7)
    moved = model.model_copy(update={"source": "gs://acme/b"})
    assert model_dir(model) != model_dir(moved) and ready_marker(model) != ready_marker(moved)
    assert model_dir(model) == model_dir(_model(7))  # stable: the same copy is the same folder
    assert model_dir(model).startswith("/models/m/main-")
    assert model_dir(model) != model_dir(model.model_copy(update={"revision": "v2"}))
    # A revision with slashes is still one folder beside the others.
    assert model_dir(model.model_copy(update={"revision": "refs/pr/1"})).count("/") == model_dir(model).count("/")
    adapter = AdapterSpec(name="a", source="hf://o/a", tenants=["t"])
    assert adapter_dir(model, adapter) != adapter_dir(model, adapter.model_copy(update={"source": "hf://o/b"}))


def test_a_changed_source_loads_a_new_folder_the_servers_roll_onto(plans, plan_variant):
    """A second `pulumi up` with another source at the same revision: a new folder, a new loader
    run (its command changed), the servers' path and marker wait moved to it."""
    def moved(values):
        values["vllm-gke:models"][0]["source"] = "hf://acme/qwen-7b-tuned"

    before, after = plans["dev"], plan_variant("dev", moved)
    old, new = (model_dir(p.config.model("qwen-7b")) for p in (before, after))
    assert old != new
    for plan, folder in ((before, old), (after, new)):
        command = plan.kube("Job", "load-qwen-7b").props["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[5] == folder and "--prune-siblings" not in command
        # The old folder goes only once the servers rolled: the prune Job keeps the new one.
        assert folder in plan.kube("Job", "prune-qwen-7b").props["spec"]["template"]["spec"]["containers"][0]["command"]
        for d in vllm_deployments(plan):
            if d["metadata"]["name"].startswith("qwen-7b"):
                pod = d["spec"]["template"]["spec"]
                (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
                assert vllm["args"][0] == folder
                assert f"{folder}/.vllm-gke-complete" in str(pod)


def test_explicit_tier_keeps_its_minimum():
    assert plan_filestore([_model(7)], WeightsSpec(tier="BASIC_SSD")) == ("BASIC_SSD", 2560)


def test_serving_volumes_are_read_only_many_onto_the_share(plans):
    plan = plans["prod"]
    pvs = {m["metadata"]["name"]: m["spec"] for m in manifests_of(plan, "PersistentVolume")}
    ro = {k: v for k, v in pvs.items() if v["accessModes"] == ["ReadOnlyMany"]}
    # the serving namespace plus the one tenant with dedicated replicas
    share = plan.platform.store.share_identity
    assert set(ro) == {f"vllm-prod-weights-{share}-serving", f"vllm-prod-weights-{share}-analytics"}
    for spec in ro.values():
        assert spec["nfs"] == {"server": "198.51.100.2", "path": "/models", "readOnly": True}
    claims = {(m["metadata"]["namespace"], m["metadata"]["name"]): m["spec"]
              for m in manifests_of(plan, "PersistentVolumeClaim")}
    assert claims[("vllm", f"model-weights-{share}")]["volumeName"] == f"vllm-prod-weights-{share}-serving"
    assert claims[("tenant-analytics", f"model-weights-{share}")]["accessModes"] == ["ReadOnlyMany"]
    assert claims[("vllm-gke-system", f"model-weights-rw-{share}")]["accessModes"] == ["ReadWriteMany"]


def test_one_loader_job_per_model_reading_token_from_secret_manager(prod_by_hand):
    plan = prod_by_hand  # with its manual canary's loader
    jobs = [j for j in manifests_of(plan, "Job", "vllm-gke-system") if j["metadata"]["name"].startswith("load-")]
    assert sorted(j["metadata"]["name"] for j in jobs) == ["load-llama-70b", "load-llama-8b", "load-llama-8b-canary",
                                                           "load-llama-8b-lora-search-rewrite",
                                                           "load-llama-8b-lora-support-sql", "load-qwen-7b"]
    jobs = [j for j in jobs if "-lora-" not in j["metadata"]["name"]]  # adapters: tests/test_lora.py
    models = [m.name for m in plan.config.models]

    def model_of(job):
        name = job["metadata"]["labels"]["vllm-gke.io/model"].removesuffix("-canary")
        assert name in models, name
        return name
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        command = container["command"]
        # The canary loads its own pinned revision into its own directory, beside the stable one.
        revision = "0e9e39f249a16976918f6564b8830bc894c89659" if job["metadata"]["name"].endswith("-canary") else "main"
        assert command[2] == "hf" and command[4] == revision and command[5].startswith("/models/")
        assert command[6:8] == ["--token-file", "/var/run/secrets/hf/token"]
        # Filestore is sized for the whole share, so the loader copies vLLM's selection unbounded.
        assert command[8:12] == ["--reads", "mistral-first", "--size-key", f"models[{model_of(job)}].diskGb"]
        # A complete copy in the folder of the layout before digests is moved, not loaded again;
        # nothing beside the folder is removed (the prune Job does, after the servers rolled).
        assert command[12:] == ["--legacy-dest", f"/models/{model_of(job)}/{revision}"]
        # The server image sets HF_HUB_OFFLINE=1; the loader must override it or download nothing.
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_HUB_OFFLINE"] == {"name": "HF_HUB_OFFLINE", "value": "0"}
        assert "HF_TOKEN" not in env  # the token comes as a mounted file
        token = next(v for v in pod["volumes"] if v["name"] == "hf-token")
        assert token["csi"]["driver"] == "secrets-store-gke.csi.k8s.io"
        assert pod["nodeSelector"] == {"vllm-gke.io/role": "system"}
    (spc,) = manifests_of(plan, "SecretProviderClass")
    assert "projects/acme-llm-prod/secrets/hf-token/versions/latest" in spc["spec"]["parameters"]["secrets"]


def test_no_secret_literals_anywhere(plans):
    for plan in plans.values():
        assert not manifests_of(plan, "Secret")
        for doc in plan.manifests():
            pod = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                for env in container.get("env", []):
                    if re.search("TOKEN|SECRET|PASSWORD|KEY", env["name"]):
                        assert "value" not in env, (doc["metadata"]["name"], env)


def test_loader_identity_is_scoped(plans):
    (member,) = props_of(plans["dev"], "gcp:secretmanager/secretIamMember:SecretIamMember")
    assert member["role"] == "roles/secretmanager.secretAccessor" and member["secretId"] == "hf-token"
    members = {p["member"] for p in props_of(plans["dev"], "gcp:serviceaccount/iAMMember:IAMMember")}
    assert "serviceAccount:acme-llm-dev.svc.id.goog[vllm-gke-system/weights-loader]" in members


def test_volume_size_is_independent_of_the_share(plans, plan_variant):
    """A bound claim cannot be resized: adding a model (a bigger share) must not touch PV or PVC."""
    def add_model(values):
        values["vllm-gke:models"].append({**values["vllm-gke:models"][0], "name": "qwen-7b-b"})
        values["vllm-gke:nodePools"][0]["maxNodes"] = 2
        values["vllm-gke:weights"]["capacityGb"] = 4096
    before, after = plans["dev"], plan_variant("dev", add_model)
    (fs_before,), (fs_after,) = (props_of(p, "gcp:filestore/instance:Instance") for p in (before, after))
    assert fs_before["fileShares"]["capacityGb"] < fs_after["fileShares"]["capacityGb"]
    for kind in ("PersistentVolume", "PersistentVolumeClaim"):
        def specs(plan, kind=kind):
            return {(m["metadata"].get("namespace"), m["metadata"]["name"]): m["spec"] for m in manifests_of(plan, kind)}
        assert specs(before) == specs(after)


def test_loader_pod_is_unprivileged(plans):
    """Root only where the export it writes is root-owned (Filestore); everywhere a read-only root
    filesystem, no capabilities, and emptyDirs for what the libraries write besides the weights."""
    for plan in plans.values():
        for job in manifests_of(plan, "Job", "vllm-gke-system"):
            pod = job["spec"]["template"]["spec"]
            assert pod["automountServiceAccountToken"] is False
            (c,) = pod["containers"]
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
            env = {e["name"]: e.get("value") for e in c["env"]}
            mounts = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert {env["HOME"], env["TMPDIR"], "/models"} == mounts
            assert env["CLOUDSDK_CONFIG"].startswith(env["HOME"]) and env["XDG_CACHE_HOME"].startswith(env["HOME"])
            assert env["HF_XET_CHUNK_CACHE_SIZE_BYTES"] == "0"
            if plan.config.weights.backend == "filestore":
                assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
            else:
                assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
                                                  "runAsUser": 10001, "runAsGroup": 10001}
                (weights,) = [v for v in pod["volumes"] if v["name"] == "weights"]
                assert "uid=10001,gid=10001" in weights["csi"]["volumeAttributes"]["mountOptions"]
    assert {p.config.weights.backend for p in plans.values()} >= {"filestore", "gcs"}


def test_gcs_source_uses_gcloud_loader(plan_variant):
    def to_gcs(values):
        values["vllm-gke:models"][0]["source"] = "gs://acme-models/qwen2.5-7b"

    plan = plan_variant("dev", to_gcs)
    container = plan.kube("Job", "load-qwen-7b").props["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][2:] == ["gcs", "gs://acme-models/qwen2.5-7b", model_dir(plan.config.model("qwen-7b")),
                                        "--revision", "main",
                                        "--reads", "mistral-first", "--size-key", "models[qwen-7b].diskGb",
                                        "--legacy-dest", "/models/qwen-7b/main"]
    assert container["image"].startswith("gcr.io/google.com/cloudsdktool/google-cloud-cli:")
    # Read access on the source bucket only, not on every bucket of the project...
    assert not [p for p in props_of(plan, "gcp:projects/iAMMember:IAMMember") if "storage" in p["role"]]
    grant = plan.named("gcp:storage/bucketIAMMember:BucketIAMMember", "weights-loader-source-acme-models")
    assert (grant.props["bucket"], grant.props["role"]) == ("acme-models", "roles/storage.objectViewer")
    # ...and the loader waits for it: its first run would fail without.
    job = plan.kube("Job", "load-qwen-7b")
    assert plan.waits_for(job, grant)


def test_hf_token_from_a_kubernetes_secret_reference(plan_variant):
    def use_secret(values):
        values["vllm-gke:weights"] = {"hfTokenKubernetesSecret": {"name": "hf-credentials", "key": "hf"}}

    plan = plan_variant("dev", use_secret)
    job = plan.kube("Job", "load-qwen-7b").props
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "hf-credentials", "key": "hf"}}}
    assert [v["name"] for v in job["spec"]["template"]["spec"]["volumes"]] == ["weights", "home", "tmp", "program"]
    assert not manifests_of(plan, "SecretProviderClass")
    assert not props_of(plan, "gcp:secretmanager/secretIamMember:SecretIamMember")


@pytest.mark.parametrize("tier,gb,size", [
    ("ZONAL", 1000, 1024), ("ZONAL", 9984, 9984), ("ZONAL", 9985, 10240), ("ZONAL", 12000, 12800),
    ("REGIONAL", 20000, 20480), ("BASIC_HDD", 1100, 1280),
])
def test_filestore_sizes_are_ones_the_tier_offers(tier, gb, size):
    """Zonal and regional: 256 GiB steps to 9.75 TiB, then 2.5 TiB steps from 10 TiB."""
    from vllm_gke.components.model.weights_layout import filestore_capacity

    assert filestore_capacity(tier, gb) == size


def test_a_share_near_the_top_of_its_range_is_warned_about(stack_values):
    import copy

    from vllm_gke.infra.advice import plan_warnings
    from vllm_gke.infra.config import parse

    cfg = parse(copy.deepcopy(stack_values["prod"]))
    assert [w for w in plan_warnings(cfg, "ZONAL", 9728) if "cannot grow past it in place" in w]
    assert not [w for w in plan_warnings(cfg, "ZONAL", 4096) if "cannot grow past it in place" in w]


def _share(plan):
    (fs,) = props_of(plan, "gcp:filestore/instance:Instance")
    claims = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in manifests_of(plan, "PersistentVolumeClaim")}
    pvs = {m["metadata"]["name"] for m in manifests_of(plan, "PersistentVolume")}
    mounted = {v["persistentVolumeClaim"]["claimName"] for d in vllm_deployments(plan)
               for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights"}
    loaders = {v["persistentVolumeClaim"]["claimName"] for j in manifests_of(plan, "Job", "vllm-gke-system")
               for v in j["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights"}
    return fs, claims, pvs, mounted, loaders


def test_adding_a_large_model_keeps_the_share_and_its_claims(plans, plan_variant):
    """The tier is the config's: 900 GB more weights (once over auto's 100 GB line to ZONAL) grow the
    share in place, nothing is re-created."""
    def add_70b(values):
        values["vllm-gke:models"].append({**values["vllm-gke:models"][0], "name": "big", "diskGb": 900})
        values["vllm-gke:nodePools"][0]["maxNodes"] = 8
        values["vllm-gke:weights"]["capacityGb"] = 2560  # a Basic share grows when this key says so
    before, after = _share(plans["dev"]), _share(plan_variant("dev", add_70b))
    assert (before[0]["name"], before[0]["tier"], before[0]["location"]) == \
        (after[0]["name"], after[0]["tier"], after[0]["location"])
    assert after[0]["fileShares"]["capacityGb"] > before[0]["fileShares"]["capacityGb"]
    assert before[1:3] == after[1:3] and before[3] <= after[3]


@pytest.mark.parametrize("change", ["tier", "zone"])
def test_a_new_share_comes_up_beside_the_old_one_and_pods_roll_onto_it(plans, plan_variant, change):
    """A tier or zone change re-creates the share: under new names (instance, PVs, PVCs) nothing is
    deleted first, the loaders re-run onto the new share, and the servers' claim changes, so they
    roll onto it; the old claims, still in use until then, go after."""
    def move(values):
        if change == "tier":
            values["vllm-gke:weights"]["tier"] = "ZONAL"
        else:
            values["vllm-gke:cluster"]["zones"] = ["us-central1-b"]
    old, new = _share(plans["dev"]), _share(plan_variant("dev", move))
    assert old[0]["name"] != new[0]["name"]
    for before, after in zip(old[1:], new[1:]):
        assert before and after and not before & after
    (claim,) = new[3]
    assert ("vllm", claim) in new[1]
    (rw,) = new[4]
    assert ("vllm-gke-system", rw) in new[1]


def test_the_share_and_its_claims_are_not_deleted_before_they_are_replaced(plans):
    plan = plans["dev"]
    share = [r for r in plan.resources if r.type in ("gcp:filestore/instance:Instance",)
             or r.props.get("kind") in ("PersistentVolume", "PersistentVolumeClaim")]
    assert len(share) == 5 and not any(r.delete_before_replace for r in share)


def test_filestore_instance_names_stay_valid():
    from vllm_gke.components.model.weights_layout import share_identity, share_instance_name

    identity = share_identity("c" * 70, "ZONAL", "us-central1-a")
    name = share_instance_name("c" * 70, identity)
    assert len(name) == 63 and name.endswith(f"-{identity}")
    assert share_identity("a", "ZONAL", "us-central1-a") != share_identity("a", "ZONAL", "us-central1-b")


def test_a_basic_share_is_sized_by_its_key_and_never_shrinks(dev_values):
    from vllm_gke.infra.config import ConfigError, parse

    dev_values["vllm-gke:models"].append({**dev_values["vllm-gke:models"][0], "name": "big", "diskGb": 900})
    dev_values["vllm-gke:nodePools"][0]["maxNodes"] = 8
    with pytest.raises(ConfigError) as exc:
        parse(dev_values)
    (issue,) = [str(i) for i in exc.value.issues]
    # (15.2 + 900) + 900 again for a new revision beside the current copy, x 1.3.
    assert "vllm-gke:weights.capacityGb" in issue and "set weights.capacityGb to 2360 or more" in issue
    # Removing the model again plans the same size: nothing for the API to refuse.
    dev_values["vllm-gke:weights"]["capacityGb"] = 2560
    grown = plan_filestore(parse(dev_values).models, parse(dev_values).weights)
    dev_values["vllm-gke:models"].pop()
    assert plan_filestore(parse(dev_values).models, parse(dev_values).weights) == grown == ("BASIC_HDD", 2560)


def test_crossing_a_zonal_size_range_brings_up_a_new_share(plans, plan_variant):
    """A ZONAL share cannot move from the 1-9.75 TiB range to 10 TiB and up in place."""
    def grow(values):
        values["vllm-gke:weights"] = {"tier": "ZONAL", "capacityGb": 9984}
    def cross(values):
        values["vllm-gke:weights"] = {"tier": "ZONAL", "capacityGb": 10240}
    low, high = _share(plan_variant("dev", grow)), _share(plan_variant("dev", cross))
    assert low[0]["name"] != high[0]["name"] and not low[1] & high[1]
    same = _share(plan_variant("dev", lambda v: v.update({"vllm-gke:weights": {"tier": "ZONAL", "capacityGb": 2048}})))
    assert same[0]["name"] == low[0]["name"]  # within a range: resized in place


def test_bucket_sources_alone_need_no_secret_manager(plan_variant):
    """No hf:// source, no Hugging Face token: no Secret Manager API, add-on, grant or mount."""
    def from_buckets(values):
        for m in values["vllm-gke:models"]:
            m["source"] = f"gs://acme-models/{m['name']}"
    plan = plan_variant("dev", from_buckets)
    from vllm_gke.components.model.gcp_apis import required_apis

    assert "secretmanager.googleapis.com" not in required_apis(plan.config)
    (cluster,) = props_of(plan, "gcp:container/cluster:Cluster")
    assert not (cluster.get("secretManagerConfig") or {}).get("enabled")
    assert not props_of(plan, "gcp:secretmanager/secretIamMember:SecretIamMember")
    assert not manifests_of(plan, "SecretProviderClass")
    for job in manifests_of(plan, "Job", "vllm-gke-system"):
        assert not any(v["name"] == "hf-token" for v in job["spec"]["template"]["spec"]["volumes"])


def _servers_of(plan, model: str):
    return [r for r in plan.kubernetes() if r.props.get("kind") in ("Deployment", "LeaderWorkerSet")
            and (r.props["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "vllm"
            and r.props["metadata"]["labels"].get("vllm-gke.io/model") == model]


def test_old_folders_are_pruned_only_after_every_reader_of_the_model_rolled(prod_by_hand):
    """The defect: each loader removed the other folders as soon as its own copy was complete,
    while the servers (rolled only after every loader, and never by a failed `up`) still read
    them: a server restarting then waited forever for a deleted marker. Now a prune Job per model
    runs after every server of the model (each pool, the canary, dedicated copies) and its load
    tests were updated, keeping the folders they read now."""
    plan = prod_by_hand  # rollouts off: with Flagger nothing is pruned (the next test)
    for job in manifests_of(plan, "Job", "vllm-gke-system"):
        assert "--prune-siblings" not in job["spec"]["template"]["spec"]["containers"][0]["command"]
    llama = plan.config.model("llama-8b")
    prune = plan.kube("Job", "prune-llama-8b", "vllm-gke-system")
    servers = _servers_of(plan, "llama-8b")
    assert {s.props["metadata"]["name"] for s in servers} >= {"llama-8b-short", "llama-8b-canary-short"}
    for reader in [*servers, plan.kube("CronJob", "loadtest-search-llama-8b")]:
        assert plan.waits_for(prune, reader), reader.name
    # The dedicated tenant's copy of qwen-7b, in its own namespace, too.
    dedicated = [s for s in _servers_of(plan, "qwen-7b") if s.props["metadata"]["namespace"] != "vllm"]
    assert dedicated and all(plan.waits_for(plan.kube("Job", "prune-qwen-7b"), s) for s in dedicated)
    # Nothing that serves waits for a prune (the servers wait for the store, not the other way).
    assert not any(plan.waits_for(s, prune) for s in servers)
    assert not plan.waits_for(prune, _servers_of(plan, "qwen-7b")[0])
    # It keeps the current and canary revisions and the adapters; it removes nothing else's.
    (container,) = prune.props["spec"]["template"]["spec"]["containers"]
    kept = container["command"][3:]
    assert container["command"][:3] == ["python3", "/opt/vllm-gke-loader/load_weights.py", "prune"]
    assert kept == sorted([model_dir(llama), model_dir(llama.canary_model()),
                           *(adapter_dir(llama, a) for a in llama.adapters)])
    # The loader's identity, volume, pool and hardening.
    loader = plan.kube("Job", "load-llama-8b").props["spec"]["template"]["spec"]
    pod = prune.props["spec"]["template"]["spec"]
    for key in ("serviceAccountName", "nodeSelector", "securityContext", "volumes", "automountServiceAccountToken"):
        assert pod[key] == (loader[key] if key != "volumes" else [v for v in loader[key] if v["name"] != "hf-token"])
    assert container["securityContext"] == loader["containers"][0]["securityContext"]


def test_a_changed_kept_set_reruns_the_prune(plans, plan_variant):
    """A Job's template cannot change: a new kept set (a new revision) is a new spec, which Pulumi
    replaces, so the prune runs again after the servers rolled onto the new revision."""
    def bump(values):
        values["vllm-gke:models"][0]["revision"] = "v2"
    before = plans["dev"].kube("Job", "prune-qwen-7b").props["spec"]
    after = plan_variant("dev", bump).kube("Job", "prune-qwen-7b").props["spec"]
    assert before["template"]["spec"]["containers"][0]["command"] != after["template"]["spec"]["containers"][0]["command"]


def test_a_share_without_room_for_a_new_copy_of_the_largest_model_is_refused(stack_values):
    """The defect: sized for the copies plus 30%, frontier's 1280 GiB share held its ~902 GB but
    not a new 405B revision beside them: the loader checks the free space first and exits 3, so
    every revision or source change of the 405B failed `pulumi up`."""
    import copy

    from vllm_gke.infra.config import ConfigError, parse

    values = copy.deepcopy(stack_values["frontier"])
    values["vllm-gke:weights"]["capacityGb"] = 1280
    with pytest.raises(ConfigError) as exc:
        parse(values)
    (issue,) = [str(i) for i in exc.value.issues]
    assert issue.startswith("vllm-gke:weights.capacityGb") and "set weights.capacityGb to 2316 or more" in issue
    del values["vllm-gke:weights"]["capacityGb"]  # derived: always enough
    cfg = parse(values)
    assert plan_filestore(cfg.models, cfg.weights) == ("ZONAL", 2560)
    assert parse(stack_values["frontier"]).weights.capacity_gb == 2560


def test_a_model_flagger_rolls_out_keeps_its_earlier_folders(plans, prod_by_hand):
    """A Flagger pool's primary reads the revision it serves until a canary is promoted (for good
    after a rollback), which no config names: a prune after `pulumi up` would delete the folder it
    reads. Prod rolls every model out by canary: no prune Job; by hand, one per model."""
    assert not [j for j in manifests_of(plans["prod"], "Job", "vllm-gke-system") if j["metadata"]["name"].startswith("prune-")]
    pruned = {j["metadata"]["name"] for j in manifests_of(prod_by_hand, "Job", "vllm-gke-system")
              if j["metadata"]["name"].startswith("prune-")}
    assert pruned == {f"prune-{m.name}" for m in prod_by_hand.config.models}
