"""Plan time and peak memory against the number of tenants and models.

    .venv/bin/python -m benchmarks.plan_scaling            # the whole grid, as a table
    .venv/bin/python -m benchmarks.plan_scaling --one 10 1 # one case, as JSON (used by the grid)

Each case runs in a fresh interpreter, so peak RSS is that plan's own; time excludes imports
(a warm-up plan of the smallest case runs first).
Growth is judged by ratios - the time each step adds per resource it adds, against the first
step of its series - not by absolute times, which depend on the machine. The grid runs twice in
one run: the default options, and every option on (Inference Gateway routing, canaries, LoRA
adapters, scale to zero, priorities, limits across replicas, weights in a bucket).
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


def scaled_config(tenants: int, models: int, every_option: bool = False) -> dict[str, Any]:
    """A valid stack with `tenants` tenants and `models` small models on one MIG pool; with
    `every_option`, every feature on at once (see with_every_option)."""
    slots = 2 * models  # a short and a long replica per model
    config = {
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
    return with_every_option(config) if every_option else config


def with_every_option(config: dict[str, Any]) -> dict[str, Any]:
    """Inference Gateway routing on every other model (the rest length-routed with a canary),
    a LoRA adapter per called model, long pools that scale to zero, tenant priorities and limits
    across replicas, weights on Hyperdisk ML disks filled from a bucket (the backend that declares
    the most: bucket, loaders, and a disk per weight set); its GPU machines must attach Hyperdisk
    ML, so A2 Ultra."""
    config["vllm-gke:cluster"]["minMasterVersion"] = "1.34"
    # Each picker's two replicas stay on the system pool (the plan checks its room).
    config["vllm-gke:cluster"].update(systemMachineType="n2-standard-16",
                                      systemMaxNodes=2 + len(config["vllm-gke:models"]) // 8)
    config["vllm-gke:globalLimits"] = {"enabled": True}
    config["vllm-gke:weights"] = {"backend": "hyperdisk-ml"}
    for pool in config["vllm-gke:nodePools"]:
        pool.update(machineType="a2-ultragpu-8g", gpuPartitionSize="3g.40gb")
    callers: dict[str, list[str]] = {}
    for t, tenant in enumerate(config["vllm-gke:tenants"]):
        tenant["priority"] = -(t % 3)  # 0 never shed, negative shed first
        tenant["rateLimit"]["tokensPerMinute"] = 100_000
        for m in tenant["models"]:
            callers.setdefault(m, []).append(tenant["name"])
    for i, model in enumerate(config["vllm-gke:models"]):
        if i % 2 == 0:
            model["routing"] = "inference-gateway"
            del model["long"]
        else:
            model["canary"] = {"revision": "v2", "weight": 10}
            model["long"]["minReplicas"] = 0
        if model["name"] in callers:
            model["adapters"] = [{"name": f"lora-{i}", "source": f"hf://org/lora-{i}",
                                  "tenants": callers[model["name"]][:1]}]
    return config


def run_one(tenants: int, models: int, every_option: bool = False) -> dict[str, Any]:
    from vllm_gke.infra.plan import run_program
    from vllm_gke.policies.rules import evaluate

    # pulumi_gcp loads its modules on first use: one small plan first, so the timing below is the
    # plan's own work, not import time.
    run_program("bench", scaled_config(1, 1, every_option))
    start = time.perf_counter()
    plan = run_program("bench", scaled_config(tenants, models, every_option))
    violations = evaluate(plan.policy_resources())
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tenants": tenants, "models": models, "every_option": every_option,
            "resources": sum(r.custom for r in plan.resources), "seconds": seconds, "peak_mb": peak_mb,
            "violations": len(violations)}


REPEATS = 3


def measure(tenants: int, models: int, every_option: bool = False) -> dict[str, Any]:
    """The median of REPEATS fresh processes: a plan of a second is at the mercy of a busy machine."""
    argv = [sys.executable, "-m", "benchmarks.plan_scaling", "--one", str(tenants), str(models)]
    runs = [json.loads(subprocess.run(argv + (["--every-option"] if every_option else []), check=True,
                                      capture_output=True, text=True).stdout.strip().splitlines()[-1])
            for _ in range(REPEATS)]
    return sorted(runs, key=lambda r: r["seconds"])[REPEATS // 2]


def grid() -> None:
    from rich.console import Console
    from rich.table import Table

    series = {"tenants": [(t, 1) for t in TENANT_GRID], "models": [(1, m) for m in MODEL_GRID],
              "both": [(1, 1), (max(TENANT_GRID), max(MODEL_GRID))]}
    table = Table(title="offline plan scaling (time excludes imports; each case a fresh process; both option sets "
                        "in one run)")
    for col in ("options", "series", "tenants", "models", "resources", "seconds", "peak MB",
                "ms per added resource", "vs first step"):
        table.add_column(col, justify="right")
    for every_option in (False, True):
        measured: dict[tuple[int, int], dict[str, Any]] = {}
        for name, cases in series.items():
            first = None
            previous = None
            for case in cases:
                r = measured.get(case) or measure(*case, every_option)
                measured[case] = r
                marginal = ratio = ""
                if previous is not None:
                    ms = 1000 * (r["seconds"] - previous["seconds"]) / (r["resources"] - previous["resources"])
                    first = first or ms
                    marginal, ratio = f"{ms:.2f}", f"{ms / first:.2f}x"
                table.add_row("all" if every_option else "default", name, str(r["tenants"]), str(r["models"]),
                              str(r["resources"]), f"{r['seconds']:.2f}", f"{r['peak_mb']:.0f}", marginal, ratio)
                previous = r
    Console(width=150).print(table)
    print("Linear growth: each step's milliseconds per added resource stays near the series' first step (1x).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", nargs=2, type=int, metavar=("TENANTS", "MODELS"))
    parser.add_argument("--every-option", action="store_true")
    args = parser.parse_args()
    if args.one:
        tenants, models = args.one
        print(json.dumps(run_one(tenants, models, args.every_option)))
    else:
        grid()


if __name__ == "__main__":
    main()
