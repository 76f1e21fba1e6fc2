"""Monitoring (alerts, notification channels, SLOs, traces), the cost assumptions, the billing budget
and load tests."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from .base import (
    Email,
    ImageRef,
    K8sName,
    Name,
    Spec,
)

# The OpenTelemetry Collector release the trace collector runs (its contrib distribution).
COLLECTOR_VERSION = "0.159.0"


class SloSpec(Spec):
    # Objectives as code: a Cloud Monitoring service per model and per tenant, its SLOs over a
    # rolling window, and the SRE workbook's multi-window, multi-burn-rate alerts on each.
    enabled: bool = True
    # Share of requests answered without a server error, an overload refusal or a lost replica
    # (the guard's count per tenant and model; a tenant's own 4xx are not the service's failures).
    availability: float = Field(default=0.995, ge=0.9, le=0.9999)
    # Share of requests whose first token comes within monitoring.ttftSloSeconds (vLLM's histogram, per model).
    ttft: float = Field(default=0.95, ge=0.5, le=0.9999)
    # The window the objectives hold over; Cloud Monitoring's rolling periods run 1 to 30 days.
    window_days: int = Field(default=28, ge=1, le=30)


class TraceSpec(Spec):
    # vLLM's OpenTelemetry spans, each under a span of the guard's with the tenant, route, model,
    # outcome and tokens, through an in-cluster collector to Cloud Trace.
    enabled: bool = False
    # Share of tenant requests traced: the guard's root span is sampled at this ratio and vLLM's
    # span follows it (a client's own trace context is dropped, so it cannot raise the rate).
    sample_ratio: float = Field(default=0.01, gt=0, le=1)
    # The collector image (otel/opentelemetry-collector-contrib, with the googlecloud exporter).
    image: ImageRef = Field(default_factory=lambda: ImageRef(
        repository="docker.io/otel/opentelemetry-collector-contrib", tag=COLLECTOR_VERSION))


class MonitoringSpec(Spec):
    # Who alert policies notify.
    notification_emails: list[Email] = Field(default_factory=list)
    # p95 queue time that pages.
    queue_latency_slo_seconds: float = Field(default=2.0, gt=0)
    # p95 time to first token that warns.
    ttft_slo_seconds: float = Field(default=3.0, gt=0)
    # KV-cache usage that warns.
    kv_cache_alert_ratio: float = Field(default=0.95, gt=0, le=1)
    # Service level objectives and their burn-rate alerts.
    slos: SloSpec = Field(default_factory=SloSpec)
    # Request traces to Cloud Trace (off unless enabled).
    traces: TraceSpec = Field(default_factory=TraceSpec)


class CostSpec(Spec):
    # Measured output tokens a second of one GPU (or TPU chip) for your models; unset, each pool's
    # tokens/s is estimated by the roofline from its accelerator and model (components/model/throughput.py).
    tokens_per_second_per_gpu: Optional[float] = Field(default=None, gt=0)
    # Expected share of capacity in use.
    target_utilization: float = Field(default=0.6, gt=0, le=1)
    # Hours a month the report prices.
    hours_per_month: float = Field(default=730.0, gt=0, le=744)


class BudgetSpec(Spec):
    # A Cloud Billing budget on the stack's project, alerting the monitoring channels.
    # The Cloud Billing account the project bills to (XXXXXX-XXXXXX-XXXXXX).
    billing_account: str
    # The month's amount, in the billing account's currency.
    monthly_amount: int = Field(gt=0)
    # The billing account's currency (ISO 4217); a budget in another currency is refused by the API.
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    # Shares of the amount whose crossing notifies, on actual spend (and 1.0 on the forecast too).
    thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.9, 1.0], min_length=1, max_length=10)

    @field_validator("billing_account")
    @classmethod
    def _account(cls, v: str) -> str:
        v = v.removeprefix("billingAccounts/")
        if not re.fullmatch(r"[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}", v):
            raise ValueError(f"'{v}' is not a billing account ID: use the form 01A2B3-C4D5E6-F7A8B9 "
                             "(gcloud billing projects describe <project> shows it)")
        return v

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, v: list[float]) -> list[float]:
        for x in v:
            if not 0 < x <= 10:
                raise ValueError(f"{x} is not a share of the amount: use values above 0 and at most 10 (0.9 is 90%)")
        if len(set(v)) != len(v):
            raise ValueError("each threshold once: the API refuses repeated thresholds")
        return sorted(v)



class RolloutGates(Spec):
    """What a canary must meet at each step, against the primary over the same window (Flagger's
    analysis: components/model/rollouts.py). A gate looser than the SLO it guards is flagged by the
    policy pack (policies/rollouts.py)."""

    # The canary's P99 time to first token, and at the TTFT SLO's percentile, at most this many
    # times the primary's (tighter than 1.5 fails healthy canaries on the histogram's coarse buckets:
    # docs/guides/rollouts.md).
    ttft_ratio: float = Field(default=1.5, ge=1.0, le=5.0)
    # The canary's P99 inter-token latency at most this many times the primary's.
    itl_ratio: float = Field(default=1.5, ge=1.0, le=5.0)
    # The canary's share of server errors (the guard's `error` outcome: a 5xx or no answer) above the
    # primary's, at most (default: the availability SLO's error budget, 1 - monitoring.slos.availability).
    error_share: Optional[float] = Field(default=None, gt=0, le=1)
    # The canary's share of refused requests (a 4xx: an adapter it lost, a shorter context) above the
    # primary's, at most.
    refused_share: float = Field(default=0.02, gt=0, le=1)
    # The canary's time to first token at the TTFT SLO's percentile, at most (default:
    # monitoring.ttftSloSeconds): the SLO itself, whatever the primary does.
    ttft_seconds: Optional[float] = Field(default=None, gt=0)


class RolloutSpec(Spec):
    """Progressive delivery with Flagger: every change to a serving pool (vLLM release or image, model
    revision, flags, adapters) rolls out as a canary whose share of the pool's route grows by steps,
    each held only while the gates hold, and rolls back at once when they fail."""

    # Flagger (installed by the stack) rolls out the pools that can run a canary (see
    # docs/guides/rollouts.md for what the others do); off, a change rolls in place.
    enabled: bool = False
    # Percent of the pool's traffic the canary gains each step.
    step_weight: int = Field(default=10, ge=1, le=50)
    # The canary's share at which it is promoted.
    max_weight: int = Field(default=50, ge=1, le=100)
    # Seconds between steps (Flagger's analysis interval); each gate reads twice this, at least 5 minutes.
    interval_seconds: int = Field(default=60, ge=30, le=3600)
    # Failed checks (a gate broken, or no traffic to judge) before the rollback.
    failed_checks: int = Field(default=2, ge=1, le=20)
    # What the canary must meet at each step, against the primary over the same window.
    gates: RolloutGates = Field(default_factory=RolloutGates)
    # The loadTests entries the canaries' pre-rollout and load webhooks start, so the analysis has
    # traffic to judge at any hour: each for the canaries of the pools its tenant's route reaches (its
    # model's shared pools, or the tenant's dedicated copy). Unset: every load test of the stack.
    load_tests: Optional[list[Name]] = None

    @model_validator(mode="after")
    def _steps(self) -> "RolloutSpec":
        if self.step_weight > self.max_weight:
            raise ValueError(f"stepWeight {self.step_weight} is above maxWeight {self.max_weight}: the first step would "
                             "pass the promotion point; lower stepWeight or raise maxWeight")
        return self

    @property
    def steps(self) -> int:
        """Analysis intervals from the first step to promotion."""
        return -(-self.max_weight // self.step_weight)

# The load-test tool: kubernetes-sigs/inference-perf, whose release workflow publishes
# quay.io/inference-perf/inference-perf:<tag> (.github/workflows/publish-on-release.yml).
INFERENCE_PERF_VERSION = "v0.7.0"


class LoadStage(Spec):
    # Requests a second, arriving as a Poisson process (so bursts happen as they do in traffic).
    rate: float = Field(gt=0, le=10000)
    # How long the stage lasts; it sends rate x seconds requests.
    duration_seconds: int = Field(ge=1, le=3600)


class TokenLengths(Spec):
    # A length distribution in tokens: lognormal gives the long tail real prompts have.
    distribution: Literal["lognormal", "normal", "uniform", "fixed"] = "lognormal"
    mean: int = Field(ge=1)
    std_dev: int = Field(default=0, ge=0)
    min: int = Field(default=1, ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "TokenLengths":
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"min {self.min} <= mean {self.mean} <= max {self.max} must hold")
        return self


class SharedPrefixLoad(Spec):
    # A second phase of requests whose prompts share long prefixes in groups, as agents and RAG send them: it
    # measures the prefix cache's effect (only meaningful with models[].enablePrefixCaching).
    groups: int = Field(default=8, ge=1, le=1000)
    prompts_per_group: int = Field(default=16, ge=1, le=10000)
    prefix_tokens: int = Field(default=2048, ge=1)
    question_tokens: int = Field(default=128, ge=1)
    output_tokens: int = Field(default=128, ge=1)
    # Requests in flight at once.
    concurrency: int = Field(default=16, ge=1, le=4096)


class LoadTestSpec(Spec):
    """An on-demand load test of one tenant's route: a suspended CronJob that
    `kubectl create job --from=cronjob/loadtest-<name>` runs (see docs/guides/operating-by-slo.md)."""

    name: Name
    # Whose route and credentials: the tenant's URL /<tenant>/<model>/v1, with a token of its issuer.
    tenant: Name
    model: Name
    # The Kubernetes Secret (key `token`) holding a bearer JWT of the tenant's issuer, in the
    # namespace the test runs in (the model's serving namespace, or the tenant's for dedicated
    # replicas). Created out of band: a token never goes through Pulumi's state. Default
    # loadtest-<name>-token: one per test, so two tenants' tests in one namespace never share a token.
    token_secret: Optional[K8sName] = None

    @property
    def token_secret_name(self) -> str:
        return self.token_secret or f"loadtest-{self.name}-token"
    # The mixed workload: prompt and output lengths (completions, streamed) over the stages.
    prompt_tokens: TokenLengths = Field(default_factory=lambda: TokenLengths(
        distribution="lognormal", mean=512, std_dev=1024, min=16, max=8192))
    output_tokens: TokenLengths = Field(default_factory=lambda: TokenLengths(
        distribution="lognormal", mean=192, std_dev=256, min=8, max=1024))
    # Steady, a burst, steady again.
    stages: list[LoadStage] = Field(default_factory=lambda: [
        LoadStage(rate=2, duration_seconds=120), LoadStage(rate=8, duration_seconds=60),
        LoadStage(rate=2, duration_seconds=120)], min_length=1, max_length=20)
    shared_prefix: Optional[SharedPrefixLoad] = None
    # Spread requests over the model's adapters the tenant may use (equal shares with the base
    # model), where it has any.
    lora_mix: bool = True
    # The share of failed requests over which the Job fails (default: what monitoring.slos.availability
    # allows, 1 - availability).
    max_failure_ratio: Optional[float] = Field(default=None, ge=0, le=1)
    image: ImageRef = Field(default_factory=lambda: ImageRef(
        repository="quay.io/inference-perf/inference-perf", tag=INFERENCE_PERF_VERSION))
