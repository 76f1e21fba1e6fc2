"""The scaling benchmark's generated stacks are valid, and what they declare grows linearly."""

from __future__ import annotations

import pytest

from benchmarks.plan_scaling import MODEL_GRID, MODELS_PER_TENANT, TENANT_GRID, scaled_config
from vllm_gke.infra.config import parse
from vllm_gke.infra.plan import run_program


@pytest.mark.parametrize("tenants,models", [(max(TENANT_GRID), 1), (1, max(MODEL_GRID)), (10, 5)])
def test_generated_configs_are_valid(tenants, models):
    cfg = parse(scaled_config(tenants, models))
    assert len(cfg.tenants) == tenants and len(cfg.models) == models


def _count(tenants: int, models: int, every_option: bool = False) -> int:
    return sum(r.custom for r in run_program("bench", scaled_config(tenants, models, every_option)).resources)


@pytest.mark.parametrize("every_option", [False, True])
def test_resources_grow_linearly_in_tenants(every_option):
    base = _count(1, 1, every_option)
    per_tenant = _count(2, 1, every_option) - base
    assert per_tenant > 0
    assert _count(6, 1, every_option) == base + 5 * per_tenant


def test_resources_grow_linearly_in_models():
    # Each tenant is allowed up to MODELS_PER_TENANT models; beyond that a model adds a fixed set.
    base = _count(1, MODELS_PER_TENANT)
    per_model = _count(1, MODELS_PER_TENANT + 1) - base
    assert per_model > 0
    assert _count(1, MODELS_PER_TENANT + 5) == base + 5 * per_model


@pytest.mark.parametrize("tenants,models", [(max(TENANT_GRID), 1), (1, max(MODEL_GRID)), (10, 5)])
def test_every_option_configs_are_valid_and_use_every_option(tenants, models):
    cfg = parse(scaled_config(tenants, models, every_option=True))
    assert cfg.global_limits.enabled and cfg.weights.backend == "hyperdisk-ml"
    routings = {m.routing for m in cfg.models}
    assert routings == ({"inference-gateway", "length"} if models > 1 else {"inference-gateway"})
    assert any(m.adapters for m in cfg.models)
    if models > 1:
        assert any(m.canary for m in cfg.models) and any(m.long.min_replicas == 0 for m in cfg.models
                                                          if m.routing == "length")


def test_resources_grow_linearly_in_models_with_every_option():
    # Models alternate between the two routings: count in pairs beyond the tenant's models.
    base = _count(1, MODELS_PER_TENANT + 1, True)
    per_pair = _count(1, MODELS_PER_TENANT + 3, True) - base
    assert per_pair > 0
    assert _count(1, MODELS_PER_TENANT + 7, True) == base + 3 * per_pair
