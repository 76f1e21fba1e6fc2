"""The stack's Cloud Billing budget (components/billing_budget.py) and the plan's verdict on it."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from vllm_gke.components.billing_budget import MAX_CHANNELS
from vllm_gke.infra.cli import app
from vllm_gke.infra.cost import cost_report
from vllm_gke.infra.mocks import MOCK_PROJECT_NUMBER
from vllm_gke.infra.report import over_budget, verdicts

BUDGET = "gcp:billing/budget:Budget"


def test_prod_declares_its_budget_on_its_project_alerting_its_channels(plans):
    plan = plans["prod"]
    spec = plan.config.budget
    assert spec is not None
    (budget,) = plan.of_type(BUDGET)
    props = budget.props
    assert props["billingAccount"] == spec.billing_account
    # The API keeps projects by number; an ID there would be replanned on every update.
    assert props["budgetFilter"] == {"projects": [f"projects/{MOCK_PROJECT_NUMBER}"], "calendarPeriod": "MONTH"}
    assert props["amount"] == {"specifiedAmount": {"currencyCode": "USD", "units": str(spec.monthly_amount)}}
    assert props["thresholdRules"] == [
        *({"thresholdPercent": t, "spendBasis": "CURRENT_SPEND"} for t in spec.thresholds),
        {"thresholdPercent": 1.0, "spendBasis": "FORECASTED_SPEND"}]
    # The channels by their REST names (projects/<project>/notificationChannels/<id>), as the API
    # wants them: the budget takes them from the channels the SLO alerts page.
    channels = plan.of_type("gcp:monitoring/notificationChannel:NotificationChannel")
    assert len(channels) == len(plan.config.monitoring.notification_emails) > 0
    assert {c.urn for c in channels} <= budget.dependencies
    rule = props["allUpdatesRule"]
    assert len(rule["monitoringNotificationChannels"]) == len(channels)
    assert all(c.startswith(f"projects/{plan.config.project}/notificationChannels/")
               for c in rule["monitoringNotificationChannels"])
    assert rule["disableDefaultIamRecipients"] is False


def test_the_budget_bills_its_calls_to_the_stacks_project(plans):
    """User credentials reach the Budget API only with a quota project: the budget's provider names
    the stack's project as one, and the project has the API on before the budget is made."""
    plan = plans["prod"]
    (budget,) = plan.of_type(BUDGET)
    (provider,) = [r for r in plan.resources if r.type == "pulumi:providers:gcp" and r.name.endswith("-quota-project")]
    assert provider.props["userProjectOverride"] in (True, "true")
    assert provider.props["billingProject"] == plan.config.project == provider.props["project"]
    assert provider.urn in budget.dependencies
    assert "billingbudgets.googleapis.com" in {s.props["service"] for s in plan.of_type("gcp:projects/service:Service")}


def test_no_budget_no_budget_api(plans):
    dev = plans["dev"]
    assert dev.config.budget is None and not dev.of_type(BUDGET)
    assert "billingbudgets.googleapis.com" not in {s.props["service"] for s in dev.of_type("gcp:projects/service:Service")}


def test_the_api_takes_five_email_channels_at_most(plan_variant):
    def mutate(v):
        v["vllm-gke:monitoring"] = {**v.get("vllm-gke:monitoring", {}),
                                    "notificationEmails": [f"oncall{i}@acme.example" for i in range(7)]}
        v["vllm-gke:budget"] = {"billingAccount": "01A2B3-C4D5E6-F7A8B9", "monthlyAmount": 100000}
    plan = plan_variant("dev", mutate)
    (budget,) = plan.of_type(BUDGET)
    channels = budget.props["allUpdatesRule"]["monitoringNotificationChannels"]
    assert len(channels) == MAX_CHANNELS
    warnings = verdicts(plan).warnings
    assert any("vllm-gke:budget" in w and "first 5" in w for w in warnings), warnings


def test_the_plan_warns_when_the_baseline_exceeds_the_budget(plans):
    plan = plans["prod"]
    store = plan.platform.store
    cost = cost_report(plan.config, store.tier, store.capacity_gb)
    assert cost.baseline_month < plan.config.budget.monthly_amount < cost.peak_month
    # prod's amount lies between its baseline and its peak: told about the peak only
    (note,) = over_budget(plan.config, cost)
    assert "a month at peak" in note and "monthlyAmount" in note
    low = plan.config.model_copy(update={"budget": plan.config.budget.model_copy(update={"monthly_amount": 1000})})
    (warning,) = over_budget(low, cost)
    assert "vllm-gke:budget.monthlyAmount is 1,000 USD but the baseline costs" in warning
    high = plan.config.model_copy(update={"budget": plan.config.budget.model_copy(update={"monthly_amount": 10**7})})
    assert over_budget(high, cost) == []
    eur = plan.config.model_copy(update={"budget": plan.config.budget.model_copy(update={"currency": "EUR"})})
    (other,) = over_budget(eur, cost)
    assert "budget.currency is EUR" in other


def test_a_wrong_billing_account_is_refused_by_key(tmp_path, stack_values):
    values = dict(stack_values["dev"])
    values["vllm-gke:budget"] = {"billingAccount": "my-billing", "monthlyAmount": 100}
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = CliRunner().invoke(app, ["plan", "--stack", "bad", "--stacks-dir", str(tmp_path), "--no-write"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "budget.billingAccount" in output and "01A2B3-C4D5E6-F7A8B9" in output and "Traceback" not in output
