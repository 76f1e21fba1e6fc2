"""The Cloud Billing Budget API: what it takes, and the credentials it bills a call to."""

from __future__ import annotations

from ...components.billing_budget import MAX_CHANNELS
from ..plan import Plan
from .base import Contract

BUDGET = "gcp:billing/budget:Budget"


def budget_api_accepts_the_budget(plan: Plan) -> list[str]:
    out = []
    providers = {r.name: r for r in plan.resources if r.type == "pulumi:providers:gcp"}
    for r in plan.resources:
        if r.type != BUDGET:
            continue
        channels = (r.props.get("allUpdatesRule") or {}).get("monitoringNotificationChannels") or []
        if len(channels) > MAX_CHANNELS:
            out.append(f"{r.name}: {len(channels)} notification channels; the API takes at most {MAX_CHANNELS}")
        for p in (r.props.get("budgetFilter") or {}).get("projects") or []:
            if not (p.startswith("projects/") and p.removeprefix("projects/").isdigit()):
                out.append(f"{r.name}: budgetFilter.projects has {p}; the API keeps projects/<number> and "
                           "a project ID would show as a change on every refresh")
        quota = [p for p in providers.values() if p.props.get("userProjectOverride") in (True, "true")
                 and p.props.get("billingProject")]
        if not quota:
            out.append(f"{r.name}: no provider names a quota project (user_project_override, billing_project): "
                       "the API refuses user credentials without one")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Billing Budget API", "v1",
             "NotificationsRule.monitoringNotificationChannels takes at most 5 channels; budgetFilter.projects is "
             "kept as projects/<number>; calls with user credentials need a quota project",
             "https://cloud.google.com/billing/docs/reference/budget/rest/v1/billingAccounts.budgets "
             "(NotificationsRule, Filter); https://cloud.google.com/billing/docs/how-to/budget-api-overview",
             "the budget notifies the first 5 email channels, filters on the project number, and is managed "
             "through a provider with user_project_override and the stack's project as billing_project",
             budget_api_accepts_the_budget),
)
