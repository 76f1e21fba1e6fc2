"""CrossGuard wrappers: each policy of policies.rules (POLICIES) as a pulumi-policy StackValidationPolicy."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)

from .rules import POLICIES, Policy, Resource

LEVEL = {"advisory": EnforcementLevel.ADVISORY, "mandatory": EnforcementLevel.MANDATORY,
         "disabled": EnforcementLevel.DISABLED}


def plain(value: Any) -> Any:
    """pulumi-policy hands props over as read-only proxies; the rules want plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(v) for v in value]
    return value


def _validator(policy: Policy) -> Callable[[StackValidationArgs, ReportViolation], None]:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [Resource(type=r.resource_type, name=r.name, props=plain(r.props or {}), urn=r.urn)
                     for r in args.resources]
        for resource, message in policy.check(resources):
            report_violation(message, resource.urn if resource and resource.urn else None)

    return validate


def crossguard_policies() -> list[StackValidationPolicy]:
    """Levels here are defaults; override per policy with `--policy-pack-config`."""
    return [StackValidationPolicy(name=p.name, description=p.description,
                                  enforcement_level=LEVEL[p.level], validate=_validator(p))
            for p in POLICIES]
