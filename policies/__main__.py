"""`pulumi preview --policy-pack policies`: the vllm-gke guardrails as a CrossGuard pack.

It runs in the project's .venv (PulumiPolicy.yaml), where `pip install -e .` put the rules under
the vllm_gke namespace.
"""

from pulumi_policy import Policy, PolicyPack

from vllm_gke.policies.pack import crossguard_policies

# PolicyPack is annotated to take a List[Policy] (invariant): the StackValidationPolicy list as one.
policies: list[Policy] = [*crossguard_policies()]
PolicyPack(name="vllm-gke", policies=policies,
           description="Rejects unsafe or wasteful vLLM-on-GKE plans.")
