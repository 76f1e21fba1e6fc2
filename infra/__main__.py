"""Entry point for `pulumi up -s <stack>` (Pulumi.yaml: main: infra/)."""

import pulumi

from vllm_gke.infra.config import ConfigError, load
from vllm_gke.infra.program import build

try:
    config = load()
except ConfigError as exc:
    # A RunError: `pulumi up` prints the problems, each naming its key, without a stack trace.
    raise pulumi.RunError(str(exc)) from None
build(config)
