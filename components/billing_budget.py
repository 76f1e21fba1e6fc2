"""BillingBudget: a Cloud Billing budget on the stack's project, alerting the monitoring channels.

The Budget API (billingbudgets.googleapis.com) bills each call to a quota project and refuses user
credentials without one ("requires a quota project, which is not set by default"): the budget is
managed through a provider of its own that names the stack's project as the quota project
(user_project_override, billing_project), so `pulumi up` with `gcloud auth application-default
login` works. Its notifications go to the stack's email channels (the API takes email channels
only, at most 5) and, as by default, to the billing account's administrators and users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_gcp as gcp

from .model.specs import BudgetSpec
from .options import child_opts
from .project_apis import ProjectApis

API = "billingbudgets.googleapis.com"
# NotificationsRule.monitoringNotificationChannels: "A maximum of 5 email notifications are allowed."
MAX_CHANNELS = 5


@dataclass
class BillingBudgetArgs:
    project: str
    cluster_name: str
    spec: BudgetSpec
    # Email notification channels (projects/<project>/notificationChannels/<id>); the first 5 are used.
    channels: Sequence[pulumi.Input[str]] = ()
    apis: Optional[ProjectApis] = None


def threshold_rules(spec: BudgetSpec) -> list[gcp.billing.BudgetThresholdRuleArgs]:
    """Each threshold on actual spend; the full amount on the forecast too, so the month's overrun
    is told while it can still be avoided."""
    rules = [gcp.billing.BudgetThresholdRuleArgs(threshold_percent=t, spend_basis="CURRENT_SPEND") for t in spec.thresholds]
    return [*rules, gcp.billing.BudgetThresholdRuleArgs(threshold_percent=1.0, spend_basis="FORECASTED_SPEND")]


class BillingBudget(pulumi.ComponentResource):
    budget: gcp.billing.Budget
    provider: gcp.Provider

    def __init__(self, name: str, args: BillingBudgetArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:BillingBudget", name, None, opts)
        self.provider = gcp.Provider(f"{name}-quota-project", project=args.project, user_project_override=True,
                                     billing_project=args.project, opts=pulumi.ResourceOptions(parent=self))
        child = child_opts(self, opts, provider=self.provider,
                           depends_on=args.apis.needs(API) if args.apis else [])
        # The filter names the project by number (projects/<number>), as the API stores it: an ID
        # there would be read back as a number and replanned on every `pulumi up`.
        number = gcp.organizations.get_project_output(project_id=args.project).number
        spec = args.spec
        self.budget = gcp.billing.Budget(
            f"{name}-budget", billing_account=spec.billing_account,
            display_name=f"vllm-gke {args.cluster_name}"[:60],
            budget_filter=gcp.billing.BudgetBudgetFilterArgs(
                projects=[number.apply(lambda n: f"projects/{n}")], calendar_period="MONTH"),
            amount=gcp.billing.BudgetAmountArgs(specified_amount=gcp.billing.BudgetAmountSpecifiedAmountArgs(
                currency_code=spec.currency, units=str(spec.monthly_amount))),
            threshold_rules=threshold_rules(spec),
            all_updates_rule=gcp.billing.BudgetAllUpdatesRuleArgs(
                monitoring_notification_channels=list(args.channels)[:MAX_CHANNELS],
                disable_default_iam_recipients=False),
            opts=child)
        self.register_outputs({"budget": self.budget.name})
