"""The installed layout (vllm_gke.*) for static tools: setuptools maps it onto the top-level folders at install time."""
