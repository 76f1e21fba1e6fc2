"""A model given by its id alone: its config.json, read once and kept beside the stack.

A model without `shape` (or `customShape`) gets its shape from its own config.json
(components/model/hf_config.py reads it): from the Hugging Face hub for hf://org/repo (through
huggingface_hub, with HF_TOKEN or `hf auth login`'s token: the one the stack's loader uses, whose
copy is in Secret Manager, for a gated repo), or from gs://bucket/path/config.json (the Cloud
Storage JSON API over the standard library, with `gcloud auth print-access-token` or
GOOGLE_OAUTH_ACCESS_TOKEN). The file goes to <stacks>/model-configs/<org>--<repo>@<revision>.json
with the commit the hub returned; committed with the stack, `pulumi up` (in CI, say) plans from the
same facts offline, and a cached file is always read before the network is asked. The resolution
writes each such model's `customShape` (and `dtype` and `maxModelLen` where the stack leaves them
out) into the raw settings before they are validated, so everything downstream sees a shape; a
Cloud Run model (cloudRun.models[]) is read the same way, its shape written as `shape`.

The stack program and `vllm-gke plan` call it through infra/config.py's load(); a program of one's
own calls `with_model_configs(config, cache_dir)` on its settings before building a Platform.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import pulumi
import yaml

from ..components.model.hf_config import SPEC_DTYPE, HfConfigError, shape_from_config
from ..components.model.specs import ModelSpec
from ..components.model.stack_config import ConfigError, ConfigIssue

CACHE_FOLDER = "model-configs"
# Overrides where the cache lives (a folder), for the plan and `pulumi up` alike.
CACHE_DIR_ENV = "VLLM_GKE_MODEL_CONFIGS"
REPO_STACKS = Path(__file__).resolve().parent.parent / "stacks"
CONFIG_FILE = "config.json"
# The default maxModelLen, lowered to what the model takes where that is less.
DEFAULT_MAX_MODEL_LEN: int = ModelSpec.model_fields["max_model_len"].default
_SHAPE_KEYS = ("shape", "customShape", "custom_shape")
def default_cache_dir() -> Path:
    """VLLM_GKE_MODEL_CONFIGS; under `pulumi up`, model-configs/ in the project's stackConfigDir (where
    Pulumi.<stack>.yaml is); else ./stacks/model-configs, or this checkout's, as the plan finds stacks."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    root = pulumi.runtime.get_root_directory()
    project = Path(root) / "Pulumi.yaml" if root else None
    if project is not None and project.is_file():
        doc = yaml.safe_load(project.read_text()) or {}
        return project.parent / str(doc.get("stackConfigDir") or ".") / CACHE_FOLDER
    here = Path.cwd() / "stacks"
    return (here if here.is_dir() else REPO_STACKS) / CACHE_FOLDER


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config.json is: hf://org/repo at a revision, or gs://bucket/path."""

    source: str
    revision: str

    @property
    def on_hub(self) -> bool:
        return self.source.startswith("hf://")

    @property
    def cache_name(self) -> str:
        if self.on_hub:
            org, repo = self.source.removeprefix("hf://").split("/", 1)
            return f"{org}--{repo}@{urllib.parse.quote(self.revision, safe='')}.json"
        return "gs--" + "--".join(p for p in self.source.removeprefix("gs://").split("/") if p) + ".json"


class _Unreachable(Exception):
    """The network (or the client library) is not there: the cache is the only way."""


class _Refused(Exception):
    """The source answered and said no: what to fix, under which key."""

    def __init__(self, key: str, problem: str):
        super().__init__(problem)
        self.key, self.problem = key, problem


def _hub_error_classes() -> tuple[type[BaseException], ...]:
    """The client's errors by name; one a release lacks stands for nothing."""
    # Imported here: huggingface_hub is the plan extra's, and `pulumi up` may run without it.
    from huggingface_hub import errors
    names = ("GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError", "LocalEntryNotFoundError",
             "EntryNotFoundError", "RemoteEntryNotFoundError", "HfHubHTTPError")
    return tuple(getattr(errors, name, None) or type(name, (Exception,), {}) for name in names)


def _hub_problem(exc: BaseException, ref: ModelSource, token_words: str) -> Exception:
    """A hub client's error in the stack's words."""
    gated, missing, revision, offline, no_entry, no_remote, http = _hub_error_classes()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    where = f"{ref.source} (revision {ref.revision})"
    if isinstance(exc, gated) or (isinstance(exc, http) and status in (401, 403) and not isinstance(exc, missing)):
        return _Refused("source", f"{ref.source} is gated: the hub refused its config.json ({status or 'gated'}). "
                        "The plan asks again with the loader's Secret Manager copy where gcloud can read it; else "
                        f"set HF_TOKEN (or run `hf auth login`) to {token_words}, once that token has been granted "
                        "access to the repository on huggingface.co, and plan again; or give shape or customShape")
    if isinstance(exc, missing):
        return _Refused("source", f"the hub has no repository {ref.source.removeprefix('hf://')} this token can see "
                        f"(misspelt, private, or gated and it needs {token_words} in HF_TOKEN); fix source or the token")
    if isinstance(exc, revision):
        return _Refused("revision", f"the hub has no revision '{ref.revision}' of {ref.source}; give a branch, tag "
                        "or commit it has")
    if isinstance(exc, offline):
        return _Unreachable(str(exc).splitlines()[0] if str(exc) else "the hub is not reachable")
    if isinstance(exc, (no_entry, no_remote)):
        return _Refused("source", f"{where} has no {CONFIG_FILE}: give shape or customShape")
    return _Unreachable(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no answer'}")


def _download(hub: Any, ref: ModelSource, token: Optional[str] = None) -> Path:
    kwargs = {"token": token} if token else {}
    return Path(hub.hf_hub_download(ref.source.removeprefix("hf://"), CONFIG_FILE, revision=ref.revision, **kwargs))


def _fetch_hub(ref: ModelSource, loader: LoaderToken) -> tuple[Any, str]:
    """config.json and the commit it was read at. The token is huggingface_hub's own choice (HF_TOKEN,
    else the one `hf auth login` stored); where the hub refuses a gated repository, the loader's own
    token from Secret Manager (gcloud, the planner's credentials), which is what the pods will use."""
    try:
        import huggingface_hub  # the plan extra's: `pulumi up` may run without it
    except ImportError:
        raise _Unreachable("huggingface_hub is not installed here (pip install 'vllm-gke[plan]')") from None
    try:
        path = _download(huggingface_hub, ref)
    except Exception as exc:  # each of the client's errors is told apart in _hub_problem
        problem = _hub_problem(exc, ref, loader.words)
        token = loader.value() if isinstance(problem, _Refused) and problem.key == "source" else None
        if token is None:
            raise problem from None
        try:
            path = _download(huggingface_hub, ref, token)
        except Exception as again:
            raise _hub_problem(again, ref, loader.words) from None
    # The hub's cache keeps each file under snapshots/<commit>/ (huggingface_hub's cache layout).
    commit = path.parent.name if path.parent.parent.name == "snapshots" else ref.revision
    try:
        return json.loads(path.read_text()), commit
    except ValueError as exc:
        raise _Refused("source", f"{ref.source}'s {CONFIG_FILE} is not JSON ({exc}): give shape or customShape") from None


def _gcloud_token() -> Optional[str]:
    """GOOGLE_OAUTH_ACCESS_TOKEN, else gcloud's for the active account; None: ask anonymously."""
    if os.environ.get("GOOGLE_OAUTH_ACCESS_TOKEN"):
        return os.environ["GOOGLE_OAUTH_ACCESS_TOKEN"]
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    done = subprocess.run([gcloud, "auth", "print-access-token"], capture_output=True, text=True, timeout=60,
                          check=False)
    token = done.stdout.strip() if done.returncode == 0 else ""
    return token or None


def _fetch_bucket(ref: ModelSource) -> tuple[Any, str]:
    """gs://bucket/path/config.json through the Cloud Storage JSON API (STORAGE_EMULATOR_HOST, as
    Google's libraries honour it, points it elsewhere), and the object's generation."""
    bucket, _, prefix = ref.source.removeprefix("gs://").partition("/")
    name = f"{prefix.strip('/')}/{CONFIG_FILE}" if prefix.strip("/") else CONFIG_FILE
    host = os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").rstrip("/")
    url = f"{host}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
    token = _gcloud_token()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read()), str(answer.headers.get("x-goog-generation") or "")
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _Refused("source", f"Cloud Storage refused gs://{bucket}/{name} ({exc.code}): run `gcloud auth "
                           f"login` (or set GOOGLE_OAUTH_ACCESS_TOKEN) as an identity that may read gs://{bucket}, "
                           "and plan again; or give shape or customShape") from None
        if exc.code == 404:
            raise _Refused("source", f"there is no gs://{bucket}/{name}: point source at the folder that holds the "
                           "model's config.json, or give shape or customShape") from None
        raise _Unreachable(f"Cloud Storage answered {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _Unreachable(str(getattr(exc, "reason", exc))) from None


def _read_cache(path: Path) -> Mapping[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise _Refused("shape", f"{path} is not JSON ({exc}): delete it and plan online again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise _Refused("shape", f"{path} holds no `config` object (a model config cache): delete it and plan online "
                       "again")
    return doc["config"]


def _write_cache(path: Path, ref: ModelSource, config: Any, commit: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"source": ref.source, "revision": ref.revision, "commit": commit, "config": config}
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
    print(f"vllm-gke: read {ref.source}'s {CONFIG_FILE} (commit {commit or 'unknown'}); cached as {path}: commit it "
          "with the stack", file=sys.stderr)


def model_config(ref: ModelSource, cache_dir: Path, loader: LoaderToken) -> Mapping[str, Any]:
    """The model's config.json: the cached copy, else fetched and cached."""
    path = cache_dir / ref.cache_name
    if path.is_file():
        return _read_cache(path)
    config, commit = _fetch_hub(ref, loader) if ref.on_hub else _fetch_bucket(ref)
    if not isinstance(config, dict):
        raise _Refused("source", f"{ref.source}'s {CONFIG_FILE} is not a JSON object: give shape or customShape")
    _write_cache(path, ref, config, commit)
    return config


def _needs_config(model: Any) -> bool:
    return (isinstance(model, dict) and all(model.get(k) is None for k in _SHAPE_KEYS)
            and isinstance(model.get("source"), str)
            and re.match(r"(hf://[^/]+/[^/]+|gs://[^/]+(/.*)?)$", str(model["source"])) is not None)


def _resolved(model: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The model with its shape (and dtype and maxModelLen where the stack leaves them) from config.json."""
    facts = shape_from_config(config)
    out = {**model, "customShape": facts.custom_shape()}
    given = model.get("dtype")
    if facts.quant_method and given in SPEC_DTYPE.values() and given != facts.dtype:
        # vLLM refuses a --quantization other than the checkpoint's own (vllm/config/model.py,
        # "Quantization method specified in the model config ... does not match").
        raise _Refused("dtype", f"{given!r} quantises otherwise than the checkpoint, whose config.json says "
                       f"quant_method {facts.quant_method!r}: vLLM would refuse to start; leave dtype out "
                       + (f"or set {facts.dtype!r}" if facts.dtype else "(the checkpoint's own method serves it)"))
    if "dtype" not in model and facts.dtype:
        out["dtype"] = facts.dtype
    if "maxModelLen" not in model and "max_model_len" not in model:
        out["maxModelLen"] = min(DEFAULT_MAX_MODEL_LEN, facts.max_context)
    return out


@dataclass(frozen=True)
class LoaderToken:
    """The Hugging Face token the stack's loader holds: how to name it, and where to read it."""

    words: str
    secret: Optional[str] = None  # its Secret Manager secret's id, where the stack keeps it there
    project: Optional[str] = None

    def value(self) -> Optional[str]:
        """The secret's latest version through gcloud (the planner's own credentials); None where
        gcloud, the project or the access is missing."""
        gcloud = shutil.which("gcloud")
        if gcloud is None or not self.secret or not self.project:
            return None
        done = subprocess.run([gcloud, "secrets", "versions", "access", "latest", f"--secret={self.secret}",
                               f"--project={self.project}"], capture_output=True, text=True, timeout=60, check=False)
        return done.stdout.strip() or None if done.returncode == 0 else None


def loader_token(weights: Any, project: Any = None) -> LoaderToken:
    """Which Hugging Face token the stack's loader holds, as the stack names it."""
    settings = weights if isinstance(weights, dict) else {}
    secret = settings.get("hfTokenKubernetesSecret")
    if isinstance(secret, dict) and secret.get("name"):
        return LoaderToken(f"the token the stack's loader uses (its copy is the Kubernetes Secret '{secret['name']}', "
                           "weights.hfTokenKubernetesSecret)")
    name = str(settings.get("secretManagerSecret") or "hf-token")
    return LoaderToken(f"the token the stack's loader uses (its copy is the Secret Manager secret '{name}', "
                       "weights.secretManagerSecret)", name, str(project) if project else None)


def _item(models: list[Any], i: int) -> str:
    """`[name]` where the list names the model once, else `[index]` (as the config's messages say it)."""
    name = models[i].get("name") if isinstance(models[i], dict) else None
    names = [m.get("name") if isinstance(m, dict) else None for m in models]
    return f"[{name}]" if isinstance(name, str) and name and names.count(name) == 1 else f"[{i}]"


def _resolve_one(model: dict[str, Any], cache_dir: Path, loader: LoaderToken) -> dict[str, Any]:
    ref = ModelSource(str(model["source"]), str(model.get("revision") or "main"))
    try:
        config = model_config(ref, cache_dir, loader)
    except _Unreachable as exc:
        raise _Refused("shape", f"not set, and {ref.source}'s {CONFIG_FILE} is neither cached "
                       f"({cache_dir / ref.cache_name}) nor reachable ({exc}). Run `vllm-gke plan` once online so it "
                       "caches the file there (commit it with the stack), or give shape (a catalog name) or "
                       "customShape {paramsBillion, layers, kvHeads, headDim}") from None
    try:
        return _resolved(model, config)
    except HfConfigError as exc:
        raise _Refused("shape", f"not set, and {ref.source}'s {CONFIG_FILE} does not give it: {exc}") from None


def resolve_models(models: Any, cache_dir: Callable[[], Path], key: str,
                   weights: Any = None, project: Any = None, shape_key: str = "customShape") -> tuple[Any, list[ConfigIssue]]:
    """The models list with each shapeless model's shape from its config.json, and the problems
    (keys start with `key`, as the config names its models list). `shape_key`: where the read shape
    goes (cloudRun.models[] take it as `shape`, which has no customShape beside it)."""
    if not isinstance(models, list) or not any(_needs_config(m) for m in models):
        return models, []
    folder, loader, out, issues = cache_dir(), loader_token(weights, project), list(models), []
    for i, model in enumerate(models):
        if not _needs_config(model):
            continue
        try:
            resolved = _resolve_one(model, folder, loader)
            resolved[shape_key] = resolved.pop("customShape")
            out[i] = resolved
        except _Refused as exc:
            issues.append(ConfigIssue(f"{key}{_item(models, i)}.{exc.key}", exc.problem))
    return out, issues


def _resolve_cloud_run(cloud_run: Any, cache_dir: Callable[[], Path], key: str, weights: Any,
                       project: Any) -> tuple[Any, list[ConfigIssue]]:
    """The cloudRun settings with each shapeless Cloud Run model resolved as models[] are."""
    if not isinstance(cloud_run, dict) or "models" not in cloud_run:
        return cloud_run, []
    models, issues = resolve_models(cloud_run["models"], cache_dir, f"{key}.models", weights, project, "shape")
    return {**cloud_run, "models": models}, issues


def with_model_configs(config: Mapping[str, Any], cache_dir: str | os.PathLike[str], name: str = "config",
                       source: str = "platform config") -> dict[str, Any]:
    """A Platform's settings (camelCase keys, as a stack file's config) with each model that has no
    shape (models[] and cloudRun.models[]) given one from its config.json, read from `cache_dir` or
    fetched and cached there; a ConfigError names the key (`config.models[name].shape`) and the fix.
    Call it before Platform:
        config = with_model_configs(config, Path(__file__).parent / "model-configs")"""
    folder = lambda: Path(cache_dir)  # noqa: E731
    models, issues = resolve_models(config.get("models"), folder, f"{name}.models",
                                    config.get("weights"), config.get("project"))
    cloud_run, more = _resolve_cloud_run(config.get("cloudRun"), folder, f"{name}.cloudRun",
                                         config.get("weights"), config.get("project"))
    if issues or more:
        raise ConfigError([*issues, *more], source)
    out = {**config, "models": models} if "models" in config else dict(config)
    return {**out, "cloudRun": cloud_run} if "cloudRun" in config else out


def with_stack_model_configs(values: Mapping[str, Any], source: str,
                             cache_dir: Callable[[], Path] = default_cache_dir) -> dict[str, Any]:
    """The stack config's values (`vllm-gke:models`, `vllm-gke:cloudRun`'s models) resolved as
    with_model_configs, with the cache beside the stack (default_cache_dir; the plan passes its
    --stacks-dir's)."""
    weights, project = values.get("vllm-gke:weights"), values.get("gcp:project")
    models, issues = resolve_models(values.get("vllm-gke:models"), cache_dir, "vllm-gke:models", weights, project)
    cloud_run, more = _resolve_cloud_run(values.get("vllm-gke:cloudRun"), cache_dir, "vllm-gke:cloudRun", weights,
                                         project)
    if issues or more:
        raise ConfigError([*issues, *more], source)
    out = {**values, "vllm-gke:models": models} if "vllm-gke:models" in values else dict(values)
    return {**out, "vllm-gke:cloudRun": cloud_run} if "vllm-gke:cloudRun" in values else out
