"""What `vllm-gke plan` reports, collected once: the verdicts (policies, capacity, cost, accelerator
options, warnings, tenant URLs and ceilings) and the checks of what the program declared (manifests
against their schemas and CRDs, the component contracts, every vLLM command line, the monitoring
definitions), plus the files written. infra/plan_text.py renders it as tables for people;
`render_json` as one document for machines. Both read the same PlanReport, so neither can say what
the other does not."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ..components.model.vllm_argv import check_argv, load_snapshot
from ..components.model.vllm_versions import TPU_RELEASES, release
from ..components.observability import Observability
from ..policies.rules import Resource, Violation, evaluate
from .contracts import Contract
from .contracts import problems as contract_problems
from .crd_cache import CrdFolder
from .crd_validation import DEFAULT_CRD_DIR, crd_dir, load_catalog
from .manifests import (
    describe,
    is_builtin,
    pod_templates,
    unpublished,
    validate,
    validate_alert_policy,
    validate_dashboard,
    validate_slo,
)
from .mocks import PlannedResource
from .plan import Plan, is_manifest, manifest
from .plan_output import write_plan
from .plan_pictures import pictures
from .provider_schema import checked as provider_checked
from .provider_schema import problems as provider_problems
from .report import Verdicts, verdicts


@dataclass
class PlanReport:
    plan: Plan
    verdicts: Verdicts
    manifests: int  # Kubernetes manifests checked
    custom_resources: int  # of them, custom resources (checked only against upstream CRDs)
    custom_resources_checked: bool
    # Where the CRDs came from (--crds, $VLLM_GKE_CRDS_DIR, the shared folder, the user's cache), or
    # why there are none (offline, a refused checksum): one line for people.
    crd_origin: str
    # (resource, its schema errors) for each manifest that fails validation.
    manifest_problems: list[tuple[str, list[str]]]
    broken_contracts: list[tuple[Contract, str]]
    vllm_args: list[tuple[str, str]]  # (resource, what vLLM's parser refuses)
    monitoring: list[str]  # dashboards, alert policies and SLOs the Cloud Monitoring API would reject
    written: list[Path] = field(default_factory=list[Path])
    # (resource, why) for each custom resource no CRD can check (infra/manifests.UNPUBLISHED_CRDS).
    unchecked: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    written_under: Optional[Path] = None  # out/<stack> when the plan wrote its files
    # Google Cloud resources (and providers, Helm releases) checked against pulumi_gcp's SDK input
    # types (infra/provider_schema.py), and (resource, where its inputs depart from it) for each that fails.
    provider_resources: int = 0
    provider_problems: list[tuple[str, list[str]]] = field(default_factory=list[tuple[str, list[str]]])

    @property
    def unsafe(self) -> bool:
        """An invalid manifest or a mandatory policy violation: exit 1."""
        return bool(self.manifest_problems or self.monitoring or self.vllm_args or self.broken_contracts
                    or self.provider_problems or self.verdicts.mandatory)


def local_crds() -> CrdFolder:
    """The CRD folder found without the network ($VLLM_GKE_CRDS_DIR, the shared folder), for callers
    that pass none; the CLI passes crd_cache.crd_folder's, which also fetches into the user's cache."""
    path = crd_dir()
    return CrdFolder(path, str(path) if path else f"no upstream CRDs at {DEFAULT_CRD_DIR} (pass --crds DIR)")


def plan_report(plan: Plan, policy_config: Mapping[str, Any], crds: Optional[CrdFolder],
                out: Optional[Path]) -> PlanReport:
    """Every verdict and check of the plan; with `out`, its files written under out/<stack>/."""
    found = verdicts(plan, policy_config)
    docs = plan.manifests()
    crds = crds or local_crds()
    catalog = load_catalog(crds.path) if crds.path else None
    observability = plan.platform.observability
    assert observability is not None
    report = PlanReport(
        plan=plan, verdicts=found, manifests=len(docs),
        custom_resources=sum(not is_builtin(d) and not unpublished(d) for d in docs),
        custom_resources_checked=catalog is not None, crd_origin=crds.origin,
        manifest_problems=[(describe(doc), errs) for doc in docs if (errs := validate(doc, catalog))],
        broken_contracts=contract_problems(plan), vllm_args=vllm_argv_problems(plan),
        monitoring=monitoring_problems(observability),
        unchecked=[(describe(doc), why) for doc in docs if (why := unpublished(doc))],
        provider_resources=provider_checked(plan.resources), provider_problems=provider_problems(plan.resources))
    if out is not None:
        report.written = write_plan(plan, out, found.to_json(), pictures(plan.config, found.cost))
        report.written_under = out / plan.stack
    return report


def vllm_argv_problems(plan: Plan) -> list[tuple[str, str]]:
    """Every vLLM server's argv (a Deployment's, a LeaderWorkerSet's leader and workers) against its
    release's real parser (images/vllm-versions): the TPU build's on TPU nodes."""
    cfg = plan.config
    out: list[tuple[str, str]] = []
    for doc in plan.manifests():
        if doc.get("kind") not in ("Deployment", "LeaderWorkerSet"):
            continue
        for _role, template in pod_templates(doc):
            selector = template["spec"].get("nodeSelector") or {}
            rel = (TPU_RELEASES[cfg.tpu_vllm_version] if "cloud.google.com/gke-tpu-accelerator" in selector
                   else release(cfg.vllm_version))
            for c in template["spec"].get("containers", []):
                if "/opt/vllm-gke/serve.py" in c.get("command", []):
                    out += [(describe(doc), err) for err in check_argv(c.get("args", []), load_snapshot(rel.snapshot))]
    return out


def monitoring_problems(obs: Observability) -> list[str]:
    """The dashboards, alert policies and SLOs, each parsed as the Cloud Monitoring API's message."""
    errors = validate_dashboard(obs.dashboard_definition)
    for board in (obs.tenant_dashboard_definition, obs.run_dashboard_definition):  # None without tenants, Cloud Run
        errors += validate_dashboard(board) if board is not None else []
    errors += [e for p in obs.alert_definitions for e in validate_alert_policy(p)]
    if (levels := obs.service_levels) is not None:
        errors += [e for s in levels.slo_definitions for e in validate_slo(s)]
        errors += [e for p in levels.alert_definitions for e in validate_alert_policy(p)]
    return errors


def render_json(report: PlanReport) -> str:
    """The plan as one document: verdicts.json's, the checks, and the files written."""
    checks = {
        "manifests": [{"resource": str(w), "errors": [str(e) for e in errs]} for w, errs in report.manifest_problems],
        "contracts": [{"component": c.component, "source": c.source, "problem": p} for c, p in report.broken_contracts],
        "vllmArgs": [{"resource": str(w), "error": str(e)} for w, e in report.vllm_args],
        "monitoring": [str(e) for e in report.monitoring],
        "providerSchema": [{"resource": w, "errors": errs} for w, errs in report.provider_problems],
        "customResourcesChecked": report.custom_resources_checked,
        "customResourceDefinitions": report.crd_origin,
        "customResourcesUnchecked": [{"resource": w, "why": why} for w, why in report.unchecked],
    }
    return json.dumps({**report.verdicts.to_json(), "checks": checks, "written": [str(f) for f in report.written]},
                      indent=2, default=str) + "\n"


@dataclass
class ResourceChecks:
    """What can be judged of resources declared outside any Platform (a program's finer components,
    or its own): each manifest against its schema or CRD, and the policies. Capacity, cost and
    tenant URLs come from a Platform's settings, which these resources do not carry."""

    resources: int
    manifests: int
    custom_resources: int
    custom_resources_checked: bool
    crd_origin: str
    manifest_problems: list[tuple[str, list[str]]]
    violations: list[Violation]
    provider_resources: int = 0  # as PlanReport's
    provider_problems: list[tuple[str, list[str]]] = field(default_factory=list[tuple[str, list[str]]])

    @property
    def unsafe(self) -> bool:
        return bool(self.manifest_problems or self.provider_problems or any(v.level == "mandatory" for v in self.violations))

    def to_json(self) -> dict[str, Any]:
        return {"resources": self.resources, "manifests": self.manifests,
                "customResourcesChecked": self.custom_resources_checked,
                "customResourceDefinitions": self.crd_origin,
                "manifestProblems": [{"resource": w, "errors": e} for w, e in self.manifest_problems],
                "providerSchema": [{"resource": w, "errors": e} for w, e in self.provider_problems],
                "violations": [asdict(v) for v in self.violations]}


def resource_checks(resources: list[PlannedResource], policy_config: Mapping[str, Any],
                    crds: Optional[CrdFolder]) -> ResourceChecks:
    docs = [manifest(r) for r in resources if is_manifest(r)]
    crds = crds or local_crds()
    catalog = load_catalog(crds.path) if crds.path else None
    return ResourceChecks(
        resources=len(resources), manifests=len(docs), custom_resources=sum(not is_builtin(d) for d in docs),
        custom_resources_checked=catalog is not None, crd_origin=crds.origin,
        manifest_problems=[(describe(d), errs) for d in docs if (errs := validate(d, catalog))],
        violations=evaluate([Resource(type=r.type, name=r.name, props=r.props, urn=r.urn) for r in resources],
                            policy_config),
        provider_resources=provider_checked(resources), provider_problems=provider_problems(resources))


def render_program_json(reports: list[PlanReport], others: Optional[ResourceChecks]) -> str:
    """A program's preview as one document: with one Platform, the stack plan's document (plus
    `otherResources` when the program declares more); with several, one per Platform."""
    docs = {r.plan.stack: json.loads(render_json(r)) for r in reports}
    extra = {"otherResources": others.to_json()} if others is not None else {}
    body = next(iter(docs.values())) if len(docs) == 1 else {"platforms": docs}
    return json.dumps({**body, **extra}, indent=2, default=str) + "\n"
