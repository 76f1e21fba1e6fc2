"""vLLM's server: the metrics it exports, how it stops, its health route and middleware, where it
writes."""

from __future__ import annotations

import json
import re

from ...components.vllm_versions import release
from ..plan import Plan
from .base import Contract, _env, _exported, _flag, _vllm_containers, _writable_mounts


def vllm_exports_what_monitoring_reads(plan: Plan) -> list[str]:
    obs = plan.platform.observability
    if obs is None:
        return []
    text = json.dumps([obs.dashboard_definition, obs.alert_definitions])
    read = set(re.findall(r"(vllm:[a-z0-9_:]+)", text))
    exported = _exported(plan)
    # prometheus_client exposes a counter `x` as `x_total`, a histogram as `x_bucket`/`_sum`/`_count`.
    base = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in read}
    return [f"the dashboard or an alert reads {m}, which vLLM {plan.config.vllm_version} does not export"
            for m in sorted(base - exported)]


def vllm_drains_on_stop(plan: Plan) -> list[str]:
    rel = release(plan.config.vllm_version)
    if not rel.shutdown_timeout_flag:
        return []
    timeout = plan.config.gateway.request_timeout_seconds
    out = []
    for name, c in _vllm_containers(plan):
        value = _flag(c["args"], rel.shutdown_timeout_flag)
        if value is None or int(value) < timeout:
            out.append(f"{name}: {rel.shutdown_timeout_flag} {value or 0}: vLLM aborts what it is generating on SIGTERM")
    return out


def vllm_health_and_guard(plan: Plan) -> list[str]:
    out = []
    for name, c in _vllm_containers(plan):
        if _flag(c["args"], "--middleware") != "vllm_gke_guard.GuardMiddleware":
            out.append(f"{name}: the guard is not loaded as vLLM middleware")
        for probe in ("readinessProbe", "livenessProbe"):
            if (c.get(probe) or {}).get("httpGet", {}).get("path") != "/health":
                out.append(f"{name}: {probe} is not vLLM's /health")
    return out


def vllm_writes_only_to_volumes(plan: Plan) -> list[str]:
    out = []
    for name, c in _vllm_containers(plan):
        env = _env(c)
        mounts = _writable_mounts(c)
        if not (c.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            continue
        home = env.get("HOME")
        if home not in mounts or "/tmp" not in mounts:
            out.append(f"{name}: HOME ({home}) and /tmp must be writable volumes: vLLM caches under ~/.cache/vllm")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("vLLM", "0.34.0",
             "exports vllm:num_requests_running/waiting, vllm:kv_cache_usage_perc, vllm:time_to_first_token_seconds "
             "and the other series the dashboard and alerts read (names in the release's snapshot)",
             "vllm-project/vllm@v0.34.0:vllm/v1/metrics/loggers.py:499-975 (images/vllm-versions/0.34.0.json)",
             "every vllm: series the dashboard and the alert policies query is one the release exports",
             vllm_exports_what_monitoring_reads),
    Contract("vLLM", "0.34.0",
             "--shutdown-timeout defaults to 0: on SIGTERM the engine aborts unfinished requests; > 0 drains",
             "vllm-project/vllm@v0.34.0:vllm/engine/arg_utils.py:1971-1976; vllm/v1/engine/core.py:1886-1905",
             "--shutdown-timeout = the gateway's request timeout (grace period and LB draining cover it)",
             vllm_drains_on_stop),
    Contract("vLLM", "0.34.0",
             "--middleware classes wrap the app; /health answers 200, or 503 once the engine is dead",
             "vllm-project/vllm@v0.34.0:vllm/entrypoints/serve/middleware/register.py:65-69; "
             "vllm/entrypoints/serve/instrumentator/health.py:22-35",
             "the guard is loaded as middleware; readiness and liveness probe /health",
             vllm_health_and_guard),
    Contract("vLLM", "0.34.0",
             "caches under ~/.cache/vllm (VLLM_CACHE_ROOT, or XDG_CACHE_HOME) and torch/Triton compile caches "
             "under HOME and /tmp",
             "vllm-project/vllm@v0.34.0:vllm/envs.py:361-366,756-762",
             "HOME and /tmp are writable emptyDirs under a read-only root filesystem",
             vllm_writes_only_to_volumes),
)
