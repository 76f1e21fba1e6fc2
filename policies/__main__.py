"""`pulumi preview --policy-pack policies`: the vllm-gke guardrails as a CrossGuard pack."""

import sys
from pathlib import Path

# The pack runs from this folder; make the repository importable for policies.rules and the catalog.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import PolicyPack  # noqa: E402

from policies.pack import crossguard_policies  # noqa: E402

PolicyPack(name="vllm-gke", policies=crossguard_policies(),
           description="Rejects unsafe or wasteful vLLM-on-GKE plans.")
