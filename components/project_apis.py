"""ProjectApis: the Google Cloud APIs the platform calls, enabled before anything uses them.

On an empty project every create would fail with SERVICE_DISABLED: enabling is asynchronous
on Google's side, and gcp.projects.Service only completes once the API is usable. Resources
that call an API wait for its Service (`ProjectApis.needs(...)`). APIs stay enabled when the
stack is destroyed (disable_on_destroy=False): other workloads in the project may use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_gcp as gcp

from .options import child_opts

# What each API is for; docs/gcp-prerequisites.md lists the same APIs.
API_PURPOSES = {
    "serviceusage.googleapis.com": "enabling the others (must already be on; `gcloud services enable` does it)",
    "cloudresourcemanager.googleapis.com": "project IAM bindings",
    "iam.googleapis.com": "service accounts and Workload Identity bindings",
    "iamcredentials.googleapis.com": "Workload Identity token exchange",
    "compute.googleapis.com": "VPC, subnets, Cloud NAT, static IPs, load balancers",
    "container.googleapis.com": "the GKE cluster and node pools",
    "containerfilesystem.googleapis.com": "image streaming of the multi-GB server image",
    "artifactregistry.googleapis.com": "pulling the pinned server image",
    "file.googleapis.com": "the Filestore share holding the weights",
    "storage.googleapis.com": "the Cloud Storage bucket holding the weights (weights.backend: gcs)",
    "gkehub.googleapis.com": "fleet membership (Cloud Service Mesh needs it)",
    "mesh.googleapis.com": "Cloud Service Mesh (managed Istio: JWT auth, authorization)",
    "secretmanager.googleapis.com": "the Hugging Face token; the Cloud Run models' metrics config, store certificate",
    "monitoring.googleapis.com": "Managed Prometheus, dashboards, alert policies",
    "logging.googleapis.com": "workload and system logs",
    "certificatemanager.googleapis.com": "Google-managed TLS certificates of external gateways",
    "networkservices.googleapis.com": "Service Extensions: the load balancer calling the Inference Gateway's endpoint picker",
    "billingbudgets.googleapis.com": "the Cloud Billing budget (the stack's project is its calls' quota project)",
    "cloudtrace.googleapis.com": "the trace collector writing the servers' spans to Cloud Trace",
    "run.googleapis.com": "the models on Cloud Run GPUs (vllm-gke:cloudRun)",
}


@dataclass
class ProjectApisArgs:
    project: str
    apis: Sequence[str]


class ProjectApis(pulumi.ComponentResource):
    services: dict[str, gcp.projects.Service]

    def __init__(self, name: str, args: ProjectApisArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:ProjectApis", name, None, opts)
        unknown = sorted(set(args.apis) - set(API_PURPOSES))
        if unknown:
            raise ValueError(f"unknown APIs {unknown}; known: {', '.join(API_PURPOSES)}")
        self.services = {
            api: gcp.projects.Service(
                f"{name}-{api.split('.')[0]}", project=args.project, service=api,
                disable_on_destroy=False, disable_dependent_services=False, opts=child_opts(self, opts))
            for api in args.apis if api != "serviceusage.googleapis.com"
        }
        self.register_outputs({"enabled": sorted(self.services)})

    def needs(self, *apis: str) -> list[pulumi.Resource]:
        """The Service resources to depend on before calling these APIs."""
        return [self.services[a] for a in apis if a in self.services]
