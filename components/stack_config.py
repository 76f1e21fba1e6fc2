"""The whole platform's settings: what a stack's config holds and what the Platform component takes.

Stacks differ only in these values; infra/config.py reads them from Pulumi config (naming the
stack's keys in every problem) and checks them across fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from vllm_gke.components.specs import (
    ClusterSpec, CostSpec, GatewaySpec, GlobalLimitsSpec, ImageRef, ModelSpec, MonitoringSpec, Name, NodePoolSpec,
    Spec, TenantSpec, WeightsSpec,
)
from vllm_gke.components.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES


class StackConfig(Spec):
    project: str
    region: str
    environment: Literal["dev", "staging", "prod"]
    cluster: ClusterSpec
    node_pools: list[NodePoolSpec] = Field(min_length=1)
    models: list[ModelSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(default_factory=list)
    server_image: ImageRef
    # The vLLM release the server image is built on (see components/vllm_versions.py).
    vllm_version: str = DEFAULT_VLLM_VERSION
    serving_namespace: Name = "vllm"
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    cost: CostSpec = Field(default_factory=CostSpec)
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
