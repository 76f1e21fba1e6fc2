"""What every cross-key check shares: how a problem is reported."""

from __future__ import annotations

from typing import Callable

PROJECT = "vllm-gke"

Add = Callable[[str, str], None]
