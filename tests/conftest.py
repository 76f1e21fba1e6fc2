"""Shared fixtures: each stack planned once under Pulumi mocks, and a way to plan a variant."""

from __future__ import annotations

import copy
import os
from typing import Any, Callable

import pytest

from vllm_gke.infra.plan import REPO_ROOT, Plan, read_stack_config, run_program  # noqa: F401 (REPO_ROOT for tests)

STACKS = ("dev", "staging", "prod", "frontier", "tuned")

# The CLI prints at the terminal's width (80 where output is not one): the tests that read its text
# read it as a wide terminal shows it; tests/test_plan_cli.py checks a narrow one on its own.
os.environ.setdefault("COLUMNS", "200")
# Plans in tests validate against ../shared/upstream-crds and never fetch the pinned CRDs into a user
# cache (tests/test_crd_cache.py fetches with openers of its own).
os.environ.setdefault("VLLM_GKE_OFFLINE", "1")


@pytest.fixture(scope="session")
def stack_values() -> dict[str, dict[str, Any]]:
    return {s: read_stack_config(s) for s in STACKS}


@pytest.fixture(scope="session")
def plans(stack_values) -> dict[str, Plan]:
    return {s: run_program(s, stack_values[s]) for s in STACKS}


# The manual canary prod ran before its rollouts were Flagger's (weight 10 on a newer commit).
MANUAL_CANARY = {"revision": "0e9e39f249a16976918f6564b8830bc894c89659", "weight": 10}


def by_hand(values: dict[str, Any]) -> None:
    """Prod as it rolls out without Flagger: rollouts off, the routes and Services the plan's own, and
    llama-8b's manual canary split (for the tests of declared routes and of manual canaries)."""
    values["vllm-gke:rollouts"] = {"enabled": False}
    next(m for m in values["vllm-gke:models"] if m["name"] == "llama-8b")["canary"] = dict(MANUAL_CANARY)


@pytest.fixture(scope="session")
def prod_by_hand(stack_values) -> Plan:
    values = copy.deepcopy(stack_values["prod"])
    by_hand(values)
    return run_program("prod", values)


@pytest.fixture
def dev_values(stack_values) -> dict[str, Any]:
    """A private deep copy of the dev stack config to mutate."""
    return copy.deepcopy(stack_values["dev"])


@pytest.fixture
def plan_variant(stack_values) -> Callable[..., Plan]:
    def run(stack: str = "dev", mutate: Callable[[dict[str, Any]], None] = lambda v: None) -> Plan:
        values = copy.deepcopy(stack_values[stack])
        mutate(values)
        return run_program(stack, values)

    return run


def without_cloud_run(values: dict[str, Any]) -> None:
    """A stack's values without its Cloud Run models (they mount the weights bucket alone: a variant on another
    weights backend has none), nor the tenants' calls and accounts for them."""
    cloud_run = {m["name"] for m in values.pop("vllm-gke:cloudRun", {}).get("models", [])}
    for tenant in values.get("vllm-gke:tenants", []):
        tenant["models"] = [m for m in tenant["models"] if m not in cloud_run]
        tenant.pop("cloudRunInvokers", None)


def props_of(plan: Plan, type_: str) -> list[dict[str, Any]]:
    return [r.props for r in plan.of_type(type_)]


def manifests_of(plan: Plan, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
    return [m for m in plan.manifests() if m["kind"] == kind
            and (namespace is None or m["metadata"].get("namespace") == namespace)]


def vllm_deployments(plan: Plan, namespace: str | None = None) -> list[dict[str, Any]]:
    """The model servers' Deployments (not the platform's own, like the metrics adapter)."""
    return [d for d in manifests_of(plan, "Deployment", namespace)
            if d["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]


@pytest.fixture(scope="session")
def crd_catalog():
    """The upstream CRDs in ../shared/upstream-crds; tests that need them skip where it is absent."""
    from vllm_gke.infra.crd_validation import DEFAULT_CRD_DIR, crd_dir, load_catalog

    directory = crd_dir()
    if directory is None:
        pytest.skip(f"upstream CRDs not found at {DEFAULT_CRD_DIR} (or $VLLM_GKE_CRDS_DIR): "
                    "custom resources cannot be checked against the real schemas here")
    return load_catalog(directory)
