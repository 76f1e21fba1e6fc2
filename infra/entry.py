"""The `vllm-gke` command: the plan's CLI, or, where the plan's extra is not installed, a line saying
how to get it (the components alone need none of it)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        # Here, not at the top: where the plan extra is missing, say how to get it instead of a traceback.
        from .cli import app
    except ModuleNotFoundError as missing:
        print(f"vllm-gke: the plan needs {missing.name}, from the plan extra: pip install 'vllm-gke[plan]'",
              file=sys.stderr)
        raise SystemExit(2) from None
    app()
