"""The plan's two pictures: node pools packed with their serving pools, and the route map."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT
from vllm_gke.infra.plan_pictures import pictures
from vllm_gke.infra.report import verdicts


def _pictures(plan):
    return pictures(plan.config, verdicts(plan).cost)


def test_the_readme_shows_what_the_plan_writes_for_prod(plans):
    """The capacity and cost page (docs/capacity-and-cost.md, once the README's section) shows prod's pictures."""
    readme = (REPO_ROOT / "docs" / "capacity-and-cost.md").read_text()
    block = re.search(r"<!-- plan-pictures:prod:begin -->\n(.*?)<!-- plan-pictures:prod:end -->", readme, re.S)
    assert block, "docs/capacity-and-cost.md's picture markers are gone"
    shown = re.findall(r"```mermaid\n(.*?)```", block.group(1), re.S)
    drawn = _pictures(plans["prod"])
    assert shown == [drawn["node-pools.mmd"], drawn["routes.mmd"]], \
        "regenerate: vllm-gke plan -s prod, then paste plan-out/prod/*.mmd into docs/capacity-and-cost.md"


def test_node_pools_are_drawn_packed_at_baseline_and_peak(plans):
    text = _pictures(plans["prod"])["node-pools.mmd"]
    # llama-70b at TP8: one whole node per replica, 1+1 at baseline, 4+2 at peak.
    assert "a100-tp8: a2-highgpu-8g, 8 x GPU per node; nodes 2 baseline, 6 peak" in text
    assert "llama-70b short: 1-4 replicas x 8 GPU" in text
    assert "GPU slots used: 16 of 16 baseline, 48 of 48 peak" in text
    # A tenant's dedicated copy is drawn on its pool, named for the tenant.
    assert "qwen-7b short for analytics: 2-6 replicas x 1 3g.20gb" in text


def test_routes_are_drawn_from_path_to_tenant_to_pool(plans, prod_by_hand):
    text = _pictures(plans["prod"])["routes.mmd"]
    assert 'p__analytics_qwen_7b_v1["/analytics/qwen-7b/v1"]' in text  # the dedicated copy's own path
    assert "t_analytics -.->|JWT| p__analytics_qwen_7b_v1" in text
    assert "t_search -.->|JWT| p__analytics_qwen_7b_v1" not in text  # only its tenant
    assert '-->|"body 16384 B or more"| s_llama_70b_long_[("llama-70b long, primary + canary")]' in text
    # By hand (rollouts off): the manual canary's weighted edge, and pools without Flagger's pair.
    by_hand = _pictures(prod_by_hand)["routes.mmd"]
    assert '-->|"canary 10%"|' in by_hand and "primary + canary" not in by_hand


def test_the_plan_writes_both_pictures(tmp_path):
    from typer.testing import CliRunner

    from vllm_gke.infra.cli import app

    result = CliRunner().invoke(app, ["plan", "-s", "dev", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "dev" / "node-pools.mmd").read_text().startswith("flowchart TB")
    assert (tmp_path / "dev" / "routes.mmd").read_text().startswith("flowchart LR")


def test_nodes_that_read_alike_stay_apart_and_a_dedicated_picker_is_the_tenants_own(plans):
    """Mermaid ids from names: 'a-b' and 'a_b' read alike but are two nodes; a tenant's dedicated
    copy behind the endpoint picker is its own pool, not the shared one."""
    from vllm_gke.components.model.specs import DedicatedSpec
    from vllm_gke.infra.plan_pictures import _Ids, routes_picture

    ids = _Ids()
    assert ids("p", "/a-b/v1") != ids("p", "/a_b/v1")
    assert ids("p", "/a-b/v1") == ids("p", "/a-b/v1")
    cfg = plans["prod"].config
    picked = cfg.models[0].model_copy(update={"routing": "inference-gateway"})
    owner = cfg.tenants[0].model_copy(update={
        "name": "own", "models": [picked.name],
        "dedicated": DedicatedSpec(models=[picked.name], node_pool=picked.node_pool)})
    text = routes_picture(cfg.model_copy(update={"models": [picked, *cfg.models[1:]], "tenants": [*cfg.tenants, owner]}))
    assert f"InferencePool {picked.name} (own's own)" in text
    assert f'ip_{picked.name.replace("-", "_")}_own[' in text
