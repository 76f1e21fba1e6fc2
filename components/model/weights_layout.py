"""Where the weights live and how they get there, as plain values the components and the plan
share: the share's paths and completion markers, each copy a loader makes (models, adapters), the
Filestore tier and size they need, and the loader's command line. No resources are declared here
(components/model_store.py and its backends' storage, components/weights_storage.py, declare them)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Optional, Sequence

from .k8s_objects import WEIGHTS_READY_MARKER
from .specs import AdapterSpec, ModelSpec, WeightsSpec, item_key
from .vllm_versions import VllmRelease

SHARE_NAME = "models"
MOUNT_PATH = "/models"
CLAIM_NAME = "model-weights"
LOADER_SA = "weights-loader"
# The unprivileged user the vLLM server runs as (VllmService); a bucket mount gives it the files.
SERVER_UID = 1000
# The vLLM servers' Kubernetes service account in every consumer namespace (MeshNamespace makes
# it): the identity the weights bucket, the limit store and nothing else grant to.
SERVER_SA = "vllm-server"
HF_TOKEN_MOUNT = "/var/run/secrets/hf"
# Filestore's smallest capacity per tier, in GiB (REGIONAL starts at 100 GiB, but its read
# throughput scales with capacity: below 1 TiB a multi-GB load crawls).
TIER_MIN_GB = {"BASIC_HDD": 1024, "BASIC_SSD": 2560, "ZONAL": 1024, "REGIONAL": 1024}
BASIC_TIERS = frozenset({"BASIC_HDD", "BASIC_SSD"})
REGIONAL_TIERS = frozenset({"REGIONAL"})
# A statically bound NFS volume's size is nominal: the kubelet never enforces it. Tying it to the
# share's capacity would turn every resize (adding a model) into a change of an immutable field.
NOMINAL_VOLUME_SIZE = "1Gi"
HEADROOM = 1.3  # tokenizer and index files, the size estimates' error
# A path segment's limit (NAME_MAX, and Cloud Storage FUSE's): a folder name is cut to it.
NAME_MAX_BYTES = 255


LOADER_ENV = ({"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "TRANSFORMERS_OFFLINE", "value": "0"},
              {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"})
# The loader's root filesystem is read-only: what huggingface_hub and gcloud write besides the
# weights (HF_HOME under XDG_CACHE_HOME, gcloud's CLOUDSDK_CONFIG, temporary files) goes to small
# emptyDirs. Xet's chunk cache (10 GB by default) is off: each file is read once.
LOADER_HOME = "/home/loader"
LOADER_SCRATCH = (("home", LOADER_HOME), ("tmp", "/tmp"))
LOADER_SCRATCH_GI = 2
LOADER_RUNTIME_ENV = ({"name": "HOME", "value": LOADER_HOME}, {"name": "XDG_CACHE_HOME", "value": f"{LOADER_HOME}/.cache"},
                      {"name": "CLOUDSDK_CONFIG", "value": f"{LOADER_HOME}/.config/gcloud"},
                      {"name": "TMPDIR", "value": "/tmp"}, {"name": "HF_XET_CHUNK_CACHE_SIZE_BYTES", "value": "0"})
# The bucket backends' loaders write through the FUSE mount as this user (the mount's uid/gid):
# no root. Filestore's export is root-owned (the instance's default), so there the loader is root,
# without capabilities, on a read-only root filesystem.
LOADER_UID = 10001


def source_bucket(source: str) -> str:
    """The bucket of a gs:// source."""
    return source.removeprefix("gs://").split("/", 1)[0]


def copy_folder(source: str, revision: str) -> str:
    """A copy's own folder name: the revision (one path segment) and a digest of source and
    revision, so a changed source at the same revision is a new folder, loaded anew and rolled
    onto, never the old files under the old marker."""
    digest = hashlib.sha256(f"{source}\n{revision}".encode()).hexdigest()[:8]
    # A revision may take 255 bytes itself: cut it (whole characters), the digest keeps it unique.
    room = NAME_MAX_BYTES - len(digest) - 1
    name = revision.replace('/', '_').encode()[:room].decode(errors="ignore")
    return f"{name}-{digest}"


def model_dir(model: ModelSpec) -> str:
    return f"{MOUNT_PATH}/{model.name}/{copy_folder(model.source, model.revision)}"


def legacy_dir(copy: "WeightCopy") -> str:
    """Where the copy lived before folders carried the digest (/models/<model>/<revision>): the
    loader moves a complete copy of the same source from there instead of loading it again."""
    parent = PurePosixPath(copy.directory).parent
    return f"{parent}/{copy.revision}"


def ready_marker(model: ModelSpec) -> str:
    return f"{model_dir(model)}/{WEIGHTS_READY_MARKER}"


# Adapters live under a folder no model name can take (names start with a letter).
ADAPTERS_DIR = f"{MOUNT_PATH}/.adapters"


def adapter_dir(model: ModelSpec, adapter: AdapterSpec) -> str:
    return f"{ADAPTERS_DIR}/{model.name}/{adapter.name}/{copy_folder(adapter.source, adapter.revision)}"


# A speculative draft (models[].speculative.draft) lives beside the adapters, under a folder no
# model name can take either; one per model, its own folder per source and revision.
DRAFTS_DIR = f"{MOUNT_PATH}/.drafts"


def draft_dir(model: ModelSpec) -> Optional[str]:
    """Where the model's speculative draft is copied (what --speculative-config's `model` names), if it has one."""
    draft = model.speculative.draft if model.speculative else None
    return None if draft is None else f"{DRAFTS_DIR}/{model.name}/{copy_folder(draft.source, draft.revision)}"


@dataclass(frozen=True)
class WeightCopy:
    """One set of files on the share, written once by its loader Job."""

    key: str  # the loader Job's suffix
    model: str  # the model it belongs to
    source: str
    revision: str
    directory: str
    # GiB its files take on disk (the stack's diskGb, else an estimate).
    weights_gb: float
    # The config key that sets weights_gb: what the loader names when the files do not fit.
    size_key: str = "diskGb"
    adapter: bool = False

    @property
    def marker(self) -> str:
        return f"{self.directory}/{WEIGHTS_READY_MARKER}"


def model_copy(key: str, model: ModelSpec, size_key: str = "diskGb") -> WeightCopy:
    return WeightCopy(key, model.name, model.source, model.revision, model_dir(model), model.files_gb, size_key)


def adapter_copies(model: ModelSpec, key_prefix: str = "") -> list[WeightCopy]:
    # The estimate: the GPU memory one adapter slot takes at the largest rank.
    return [WeightCopy(f"{model.name}-lora-{a.name}", model.name, a.source, a.revision, adapter_dir(model, a),
                       a.disk_gb or model.lora_gb() / max(model.lora_slots, 1),
                       f"{key_prefix}{item_key('adapters', model.adapters, j)}.diskGb", adapter=True)
            for j, a in enumerate(model.adapters)]


def draft_copies(model: ModelSpec, key_prefix: str = "") -> list[WeightCopy]:
    """The model's speculative draft, loaded like a model (the release's weight files), if it has one."""
    draft, directory = (model.speculative.draft if model.speculative else None), draft_dir(model)
    if draft is None or directory is None:
        return []
    size = draft.disk_gb or draft.params_billion * draft.bytes_per_weight
    return [WeightCopy(f"{model.name}-draft", model.name, draft.source, draft.revision, directory, size,
                       f"{key_prefix}speculative.draft.diskGb")]


def side_copies(model: ModelSpec) -> list[WeightCopy]:
    """What a server reads beside the model's own folder: its adapters and its speculative draft."""
    return adapter_copies(model) + draft_copies(model)


def reads_hub(models: Sequence[ModelSpec]) -> bool:
    """Whether any copy comes from the Hugging Face Hub (the only sources that need its token)."""
    return any(c.source.startswith("hf://") for c in weight_copies(models))


def reads_hub_token_from_secret_manager(models: Sequence[ModelSpec], weights: WeightsSpec) -> bool:
    """Whether any loader needs the Hugging Face token from Secret Manager: only hf:// sources
    read one, and only where no Kubernetes Secret is given instead."""
    return weights.hf_token_kubernetes_secret is None and reads_hub(models)


def served_files_gb(model: ModelSpec) -> float:
    """What one server of the model reads from the store: its files, its adapters' and its draft's."""
    return model.files_gb + sum(a.weights_gb for a in side_copies(model))


def weight_copies(models: Sequence[ModelSpec]) -> list[WeightCopy]:
    """Every copy on the share: each model, each canary's revision (its own directory beside the
    current one), each LoRA adapter and each speculative draft; each names the key (models[<name>]...)
    that sizes it."""
    return [model_copy(m.name, m, f"{item_key('models', models, i)}.diskGb") for i, m in enumerate(models)] + \
        [model_copy(f"{m.name}-canary", c, f"{item_key('models', models, i)}.diskGb") for i, m in enumerate(models)
         if (c := m.canary_model()) is not None] + \
        [a for i, m in enumerate(models) for a in adapter_copies(m, f"{item_key('models', models, i)}.")] + \
        [d for i, m in enumerate(models) for d in draft_copies(m, f"{item_key('models', models, i)}.")]


def plan_filestore(models: Sequence[ModelSpec], weights: WeightsSpec) -> tuple[str, int]:
    """Tier and capacity (GiB) for the share: the tier's minimum or the weights plus headroom. The
    tier is the config's alone: one chosen from the models would replace the share when a model
    is added (a tier cannot change in place)."""
    tier = weights.tier
    if tier in BASIC_TIERS:
        # Basic shares only grow: derived from the models, removing one would plan a shrink the
        # API refuses. Their size is the config's (the stack config checks the models fit it).
        return tier, filestore_capacity(tier, max(TIER_MIN_GB[tier], weights.capacity_gb or 0))
    capacity = filestore_capacity(tier, max(TIER_MIN_GB[tier], needed_gb(models), weights.capacity_gb or 0))
    return tier, capacity


def needed_gb(models: Sequence[ModelSpec]) -> int:
    """What the share must hold: every copy plus the largest again (a new revision or source
    loads beside the current copy, which is removed only once the servers read the new one),
    plus headroom."""
    sizes = [c.weights_gb for c in weight_copies(models)]
    return math.ceil((sum(sizes) + max(sizes, default=0)) * HEADROOM)


def capacity_range(tier: str, capacity_gb: int) -> str:
    """Zonal and regional shares cannot move between their two size ranges in place."""
    return "high" if tier in ("ZONAL", "REGIONAL") and capacity_gb > LOW_RANGE_MAX_GB else "low"


# Zonal and regional Filestore sizes: 1-9.75 TiB in 256 GiB steps, 10-100 TiB in 2.5 TiB steps, and
# an instance cannot move between the two ranges in place (cloud.google.com/filestore/docs/service-tiers).
LOW_RANGE_MAX_GB = 9984
HIGH_RANGE_MIN_GB, HIGH_RANGE_STEP_GB = 10240, 2560


def filestore_capacity(tier: str, gb: int) -> int:
    """The smallest size the tier offers that holds `gb` GiB."""
    if tier in ("ZONAL", "REGIONAL") and gb > LOW_RANGE_MAX_GB:
        return max(HIGH_RANGE_MIN_GB, math.ceil(gb / HIGH_RANGE_STEP_GB) * HIGH_RANGE_STEP_GB)
    return math.ceil(gb / 256) * 256


def share_identity(instance_name: str, tier: str, location: str, size_range: str = "low") -> str:
    """A digest of what Filestore cannot change in place (tier, location, a zonal or regional
    share's size range) and the name it was asked for: the instance and its PVs and PVCs are
    named by it, so a change is a new share beside the old one, with new claims the servers roll
    onto (once loaded) before the old ones are deleted."""
    identity = f"{instance_name}\n{tier}\n{location}" + ("" if size_range == "low" else f"\n{size_range}")
    return hashlib.sha256(identity.encode()).hexdigest()[:6]


def share_instance_name(instance_name: str, identity: str) -> str:
    """Filestore instance ids: a lowercase letter first, at most 63 characters, no trailing '-'."""
    return f"{instance_name[:63 - len(identity) - 1].rstrip('-')}-{identity}"


LOADER_PROGRAM = Path(__file__).parent.parent / "scripts" / "load_weights.py"
LOADER_MOUNT = "/opt/vllm-gke-loader"
# load_weights.py's EXIT_UNLOADABLE.
LOADER_EXIT_UNLOADABLE = 3


def reads(copy: WeightCopy, rel: VllmRelease) -> str:
    """Which weight files vLLM opens in this copy (the loader's --reads)."""
    return "adapter" if copy.adapter else rel.weights_rule


def bucket_folder(copy: WeightCopy) -> str:
    """The copy's folder in the weights bucket (the bucket holds what the share would under /models)."""
    return copy.directory.removeprefix(MOUNT_PATH).strip("/")


def loader_command(copy: WeightCopy, rel: VllmRelease, max_gib: Optional[float] = None,
                   dest_uri: Optional[Any] = None) -> list[Any]:
    """The loader's argv: exec form, every value an argument (a shell never parses them). With
    max_gib (a Hyperdisk ML disk is filled from the folder) the loader refuses a selection that
    does not fit, naming the key, and leaves nothing else in the folder. It removes nothing
    beside its folder: the servers still read the current copy until they roll (prune_command).
    `dest_uri`: the folder in the weights bucket (gs://BUCKET/bucket_folder(copy), a string or a
    Pulumi output of one), where the loader copies server-side."""
    program = f"{LOADER_MOUNT}/{LOADER_PROGRAM.name}"
    if copy.source.startswith("hf://"):
        argv: list[Any] = ["python3", program, "hf", copy.source.removeprefix("hf://"), copy.revision,
                                         copy.directory, "--token-file", f"{HF_TOKEN_MOUNT}/token"]
    else:
        argv = ["python3", program, "gcs", copy.source, copy.directory, "--revision", copy.revision]
        if dest_uri is not None:  # the folder is the weights bucket's: copy server-side
            argv += ["--dest-uri", dest_uri]
    argv += ["--reads", reads(copy, rel), "--size-key", copy.size_key, "--legacy-dest", legacy_dir(copy)]
    if max_gib is not None:
        argv += ["--max-gib", f"{max_gib:.2f}", "--prune"]
    return argv


def kept_folders(model: str, copies: Sequence[WeightCopy]) -> list[str]:
    """The model's folders a serving pool reads: its current and canary revisions, its adapters'."""
    return sorted(c.directory for c in copies if c.model == model)


def prune_command(model: str, copies: Sequence[WeightCopy]) -> list[str]:
    """The prune Job's argv: remove every folder beside the model's kept folders (earlier
    revisions and sources, the layout before digests) but those. Run only once every server and
    load test reading the model rolled onto the kept folders, so the argv is the Job's identity:
    a changed set re-runs it."""
    return ["python3", f"{LOADER_MOUNT}/{LOADER_PROGRAM.name}", "prune", *kept_folders(model, copies)]
