"""A model's fallback (models[].fallback): another model of the stack, one step (no chains, no
loops), that some tenant the model sheds may call - else nothing would ever go there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fallback import sent_tenants, shared_callers
from ..specs import ModelSpec, item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def fallbacks(cfg: "StackConfig", add: Add) -> None:
    models = {m.name: m for m in cfg.models}
    for i, model in enumerate(cfg.models):
        if model.fallback is None:
            continue
        key, name = f"{item_key('models', cfg.models, i)}.fallback.model", model.fallback.model
        target = models.get(name)
        if name == model.name:
            add(key, f"'{name}' is the model itself: its shed tenants would be sent back into the queue they "
                "were shed from; name another, smaller model of the stack, or remove fallback")
        elif target is None:
            others = ", ".join(m for m in models if m != model.name) or "(no other model)"
            add(key, f"model '{name}' is not declared; use one of {others} or add it under vllm-gke:models")
        elif target.fallback is not None:
            add(key, f"model '{name}' has a fallback of its own ('{target.fallback.model}'): a request is sent on "
                f"once, never along a chain or round a loop; name a model without one, or remove "
                f"models[{name}].fallback")
        else:
            _someone_is_sent(cfg, add, key, model, name)


def _someone_is_sent(cfg: "StackConfig", add: Add, key: str, model: ModelSpec, name: str) -> None:
    """Only shed tenants (negative priority) allowed the fallback are sent: none, and it is dead config."""
    callers = shared_callers(cfg, model)
    shed = [t.name for t in callers if t.priority < 0]
    if not shed:
        add(key, f"no tenant calling model '{model.name}' on its shared replicas has a negative priority, and only "
            f"shed tenants are sent to '{name}': nothing ever would be; give such a tenant tenants[].priority "
            "below 0, or remove fallback")
    elif not sent_tenants(model, callers):
        add(key, f"none of the tenants model '{model.name}' sheds ({', '.join(shed)}) may call '{name}', and only "
            f"those allowed it are sent there; add '{name}' to one's tenants[].models, or remove fallback")
