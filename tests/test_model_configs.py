"""A model given by its id alone (infra/model_configs.py): its config.json fetched through a fake
hub (huggingface_hub.hf_hub_download replaced) or a local Cloud Storage stand-in, cached beside the
stack and read from there offline; gated and unreachable sources told apart, each naming its key
and the fix; and a stack planned end to end from an id with the cached file beside it."""

from __future__ import annotations

import copy
import http.server
import json
import os
import shutil
import sys
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import huggingface_hub
import pytest
import yaml
from huggingface_hub import errors
from typer.testing import CliRunner

from tests.conftest import REPO_ROOT
from vllm_gke.components.model.capacity_report import capacity_report
from vllm_gke.components.model.config_errors import stack_config
from vllm_gke.components.model.hf_config import shape_from_config
from vllm_gke.components.model.stack_config import ConfigError
from vllm_gke.infra import model_configs
from vllm_gke.infra.cli import app
from vllm_gke.infra.model_configs import with_model_configs

CONFIGS = REPO_ROOT / "tests" / "fixtures" / "hf-configs"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"


class FakeHub:
    """hf_hub_download over the fixtures, laid out as huggingface_hub's cache keeps files."""

    def __init__(self, root: Path, gated: frozenset[str] = frozenset(), offline: bool = False):
        self.root, self.gated, self.offline, self.calls = root, gated, offline, []
        self.tokens: list[str] = []
        self.granted = "loader-token"  # the one token the gated repository admits

    def __call__(self, repo_id: str, filename: str, *, revision: str | None = None, token: str | None = None,
                 **_: Any) -> str:
        self.calls.append((repo_id, filename, revision))
        if token is not None:
            self.tokens.append(token)
            if token == self.granted:
                self.gated = frozenset()
        if self.offline:
            raise errors.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub and "
                                                 "we cannot find the requested files in the local cache.")
        if repo_id in self.gated:
            response = SimpleNamespace(status_code=401, headers={}, request=None)
            raise errors.GatedRepoError(f"401 Client Error. Cannot access gated repo for url .../{repo_id}.",
                                        response=response)
        snapshot = self.root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copy(CONFIGS / repo_id.replace("/", "--") / filename, snapshot / filename)
        return str(snapshot / filename)


@pytest.fixture
def hub(tmp_path, monkeypatch) -> FakeHub:
    fake = FakeHub(tmp_path / "hf-cache")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    return fake


def settings(**model: Any) -> dict[str, Any]:
    return {"models": [{"name": "llama", "source": f"hf://{LLAMA}", "nodePool": "gpu", **model}]}


def test_a_model_by_id_gets_its_shape_from_its_config_json_and_caches_it(hub, tmp_path):
    out = with_model_configs(settings(), tmp_path / "model-configs")
    facts = shape_from_config(json.loads((CONFIGS / LLAMA.replace("/", "--") / "config.json").read_text()))
    model = out["models"][0]
    assert model["customShape"] == facts.custom_shape()
    assert (model["dtype"], model["maxModelLen"]) == ("bfloat16", 8192)  # the default, within its 131072
    cached = json.loads((tmp_path / "model-configs" / "meta-llama--Llama-3.1-8B-Instruct@main.json").read_text())
    assert (cached["source"], cached["revision"], cached["commit"]) == (f"hf://{LLAMA}", "main", COMMIT)
    assert cached["config"] == json.loads((CONFIGS / LLAMA.replace("/", "--") / "config.json").read_text())
    assert hub.calls == [(LLAMA, "config.json", "main")]


def test_the_cache_is_read_first_so_a_plan_offline_sees_the_same_facts(hub, tmp_path):
    first = with_model_configs(settings(), tmp_path)
    hub.offline = True
    again = with_model_configs(settings(), tmp_path)
    assert again == first and len(hub.calls) == 1


def test_the_models_revision_names_its_cache_file_and_the_stacks_settings_win(hub, tmp_path):
    out = with_model_configs(settings(revision="refs/pr/7", dtype="fp8", maxModelLen=32768), tmp_path)
    assert hub.calls == [(LLAMA, "config.json", "refs/pr/7")]
    assert (tmp_path / "meta-llama--Llama-3.1-8B-Instruct@refs%2Fpr%2F7.json").is_file()
    assert (out["models"][0]["dtype"], out["models"][0]["maxModelLen"]) == ("fp8", 32768)


def test_a_model_with_a_shape_is_left_alone_and_nothing_is_fetched(hub, tmp_path):
    given = settings(shape="llama-3-8b")
    assert with_model_configs(given, tmp_path) == given and hub.calls == []


def test_a_gated_repo_says_which_token_to_use(hub, tmp_path):
    hub.gated = frozenset({LLAMA})
    with pytest.raises(ConfigError) as err:
        with_model_configs({**settings(), "weights": {"secretManagerSecret": "hub-token"}}, tmp_path)
    [issue] = err.value.issues
    assert issue.key == "config.models[llama].source"
    assert "gated" in issue.problem and "HF_TOKEN" in issue.problem and "hf auth login" in issue.problem
    assert "Secret Manager secret 'hub-token'" in issue.problem and "weights.secretManagerSecret" in issue.problem
    assert not list(tmp_path.glob("*.json"))


def test_no_cache_and_no_network_is_a_config_error_naming_the_shape_and_the_fix(hub, tmp_path):
    hub.offline = True
    with pytest.raises(ConfigError) as err:
        with_model_configs(settings(), tmp_path)
    [issue] = err.value.issues
    assert issue.key == "config.models[llama].shape"
    assert "vllm-gke plan" in issue.problem and "online" in issue.problem and "customShape" in issue.problem
    assert str(tmp_path / "meta-llama--Llama-3.1-8B-Instruct@main.json") in issue.problem


def test_without_huggingface_hub_the_cache_still_serves(hub, tmp_path, monkeypatch):
    with_model_configs(settings(), tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `pulumi up` without the plan extra
    assert with_model_configs(settings(), tmp_path)["models"][0]["customShape"]["layers"] == 32
    with pytest.raises(ConfigError, match="huggingface_hub is not installed"):
        with_model_configs(settings(revision="v2"), tmp_path)


def test_a_config_the_estimate_cannot_read_is_a_config_error(hub, tmp_path):
    (tmp_path / "meta-llama--Llama-3.1-8B-Instruct@main.json").write_text(json.dumps({"config": {"model_type": "x"}}))
    with pytest.raises(ConfigError) as err:
        with_model_configs(settings(), tmp_path)
    assert err.value.issues[0].key == "config.models[llama].shape"
    assert "num_hidden_layers" in err.value.issues[0].problem and hub.calls == []


class Bucket(http.server.BaseHTTPRequestHandler):
    """The Cloud Storage JSON API's media download of one object."""

    objects: dict[str, bytes] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = self.objects.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("x-goog-generation", "1712345678901234")
        self.end_headers()
        self.wfile.write(body or b"{}")


@pytest.fixture
def bucket(monkeypatch) -> Iterator[type[Bucket]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bucket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.test")
    Bucket.objects = {"/storage/v1/b/acme-models/o/qwen3%2F30b-a3b%2Fconfig.json?alt=media":
                      (CONFIGS / "Qwen--Qwen3-30B-A3B" / "config.json").read_bytes()}
    yield Bucket
    server.shutdown()


def test_a_bucket_source_reads_config_json_through_the_json_api(bucket, tmp_path):
    out = with_model_configs(settings(source="gs://acme-models/qwen3/30b-a3b"), tmp_path)
    assert out["models"][0]["customShape"]["activeParamsBillion"] == pytest.approx(3.35, abs=0.01)
    cached = json.loads((tmp_path / "gs--acme-models--qwen3--30b-a3b.json").read_text())
    assert cached["commit"] == "1712345678901234"  # the object's generation
    with pytest.raises(ConfigError, match=r"no gs://acme-models/other/config\.json"):
        with_model_configs(settings(source="gs://acme-models/other"), tmp_path)


def stack_file(dev: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The dev stack serving Llama 3.1 8B on its 20 GB MIG slice, sized so it fits."""
    doc = copy.deepcopy(dev)
    config = doc["config"]
    config["vllm-gke:models"] = [{"name": "llama", "source": f"hf://{LLAMA}", "nodePool": "a100-mig",
                                  "gpuMemoryUtilization": 0.95, "longRequestBytes": 8192, **model,
                                  "short": {"minReplicas": 1, "maxReplicas": 1, "maxNumSeqs": 4, "maxModelLen": 4096,
                                            "contextTokens": 2048},
                                  "long": {"minReplicas": 1, "maxReplicas": 1, "maxNumSeqs": 1}}]
    config["vllm-gke:tenants"][0]["models"] = ["llama"]
    return doc


def plan_json(runner: CliRunner, stack: str, *more: str) -> dict[str, Any]:
    result = runner.invoke(app, ["plan", "--stack", stack, "--no-write", "--output", "json", *more])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_stack_planned_from_an_id_has_the_catalog_shapes_capacity(tmp_path, monkeypatch, hub):
    hub.offline = True  # the cached file beside the stack is all it reads
    dev = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    stacks = tmp_path / "stacks"
    (stacks / "model-configs").mkdir(parents=True)
    (stacks / "Pulumi.byid.yaml").write_text(yaml.safe_dump(stack_file(dev, {})))
    (stacks / "Pulumi.catalog.yaml").write_text(yaml.safe_dump(stack_file(dev, {"shape": "llama-3-8b"})))
    fixture = json.loads((CONFIGS / LLAMA.replace("/", "--") / "config.json").read_text())
    (stacks / "model-configs" / "meta-llama--Llama-3.1-8B-Instruct@main.json").write_text(json.dumps(
        {"source": f"hf://{LLAMA}", "revision": "main", "commit": COMMIT, "config": fixture}))
    monkeypatch.chdir(tmp_path)  # ./stacks, as a project of one's own keeps it
    runner = CliRunner()
    by_id, catalog = plan_json(runner, "byid"), plan_json(runner, "catalog")
    assert by_id["capacity"] == catalog["capacity"] and len(by_id["capacity"]) == 2
    assert by_id["capacity"][0]["weightsPerGpuGb"] == pytest.approx(8.03 * 2)
    # From elsewhere, --stacks-dir names the folder, and its model-configs/ is the cache.
    monkeypatch.chdir(REPO_ROOT)
    assert plan_json(runner, "byid", "--stacks-dir", str(stacks))["capacity"] == catalog["capacity"]
    assert hub.calls == []


def test_plan_exits_2_when_a_shapeless_model_has_no_cache_and_no_network(tmp_path, monkeypatch, hub):
    hub.offline = True
    dev = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.byid.yaml").write_text(yaml.safe_dump(stack_file(dev, {})))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plan", "--stack", "byid", "--no-write"])
    assert result.exit_code == 2, result.output
    assert "vllm-gke:models[llama].shape" in result.output and "online" in result.output
    assert "model-configs" in result.output and "meta-llama--Llama-3.1-8B-Instruct@main.json" in result.output
    assert "Traceback" not in result.output


def test_the_cache_lives_beside_the_stack_files(tmp_path, monkeypatch):
    monkeypatch.delenv(model_configs.CACHE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert model_configs.default_cache_dir() == model_configs.REPO_STACKS / "model-configs"
    (tmp_path / "stacks").mkdir()
    assert model_configs.default_cache_dir() == tmp_path / "stacks" / "model-configs"
    monkeypatch.setenv(model_configs.CACHE_DIR_ENV, str(tmp_path / "ci"))
    assert model_configs.default_cache_dir() == tmp_path / "ci"


def test_a_program_of_ones_own_resolves_its_settings_before_the_platform_validates_them(hub, tmp_path):
    dev = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
    gcp = {"gcp:project": "project", "gcp:region": "region"}

    def as_settings(model: dict[str, Any]) -> dict[str, Any]:
        values = stack_file({"config": dev}, model)["config"]
        return {gcp.get(k, k.removeprefix("vllm-gke:")): v for k, v in values.items()}

    by_id = stack_config(with_model_configs(as_settings({}), tmp_path / "model-configs"))
    catalog = stack_config(as_settings({"shape": "llama-3-8b"}))
    mine, theirs = by_id.models[0].model_shape, catalog.models[0].model_shape
    assert replace(mine, hidden_size=None) == theirs and mine.hidden == theirs.hidden
    assert capacity_report(by_id) == capacity_report(catalog)


def test_a_dtype_that_quantises_otherwise_than_the_checkpoint_is_refused(hub, tmp_path):
    """An AWQ checkpoint served with dtype fp8 is `--quantization fp8`, which vLLM refuses at start:
    the config error names models[...].dtype; the checkpoint's own method is accepted."""
    awq = "Qwen/Qwen2.5-7B-Instruct-AWQ"
    with pytest.raises(ConfigError) as exc:
        with_model_configs(settings(source=f"hf://{awq}", dtype="fp8"), tmp_path)
    assert "config.models[llama].dtype: 'fp8' quantises otherwise than the checkpoint" in str(exc.value)
    assert "quant_method 'awq'" in str(exc.value)
    assert with_model_configs(settings(source=f"hf://{awq}", dtype="awq"), tmp_path)["models"][0]["dtype"] == "awq"


def test_a_gated_repo_is_read_with_the_loaders_own_token_from_secret_manager(hub, tmp_path, monkeypatch):
    """Refused with the planner's token, the plan reads the loader's copy (gcloud secrets versions access,
    the stack's project and secret) and asks again with it: the token the pods will download with."""
    hub.gated = frozenset({LLAMA})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\necho loader-token\n')
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = with_model_configs({**settings(), "project": "team-llm", "weights": {"secretManagerSecret": "hub-token"}},
                             tmp_path / "cache")
    assert "customShape" in out["models"][0] and hub.tokens == ["loader-token"]
    assert (bin_dir / "args").read_text().split() == ["secrets", "versions", "access", "latest", "--secret=hub-token",
                                                      "--project=team-llm"]
