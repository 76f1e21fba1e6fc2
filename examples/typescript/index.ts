// A whole vllm-gke platform from TypeScript: one Platform serving Qwen2.5-7B to one tenant.
// `pulumi install` generates the @pulumi/vllm-gke SDK under sdks/ from the package Pulumi.yaml
// names (../../components/provider), then installs package.json's dependencies.
// The settings are a stack config's (docs/reference/config.md), checked the same way.
// examples/typescript-components composes the finer components by hand instead.
import * as pulumi from "@pulumi/pulumi";
import * as vllmgke from "@pulumi/vllm-gke";

const project = new pulumi.Config("gcp").require("project");

const platform = new vllmgke.Platform("llm", {
    config: {
        project: project,
        region: "us-central1",
        environment: "prod",
        cluster: {
            name: "ts-prod",
            zones: ["us-central1-a", "us-central1-b"],
            releaseChannel: "STABLE",
            authorizedNetworks: [{ cidr: "203.0.113.0/24", displayName: "office" }],
        },
        nodePools: [
            { name: "a100-mig", machineType: "a2-highgpu-8g", gpuPartitionSize: "3g.20gb", minNodes: 1, maxNodes: 2 },
        ],
        serverImage: { repository: "us-central1-docker.pkg.dev/acme/vllm-gke/vllm-server", tag: "v0.34.0-gke.1" },
        models: [{
            name: "qwen-7b",
            source: "hf://Qwen/Qwen2.5-7B-Instruct",
            shape: "qwen2.5-7b",
            nodePool: "a100-mig",
            gpuMemoryUtilization: 0.95,
            short: { minReplicas: 2, maxReplicas: 6, maxNumSeqs: 16, maxModelLen: 4096, contextTokens: 2048 },
            long: { minReplicas: 1, maxReplicas: 3, maxNumSeqs: 2 },
        }],
        tenants: [{
            name: "search",
            jwt: { issuer: "https://auth.acme.example/search", jwksUri: "https://auth.acme.example/search/jwks", audiences: ["llm"] },
            models: ["qwen-7b"],
            rateLimit: { requestsPerMinute: 600 },
            maxTokens: 2048,
        }],
        weights: { tier: "REGIONAL" },
        monitoring: { notificationEmails: ["oncall@acme.example"] },
    },
});

export const routes = platform.routes;
export const kubeconfig = platform.kubeconfig;
