"""Serving held to its SLOs: objectives declared, and their burn-rate alerts paging someone."""

from __future__ import annotations

import re
from typing import Iterator, Sequence

from .base import Finding, Resource, vllm_servers, where

SLO = "gcp:monitoring/slo:Slo"
ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
# A condition on an SLO's burn rate: select_slo_burn_rate("<slo name>", "<lookback>s").
BURN_RATE = re.compile(r'select_slo_burn_rate\("([^"]+)",\s*"(\d+)s"\)')
# The SRE workbook's fast burn looks back an hour at most; its slow burns six hours or more.
FAST_S, SLOW_S = 3600, 6 * 3600
# Cloud Monitoring takes a burn-rate lookback of a day at most ("It is not currently possible to
# base alerts on the error budget consumption rate of an SLO using a compliance period of greater
# than 24 hours": cloud.google.com/stackdriver/docs/solutions/slo-monitoring/alerting-on-budget-burn-rate).
MAX_LOOKBACK_S = 86400


def _burn_alerts(resources: Sequence[Resource]) -> list[tuple[str, int, bool]]:
    """(SLO name, lookback seconds, routed to a channel) for each burn-rate condition."""
    out: list[tuple[str, int, bool]] = []
    for policy in resources:
        if policy.type != ALERT_POLICY or policy.props.get("enabled") is False:
            continue
        routed = bool(policy.props.get("notificationChannels"))
        for condition in policy.props.get("conditions") or []:
            query = ((condition or {}).get("conditionThreshold") or {}).get("filter") or ""
            out.extend((name, int(seconds), routed) for name, seconds in BURN_RATE.findall(query))
    return out


def serving_held_to_slos(resources: Sequence[Resource]) -> Iterator[Finding]:
    """vLLM servers come with SLOs, and each SLO with burn-rate alerts routed to a notification
    channel: a fast one (a lookback of an hour at most) and a slow one (six hours or more). An SLO
    nobody is paged on is a chart."""
    slos = [r for r in resources if r.type == SLO]
    servers = [r for r, _pod, _c in vllm_servers(resources)]
    if servers and not slos:
        yield servers[0], (f"{where(servers[0])} serves a model but the plan declares no SLO: set "
                           "vllm-gke:monitoring.slos.enabled (availability and time to first token, with burn-rate alerts)")
    alerts = _burn_alerts(resources)
    for policy in resources:
        if policy.type != ALERT_POLICY:
            continue
        for condition in policy.props.get("conditions") or []:
            query = ((condition or {}).get("conditionThreshold") or {}).get("filter") or ""
            if any(int(seconds) > MAX_LOOKBACK_S for _name, seconds in BURN_RATE.findall(query)):
                yield policy, (f"{where(policy)} looks back over a day at a burn rate: Cloud Monitoring evaluates "
                               "burn rates over 24 hours at most, so it never alerts")
    for slo in slos:
        # The SLO's resource name ends with services/<service>/serviceLevelObjectives/<id>, whether
        # the project in front of it is given by ID or by number.
        suffix = f"/services/{slo.props.get('service')}/serviceLevelObjectives/{slo.props.get('sloId')}"
        mine = [(seconds, routed) for name, seconds, routed in alerts if name.endswith(suffix)]
        if not any(routed and seconds <= FAST_S for seconds, routed in mine):
            yield slo, (f"{where(slo)} ({slo.props.get('sloId')} of {slo.props.get('service')}) has no fast-burn "
                        "alert (a burn rate over an hour at most) sent to a notification channel: set "
                        "vllm-gke:monitoring.notificationEmails")
        if not any(routed and seconds >= SLOW_S for seconds, routed in mine):
            yield slo, (f"{where(slo)} ({slo.props.get('sloId')} of {slo.props.get('service')}) has no slow-burn "
                        "alert (a burn rate over six hours or more) sent to a notification channel")


LOAD_TEST_LABEL = ("app.kubernetes.io/name", "vllm-gke-loadtest")


def load_tests_on_demand(resources: Sequence[Resource]) -> Iterator[Finding]:
    """A load test spends real capacity and a tenant's limits: it runs when someone asks, never on
    `pulumi up` or a schedule, once at a time, and never retried blindly."""
    for r in resources:
        kind = r.props.get("kind")
        labels = ((r.props.get("metadata") or {}).get("labels") or {})
        if labels.get(LOAD_TEST_LABEL[0]) != LOAD_TEST_LABEL[1] or kind not in ("CronJob", "Job"):
            continue
        if kind == "Job":
            yield r, f"{where(r)} is a load test that runs at every `pulumi up`: declare a suspended CronJob"
            continue
        spec = r.props.get("spec") or {}
        if spec.get("suspend") is not True:
            yield r, f"{where(r)} is a load test on a schedule: set suspend: true (run it with kubectl create job --from)"
        if spec.get("concurrencyPolicy") != "Forbid":
            yield r, f"{where(r)} may run twice at once: set concurrencyPolicy: Forbid"
        if ((spec.get("jobTemplate") or {}).get("spec") or {}).get("backoffLimit") != 0:
            yield r, f"{where(r)} retries a failed load test: set backoffLimit: 0"
