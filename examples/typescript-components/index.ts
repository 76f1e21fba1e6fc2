// The vllm-gke components from TypeScript. `pulumi package add ../../components/provider`
// generates the @pulumi/vllm-gke SDK under sdks/ from the package schema.
import * as pulumi from "@pulumi/pulumi";
import * as vllmgke from "@pulumi/vllm-gke";

const project = new pulumi.Config("gcp").require("project");

const clusterSpec = {
    name: "ts-prod",
    zones: ["us-central1-a", "us-central1-b"],
    releaseChannel: "STABLE",
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
    consumerNamespaces: { "serving": "vllm" },  // a map: its keys are yours
});

const tenant = {
    name: "search",
    jwt: { issuer: "https://auth.acme.example/search", jwksUri: "https://auth.acme.example/search/jwks", audiences: ["llm"] },
    models: ["qwen-7b"],
    rateLimit: { requestsPerMinute: 600 },
    maxTokens: 2048,
};

new vllmgke.TenantAuth("search", {
    tenant: tenant,
    cluster: clusterSpec,  // its ranges: who may health-check and scrape the servers
    kubeconfig: cluster.kubeconfig,
    servingNamespace: "vllm",
    sharedModels: ["qwen-7b"],
});

const pools = ["short", "long"].map(pool => new vllmgke.VllmService(`qwen-7b-${pool}`, {
    model: model,
    poolName: pool,
    nodePool: { name: "a100-mig", machineType: "a2-highgpu-8g", gpuPartitionSize: "3g.20gb" },
    namespace: "vllm",
    image: image,
    claimName: weights.claimName,
    kubeconfig: cluster.kubeconfig,
    project: project,  // KEDA (installed in the cluster) reads the queue depth from its Managed Prometheus
    tenants: [tenant],
}));

const gateway = new vllmgke.Gateway("gateway", {
    gateway: { className: "gke-l7-regional-external-managed", hostname: "llm.acme.example", managedCertificate: true },
    namespace: "vllm",
    targets: [{
        routeName: "qwen-7b", namespace: "vllm", pathPrefix: "qwen-7b",
        // VllmService names its Service <model>-<pool>.
        shortService: "qwen-7b-short", longService: "qwen-7b-long", longRequestBytes: 16384,
    }],
    kubeconfig: cluster.kubeconfig,
    project: project,
    region: "us-central1",
    namePrefix: "ts-prod",
});

new vllmgke.Observability("observability", {
    project: project,
    clusterName: "ts-prod",  // plain: it names the dashboard's queries
    title: "vLLM on GKE (TypeScript example)",
    monitoring: { notificationEmails: ["oncall@acme.example"], queueLatencySloSeconds: 1 },
});

export const services = pools.map(p => p.serviceName);
export const address = gateway.address;
export const dnsRecord = gateway.dnsAuthorizationRecord;
