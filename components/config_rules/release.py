"""The vLLM release: the server image is one of its builds, and extraArgs parse with its parser
and leave the platform's own flags alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..specs import MANAGED_VLLM_OPTIONS, ImageRef, ModelSpec, item_key
from ..vllm_argv import check_argv, load_snapshot, normalise
from ..vllm_versions import release
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig

def vllm_release(cfg: "StackConfig", add: Add) -> None:
    check_image_tag(add, "serverImage.tag", cfg.server_image, cfg.vllm_version)
    for i, model in enumerate(cfg.models):
        check_extra_args(add, f"{item_key('models', cfg.models, i)}.extraArgs", model, cfg.vllm_version)


def check_image_tag(add: Add, key: str, image: ImageRef, vllm_version: str,
                    version_key: str = "vllm-gke:vllmVersion") -> None:
    """An image tag of the chosen vLLM release. Also run by the package's VllmService."""
    rel = release(vllm_version)
    tag = image.tag
    if tag and not (tag == rel.image_tag or tag.startswith(rel.image_tag + "-")):
        add(key, f"'{tag}' is not an image of vLLM {vllm_version} ({version_key}); build "
            f"one tagged {rel.image_tag}-<suffix> or set {version_key} to the image's release")


def check_extra_args(add: Add, key: str, model: ModelSpec, vllm_version: str) -> None:
    """The model's extraArgs against the release's real parser, and none the platform sets itself.
    Also run by the package's VllmService."""
    snapshot = load_snapshot(vllm_version)
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
