"""The weights backends as facts (components/model/weights_backends.py) and the loader's pod
(components/model/pods/loader.py): plain values, no Pulumi mocks."""

from __future__ import annotations

from typing import get_args

import pytest

from vllm_gke.components.model.cold_start import read_mib_s
from vllm_gke.components.model.pods.loader import LoaderPod, LoaderRun, loader_pod
from vllm_gke.components.model.specs import ImageRef, ModelSpec, WeightsSpec
from vllm_gke.components.model.weights_backends import (
    BACKENDS,
    GCS_FUSE_READ_MIB_S,
    STORAGE_API,
    backend_of,
    filestore_read_mib_s,
)
from vllm_gke.components.model.weights_layout import LOADER_MOUNT, LOADER_UID, MOUNT_PATH, plan_filestore
from vllm_gke.components.model.weights_mount import writable_mount
from vllm_gke.components.model_store import STORAGE


def _model(params: float = 7) -> ModelSpec:
    return ModelSpec(name="m", source="hf://a/b", shape={"params_billion": params, "layers": 1,
                                                        "kv_heads": 1, "head_dim": 1}, node_pool="p")


def test_every_backend_the_config_takes_is_described_and_declared():
    names = set(get_args(WeightsSpec.model_fields["backend"].annotation))
    assert set(BACKENDS) == names
    # ...and has its storage on the resource side (components/weights_*.py, hyperdisk_weights.py).
    assert set(STORAGE) == names
    for name in names:
        assert backend_of(WeightsSpec(backend=name)).name == name


@pytest.mark.parametrize("name,bucket,share,fuse_servers,populator,one_claim", [
    ("filestore", False, True, False, False, True),
    ("gcs", True, False, True, False, False),
    ("hyperdisk-ml", True, False, False, True, False),
])
def test_each_backend_says_what_it_needs(name, bucket, share, fuse_servers, populator, one_claim):
    b = BACKENDS[name]
    assert (b.uses_bucket, b.has_filestore_share, b.servers_read_through_fuse, b.needs_volume_populator,
            b.one_claim_per_namespace) == (bucket, share, fuse_servers, populator, one_claim)
    # A bucket is written through Cloud Storage FUSE (the cluster's CSI driver) with the Storage API,
    # and the load test reads its tokenizer from it.
    assert b.needs_gcs_fuse == b.tokenizer_from_bucket == bucket
    assert b.apis == ((STORAGE_API,) if bucket else ())


def test_only_hyperdisk_ml_has_a_transfer_pool():
    weights = WeightsSpec(backend="hyperdisk-ml", populator_machine_type="c3-standard-22")
    assert backend_of(weights).transfer_machine_type(weights) == "c3-standard-22"
    for name in ("filestore", "gcs"):
        assert BACKENDS[name].transfer_machine_type(weights) is None


def test_filestore_throughput_follows_the_documented_table():
    assert filestore_read_mib_s("BASIC_HDD", 1024) == 100 and filestore_read_mib_s("BASIC_HDD", 10240) == 180
    assert filestore_read_mib_s("BASIC_SSD", 2560) == 1200
    assert filestore_read_mib_s("ZONAL", 2048) == 520
    assert filestore_read_mib_s("REGIONAL", 1024) == 120 and filestore_read_mib_s("REGIONAL", 10240) == 2600
    with pytest.raises(ValueError):
        filestore_read_mib_s("PREMIUM", 1024)


def test_each_backend_reads_at_its_own_throughput():
    models = [_model(600)]
    share = WeightsSpec(tier="ZONAL")
    assert BACKENDS["filestore"].read_mib_s(models, share) == filestore_read_mib_s(*plan_filestore(models, share))
    assert BACKENDS["gcs"].read_mib_s(models, WeightsSpec(backend="gcs")) == GCS_FUSE_READ_MIB_S
    disks = WeightsSpec(backend="hyperdisk-ml", hyperdisk_throughput_mib_s=4800)
    assert BACKENDS["hyperdisk-ml"].read_mib_s(models, disks) == 4800


def test_a_measured_throughput_overrides_any_backend(plans):
    cfg = plans["dev"].config
    for name in BACKENDS:
        weights = cfg.weights.model_copy(update={"backend": name, "read_throughput_mib_s": 333})
        assert read_mib_s(cfg.model_copy(update={"weights": weights})) == 333


# --- the loader's pod --------------------------------------------------------------------------

HUB = ImageRef(repository="example.com/p/server", tag="1")
CLI = ImageRef(repository="example.com/p/cli", tag="2")
SHARE_VOLUME = {"name": "weights", "persistentVolumeClaim": {"claimName": "model-weights-rw-abc"}}
BUCKET_VOLUME = {"name": "weights", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "readOnly": False}}


HUB_RUN = LoaderRun("m", "hf://a/b", ["python3", "load"])


def _pod(through_fuse: bool, run: LoaderRun = HUB_RUN) -> dict:
    weights = (writable_mount(BUCKET_VOLUME, {"gke-gcsfuse/volumes": "true"}, through_fuse=True) if through_fuse
               else writable_mount(SHARE_VOLUME))
    return loader_pod(LoaderPod("weights-loader", "digest1", weights, {"vllm-gke.io/role": "system"}, HUB, CLI), run)


def test_the_loader_on_a_share_runs_as_root_without_capabilities():
    pod = _pod(through_fuse=False)
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    # Filestore's export is root-owned: no runAsNonRoot, but seccomp and the container's hardening.
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not any(e["name"] == "HF_HUB_DISABLE_XET" for e in container["env"])
    assert spec["volumes"][0] == SHARE_VOLUME
    assert container["volumeMounts"][:2] == [{"name": "weights", "mountPath": MOUNT_PATH},
                                             {"name": "program", "mountPath": LOADER_MOUNT, "readOnly": True}]
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false", "vllm-gke.io/loader-program": "digest1"}
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False


def test_the_loader_through_fuse_writes_in_order_as_its_own_user():
    pod = _pod(through_fuse=True)
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
                                       "runAsUser": LOADER_UID, "runAsGroup": LOADER_UID}
    assert container["env"][-1] == {"name": "HF_HUB_DISABLE_XET", "value": "1"}
    assert spec["volumes"][0] == BUCKET_VOLUME
    assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"


def test_the_loader_image_follows_the_source_and_the_run_adds_its_own():
    assert _pod(False)["spec"]["containers"][0]["image"] == HUB.uri
    token = {"name": "hf-token", "secret": {"secretName": "t"}}
    pod = _pod(False, LoaderRun("m", "gs://b/m", ["python3", "load"], volumes=[token], cpu=("250m", "1"),
                                memory=("256Mi", "1Gi")))
    (container,) = pod["spec"]["containers"]
    assert container["image"] == CLI.uri
    assert pod["spec"]["volumes"][-1] == token
    assert container["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "4Gi"}
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert container["command"] == ["python3", "load"]
