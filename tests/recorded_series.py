"""Recorded series for a canary's analysis: what Google Managed Prometheus would hold for a pool's
primary and canary pods, written as OpenMetrics text with timestamps and backfilled into a real
Prometheus TSDB (`promtool tsdb create-blocks-from openmetrics`), then served by a real
`prometheus` whose query API the analysis reads.

The series are vLLM 0.34.0's TTFT and inter-token-latency histograms (its bucket bounds) and the
guard's per-tenant request counter (its outcomes ok, error, refused), one sample each scrape of the
PodMonitoring's interval, labelled as GMP v0.17.2's collector labels a pod's series under the pool's
PodMonitoring (`gmp_target_labels`: the pods are read from the cluster, so the `workload` label each
revision carries is the one its pod really has; the cluster's project, location and name the plan's).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable, Optional

# vLLM 0.34.0, vllm/v1/metrics/buckets.py TIME_TO_FIRST_TOKEN_BUCKETS and INTER_TOKEN_LATENCY_BUCKETS,
# which vllm/v1/metrics/loggers.py:831-835 hands vllm:time_to_first_token_seconds and
# vllm:inter_token_latency_seconds (no custom_histogram_buckets set).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
TTFT, ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
# images/vllm_gke_guard/metrics.py: TENANT_REQUESTS and its four outcomes, each created at zero.
TENANT_REQUESTS, OUTCOMES = "vllm_gke_tenant_requests", ("ok", "refused", "error", "shed")
# Tokens a request streams: inter-token latencies observed per request.
TOKENS_PER_REQUEST = 40


@dataclass(frozen=True)
class Lognormal:
    """A latency distribution: its median and the spread of its logarithm."""

    median: float
    sigma: float

    def cdf(self, x: float) -> float:
        return 0.5 * (1 + math.erf((math.log(x) - math.log(self.median)) / (self.sigma * math.sqrt(2))))

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)


@dataclass(frozen=True)
class Serving:
    """How a revision serves: time to first token, inter-token latency, the share of the requests it
    answers that fail (a 5xx or no answer), the share of all requests it refuses (a 4xx before any
    token: an adapter it lost), and the share of its pod's request rate it gets (0: no traffic at all)."""

    ttft: Lognormal = Lognormal(0.3, 0.6)
    itl: Lognormal = Lognormal(0.03, 0.35)
    errors: float = 0.001
    refused: float = 0.0
    traffic: float = 1.0


@dataclass(frozen=True)
class PodRecording:
    """One pod's series: its target labels, requests a second, from when to when (unix seconds), and
    how it serves."""

    labels: dict[str, str]
    rate: float
    start: int
    end: int
    serving: Serving


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _Counters:
    """A pod's cumulative counts as floats, rounded when written (counts stay monotone)."""

    def __init__(self, tenants: tuple[str, ...]):
        self.buckets = {TTFT: [0.0] * (len(TTFT_BUCKETS) + 1), ITL: [0.0] * (len(ITL_BUCKETS) + 1)}
        self.sums = {TTFT: 0.0, ITL: 0.0}
        self.requests = {(t, o): 0.0 for t in tenants for o in OUTCOMES}

    def observe(self, s: Serving, requests: float, tenants: tuple[str, ...]) -> None:
        answered = requests * (1 - s.refused)  # a refused request never reaches a first token
        for name, dist, bounds, n in ((TTFT, s.ttft, TTFT_BUCKETS, answered),
                                      (ITL, s.itl, ITL_BUCKETS, answered * TOKENS_PER_REQUEST)):
            for i, b in enumerate(bounds):
                self.buckets[name][i] += n * dist.cdf(b)
            self.buckets[name][-1] += n
            self.sums[name] += n * dist.mean
        for t in tenants:
            self.requests[(t, "refused")] += (requests - answered) / len(tenants)
            self.requests[(t, "error")] += answered * s.errors / len(tenants)
            self.requests[(t, "ok")] += answered * (1 - s.errors) / len(tenants)


def openmetrics(pods: Iterable[PodRecording], tenants: tuple[str, ...], model: str, scrape_seconds: int) -> str:
    """The pods' series, one sample each scrape (every `scrape_seconds`: the PodMonitoring's interval),
    as OpenMetrics text (one family at a time)."""
    families: dict[str, list[str]] = {TTFT: [], ITL: [], TENANT_REQUESTS: []}
    for pod in pods:
        counts = _Counters(tenants)
        vllm_labels = {**pod.labels, "model_name": model, "engine": "0"}
        for t in range(pod.start, pod.end + 1, scrape_seconds):
            if t > pod.start:
                counts.observe(pod.serving, pod.rate * pod.serving.traffic * scrape_seconds, tenants)
            for name, bounds in ((TTFT, TTFT_BUCKETS), (ITL, ITL_BUCKETS)):
                cum = counts.buckets[name]
                for b, c in zip((*bounds, math.inf), cum):
                    families[name].append(f"{name}_bucket{{{_labels({**vllm_labels, 'le': _le(b)})}}} {round(c)} {t}")
                families[name].append(f"{name}_count{{{_labels(vllm_labels)}}} {round(cum[-1])} {t}")
                families[name].append(f"{name}_sum{{{_labels(vllm_labels)}}} {counts.sums[name]:.6f} {t}")
            for (tenant, outcome), c in counts.requests.items():
                lab = {**pod.labels, "tenant": tenant, "model": model, "outcome": outcome}
                families[TENANT_REQUESTS].append(f"{TENANT_REQUESTS}_total{{{_labels(lab)}}} {round(c)} {t}")
    kinds = {TTFT: "histogram", ITL: "histogram", TENANT_REQUESTS: "counter"}
    return "".join(f"# TYPE {name} {kinds[name]}\n" + "".join(s + "\n" for s in lines)
                   for name, lines in families.items() if lines)


def gauge_openmetrics(name: str, samples: Iterable[tuple[dict[str, str], int, float]]) -> str:
    """One gauge family from (labels, unix seconds, value) samples."""
    return f"# TYPE {name} gauge\n" + "".join(f"{name}{{{_labels(lab)}}} {v:g} {t}\n" for lab, t, v in samples)


# --- GMP's labels -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GmpCluster:
    """The target labels GMP forces on every series (pod_config.go:120-136): the cluster's project,
    location and name (the gates' queries select its `cluster`)."""

    project_id: str
    location: str
    cluster: str


def _controller(pod: dict[str, Any]) -> tuple[str, str]:
    """top_level_controller_name/type (pod_config.go:66-114): a ReplicaSet's pod with a template
    hash belongs to the Deployment named as the ReplicaSet less its hash."""
    owner = next((o for o in pod["metadata"].get("ownerReferences", []) if o.get("controller")), None)
    if owner is None:
        return "", ""
    if owner["kind"] == "ReplicaSet" and "pod-template-hash" in pod["metadata"].get("labels", {}):
        return owner["name"].rsplit("-", 1)[0], "Deployment"
    return owner["name"], owner["kind"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if selector.get("matchExpressions"):
        raise NotImplementedError("a PodMonitoring selector with matchExpressions is not emulated")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def gmp_target_labels(pm: dict[str, Any], pod: dict[str, Any], gmp: GmpCluster) -> Optional[dict[str, str]]:
    """The target labels GMP v0.17.2's collector gives a pod's series under a PodMonitoring as the API
    server stored it (its CRD defaults targetLabels.metadata), or None where it scrapes no such target
    (pkg/operator/apis/monitoring/v1/pod_config.go: PodMonitoring.ScrapeConfigs, endpointScrapeConfig,
    relabelingsForMetadata, labelMappingRelabelConfigs)."""
    spec, meta = pm["spec"], pod["metadata"]
    labels = meta.get("labels", {})
    (endpoint,) = spec["endpoints"]  # one endpoint: more are not emulated (and unpacking says so)
    port = endpoint["port"]
    container = next((c["name"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == port), None)
    if (meta["namespace"] != pm["metadata"]["namespace"] or not _selects(spec["selector"], labels)
            or pod.get("status", {}).get("phase") in ("Failed", "Succeeded") or container is None):
        return None
    out = {"project_id": gmp.project_id, "location": gmp.location, "cluster": gmp.cluster}
    controller, kind = _controller(pod)
    metadata = {"pod": meta["name"], "container": container, "node": pod["spec"].get("nodeName", ""),
                "top_level_controller_name": controller, "top_level_controller_type": kind}
    for key in (spec.get("targetLabels") or {}).get("metadata") or ():
        out[key] = metadata[key]
    out.update(namespace=meta["namespace"], job=pm["metadata"]["name"], instance=f"{meta['name']}:{port}")
    for m in (spec.get("targetLabels") or {}).get("fromPod") or ():
        if labels.get(m["from"]):  # a relabel from an absent label writes "", which drops it
            out[m.get("to") or m["from"]] = labels[m["from"]]
    return out


def with_metric_labels(target: dict[str, str], metric: dict[str, str]) -> dict[str, str]:
    """A series' labels: the target's, and the metric's own, those that collide renamed exported_<name>
    (honor_labels false: GMP's scrape configs never set it; Prometheus scrape.go mutateSampleLabels)."""
    out = dict(target)
    for k, v in metric.items():
        out[f"exported_{k}" if k in target else k] = v
    return out


# --- a real Prometheus on the backfilled TSDB ---------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordedPrometheus:
    """`prometheus` on a TSDB made by `promtool tsdb create-blocks-from openmetrics`: blocks are
    added while it is stopped (it loads them when it starts), queried at a given time."""

    def __init__(self, prometheus: str, promtool: str):
        self.prometheus, self.promtool = prometheus, promtool
        self.dir = Path(tempfile.mkdtemp(prefix="recorded-prom-"))
        (self.dir / "data").mkdir()
        (self.dir / "prometheus.yml").write_text("global: {}\n")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.url = ""
        self.files = 0

    def backfill(self, text: str) -> None:
        assert self.proc is None, "blocks are added while Prometheus is stopped"
        self.files += 1
        src = self.dir / f"series-{self.files}.om"
        src.write_text(text + "# EOF\n")
        done = subprocess.run([self.promtool, "tsdb", "create-blocks-from", "openmetrics", str(src),
                               str(self.dir / "data")], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise AssertionError(f"promtool create-blocks-from openmetrics: {done.stderr or done.stdout}")

    def start(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.dir / "prometheus.log", "ab")
        # Retention far beyond the recording, so no loaded block is deleted as old.
        self.proc = subprocess.Popen([self.prometheus, f"--config.file={self.dir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.dir / 'data'}", "--storage.tsdb.retention.time=100y",
                                      f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus not ready: {(self.dir / 'prometheus.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query's vector at `at` (unix seconds)."""
        params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class QueryClock:
    """The analysis' virtual now (unix seconds), which the query proxy evaluates at."""

    def __init__(self, now: float):
        self.now = now


class QueryProxy:
    """Stands where the pool's query endpoint would be: it answers Flagger's instant queries
    (GET <address path>/api/v1/query?query=..., which never carries `time`:
    pkg/metrics/providers/prometheus.go RunQuery) from the recorded Prometheus at the clock's now,
    by adding `time`. Nothing else of the request changes; `queries` keeps each as it arrived."""

    def __init__(self, prom: RecordedPrometheus, clock: QueryClock):
        self.queries: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urllib.parse.urlsplit(self.path)
                params = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                if not url.path.endswith("/api/v1/query") or "time" in params or list(params) != ["query"]:
                    self.send_error(400, f"not a Flagger instant query: {self.path}")
                    return
                proxy.queries.append(params["query"][0])
                upstream = f"{prom.url}/api/v1/query?{url.query}&time={clock.now:.3f}"
                try:
                    with urllib.request.urlopen(upstream, timeout=30) as r:
                        status, body = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, body = e.code, e.read()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
