"""The load-test Job's program: kubernetes-sigs/inference-perf 0.7.0's own CLI, run once per phase
of the declared workload, with what a tenant's route needs, then a verdict against the SLOs.

Runs in inference-perf's image (Python 3.12; this file only needs the standard library, requests
and inference_perf). Its inputs, from the ConfigMap the LoadTest component writes:
  LOADTEST_PLAN   the phases (inference-perf configs), the SLO thresholds, the pool's dollars an hour
  LOADTEST_AUTH_DIR  where the tenant's bearer token is, as the file `token` (a mounted Secret)
What upstream lacks, and this adds in process, the tool unmodified:
  - the token goes only into the HTTP client (as its api_key, sent as Authorization: Bearer;
    inference_perf/client/modelserver/openai_client.py:467-473): upstream takes it only in the
    config or argv, and then logs it (config/config.py:136) and writes it into the config.yaml
    report (reportgen/base.py:939-946);
  - GET /v1/models (its model and adapter checks) carries the token too: upstream sends no headers
    (openai_client.py:185-196), which a tenant route refuses;
  - the exit status says whether the test passed: upstream exits 0 even when every request failed
    (main.py:409-460). 0: within max failure ratio and SLOs; 1: too many failures or none
    succeeded; 3: the SLOs missed; 2: a phase produced no summary.
The verdict (TTFT and inter-token latency p50/p99, tokens/s, dollars per million tokens) is
printed and written to <reports>/verdict.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional

EXIT_FAILURES, EXIT_NO_SUMMARY, EXIT_SLO = 1, 2, 3


def _patch(token: Optional[str], kept: list[Any]) -> Any:
    """inference-perf with the token in its client alone, sent on every call, and its reports kept."""
    import requests
    from inference_perf import main as ip_main  # type: ignore[import-not-found]  # pyright: ignore[reportMissingImports]
    from inference_perf.client.modelserver import (  # type: ignore[import-not-found]  # pyright: ignore[reportMissingImports]
        openai_client,
        vLLMModelServerClient,
    )

    original_init = vLLMModelServerClient.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if token:
            kwargs["api_key"] = token  # main.py passes api_key by keyword
        original_init(self, *args, **kwargs)

    def supported_models(self: Any) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        headers.update(self.api_config.headers or {})
        try:
            response = requests.get(f"{self.uri}/v1/models", headers=headers, timeout=30)
            response.raise_for_status()
            data = response.json().get("data")
            return data if isinstance(data, list) else []
        except Exception as exc:  # as upstream: logged, then "no models"
            openai_client.logger.error(f"Got exception retrieving supported models {exc}")
            return []

    original_save = ip_main.InferencePerfRunner.save_reports

    def save_reports(self: Any, reports: list[Any]) -> None:  # main.py calls it with reports=
        kept.extend(reports)
        original_save(self, reports=reports)

    vLLMModelServerClient.__init__ = init
    openai_client.openAIModelServerClient.get_supported_models = supported_models
    ip_main.InferencePerfRunner.save_reports = save_reports
    return ip_main


def _percentile(metric: dict[str, Any], name: str) -> Optional[float]:
    value = metric.get(name)
    return float(value) if isinstance(value, (int, float)) else None


def phase_verdict(name: str, summary: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """One phase's numbers and whether they hold the SLOs, from inference-perf's summary report."""
    ok = int((summary.get("successes") or {}).get("count") or 0)
    failed = int((summary.get("failures") or {}).get("count") or 0)
    latency = (summary.get("successes") or {}).get("latency") or {}
    throughput = (summary.get("successes") or {}).get("throughput") or {}
    ttft, itl = latency.get("time_to_first_token") or {}, latency.get("inter_token_latency") or {}
    out_tps = float(throughput.get("output_tokens_per_sec") or 0.0)
    total_tps = float(throughput.get("total_tokens_per_sec") or 0.0)
    dollars_hour = plan.get("dollarsPerHour")
    verdict = {
        "phase": name, "requests": ok + failed, "successes": ok, "failures": failed,
        "failureRatio": failed / (ok + failed) if ok + failed else 1.0,
        "ttftP50": _percentile(ttft, "median"), "ttftP99": _percentile(ttft, "p99"),
        "itlP50": _percentile(itl, "median"), "itlP99": _percentile(itl, "p99"),
        "outputTokensPerSecond": out_tps, "totalTokensPerSecond": total_tps,
        # The pools' baseline cost over what they made in this test: an upper bound where the
        # test did not fill them.
        "dollarsPerMillionOutputTokens": float(dollars_hour) / (out_tps * 3600) * 1e6
        if out_tps and dollars_hour is not None else None,
    }
    # The SLO is a share of requests under ttftSloSeconds: the percentile of that share holds it.
    key = str(plan.get("ttftPercentile") or "p99")
    at_slo = _percentile(ttft, key)
    verdict["ttftPercentile"], verdict["ttftAtSlo"] = key, at_slo
    verdict["ttftSloSeconds"] = plan["ttftSloSeconds"]
    verdict["ttftHeld"] = at_slo is not None and at_slo <= float(plan["ttftSloSeconds"])
    return verdict


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}s"


def report(verdicts: list[dict[str, Any]]) -> None:
    print("=== LOAD TEST VERDICT ===")
    for v in verdicts:
        cost = v["dollarsPerMillionOutputTokens"]
        print(f"{v['phase']}: {v['successes']}/{v['requests']} ok (failure ratio {v['failureRatio']:.3f}); "
              f"TTFT p50 {_seconds(v['ttftP50'])} p99 {_seconds(v['ttftP99'])} "
              f"(SLO: {v['ttftPercentile']} {_seconds(v['ttftAtSlo'])} within {v['ttftSloSeconds']:g}s, "
              f"{'held' if v['ttftHeld'] else 'MISSED'}); "
              f"ITL p50 {_seconds(v['itlP50'])} p99 {_seconds(v['itlP99'])}; "
              f"{v['outputTokensPerSecond']:.1f} output tokens/s; "
              f"{'-' if cost is None else f'${cost:.2f}'} per million output tokens at the pools' baseline cost")


def main(argv: list[str]) -> int:
    plan = json.loads(open(os.environ["LOADTEST_PLAN"]).read())
    auth = os.environ.get("LOADTEST_AUTH_DIR")
    token = open(os.path.join(auth, "token")).read().strip() if auth else None
    reports: list[Any] = []
    ip_main = _patch(token, reports)
    verdicts = []
    for phase in plan["phases"]:
        reports.clear()
        sys.argv = ["inference-perf", "--config_file", phase["configFile"], *argv]
        try:
            ip_main.main_cli()
        except SystemExit as exc:  # its argument parser or a failed start
            if exc.code not in (0, None):
                print(f"load test: phase {phase['name']}: inference-perf exited {exc.code}", file=sys.stderr)
                return EXIT_FAILURES
        summary = next((r.contents for r in reports if r.name == "summary_lifecycle_metrics"), None)
        if summary is None:
            print(f"load test: phase {phase['name']}: no summary report", file=sys.stderr)
            return EXIT_NO_SUMMARY
        verdicts.append(phase_verdict(phase["name"], summary, plan))
    report(verdicts)
    with open(os.path.join(plan["reportsDir"], "verdict.json"), "w") as f:
        json.dump(verdicts, f, indent=1)
    if any(v["successes"] == 0 or v["failureRatio"] > float(plan["maxFailureRatio"]) for v in verdicts):
        return EXIT_FAILURES
    return 0 if all(v["ttftHeld"] for v in verdicts) else EXIT_SLO


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
