"""The vllm-gke CrossGuard policy pack; policies.rules holds the table of policies, the checks live in modules by concern."""
