"""What a Flagger MetricTemplate's PromQL query reads, as far as the rollout policies judge a gate by
it (its name says nothing Flagger acts on): which series, of which workload, at which quantile.

A query is read, not evaluated: its series selectors (`name{label op "value", ...}`, whose quoted
values may hold Flagger's `{{ target }}`), and whether it is one histogram_quantile call and nothing
else. Only the standard library: the pack must stay light.
"""

from __future__ import annotations

import re
from typing import Optional

# vLLM's time-to-first-token histogram, and the guard's per-tenant request counter with its
# `outcome` label (images/vllm_gke_guard/metrics.py).
TTFT_BUCKETS = "vllm:time_to_first_token_seconds_bucket"
TENANT_REQUESTS = "vllm_gke_tenant_requests_total"
# The series label the PodMonitoring copies the pod's workload onto (components/model/rollouts.py
# WORKLOAD_SERIES_LABEL), and its value on the canary's series as Flagger renders it: the target
# Deployment's name (the primary's series carry `{{ target }}-primary`).
WORKLOAD = "workload"
CANARY = "{{ target }}"

_STRING = r'"(?:[^"\\]|\\.)*"'
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{((?:[^{}\"]|" + _STRING + r")*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(" + _STRING + ")")
_QUANTILE = re.compile(r"histogram_quantile\s*\(\s*([0-9.eE+-]+)\s*,")

Matchers = dict[str, tuple[str, str]]


def selectors(query: str) -> list[tuple[str, Matchers]]:
    """Each series selector in the query, in order: its metric name and {label: (op, value)}."""
    out: list[tuple[str, Matchers]] = []
    for name, body in _SELECTOR.findall(query):
        out.append((name, {k: (op, v[1:-1]) for k, op, v in _MATCHER.findall(body)}))
    return out


def of_canary(matchers: Matchers) -> bool:
    return matchers.get(WORKLOAD) == ("=", CANARY)


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis closing the one at `opening` (quoted strings skipped), or -1."""
    depth, i = 0, opening
    while i < len(text):
        if text[i] == '"':
            string = re.compile(_STRING).match(text, i)
            i = string.end() if string else len(text)
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
        i += 1
    return -1


def ttft_quantile(query: str) -> Optional[float]:
    """The quantile (histogram_quantile's first argument) of a query that is the canary's own time to
    first token and nothing else: one histogram_quantile over vLLM's TTFT histogram of the
    `{{ target }}` workload, not divided by the primary's nor scaled. None for any other query."""
    text = query.strip()
    head = _QUANTILE.match(text)
    if head is None or _closing(text, text.index("(")) != len(text) - 1:
        return None
    series = selectors(text)
    if len(series) != 1 or series[0][0] != TTFT_BUCKETS or not of_canary(series[0][1]):
        return None
    try:
        return float(head.group(1))
    except ValueError:
        return None


def _outcomes(matchers: Matchers, *outcomes: str) -> Optional[tuple[bool, ...]]:
    """Whether the selector's `outcome` matcher takes each of these outcomes (None: none to read)."""
    op, value = matchers.get("outcome", ("", ""))
    if op not in ("=", "=~"):
        return None
    try:
        pattern = re.compile(re.escape(value) if op == "=" else value)
    except re.error:
        return None
    return tuple(pattern.fullmatch(o) is not None for o in outcomes)


def canary_error_share(query: str) -> bool:
    """Whether the query leads with the canary's share of server errors: the guard's count of the
    `{{ target }}` workload's `error` outcomes over its answered ones (`ok` and `error`), less the
    primary's share where it compares."""
    series = selectors(query)
    if len(series) < 2 or any(name != TENANT_REQUESTS or not of_canary(m) for name, m in series[:2]):
        return False
    return _outcomes(series[0][1], "error", "ok") == (True, False) and _outcomes(series[1][1], "error", "ok") == (True, True)
