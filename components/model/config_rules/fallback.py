"""A model's fallback (models[].fallback): another model of the stack, one step (no chains, no
loops), that some tenant the model sheds may call - else nothing would ever go there; and a queue
objective below the TTFT bound, for the queue time is what sends requests there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fallback import sent_tenants, shared_callers
from ..specs import ModelSpec, item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def fallbacks(cfg: "StackConfig", add: Add) -> None:
    _queue_below_ttft(cfg, add)
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


def _queue_below_ttft(cfg: "StackConfig", add: Add) -> None:
    """The guard sheds, and so sends to a fallback, on its queue time alone (components/model/
    fallback.py): with a queue objective at or over the TTFT bound, the bound is broken long
    before anything is sent."""
    queue, ttft = cfg.monitoring.queue_latency_slo_seconds, cfg.monitoring.ttft_slo_seconds
    named = [m.name for m in cfg.models if m.fallback is not None]
    if named and queue >= ttft:
        add("monitoring.queueLatencySloSeconds", (
            f"{queue:g}s is not below monitoring.ttftSloSeconds ({ttft:g}s), and the replicas of "
            f"{', '.join(named)} send tenants to their fallback only while their queue time is over it: the "
            f"TTFT bound would be broken before any request went there; set it below {ttft:g}s (the queue "
            "is part of the time to first token), or remove models[].fallback"))
