"""The Google APIs a stack calls: enabled first, every resource that calls one waits for it."""

from __future__ import annotations

from .cloud_run import weights_models
from .stack_config import StackConfig
from .weights_backends import backend_of
from .weights_layout import reads_hub_token_from_secret_manager

BASE_APIS = (
    "serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com", "iam.googleapis.com",
    "iamcredentials.googleapis.com", "compute.googleapis.com", "container.googleapis.com",
    "containerfilesystem.googleapis.com", "artifactregistry.googleapis.com", "file.googleapis.com",
    "gkehub.googleapis.com", "mesh.googleapis.com", "monitoring.googleapis.com", "logging.googleapis.com",
)
TRACE_API = "cloudtrace.googleapis.com"
RUN_API = "run.googleapis.com"


def required_apis(cfg: StackConfig) -> list[str]:
    apis: list[str] = list(BASE_APIS)
    # The Cloud Run models keep their metrics sidecar's config (and the store's client certificate) in
    # Secret Manager, and their load balancer serves HTTPS with a Certificate Manager certificate.
    if reads_hub_token_from_secret_manager(weights_models(cfg), cfg.weights) or cfg.cloud_run is not None:
        apis.append("secretmanager.googleapis.com")
    if cfg.gateway.managed_certificate or (cfg.cloud_run is not None and cfg.gateway.tls):
        apis.append("certificatemanager.googleapis.com")
    if cfg.cloud_run is not None:
        apis.append(RUN_API)
    apis.extend(backend_of(cfg.weights).apis)
    if cfg.budget:
        # The Budget API bills its calls to the stack's project (components/billing_budget.py).
        apis.append("billingbudgets.googleapis.com")
    if cfg.monitoring.traces.enabled:
        # The trace collector writes spans through the Cloud Trace API (components/trace_collector.py).
        apis.append(TRACE_API)
    if any(m.routing == "inference-gateway" for m in cfg.models):
        # "Deploy GKE Inference Gateway": the load balancer calls the picker through Service
        # Extensions, part of the Network Services API.
        apis.append("networkservices.googleapis.com")
    return apis
