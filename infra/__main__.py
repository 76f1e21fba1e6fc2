"""Entry point for `pulumi up -s <stack>` (Pulumi.yaml: main: infra/)."""

from vllm_gke.infra.config import load
from vllm_gke.infra.program import build

build(load())
