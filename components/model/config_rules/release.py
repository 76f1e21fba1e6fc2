"""The vLLM release: the server image is one of its builds, and extraArgs parse with its parser
and leave the platform's own flags alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import placements
from ..specs import MANAGED_VLLM_OPTIONS, ImageRef, ModelSpec, item_key
from ..vllm_argv import check_argv, load_snapshot, normalise
from ..vllm_versions import TPU_RELEASES, release
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def vllm_release(cfg: "StackConfig", add: Add) -> None:
    check_image_tag(add, "serverImage.tag", cfg.server_image, cfg.vllm_version)
    tpu_pools = sorted({p for _m, p, _t in placements(cfg) if p in cfg_pools(cfg) and cfg.pool(p).is_tpu})
    if tpu_pools and cfg.tpu_server_image is None:
        add("tpuServerImage", f"node pool(s) {', '.join(tpu_pools)} are TPUs, which run the vLLM TPU build: build "
            f"images/ with VLLM_IMAGE=vllm/vllm-tpu (images/cloudbuild-tpu.yaml) and set tpuServerImage "
            f"(repository, tag v{cfg.tpu_vllm_version}-<suffix>)")
    if cfg.tpu_server_image is not None:
        check_image_tag(add, "tpuServerImage.tag", cfg.tpu_server_image, cfg.tpu_vllm_version,
                        "vllm-gke:tpuVllmVersion", tpu=True)
    for i, model in enumerate(cfg.models):
        # Checked by every release its replicas run on (a dedicated tenant's pool may differ).
        pools = {model.node_pool, *(t.dedicated.node_pool for t in cfg.tenants
                                    if t.dedicated and model.name in t.dedicated.models)}
        for rel in {cfg.release_for(p) for p in pools if p in cfg_pools(cfg)}:
            check_extra_args(add, f"{item_key('models', cfg.models, i)}.extraArgs", model, rel.version,
                             tpu=rel.platform == "tpu")


def cfg_pools(cfg: "StackConfig") -> set[str]:
    return {p.name for p in cfg.node_pools}


def check_image_tag(add: Add, key: str, image: ImageRef, vllm_version: str,
                    version_key: str = "vllm-gke:vllmVersion", tpu: bool = False) -> None:
    """An image tag of the chosen vLLM release. Also run by the package's VllmService."""
    rel = TPU_RELEASES[vllm_version] if tpu else release(vllm_version)
    tag = image.tag
    if tag and not (tag == rel.image_tag or tag.startswith(rel.image_tag + "-")):
        add(key, f"'{tag}' is not an image of {rel.label} ({version_key}); build "
            f"one tagged {rel.image_tag}-<suffix> or set {version_key} to the image's release")


def check_extra_args(add: Add, key: str, model: ModelSpec, vllm_version: str, tpu: bool = False) -> None:
    """The model's extraArgs against the release's real parser, and none the platform sets itself.
    Also run by the package's VllmService."""
    rel = TPU_RELEASES[vllm_version] if tpu else release(vllm_version)
    vllm_version = rel.label.removeprefix("vLLM ")
    snapshot = load_snapshot(rel.snapshot)
    flags = snapshot["flags"]
    for arg in model.extra_args:
        if not arg.startswith("-"):
            continue
        name = normalise(arg)[0] if arg.startswith("--") else arg.split("=", 1)[0]
        spec = flags.get(name)
        if spec is not None and spec["dest"] in MANAGED_VLLM_OPTIONS:
            add(key, f"may not set {name}: {MANAGED_VLLM_OPTIONS[spec['dest']]}")
    for problem in check_argv(model.extra_args, snapshot) if model.extra_args else []:
        add(key, f"{problem} (checked against vLLM {vllm_version}'s parser)")
