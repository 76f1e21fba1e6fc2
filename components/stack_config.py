"""The whole platform's settings: what a stack's config holds and what the Platform component takes.

Stacks differ only in these values; infra/config.py reads them from Pulumi config (naming the
stack's keys in every problem) and checks them across fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pulumi

from pydantic import Field, field_validator

from vllm_gke.components.specs import (
    ClusterSpec, CostSpec, GatewaySpec, GlobalLimitsSpec, ImageRef, ModelSpec, MonitoringSpec, Name, NodePoolSpec,
    Spec, TenantSpec, WeightsSpec,
)
from vllm_gke.components.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


class ConfigError(pulumi.RunError):
    def __init__(self, issues: list[ConfigIssue], source: str = "stack config"):
        self.issues = issues
        self.source = source
        lines = [f"invalid {source} ({len(issues)} problem{'s' if len(issues) != 1 else ''}):"]
        lines += [f"  - {issue}" for issue in issues]
        super().__init__("\n".join(lines))


class StackConfig(Spec):
    """A whole platform's settings: what one stack's config holds (see the README config reference)."""

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
    tenants: list[TenantSpec] = Field(default_factory=list)
    # The vLLM server image built from images/ (a tag of the chosen vLLM release, or a digest).
    server_image: ImageRef
    # The vLLM release the server image is built on (see components/vllm_versions.py).
    vllm_version: str = DEFAULT_VLLM_VERSION
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
    # Per-tenant limits across all replicas (a shared store) instead of per replica.
    global_limits: GlobalLimitsSpec = Field(default_factory=GlobalLimitsSpec)

    @field_validator("vllm_version")
    @classmethod
    def _supported(cls, v: str) -> str:
        if v not in RELEASES:
            raise ValueError(f"vLLM {v} is not supported; use one of {', '.join(RELEASES)}")
        return v

    def pool(self, name: str) -> NodePoolSpec:
        return next(p for p in self.node_pools if p.name == name)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)
