"""The vllm-gke stack program, its config schema and the offline plan."""
