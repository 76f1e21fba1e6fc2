"""Plan time and peak memory against the number of tenants and models.

    .venv/bin/python -m benchmarks.plan_scaling            # the whole grid, as a table
    .venv/bin/python -m benchmarks.plan_scaling --one 10 1 # one case, as JSON (used by the grid)

Each case runs in a fresh interpreter, so peak RSS is that plan's own; time excludes imports
(a warm-up plan of the smallest case runs first).
Growth is judged by ratios - seconds per resource and MB per resource against the smallest
case - not by absolute times, which depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

TENANT_GRID = (1, 10, 50)
MODEL_GRID = (1, 5, 20)
MODELS_PER_TENANT = 3


def scaled_config(tenants: int, models: int) -> dict[str, Any]:
    """A valid stack with `tenants` tenants and `models` small models on one MIG pool."""
    slots = 2 * models  # a short and a long replica per model
    return {
        "gcp:project": "bench-project",
        "gcp:region": "us-central1",
        "vllm-gke:environment": "staging",
        "vllm-gke:cluster": {"name": "bench", "zones": ["us-central1-a"]},
        "vllm-gke:nodePools": [{"name": "mig", "machineType": "a2-highgpu-8g", "gpuPartitionSize": "3g.20gb",
                                "minNodes": 1, "maxNodes": max(1, -(-slots // 16))}],
        "vllm-gke:serverImage": {"repository": "example.com/vllm-server", "tag": "v0.34.0-gke.1"},
        "vllm-gke:models": [{
            "name": f"model-{i}", "source": f"hf://org/model-{i}", "shape": "qwen2.5-1.5b",
            "maxModelLen": 4096, "nodePool": "mig",
            "short": {"minReplicas": 1, "maxReplicas": 1, "maxNumSeqs": 32},
            "long": {"minReplicas": 1, "maxReplicas": 1, "maxNumSeqs": 8},
        } for i in range(models)],
        "vllm-gke:tenants": [{
            "name": f"tenant-{t}",
            "jwt": {"issuer": f"https://auth.example/t{t}", "jwksUri": f"https://auth.example/t{t}/jwks",
                    "audiences": ["bench"]},
            "models": sorted({f"model-{(t + k) % models}" for k in range(MODELS_PER_TENANT)}),
            "rateLimit": {"requestsPerMinute": 600}, "maxTokens": 1024,
        } for t in range(tenants)],
    }


def run_one(tenants: int, models: int) -> dict[str, Any]:
    from vllm_gke.infra.plan import run_program
    from vllm_gke.policies.rules import evaluate

    # pulumi_gcp loads its modules on first use: one small plan first, so the timing below is the
    # plan's own work, not import time.
    run_program("bench", scaled_config(1, 1))
    start = time.perf_counter()
    plan = run_program("bench", scaled_config(tenants, models))
    violations = evaluate(plan.policy_resources())
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tenants": tenants, "models": models, "resources": sum(r.custom for r in plan.resources),
            "seconds": seconds, "peak_mb": peak_mb, "violations": len(violations)}


def measure(tenants: int, models: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.plan_scaling", "--one", str(tenants), str(models)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def grid() -> None:
    from rich.console import Console
    from rich.table import Table

    cases = [(t, 1) for t in TENANT_GRID] + [(1, m) for m in MODEL_GRID if m != 1]
    rows = [measure(t, m) for t, m in cases]
    base = rows[0]
    table = Table(title="offline plan scaling (time excludes imports; each case a fresh process)")
    for col in ("tenants", "models", "resources", "seconds", "peak MB", "s/resource vs base", "resources vs base",
                "seconds vs base"):
        table.add_column(col, justify="right")
    for r in rows:
        per = (r["seconds"] / r["resources"]) / (base["seconds"] / base["resources"])
        table.add_row(str(r["tenants"]), str(r["models"]), str(r["resources"]), f"{r['seconds']:.2f}",
                      f"{r['peak_mb']:.0f}", f"{per:.2f}x", f"{r['resources'] / base['resources']:.1f}x",
                      f"{r['seconds'] / base['seconds']:.1f}x")
    Console(width=140).print(table)
    print("Linear growth: 's/resource vs base' stays near 1x while resources grow.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", nargs=2, type=int, metavar=("TENANTS", "MODELS"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one)))
    else:
        grid()


if __name__ == "__main__":
    main()
