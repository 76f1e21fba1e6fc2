"""The vllm-gke CrossGuard policy pack; the policy logic lives in policies.rules."""
