"""The whole platform's settings: what a stack's config holds and what the Platform component takes.

Stacks differ only in these values; infra/config.py reads them from Pulumi config (naming the
stack's keys in every problem) and checks them across fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from pydantic import Field, ValidationInfo, field_validator

from .catalog import region_problem
from .specs import (
    BudgetSpec,
    CloudRunModelSpec,
    CloudRunSpec,
    ClusterSpec,
    CostSpec,
    GatewaySpec,
    GlobalLimitsSpec,
    ImageRef,
    LoadTestSpec,
    ModelSpec,
    MonitoringSpec,
    Name,
    NodePoolSpec,
    PickerSpec,
    RolloutSpec,
    Spec,
    TenantSpec,
    WeightsSpec,
)
from .vllm_versions import DEFAULT_TPU_VLLM_VERSION, DEFAULT_VLLM_VERSION, RELEASES, TPU_RELEASES, VllmRelease


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# pydantic's error types in the words of a config file: what the value must be, and what it was.
_WORDING: dict[str, str] = {
    "string_type": "must be text", "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number", "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false", "list_type": "must be a list",
    "dict_type": "must be a map of keys to values", "model_type": "must be a map of settings",
    "model_attributes_type": "must be a map of settings",
}
_BOUNDS = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
           "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}


def plain_problem(err: Mapping[str, Any]) -> str:
    """One pydantic error as a person reads it: `must be a whole number, not 'abc'` rather than
    `Input should be a valid integer, unable to parse string as an integer`. The specs' own
    validators already speak plainly; their text is kept."""
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    kind, value = err["type"], err.get("input")
    if kind in _WORDING:
        return f"{_WORDING[kind]}, not {_shown(value)}"
    if kind in _BOUNDS:
        words, bound = _BOUNDS[kind]
        return f"must be {words} {ctx.get(bound)}, not {_shown(value)}"
    if kind == "literal_error":
        return f"{_shown(value)} is not one of: {str(ctx.get('expected', '')).replace(' or ', ', ')}"
    if kind == "string_too_short":
        return f"must have at least {ctx.get('min_length')} characters, not {_shown(value)}"
    if kind == "string_too_long":
        return f"must have at most {ctx.get('max_length')} characters, not {_shown(value)}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} items"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "string_pattern_mismatch":
        return f"{_shown(value)} is not of the form {ctx.get('pattern')}"
    return str(err["msg"]).removeprefix("Value error, ")


class ConfigError(ValueError):
    """Every problem of a config, each naming its key and the fix. Pulumi programs raise it as a
    pulumi.RunError (infra/__main__.py, Platform), which `pulumi up` prints without a stack trace."""

    def __init__(self, issues: list[ConfigIssue], source: str = "stack config"):
        self.issues = issues
        self.source = source
        lines = [f"invalid {source} ({len(issues)} problem{'s' if len(issues) != 1 else ''}):"]
        lines += [f"  - {issue}" for issue in issues]
        super().__init__("\n".join(lines))


class StackConfig(Spec):
    """A whole platform's settings: what one stack's config holds (see docs/reference/config.md)."""

    # The Google Cloud project everything is created in (stack config: gcp:project).
    project: str
    # The region of the cluster, its subnets, gateway and bucket (stack config: gcp:region).
    region: str
    # A label on every resource; behaviour comes from the other settings, never from this.
    environment: Literal["dev", "staging", "prod"]
    # The GKE cluster: name, zones, ranges, release channel, private nodes, maintenance.
    cluster: ClusterSpec
    # The GPU node pools (machine type, MIG partition, spot, sizes) the models run on.
    node_pools: list[NodePoolSpec] = Field(min_length=1)
    # The models served: source, shape, dtype, pools, routing, adapters, canary.
    models: list[ModelSpec] = Field(min_length=1)
    # The tenants: JWT issuer, the models each may call, rate limits and token caps.
    tenants: list[TenantSpec] = Field(default_factory=list[TenantSpec])
    # The vLLM server image built from images/: a tag of the chosen vLLM release (v<version> or
    # v<version>-<suffix>, never latest), or a digest (sha256:...).
    server_image: ImageRef
    # The vLLM release the server image is built on (see components/model/vllm_versions.py).
    vllm_version: str = DEFAULT_VLLM_VERSION
    # Models on TPU node pools: the server image built from images/ on the vLLM TPU release
    # (VLLM_IMAGE=vllm/vllm-tpu; a tag v<version> or v<version>-<suffix>, or a digest).
    tpu_server_image: Optional[ImageRef] = None
    # The vLLM TPU release (vllm-tpu on PyPI, image vllm/vllm-tpu) that image is built on.
    tpu_vllm_version: str = DEFAULT_TPU_VLLM_VERSION
    # The namespace of the shared model pools.
    serving_namespace: Name = "vllm"
    # The load balancer: Gateway class, hostname, TLS, request timeout.
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    # Where the one copy of the weights lives (Filestore, a bucket, Hyperdisk ML) and the HF token.
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    # Alert e-mails and SLO thresholds.
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    # Throughput and utilisation assumptions of the cost report.
    cost: CostSpec = Field(default_factory=CostSpec)
    # A Cloud Billing budget on the project (none without it); the plan warns when the baseline exceeds it.
    budget: Optional[BudgetSpec] = None
    # Per-tenant limits across all replicas (a shared store) instead of per replica.
    global_limits: GlobalLimitsSpec = Field(default_factory=GlobalLimitsSpec)
    # On-demand load tests of tenants' routes (suspended CronJobs running inference-perf).
    load_tests: list[LoadTestSpec] = Field(default_factory=list[LoadTestSpec])
    # Progressive delivery: Flagger canaries gated by the SLOs (off: a change rolls in place).
    rollouts: RolloutSpec = Field(default_factory=RolloutSpec)
    # The endpoint picker of models with routing: inference-gateway: failure mode, scorers,
    # saturation, flow control.
    picker: PickerSpec = Field(default_factory=PickerSpec)
    # Models on Cloud Run GPUs beside the cluster: scale to zero, per-second billing, the same tenants,
    # guard and URL scheme (docs/guides/cloud-run.md).
    cloud_run: Optional[CloudRunSpec] = None

    @field_validator("vllm_version", "tpu_vllm_version")
    @classmethod
    def _supported(cls, v: str, info: ValidationInfo) -> str:
        what, known = ("vLLM TPU", TPU_RELEASES) if info.field_name == "tpu_vllm_version" else ("vLLM", RELEASES)
        if v not in known:
            raise ValueError(f"{what} {v} is not supported; use one of {', '.join(known)}")
        return v

    @field_validator("region")
    @classmethod
    def _known_region(cls, v: str) -> str:
        # A misspelt region would only fail at `pulumi up` (and its zones could not be checked).
        if (problem := region_problem(v)) is not None:
            raise ValueError(problem)
        return v

    def pool(self, name: str) -> NodePoolSpec:
        return next(p for p in self.node_pools if p.name == name)

    def release_for(self, node_pool: str) -> VllmRelease:
        """The vLLM release that serves on a node pool: the TPU build on TPUs."""
        pool = next((p for p in self.node_pools if p.name == node_pool), None)
        return TPU_RELEASES[self.tpu_vllm_version] if pool is not None and pool.is_tpu else RELEASES[self.vllm_version]

    def image_for(self, node_pool: str) -> ImageRef:
        """The server image on a node pool (the placement check makes a TPU pool's set)."""
        if self.release_for(node_pool).platform == "tpu" and self.tpu_server_image is not None:
            return self.tpu_server_image
        return self.server_image

    @property
    def has_tpu_models(self) -> bool:
        """Some replicas (a model's, or a dedicated tenant's) run on a TPU pool."""
        used = {m.node_pool for m in self.models} | {t.dedicated.node_pool for t in self.tenants if t.dedicated}
        return any(p.is_tpu for p in self.node_pools if p.name in used)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    @property
    def cloud_run_models(self) -> list["CloudRunModelSpec"]:
        """The models on Cloud Run (none without vllm-gke:cloudRun)."""
        return list(self.cloud_run.models) if self.cloud_run is not None else []

    def cloud_run_region(self, model: "CloudRunModelSpec") -> str:
        """Where a Cloud Run model's service runs: its own region, else the stack's."""
        return model.region or self.region
