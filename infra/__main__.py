"""Entry point for `pulumi up -s <stack>` (Pulumi.yaml: main: infra/)."""

from infra.config import load
from infra.program import build

build(load())
