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
    assert twin["autoscaling"]["totalMinNodeCount"] == 0
    assert spot["autoscaling"] == {"totalMinNodeCount": 1, "totalMaxNodeCount": 1, "locationPolicy": "ANY"}
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
    # Moving warm pods back to spot evicts them: off unless the pool opts in.
    assert cc["spec"]["activeMigration"] == {"optimizeRulePriority": False}


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


def test_node_counts_are_totals_across_zones(plans):
    """Per-zone min/max in a three-zone pool would run 3x what the capacity check and cost assume."""
    for plan in plans.values():
        for name, pool in pools(plan).items():
            autoscaling = pool["autoscaling"]
            if len(pool.get("nodeLocations") or []) == 1:
                continue  # a TPU pool lives in one zone: its per-zone counts are the totals
            assert "minNodeCount" not in autoscaling and "maxNodeCount" not in autoscaling, name
    prod = pools(plans["prod"])
    assert prod["a100-tp8"]["autoscaling"]["totalMaxNodeCount"] == 6
    assert prod["a100-tp8"]["initialNodeCount"] == 0
    assert prod["system"]["autoscaling"]["totalMinNodeCount"] == 3
    assert prod["system"]["initialNodeCount"] == 1  # per zone: three zones, three nodes


def test_spot_return_migration_is_opt_in(plan_variant):
    def opt_in(values):
        values["vllm-gke:nodePools"][2]["spotReturnMigration"] = True
    (cc,) = manifests_of(plan_variant("prod", opt_in), "ComputeClass")
    assert cc["spec"]["activeMigration"] == {"optimizeRulePriority": True}


def test_gpu_pools_surge_a_node_before_draining_one(plans):
    for name, pool in pools(plans["prod"]).items():
        assert pool["upgradeSettings"] == {"strategy": "SURGE", "maxSurge": 1, "maxUnavailable": 0}, name


def test_blue_green_upgrades_on_request(plan_variant):
    def blue_green(values):
        values["vllm-gke:nodePools"][0]["upgrade"] = {"strategy": "BLUE_GREEN", "soakMinutes": 20}
    pool = pools(plan_variant("prod", blue_green))["a100-tp8"]
    assert pool["upgradeSettings"]["strategy"] == "BLUE_GREEN"
    assert pool["upgradeSettings"]["blueGreenSettings"]["nodePoolSoakDuration"] == "1200s"


def test_maintenance_window_and_exclusions(plans):
    (prod,) = props_of(plans["prod"], CLUSTER)
    policy = prod["maintenancePolicy"]
    assert policy["recurringWindow"] == {"startTime": "2026-01-03T02:00:00Z", "endTime": "2026-01-03T08:00:00Z",
                                         "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU"}
    (freeze,) = policy["maintenanceExclusions"]
    assert freeze["exclusionName"] == "quarter-end-freeze"
    assert freeze["exclusionOptions"] == {"scope": "NO_MINOR_OR_NODE_UPGRADES"}
    (dev,) = props_of(plans["dev"], CLUSTER)
    assert "maintenancePolicy" not in dev


def test_control_plane_authorized_networks(plans, plan_variant):
    (prod,) = props_of(plans["prod"], CLUSTER)
    assert prod["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "203.0.113.0/24", "displayName": "office"},
                       {"cidrBlock": "198.51.100.16/28", "displayName": "ci"}],
        "gcpPublicCidrsAccessEnabled": False}
    def open_to_all(values):
        del values["vllm-gke:cluster"]["authorizedNetworks"]
    (dev,) = props_of(plan_variant("dev", open_to_all), CLUSTER)
    assert "masterAuthorizedNetworksConfig" not in dev


def test_secret_manager_add_on_only_where_the_weights_read_from_it(plans, plan_variant):
    (cluster,) = plans["dev"].of_type("gcp:container/cluster:Cluster")
    assert cluster.props["secretManagerConfig"] == {"enabled": True}  # the HF token from Secret Manager
    plan = plan_variant("dev", lambda v: v.setdefault("vllm-gke:weights", {}).update(
        hfTokenKubernetesSecret={"name": "hf-token"}))
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    assert cluster.props["secretManagerConfig"] == {"enabled": False}


def test_a_cluster_with_groups_across_hosts_enforces_network_policy(plans):
    """frontier's LeaderWorkerSet groups rely on their NetworkPolicy: its cluster runs Dataplane V2
    (datapathProvider ADVANCED_DATAPATH), which GKE fixes at creation."""
    (cluster,) = props_of(plans["frontier"], CLUSTER)
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH"
