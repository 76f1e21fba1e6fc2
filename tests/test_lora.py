"""LoRA adapters: loaded once onto the share, served by the model's replicas, each only for the
tenants it names (the guard checks the body's `model`), and counted in the GPU memory check."""

from __future__ import annotations

import copy
import json
import sys

import pytest

from tests.conftest import REPO_ROOT
from vllm_gke.components.model.capacity import pool_capacity
from vllm_gke.components.model.serving_api import guard_config, tenant_routes
from vllm_gke.components.model.specs import ModelSpec, TenantSpec, WeightsSpec
from vllm_gke.components.model.weights_layout import ADAPTERS_DIR, adapter_dir, plan_filestore
from vllm_gke.infra.config import ConfigError, parse

sys.path.insert(0, str(REPO_ROOT / "images"))
import vllm_gke_guard as guard  # noqa: E402

from tests.test_guard import Clock, Recorder, call, error, status  # noqa: E402

SEARCH, SUPPORT = "https://auth.acme.example/search", "https://auth.acme.example/support"


def deployment(plan, name):
    return plan.kube("Deployment", name).props["spec"]["template"]["spec"]


def test_server_loads_each_adapter_from_the_share(plans):
    args = deployment(plans["prod"], "llama-8b-short")["containers"][0]["args"]
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"
    assert args[args.index("--max-lora-rank") + 1] == "32"  # the largest adapter's rank
    i = args.index("--lora-modules")
    llama = plans["prod"].config.model("llama-8b")
    assert args[i + 1:i + 3] == [f"{a.name}={adapter_dir(llama, a)}" for a in llama.adapters]
    assert [a.name for a in llama.adapters] == ["support-sql", "search-rewrite"]
    assert adapter_dir(llama, llama.adapters[0]).startswith(f"{ADAPTERS_DIR}/llama-8b/support-sql/v3-")
    # Models without adapters are untouched.
    assert "--enable-lora" not in deployment(plans["prod"], "qwen-7b-short")["containers"][0]["args"]


def test_one_loader_job_per_adapter_and_servers_wait_for_them(prod_by_hand):
    plan = prod_by_hand  # with llama-8b's manual canary
    job = plan.kube("Job", "load-llama-8b-lora-support-sql").props
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    llama = plan.config.model("llama-8b")
    assert cmd[2:6] == ["hf", "acme-ml/llama-3.1-8b-support-sql-lora", "v3", adapter_dir(llama, llama.adapters[0])]
    assert job["metadata"]["labels"]["vllm-gke.io/model"] == "llama-8b"
    wait = deployment(plan, "llama-8b-short")["initContainers"][0]["command"][2]
    for adapter in llama.adapters:
        assert f"{adapter_dir(llama, adapter)}/.vllm-gke-complete" in wait
    # The canary serves the same adapters, so it waits for them too.
    assert adapter_dir(llama, llama.adapters[0]) in deployment(plan, "llama-8b-canary-short")["initContainers"][0]["command"][2]


def test_each_tenant_may_send_only_its_own_adapters(plans):
    env = {e["name"]: e.get("value") for e in deployment(plans["prod"], "llama-8b-long")["containers"][0]["env"]}
    issuers = json.loads(env["GKE_LLM_GUARD_CONFIG"])["issuers"]
    assert issuers[SEARCH]["models"] == ["llama-8b", "search-rewrite"]
    assert issuers[SUPPORT]["models"] == ["llama-8b", "support-sql"]


MODEL = ModelSpec.model_validate({
    "name": "m", "source": "hf://org/m", "shape": "llama-3-8b", "nodePool": "p",
    "adapters": [{"name": "mine", "source": "hf://org/mine", "tenants": ["a"]},
                 {"name": "theirs", "source": "hf://org/theirs", "tenants": ["b"]}]})
TENANT = TenantSpec.model_validate({
    "name": "a", "jwt": {"issuer": "https://auth.example/a", "jwksUri": "https://auth.example/a/jwks",
                         "audiences": ["x"]}, "models": ["m"], "rateLimit": {"requestsPerMinute": 1000},
    "maxTokens": 100})


@pytest.mark.parametrize("body,path,code", [
    ({"model": "mine", "prompt": "x", "max_tokens": 5}, "/v1/completions", 200),
    ({"model": "m", "prompt": "x", "max_tokens": 5}, "/v1/completions", 200),
    ({"prompt": "x", "max_tokens": 5}, "/v1/completions", 200),  # no model: the base
    ({"model": "theirs", "prompt": "x", "max_tokens": 5}, "/v1/completions", 404),
    ({"model": "theirs", "messages": [{"role": "user", "content": "x"}]}, "/v1/chat/completions", 404),
    ({"model": "theirs", "input": "x"}, "/v1/embeddings", 404),  # pooling routes are checked too
    ({"model": "nope", "prompt": "x"}, "/v1/completions", 404),
    ({"model": ["mine"], "prompt": "x"}, "/v1/completions", 400),
])
def test_guard_admits_a_tenant_only_to_its_adapters(body, path, code):
    app = Recorder()
    mw = guard.GuardMiddleware(app, guard_config([TENANT], tenant_routes(), served=MODEL), Clock())
    sent = call(mw, body, path=path, issuer=TENANT.jwt.issuer)
    assert status(sent) == code
    if code == 404:
        assert error(sent)["code"] == "model_not_found" and error(sent)["param"] == "model"
        assert not app.seen


def test_large_bodies_are_read_the_same_way():
    """Above msgspec's size the scanner reads `model`: the same verdict."""
    app = Recorder()
    mw = guard.GuardMiddleware(app, guard_config([TENANT], tenant_routes(), served=MODEL), Clock())
    big = "x" * (guard.MSGSPEC_MAX_BYTES + 10)
    assert status(call(mw, {"prompt": big, "model": "theirs", "max_tokens": 5}, issuer=TENANT.jwt.issuer)) == 404
    assert status(call(mw, {"prompt": big, "model": "mine", "max_tokens": 5}, issuer=TENANT.jwt.issuer)) == 200


def test_adapters_take_gpu_memory_from_the_kv_cache(stack_values):
    from vllm_gke.components.model.specs import NodePoolSpec

    pool = NodePoolSpec(name="p", machine_type="a2-highgpu-1g", gpu_partition_size="3g.20gb")
    plain = MODEL.model_copy(update={"adapters": []})
    with_lora = pool_capacity(MODEL, "short", MODEL.short, pool)
    without = pool_capacity(plain, "short", plain.short, pool)
    assert 0.1 < with_lora.lora_per_gpu_gb < 0.3  # two rank-16 slots of an 8B model: ~0.1 GB each
    assert with_lora.kv_budget_gb == pytest.approx(without.kv_budget_gb - with_lora.lora_per_gpu_gb)
    # Enough adapters at a high rank no longer fit a 20 GB slice: the plan says so, naming LoRA.
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0]["adapters"] = [
        {"name": f"a{i}", "source": f"hf://org/a{i}", "rank": 512, "tenants": ["dev-team"]} for i in range(8)]
    with pytest.raises(ConfigError) as exc:
        parse(values)
    assert any("GB of LoRA adapters" in str(i) for i in exc.value.issues)


def test_share_is_sized_for_the_adapters_too():
    heavy = MODEL.model_copy(update={"max_loras": 2, "adapters": [
        a.model_copy(update={"rank": 512}) for a in MODEL.adapters]})
    assert heavy.lora_gb() > MODEL.lora_gb()
    tier, _ = plan_filestore([heavy], WeightsSpec(tier="BASIC_HDD"))
    assert tier == "BASIC_HDD"
    from vllm_gke.components.model.weights_layout import weight_copies

    copies = {c.key: c for c in weight_copies([heavy])}
    assert set(copies) == {"m", "m-lora-mine", "m-lora-theirs"}
    assert copies["m-lora-mine"].weights_gb == pytest.approx(heavy.lora_gb() / 2)


class ListingApp:
    """vLLM's GET /v1/models on a LoRA server: the base model and every adapter it loaded."""

    def __init__(self, status=200, body=None, chunks=1):
        self.status, self.chunks = status, chunks
        self.body = body if body is not None else json.dumps({"object": "list", "data": [
            {"id": "m", "object": "model", "root": "/models/m/main"},
            {"id": "mine", "object": "model", "parent": "m"},
            {"id": "theirs", "object": "model", "parent": "m"}]}).encode()

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(self.body)).encode())]})
        step = -(-len(self.body) // self.chunks)
        for i in range(0, len(self.body), step):
            await send({"type": "http.response.body", "body": self.body[i:i + step],
                        "more_body": i + step < len(self.body)})


def listing(app, tenant=TENANT, served=MODEL):
    mw = guard.GuardMiddleware(app, guard_config([tenant], tenant_routes(), served=served), Clock())
    sent = call(mw, path="/v1/models", method="GET", issuer=tenant.jwt.issuer)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent, body


@pytest.mark.parametrize("chunks", [1, 3])
def test_the_model_list_shows_a_tenant_only_what_it_may_use(chunks):
    """Another tenant's adapter names (often a customer's) never reach this tenant."""
    sent, body = listing(ListingApp(chunks=chunks))
    assert status(sent) == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["m", "mine"]
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(body)).encode()


@pytest.mark.parametrize("app", [ListingApp(body=b"not json"), ListingApp(body=b'["m", "theirs"]'),
                                 ListingApp(body=json.dumps({"data": ["theirs"]}).encode())])
def test_a_model_list_the_guard_cannot_read_is_empty_not_passed_on(app):
    sent, body = listing(app)
    assert status(sent) == 200 and json.loads(body)["data"] == []


def test_errors_and_servers_without_adapters_pass_unchanged():
    sent, body = listing(ListingApp(status=503, body=b'{"error": "starting"}'))
    assert status(sent) == 503 and body == b'{"error": "starting"}'
    plain = MODEL.model_copy(update={"adapters": []})
    app = ListingApp()
    sent, body = listing(app, served=plain)
    assert body == app.body  # one model, nothing to hide: the bytes untouched
