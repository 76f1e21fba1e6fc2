"""inference-perf, the load tests' tool: how it builds URLs, treats credentials and reports failure."""

from __future__ import annotations

import json
from typing import Any

import yaml

from ...components.load_test import PROGRAM
from ...components.model.specs.operations import INFERENCE_PERF_VERSION
from ..plan import Plan
from .base import Contract, _docs


def _load_tests(plan: Plan) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each load test's CronJob and its ConfigMap."""
    maps = {(m["metadata"]["namespace"], m["metadata"]["name"]): m for m in _docs(plan, "ConfigMap")}
    return [(c, maps[(c["metadata"]["namespace"], c["metadata"]["name"])]) for c in _docs(plan, "CronJob")
            if (c["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "vllm-gke-loadtest"]


def inference_perf_runs_as_the_tenant(plan: Plan) -> list[str]:
    out = []
    for cron, cm in _load_tests(plan):
        name = cron["metadata"]["name"]
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        if c["command"][-1].rsplit("/", 1)[-1] != PROGRAM:
            out.append(f"{name}: inference-perf runs bare: it exits 0 with every request failed and sends no "
                       "token on /v1/models; run it through the platform's program")
        cpus = int(c["resources"]["limits"]["cpu"])
        mounts = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
        if "/dev/shm" not in mounts:
            out.append(f"{name}: its worker processes need a writable /dev/shm")
        if not (pod.get("securityContext") or {}).get("runAsUser"):
            out.append(f"{name}: the image has no USER (root): the pod must name one")
        for file, text in cm["data"].items():
            if not file.endswith(".yaml"):
                continue
            config = yaml.safe_load(text)
            server = config["server"]
            base = str(server.get("base_url", ""))
            if base.endswith("/") or base.endswith("/v1"):
                out.append(f"{name} {file}: base_url {base}: the client appends /v1/completions to it as given")
            if not server.get("model_name"):
                out.append(f"{name} {file}: no model_name: the tool would ask /v1/models, which the route refuses")
            if "api_key" in server:
                out.append(f"{name} {file}: api_key in the config: inference-perf logs it and writes it to its reports")
            workers = config["load"].get("num_workers")
            if workers is None or workers > cpus:
                out.append(f"{name} {file}: num_workers {workers}: the default is the node's CPU count, "
                           f"not the pod's {cpus}")
            split = config["load"].get("lora_traffic_split")
            if split is not None and sum(s["split"] for s in split) != 1.0:
                out.append(f"{name} {file}: the LoRA shares sum to {sum(s['split'] for s in split)}, not exactly 1.0")
            path = str(((config.get("storage") or {}).get("local_storage") or {}).get("path", ""))
            if not any(path.startswith(m + "/") for m in mounts):
                out.append(f"{name} {file}: reports go to {path or 'a relative directory'}, not a writable volume")
    return out


def inference_perf_reports_the_verdicts_percentiles(plan: Plan) -> list[str]:
    out = []
    for cron, cm in _load_tests(plan):
        name = cron["metadata"]["name"]
        wanted = {50.0, 99.0, float(str(json.loads(cm["data"]["plan.json"])["ttftPercentile"]).lstrip("p"))}
        for file, text in cm["data"].items():
            if not file.endswith(".yaml"):
                continue
            asked = ((yaml.safe_load(text).get("report") or {}).get("request_lifecycle") or {}).get("percentiles")
            if asked is None:
                out.append(f"{name} {file}: no report.request_lifecycle.percentiles: the verdict would read "
                           "whatever the tool's default list holds")
            elif missing := sorted(wanted - {float(p) for p in asked}):
                out.append(f"{name} {file}: the summary would have no {', '.join(f'p{p:g}' for p in missing)}, "
                           "which the verdict reads")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("inference-perf", INFERENCE_PERF_VERSION,
             "appends /v1/completions (or /v1/chat/completions) to server.base_url as given; asks GET /v1/models "
             "without headers when model_name is unset or adapters are split; logs server.api_key and writes it "
             "into its config.yaml report; exits 0 even when every request failed; num_workers defaults to the "
             "node's CPU count; LoRA shares must sum to exactly 1.0; its image has no USER; it writes only the "
             "report directory (workers share /dev/shm)",
             "kubernetes-sigs/inference-perf@v0.7.0:inference_perf/client/modelserver/openai_client.py:119-196,"
             "467-473,548; inference_perf/config/config.py:100-136; inference_perf/reportgen/base.py:939-946; "
             "inference_perf/main.py:409-460; inference_perf/config/loadgen/config.py:157-160,256-260; Dockerfile",
             "configs name the model and the tenant's base URL without /v1, hold no key (the program puts the "
             "tenant's token in the client alone, sends it on /v1/models, and fails the Job on failures), set "
             "num_workers to the pod's CPUs and shares that sum to 1.0; the pod runs as 65532 with /dev/shm and "
             "/reports on emptyDirs",
             inference_perf_runs_as_the_tenant),
    Contract("inference-perf", INFERENCE_PERF_VERSION,
             "reports each latency at the percentiles of report.request_lifecycle.percentiles (a default list "
             "when unset), named 'median' for 50 and 'p<n>' otherwise",
             "kubernetes-sigs/inference-perf@7de5ef2 (the newest source reachable here, before v0.7.0's tag):"
             "inference_perf/config/reportgen/config.py:28-30; inference_perf/reportgen/base.py:168-179",
             "every phase's config names the percentiles the verdict reads: p50, p99 and the TTFT objective's",
             inference_perf_reports_the_verdicts_percentiles),
)
