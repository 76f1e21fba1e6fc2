// The finer vllm-gke components composed by hand from TypeScript: the same platform one Platform
// declares (see ../typescript), for teams that wire their own. `pulumi install` generates the
// @pulumi/vllm-gke SDK under sdks/ from the package Pulumi.yaml names (../../components/provider).
import * as pulumi from "@pulumi/pulumi";
import * as vllmgke from "@pulumi/vllm-gke";

const project = new pulumi.Config("gcp").require("project");

const clusterSpec = {
    name: "ts-prod",
    zones: ["us-central1-a", "us-central1-b"],
    releaseChannel: "STABLE" as const,
    authorizedNetworks: [{ cidr: "203.0.113.0/24", displayName: "office" }],
};

const cluster = new vllmgke.GpuCluster("cluster", {
    project: project,
    region: "us-central1",
    cluster: clusterSpec,
    nodePools: [
        { name: "a100-mig", machineType: "a2-highgpu-8g", gpuPartitionSize: "3g.20gb", minNodes: 1, maxNodes: 2 },
    ],
});

// Istio resources and meshed pods wait for the managed mesh; KEDA scales the pools (and to zero).
const mesh = new vllmgke.MeshReadiness("mesh", { kubeconfig: cluster.kubeconfig, cluster: clusterSpec });
const keda = new vllmgke.Keda("keda", {
    project: project,
    kubeconfig: cluster.kubeconfig,
    workloadPool: cluster.workloadPool,
    networkName: cluster.networkName,
    cluster: clusterSpec,
});

const model = {
    name: "qwen-7b",
    source: "hf://Qwen/Qwen2.5-7B-Instruct",
    shape: "qwen2.5-7b",
    nodePool: "a100-mig",
    gpuMemoryUtilization: 0.95,
    short: { minReplicas: 2, maxReplicas: 6, maxNumSeqs: 16, maxModelLen: 4096, contextTokens: 2048 },
    long: { minReplicas: 1, maxReplicas: 3, maxNumSeqs: 2 },
};
const image = { repository: "us-central1-docker.pkg.dev/acme/vllm-gke/vllm-server", tag: "v0.34.0-gke.1" };
const tenant = {
    name: "search",
    jwt: { issuer: "https://auth.acme.example/search", jwksUri: "https://auth.acme.example/search/jwks", audiences: ["llm"] },
    models: ["qwen-7b"],
    rateLimit: { requestsPerMinute: 600 },
    maxTokens: 2048,
};

// The serving namespace: deny-all but health checks and metric scrapes from the cluster's ranges.
const serving = new vllmgke.MeshNamespace("serving", {
    name: "vllm",
    kubeconfig: cluster.kubeconfig,
    cluster: clusterSpec,
    tenants: [tenant],
}, { dependsOn: [mesh] });

new vllmgke.TenantAuth("search", {
    tenant: tenant,
    cluster: clusterSpec,  // its ranges: who may health-check and scrape the servers
    kubeconfig: cluster.kubeconfig,
    servingNamespace: serving.name,
    sharedModels: ["qwen-7b"],
}, { dependsOn: [mesh] });

const weights = new vllmgke.ModelStore("weights", {
    project: project,
    zone: "us-central1-a",
    region: "us-central1",
    networkName: cluster.networkName,
    workloadPool: cluster.workloadPool,
    kubeconfig: cluster.kubeconfig,
    models: [model],
    serverImage: image,
    weights: { tier: "REGIONAL" },
    consumerNamespaces: { "serving": serving.name },  // a map: its keys are yours
});

// Each tenant's rate limit counted across all replicas, not per replica.
const limits = new vllmgke.LimitStore("limits", {
    kubeconfig: cluster.kubeconfig,
    clientNamespaces: ["vllm"],
    image: { repository: "mirror.gcr.io/library/redis", tag: "7.4.2-alpine" },
}, { dependsOn: [mesh] });

const pools = (["short", "long"] as const).map(pool => new vllmgke.VllmService(`qwen-7b-${pool}`, {
    model: model,
    poolName: pool,
    nodePool: { name: "a100-mig", machineType: "a2-highgpu-8g", gpuPartitionSize: "3g.20gb" },
    namespace: serving.name,
    image: image,
    claimName: weights.claimName,
    kubeconfig: cluster.kubeconfig,
    project: project,  // KEDA reads the queue depth from this project's Managed Prometheus
    kedaAuth: keda.authName,
    globalLimits: true,
    requestTimeoutSeconds: 600,  // as the Gateway's: a stopping replica finishes what it accepted
    tenants: [tenant],
}, { dependsOn: [mesh, keda, weights, serving, limits] }));

const gateway = new vllmgke.Gateway("gateway", {
    gateway: { className: "gke-l7-regional-external-managed", hostname: "llm.acme.example", managedCertificate: true },
    namespace: serving.name,
    targets: [{
        routeName: "qwen-7b", namespace: serving.name, pathPrefix: "qwen-7b",
        // VllmService names its Service <model>-<pool> (plain: it names the route's backends).
        shortService: "qwen-7b-short", longService: "qwen-7b-long", longRequestBytes: 16384,
    }],
    kubeconfig: cluster.kubeconfig,
    project: project,
    region: "us-central1",
    subnetwork: cluster.subnetworkId,
    namePrefix: "ts-prod",
});

new vllmgke.Observability("observability", {
    project: project,
    clusterName: "ts-prod",  // plain: it names the dashboard's queries
    title: "vLLM on GKE (TypeScript example)",
    monitoring: { notificationEmails: ["oncall@acme.example"], queueLatencySloSeconds: 1 },
    limitStore: true,  // alert when the guards cannot reach it
});

export const services = pools.map(p => p.serviceName);
export const address = gateway.address;
export const dnsRecord = gateway.dnsAuthorizationRecord;
