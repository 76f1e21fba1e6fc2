"""vLLM's server: the metrics it exports, how it stops, its health route and middleware, where it
writes."""

from __future__ import annotations

import json
import re

from ...components.model.specs.models import MODALITY_ADAPTER_NAMES, normalise_flag
from ...components.model.vllm_argv import load_snapshot
from ...components.model.vllm_versions import TTFT_BUCKETS, release
from ..plan import Plan
from .base import Contract, _env, _exported, _flag, _guard_configs, _vllm_containers, _writable_mounts

# The series the guard's overload check reads from vLLM's registry in its own process.
QUEUE_SERIES = ("vllm:num_requests_waiting", "vllm:time_to_first_token_seconds")


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


def vllm_ttft_buckets_cut_at_the_slo(plan: Plan) -> list[str]:
    """With SLOs on, every server's TTFT histogram has a bucket bound at the objective's threshold:
    Cloud Monitoring's distribution cut counts good requests only up to a bound."""
    if not plan.config.monitoring.slos.enabled:
        return []
    slo = plan.config.monitoring.ttft_slo_seconds
    flag = release(plan.config.vllm_version).histogram_buckets_flag
    out = []
    for name, c in _vllm_containers(plan):
        value = _flag(c["args"], flag) if flag else None
        bounds: list[float] = list(TTFT_BUCKETS)
        if value is not None:
            families = json.loads(value)
            bounds = families.get("time_to_first_token") or bounds
            if set(families) - {"time_to_first_token"}:
                out.append(f"{name}: {flag} names families other than time_to_first_token: {sorted(families)}")
            if any(b <= 0 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
                out.append(f"{name}: {flag} bounds must be positive and strictly increasing (vLLM refuses to start)")
        if flag and slo not in bounds:
            out.append(f"{name}: no TTFT bucket bound at the {slo:g}s objective: the SLO cannot count it exactly")
    return out


def guard_reads_queue_series_vllm_exports(plan: Plan) -> list[str]:
    """The overload check reads the queue from vLLM's own registry: the series must exist there,
    and one API server process must hold both (more API servers export through a shared directory
    and the engine's loggers live elsewhere)."""
    exported = _exported(plan)
    out = []
    for name, cfg in _guard_configs(plan):
        if not cfg.get("overload"):
            continue
        out += [f"{name}: the guard sheds on {m}, which vLLM {plan.config.vllm_version} does not export"
                for m in QUEUE_SERIES if m not in exported]
    flags = load_snapshot(plan.config.vllm_version)["flags"]
    for name, c in _vllm_containers(plan):
        args = [str(a) for a in c["args"]]
        for i, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            spec = flags.get(normalise_flag(flag) if flag.startswith("--") else flag) or {}
            if spec.get("dest") in ("api_server_count", "data_parallel_size"):
                value = value or (args[i + 1] if i + 1 < len(args) else "")
                if value != "1":
                    out.append(f"{name}: {flag} {value}: several API servers; the guard in each would not see "
                               "the engine's whole queue")
    return out


def vllm_usage_reaches_the_guard(plan: Plan) -> list[str]:
    """Tokens per tenant come from the request's state, which only in-process middleware shares."""
    return [f"{name}: the guard is not vLLM middleware: it cannot read vLLM's final usage of a request"
            for name, c in _vllm_containers(plan) if _flag(c["args"], "--middleware") != "vllm_gke_guard.GuardMiddleware"]


def vllm_applies_no_adapter_by_itself(plan: Plan) -> list[str]:
    """A LoRA named like a chat content part's type serves every chat request with such a part."""
    out = []
    for name, c in _vllm_containers(plan):
        args = [str(a) for a in c["args"]]
        start = args.index("--lora-modules") + 1 if "--lora-modules" in args else len(args)
        for module in args[start:]:
            if module.startswith("--"):
                break
            if (adapter := module.split("=", 1)[0]) in MODALITY_ADAPTER_NAMES:
                out.append(f"{name}: adapter '{adapter}' is a content part type: vLLM would apply it to every chat "
                           "request with such a part, whatever its model")
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
    Contract("vLLM", "0.34.0",
             "--custom-histogram-buckets takes JSON {family: bounds} and refuses an unknown family or bounds "
             "not positive and strictly increasing; time_to_first_token replaces vllm:time_to_first_token_seconds' "
             "default buckets",
             "vllm-project/vllm@v0.34.0:vllm/config/observability.py:72-82,161-210; vllm/v1/metrics/buckets.py:17,57-80,206",
             "with SLOs on, every server's TTFT buckets are the defaults plus monitoring.ttftSloSeconds, so the "
             "SLO's distribution cut counts requests under the threshold exactly",
             vllm_ttft_buckets_cut_at_the_slo),
    Contract("vLLM", "0.34.0",
             "exports vllm:num_requests_waiting (gauge, set each step) and vllm:time_to_first_token_seconds "
             "(histogram, observed as each request's first token comes, so its count is the requests that left "
             "the queue) to the prometheus_client registry of the API server process; "
             "vllm:request_queue_time_seconds is observed only when a request finishes",
             "vllm-project/vllm@v0.34.0:vllm/v1/metrics/loggers.py:537-543,930-938,1284-1285,1289-1298",
             "the guard's overload check reads the gauge and the count in-process (Little's law); servers run "
             "one API server process",
             guard_reads_queue_series_vllm_exports),
    Contract("vLLM", "0.34.0",
             "chat and completions handlers leave the request's final usage (prompt and completion tokens, "
             "streamed or not) on request.state.request_metadata.final_usage_info",
             "vllm-project/vllm@v0.34.0:vllm/entrypoints/openai/chat_completion/serving.py:928,1130; "
             "vllm/entrypoints/openai/completion/serving.py:618,745",
             "the guard runs as --middleware in the same app and counts those tokens per tenant after the handler returns",
             vllm_usage_reaches_the_guard),
    Contract("vLLM", "0.34.0",
             "a chat request whose messages hold a content part of type T is served by the loaded LoRA named T's "
             "modality (input_ removed, else T up to its first '_') when exactly one matches, whatever its model; "
             "the part types its request model keeps give text, image, audio, video, file, refusal, prompt, "
             "thinking, tool",
             "vllm-project/vllm@v0.34.0:vllm/entrypoints/serve/engine/serving.py:144-211; "
             "vllm/entrypoints/openai/chat_completion/serving.py:329; vllm/renderers/chat_utils/types.py:264-281",
             "adapters[].name may not be one of them (MODALITY_ADAPTER_NAMES, exit 2 naming the key), so every "
             "adapter serves only the tenants whose `model` names it",
             vllm_applies_no_adapter_by_itself),
)
