"""RunMetricsSidecar: what a Cloud Run model's metrics sidecar needs beside its service: the
RunMonitoring config as a Secret Manager secret (the sidecar reads it from a secret volume, Google's
guide's way), read by the service's account, which also writes the series to Managed Prometheus.

The config is no secret, but a secret volume is the one way to put a file into the sidecar's image
(FROM scratch: no shell to write it). Its version is written through the write-only field (secret_data_wo),
which the bridged provider still keeps in Pulumi's state inputs, encrypted as a secret, though never in its
outputs (pulumi/pulumi-terraform-bridge#3215; #3201 is the open issue to stop that). The text holds nothing
secret: it is in the plan, from components/model/cloud_run_monitoring.py.
components/cloud_run.py adds `container` and `volume` to the service's revision template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_gcp as gcp

from .model.cloud_run_monitoring import config_digest, config_volume, gmp_sidecar, run_monitoring_text
from .model.vllm_server import PORT
from .options import child_opts
from .project_apis import ProjectApis

SECRETS_API = "secretmanager.googleapis.com"


@dataclass
class RunMetricsSidecarArgs:
    project: str
    # The Cloud Run service's name (the secret is named after it) and its server container's name.
    service: str
    server_container: str
    # The service's account ("serviceAccount:<email>"): reads the config, writes the metrics.
    member: pulumi.Input[str]
    # The server's port, where its /metrics is.
    port: int = PORT
    apis: Optional[ProjectApis] = None


class RunMetricsSidecar(pulumi.ComponentResource):
    """The service depends on `grants` (a revision whose account cannot read the secret fails to deploy)."""

    secret: gcp.secretmanager.Secret
    version: gcp.secretmanager.SecretVersion
    grants: list[pulumi.Resource]
    # The revision template's parts (provider input names).
    container: dict[str, Any]
    volume: dict[str, Any]
    config_text: str

    def __init__(self, name: str, args: RunMetricsSidecarArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:RunMetricsSidecar", name, None, opts)
        needs = args.apis.needs(SECRETS_API) if args.apis else []
        child = child_opts(self, opts, depends_on=needs)
        self.config_text = run_monitoring_text(args.port)
        self.secret = gcp.secretmanager.Secret(
            f"{name}-config", project=args.project, secret_id=f"{args.service}-rungmp",
            replication={"auto": {}}, labels={"vllm-gke-content": "run-monitoring"}, opts=child)
        # Write-only: in state only as an encrypted input (see above), never an output; a new text is a new version.
        self.version = gcp.secretmanager.SecretVersion(
            f"{name}-config-version", secret=self.secret.id, secret_data_wo=self.config_text,
            secret_data_wo_version=config_digest(self.config_text), opts=child)
        self.grants = [
            gcp.secretmanager.SecretIamMember(f"{name}-config-reader", project=args.project, secret_id=self.secret.secret_id,
                                              role="roles/secretmanager.secretAccessor", member=args.member, opts=child),
            gcp.projects.IAMMember(f"{name}-metric-writer", project=args.project, role="roles/monitoring.metricWriter",
                                   member=args.member, opts=child_opts(self, opts, depends_on=args.apis.needs(
                                       "cloudresourcemanager.googleapis.com") if args.apis else [])),
            self.version]
        self.container = gmp_sidecar(args.server_container)
        self.volume = config_volume(self.secret.secret_id, self.version.version)
        self.register_outputs({"secret": self.secret.name})
