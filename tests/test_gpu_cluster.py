"""GpuCluster: VPC-native cluster, system pool, GPU/MIG pools, spot with on-demand fallback."""

from __future__ import annotations

import json

from tests.conftest import manifests_of, props_of

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"


def pools(plan) -> dict[str, dict]:
    return {p["name"]: p for p in props_of(plan, NODE_POOL)}


def test_cluster_features(plans):
    (cluster,) = props_of(plans["prod"], CLUSTER)
    assert cluster["networkingMode"] == "VPC_NATIVE"
    assert cluster["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "pods",
                                             "servicesSecondaryRangeName": "services"}
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "acme-llm-prod.svc.id.goog"}
    assert cluster["monitoringConfig"]["managedPrometheus"] == {"enabled": True}
    assert "DCGM" in cluster["monitoringConfig"]["enableComponents"]
    assert cluster["addonsConfig"]["gcpFilestoreCsiDriverConfig"] == {"enabled": True}
    assert cluster["gatewayApiConfig"] == {"channel": "CHANNEL_STANDARD"}
    assert cluster["releaseChannel"] == {"channel": "STABLE"}
    assert cluster["removeDefaultNodePool"] is True
    assert cluster["nodeLocations"] == ["us-central1-a", "us-central1-b", "us-central1-c"]


def test_dev_has_system_pool_and_spot_mig_pool_with_fallback(plans):
    by_name = pools(plans["dev"])
    assert set(by_name) == {"system", "a100-mig", "a100-mig-ondemand"}
    assert "guestAccelerators" not in by_name["system"]["nodeConfig"]
    spot, twin = by_name["a100-mig"], by_name["a100-mig-ondemand"]
    assert spot["nodeConfig"]["spot"] is True and twin["nodeConfig"]["spot"] is False
    assert twin["autoscaling"]["minNodeCount"] == 0
    assert spot["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 1, "locationPolicy": "ANY"}
    for pool in (spot, twin):
        (acc,) = pool["nodeConfig"]["guestAccelerators"]
        assert acc == {"type": "nvidia-tesla-a100", "count": 1, "gpuPartitionSize": "3g.20gb",
                       "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"}}


def test_accelerators_derive_from_machine_type(plans):
    by_name = pools(plans["prod"])
    tp8 = by_name["a100-tp8"]["nodeConfig"]["guestAccelerators"][0]
    assert tp8["type"] == "nvidia-tesla-a100" and tp8["count"] == 8 and "gpuPartitionSize" not in tp8
    mig = by_name["a100-mig"]["nodeConfig"]["guestAccelerators"][0]
    assert mig["gpuPartitionSize"] == "3g.20gb" and mig["count"] == 8
    assert by_name["a100-tp8"]["autoscaling"]["locationPolicy"] == "BALANCED"


def test_every_gpu_pool_is_tainted(plans):
    for plan in plans.values():
        for name, pool in pools(plan).items():
            taints = pool["nodeConfig"].get("taints", [])
            has_gpu = "guestAccelerators" in pool["nodeConfig"]
            assert has_gpu == any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NO_SCHEDULE" for t in taints), name


def test_compute_class_prefers_spot_then_on_demand(plans):
    (cc,) = manifests_of(plans["prod"], "ComputeClass")
    assert cc["metadata"]["name"] == "a100-spot"
    assert cc["spec"]["priorities"] == [{"nodepools": ["a100-spot"]}, {"nodepools": ["a100-spot-ondemand"]}]
    assert cc["spec"]["activeMigration"] == {"optimizeRulePriority": True}


def test_kubernetes_provider_uses_exec_auth_not_static_credentials(plans):
    (provider,) = plans["dev"].of_type("pulumi:providers:kubernetes")
    kubeconfig = json.loads(provider.props["kubeconfig"])
    user = kubeconfig["users"][0]["user"]
    assert user["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert "token" not in user and "client-key-data" not in user
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://203.0.113.10"


def test_nodes_run_as_least_privilege_service_account(plans):
    roles = {r["role"] for r in props_of(plans["dev"], "gcp:projects/iAMMember:IAMMember")}
    assert "roles/editor" not in roles and "roles/monitoring.metricWriter" in roles
    for pool in pools(plans["dev"]).values():
        assert pool["nodeConfig"]["serviceAccount"] == "vllm-dev-nodes@acme-llm-dev.iam.gserviceaccount.com"
        assert pool["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}


def test_mesh_is_enabled_through_the_fleet(plans):
    (fm,) = props_of(plans["dev"], "gcp:gkehub/featureMembership:FeatureMembership")
    assert fm["feature"] == "servicemesh" and fm["mesh"] == {"management": "MANAGEMENT_AUTOMATIC"}
