"""The first `pulumi up` into an empty project: what must exist before what.

The plan records each resource's dependencies as the engine sees them (depends_on, the
resources whose outputs feed its inputs, its provider); these tests follow them transitively.
"""

from __future__ import annotations

import pytest

from tests.conftest import STACKS, vllm_deployments

SERVICE = "gcp:projects/service:Service"
# Resource type prefix -> the API it calls.
API_OF = {
    "gcp:compute/": "compute.googleapis.com",
    "gcp:container/": "container.googleapis.com",
    "gcp:filestore/": "file.googleapis.com",
    "gcp:gkehub/": "gkehub.googleapis.com",
    "gcp:secretmanager/": "secretmanager.googleapis.com",
    "gcp:monitoring/": "monitoring.googleapis.com",
    "gcp:serviceaccount/": "iam.googleapis.com",
    "gcp:projects/iAMMember": "cloudresourcemanager.googleapis.com",
    "gcp:certificatemanager/": "certificatemanager.googleapis.com",
    "gcp:billing/": "billingbudgets.googleapis.com",
}


def api_service(plan, api):
    return next(r for r in plan.of_type(SERVICE) if r.props["service"] == api)


@pytest.mark.parametrize("stack", STACKS)
def test_every_gcp_resource_waits_for_its_api(plans, stack):
    plan = plans[stack]
    checked = 0
    for r in plan.resources:
        api = next((a for prefix, a in API_OF.items() if r.type.startswith(prefix)), None)
        if api is None or not r.custom:
            continue
        assert plan.waits_for(r, api_service(plan, api)), (r.type, r.name, api)
        checked += 1
    assert checked > 20


def test_apis_stay_enabled_on_destroy(plans):
    services = plans["prod"].of_type(SERVICE)
    assert {s.props["service"] for s in services} >= {
        "container.googleapis.com", "file.googleapis.com", "gkehub.googleapis.com", "mesh.googleapis.com",
        "secretmanager.googleapis.com", "monitoring.googleapis.com", "compute.googleapis.com"}
    assert all(s.props["disableOnDestroy"] is False for s in services)
    staging = {s.props["service"] for s in plans["staging"].of_type(SERVICE)}
    assert "certificatemanager.googleapis.com" in staging  # only where a managed certificate is used
    assert "certificatemanager.googleapis.com" not in {s.props["service"] for s in services}


@pytest.mark.parametrize("stack", STACKS)
def test_workload_identity_bindings_wait_for_the_cluster(plans, stack):
    """PROJECT.svc.id.goog exists only once the cluster does: a binding made before fails."""
    plan = plans[stack]
    (cluster,) = plan.of_type("gcp:container/cluster:Cluster")
    bindings = [r for r in plan.of_type("gcp:serviceaccount/iAMMember:IAMMember")
                if ".svc.id.goog[" in r.props["member"]]
    # the loader and KEDA's operator, and where pools roll out by canary, Flagger's PromQL frontend
    flagger = {"flagger-frontend-wi"} if plan.config.rollouts.enabled else set()
    assert {b.name for b in bindings} == {"weights-loader-wi", "keda-wi", *flagger}
    for binding in bindings:
        assert plan.waits_for(binding, cluster), binding.name


@pytest.mark.parametrize("stack", STACKS)
def test_mesh_resources_and_meshed_pods_wait_for_mesh_readiness(plans, stack):
    plan = plans[stack]
    job = plan.kube("Job", "mesh-ready")
    (membership,) = plan.of_type("gcp:gkehub/featureMembership:FeatureMembership")
    assert plan.waits_for(job, membership)
    istio = [r for r in plan.kubernetes() if "istio.io/" in r.type]
    assert {r.props["kind"] for r in istio} >= {"AuthorizationPolicy", "RequestAuthentication", "ServiceEntry",
                                                "DestinationRule"}
    for r in istio:
        assert plan.waits_for(r, job), r.name
    for dep in vllm_deployments(plan):
        resource = plan.kube("Deployment", dep["metadata"]["name"], dep["metadata"]["namespace"])
        assert plan.waits_for(resource, job), dep["metadata"]["name"]


def test_mesh_readiness_waits_for_crds_then_the_control_plane(plans):
    for stack, revision in (("dev", "asm-managed"), ("prod", "asm-managed-stable")):
        job = plans[stack].kube("Job", "mesh-ready").props
        pod = job["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["command"] == ["kubectl"] and init["args"][:2] == ["wait", "--for=condition=Established"]
        assert "crd/requestauthentications.security.istio.io" in init["args"]
        assert "crd/serviceentries.networking.istio.io" in init["args"]
        (main,) = pod["containers"]
        assert main["args"][-1] == f"controlplanerevision/{revision}"
        assert "--for=condition=ProvisioningFinished" in main["args"]
        assert job["spec"]["backoffLimit"] >= 10  # kubectl wait fails until the CRDs exist: retry


def test_loader_waits_for_its_identity(plans):
    plan = plans["dev"]
    job = plan.kube("Job", "load-qwen-7b")
    binding = plan.named("gcp:serviceaccount/iAMMember:IAMMember", "weights-loader-wi")
    assert plan.waits_for(job, binding)


def test_a_component_depends_on_reaches_its_children(plans):
    """Pulumi does not pass a component's depends_on to its children; child_opts does."""
    plan = plans["prod"]
    job = plan.kube("Job", "mesh-ready")
    for kind in ("Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"):
        for r in plan.kubernetes():
            if r.props.get("kind") == kind and r.props["metadata"].get("namespace") in ("vllm", "tenant-analytics"):
                assert plan.waits_for(r, job), (kind, r.name)


def test_groups_wait_for_the_leader_worker_set_webhooks(plans):
    """A LeaderWorkerSet created before its controller's webhooks serve is refused (they fail
    closed): every set waits for the Job that dry-runs one through them, which waits for the
    controller's manifests; and for the mesh, as any serving pod."""
    plan = plans["frontier"]
    ready = plan.kube("Job", "lws-webhook-ready", "lws-system")
    manifests = next(r for r in plan.resources if r.type == "kubernetes:yaml/v2:ConfigFile" and r.name == "lws-manifests")
    assert plan.waits_for(ready, manifests)
    groups = [r for r in plan.kubernetes() if r.props.get("kind") == "LeaderWorkerSet"]
    assert len(groups) == 2
    for group in groups:
        assert plan.waits_for(group, ready), group.name
        assert plan.waits_for(group, plan.kube("Job", "mesh-ready")), group.name


@pytest.mark.parametrize("stack", STACKS)
def test_slos_wait_until_cloud_monitoring_knows_their_metrics(plans, stack):
    """Cloud Monitoring refuses an SLO on a metric without a descriptor, and Managed Prometheus
    makes one only on first ingesting it: on a new project (a pool at minReplicas 0 may never run a
    replica) each SLO on a Managed Prometheus metric waits for the Job that seeds every such metric
    its filters name, with their label keys, and succeeds once each descriptor exists."""
    import json
    import re

    from vllm_gke.components.slo_metrics import GMP

    plan = plans[stack]
    slos = plan.of_type("gcp:monitoring/slo:Slo")
    assert slos
    job = plan.kube("Job", "slo-metrics", "vllm-gke-slo-metrics")
    (config,) = [r for r in plan.kubernetes() if r.props.get("kind") == "ConfigMap"
                 and r.props["metadata"]["name"] == "slo-metrics"]
    seeded = {m["type"]: m["text"] for m in json.loads(config.props["data"]["seed.json"])["metrics"]}
    on_gmp = 0
    for slo in slos:
        filters = [f for f in re.findall(r'metric\.type=\\"([^\\]+)\\"', json.dumps(slo.props["requestBasedSli"]))]
        if not any(f.startswith(GMP) for f in filters):
            continue  # built-in metrics (the load balancer's) have descriptors in every project
        on_gmp += 1
        assert plan.waits_for(slo, job), slo.name
        for metric in filters:
            assert metric in seeded, (slo.name, metric)
            for label in re.findall(r'metric\.label\.\\"([^\\]+)\\"', json.dumps(slo.props["requestBasedSli"])):
                assert f'{label}="' in seeded[metric], (metric, label)
    # All but the gateway's and each Cloud Run model's availability (built-in metrics: the load balancer's, Cloud Run's).
    assert on_gmp == len(slos) - 1 - len(plan.config.cloud_run_models)
    # the Job reads descriptors as its own identity, and is scraped by its own PodMonitoring
    grant = next(r for r in plan.of_type("gcp:projects/iAMMember:IAMMember") if r.props["role"] == "roles/monitoring.viewer"
                 and "/ns/vllm-gke-slo-metrics/" in r.props["member"])
    assert plan.waits_for(job, grant) and "/ns/vllm-gke-slo-metrics/sa/slo-metrics" in grant.props["member"]
    assert plan.waits_for(job, plan.kube("PodMonitoring", "slo-metrics", "vllm-gke-slo-metrics"))
