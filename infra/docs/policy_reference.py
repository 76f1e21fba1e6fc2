"""docs/reference/policies.md: the policy pack's table (policies/rules.py POLICIES)."""

from __future__ import annotations

from ...policies.rules import POLICIES
from .common import _cell, footer

POLICY_PREAMBLE = """\
# Policies

`policies/` is a CrossGuard pack: `pulumi preview -s prod --policy-pack policies` (it runs in the
project's `.venv`; see `PulumiPolicy.yaml`). The rules themselves are plain functions in
modules by what they protect (`policies/cluster.py`, `weights.py`, `workloads.py`, `tenant_access.py`,
`inference_gateway.py`, `tenant_limits.py`, `availability.py`; `policies/rules.py` assembles the
table), which the offline plan calls on the planned resources, so both give the same
verdicts. Levels are defaults; override them with `--policy-pack-config policies/policy-config.example.json`
for Pulumi, or `vllm-gke plan --policy-config FILE` offline (same format: `{"all": "advisory",
"<policy>": "mandatory" | "disabled" | {"enforcementLevel": ...}}`). The offline plan exits 1 on any
mandatory violation.
"""


def policies_page() -> str:

    out = [POLICY_PREAMBLE, "| policy | default | what it holds, and what it rejects | rules in |", "|---|---|---|---|"]
    for p in POLICIES:
        module = p.check.__module__.removeprefix("vllm_gke.").replace(".", "/") + ".py"
        out.append(f"| `{p.name}` | {p.level} | {_cell(p.description)} | `{module}` |")
    return "\n".join(out) + "\n" + footer("`policies/rules.py` (POLICIES)")
