"""The guard's config: JSON in GKE_LLM_GUARD_CONFIG (components/model/serving_api.py writes it; see
there for the shape), read once when vLLM builds its app, and each issuer's tenant in it."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from .limits import SlidingTokenWindow, SlidingWindowLimiter
from .metrics import TenantMeters

CONFIG_ENV = "GKE_LLM_GUARD_CONFIG"
WARMUP_TOKEN_ENV = "GKE_LLM_WARMUP_TOKEN"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Istio's sidecar connects to the application from this address (inbound passthrough).
DEFAULT_TRUSTED_PEERS = ("127.0.0.6",)


def load_config(config: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The config given, else the one in the environment (none: no tenant, every tenant route refused)."""
    return config if config is not None else json.loads(os.environ.get(CONFIG_ENV) or "{}")


def warmup_token() -> bytes:
    """The entrypoint's warm-up token (serve.py sets it), which lets its own requests past."""
    return os.environ.get(WARMUP_TOKEN_ENV, "").encode()


class Tenant:
    """One issuer's tenant, read from config once (not looked up in a dict on every request)."""

    __slots__ = ("name", "cap", "rpm", "tpm", "objective", "models", "limiter", "tokens", "salt", "meters", "priority",
                 "subjects")

    def __init__(self, entry: dict[str, Any], clock: Callable[[], float], model: str = ""):
        self.name = str(entry["tenant"])
        self.cap = int(entry["maxTokens"])
        self.rpm = int(entry["requestsPerMinute"])
        self.tpm: Optional[int] = entry.get("tokensPerMinute")
        self.objective: Optional[str] = entry.get("objective")
        # Below 0: shed, lowest first, while the server's queue is over its objective (overload.py).
        self.priority = int(entry.get("priority") or 0)
        # On a server with LoRA adapters: the `model` values the tenant may name.
        self.models: Optional[frozenset[str]] = frozenset(entry["models"]) if "models" in entry else None
        # The verified subjects (sub) that are this tenant; None: every subject of its issuer.
        self.subjects: Optional[frozenset[bytes]] = frozenset(
            str(s).encode() for s in entry["subjects"]) if "subjects" in entry else None
        self.limiter = SlidingWindowLimiter(self.rpm, clock)
        # tokensPerMinute per replica, while the shared store is unreachable.
        self.tokens = SlidingTokenWindow(int(self.tpm), clock) if self.tpm else None
        # The member appended to salted requests, encoded once: `"cache_salt":"<salt>"`.
        salt = entry.get("cacheSalt")
        self.salt: Optional[bytes] = b'"cache_salt":' + json.dumps(str(salt)).encode() if salt else None
        # Its requests and tokens on this server's /metrics (usage.py counts them).
        self.meters = TenantMeters(self.name, model)
