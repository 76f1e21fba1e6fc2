"""A platform team's own Pulumi program (Python): one Platform serving Qwen2.5-7B to one tenant.

`pip install "vllm-gke @ git+..."` (components only), `pulumi up`; offline first with
`vllm-gke preview examples/python --config gcp:project=my-project` (capacity, cost, URLs, checks,
policies). Everything the stack program of this repository declares comes from this one resource;
the settings are a stack config's, checked the same way and named as written here
(`config.models[qwen-7b].shape`; a 70B model on a 3g.20gb slice fails with the stack config's message).
"""

import pulumi

from vllm_gke.components.platform import Platform, PlatformArgs

project = pulumi.Config("gcp").require("project")

config = {
    "project": project,
    "region": "us-central1",
    "environment": "staging",
    "cluster": {"name": "team-llm", "zones": ["us-central1-a", "us-central1-c"],
                "authorizedNetworks": [{"cidr": "203.0.113.0/24", "displayName": "office"}]},
    "nodePools": [{"name": "a100-mig", "machineType": "a2-highgpu-1g", "gpuPartitionSize": "3g.20gb",
                   "minNodes": 1, "maxNodes": 2}],
    "serverImage": {"repository": "us-central1-docker.pkg.dev/team/vllm-gke/vllm-server", "tag": "v0.34.0-gke.1"},
    "models": [{"name": "qwen-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct", "shape": "qwen2.5-7b",
                "nodePool": "a100-mig", "gpuMemoryUtilization": 0.95, "maxModelLen": 8192,
                "short": {"minReplicas": 1, "maxReplicas": 2, "maxNumSeqs": 16, "maxModelLen": 4096,
                          "contextTokens": 2048},
                "long": {"minReplicas": 0, "maxReplicas": 1, "maxNumSeqs": 4, "maxNumBatchedTokens": 2048}}],
    "tenants": [{"name": "search", "jwt": {"issuer": "https://auth.team.example/search",
                                           "jwksUri": "https://auth.team.example/search/jwks",
                                           "audiences": ["llm"]},
                 "models": ["qwen-7b"], "rateLimit": {"requestsPerMinute": 600}, "maxTokens": 2048}],
    "weights": {"backend": "gcs"},
}

platform = Platform("llm", PlatformArgs(config))
pulumi.export("routes", platform.routes)
pulumi.export("kubeconfig", platform.cluster.kubeconfig)
