"""Seed the Managed Prometheus metrics the SLOs read, then wait until Cloud Monitoring knows them.

Cloud Monitoring refuses an SLO whose filter names a metric it has no descriptor for ("The metric
referenced by the provided filter is unknown. Check the metric name and labels."), and a
prometheus.googleapis.com descriptor cannot be created through the API (user-defined types are
custom.googleapis.com or external.googleapis.com): Managed Prometheus creates it when it first
ingests the metric. On a new project no replica has been scraped yet (a pool at minReplicas 0
may never run one), so this Job serves each metric the SLOs read, with the labels their filters
name, at zero, for its PodMonitoring to scrape; and exits once every descriptor exists. The SLOs
depend on the Job (Pulumi waits for a Job to succeed). Its series carry their own label values
(SEED), which no SLO filter selects, and zeros: they change no SLO.

Standard library only (the image is plain Python); the token is the pod's Workload Identity, from
the GKE metadata server. Config: /etc/seed/seed.json {"project", "metrics": [{"type", "text"}], "port"}.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

CONFIG = "/etc/seed/seed.json"
TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
API = "https://monitoring.googleapis.com/v3"
POLL_SECONDS = 15


def serve(text: str, port: int) -> None:
    body = text.encode()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            if self.path == "/metrics":
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def token() -> str:
    request = urllib.request.Request(TOKEN_URL, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["access_token"]


def descriptor_exists(project: str, metric_type: str) -> bool:
    name = f"projects/{project}/metricDescriptors/{urllib.parse.quote(metric_type, safe='/')}"
    request = urllib.request.Request(f"{API}/{name}", headers={"Authorization": f"Bearer {token()}"})
    try:
        with urllib.request.urlopen(request, timeout=30):
            return True
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise


def main() -> int:
    with open(CONFIG) as f:
        config = json.load(f)
    serve("".join(m["text"] for m in config["metrics"]), int(config["port"]))
    waiting = [m["type"] for m in config["metrics"]]
    while waiting:
        try:
            waiting = [t for t in waiting if not descriptor_exists(config["project"], t)]
        except (urllib.error.URLError, OSError) as err:  # the metadata server or the API, for now
            print(f"checking the descriptors: {err}; retrying", flush=True)
        if waiting:
            print(f"waiting for Managed Prometheus to ingest: {', '.join(waiting)}", flush=True)
            time.sleep(POLL_SECONDS)
    print("every metric the SLOs read is known to Cloud Monitoring", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
