"""Entry point of the component package plugin (PulumiPlugin.yaml, runtime python)."""

from vllm_gke.components.provider.host import serve

if __name__ == "__main__":
    serve()
