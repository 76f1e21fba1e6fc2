"""CloudRunServices: the models on Cloud Run GPUs (vllm-gke:cloudRun), beside the cluster.

Per model: its own service account (it reads its folders of the weights bucket and nothing else),
the Cloud Run service of the project's server image (vLLM with the tenant guard) on one GPU an
instance, the bucket mounted read-only as a Cloud Storage volume, and, with auth: iam, one
roles/run.invoker binding per tenant service account. Shared: the subnet the instances' Direct VPC
egress takes its addresses from (the limit store admits it). What each setting is and why is in
components/model/cloud_run.py; the contracts in infra/contracts/cloud_run_service.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, cast

import pulumi
import pulumi_gcp as gcp

from . import bucket_readers
from .cloud_run_monitoring import RunMetricsSidecar, RunMetricsSidecarArgs
from .limit_store import cloud_run_reader
from .model.cloud_run import CONTAINER_NAME, CloudRunService, service_name
from .model.cloud_run_store import CloudRunAccess
from .model.gcp_names import service_account_id
from .options import child_opts
from .project_apis import ProjectApis

RUN_API = "run.googleapis.com"


@dataclass
class CloudRunServicesArgs:
    project: str
    # The services, as the model layer plans them (components/model/cloud_run.py cloud_run_service).
    services: Sequence[CloudRunService]
    # The cluster's VPC (the egress subnet is made in it) and the subnet's range and region.
    network: pulumi.Input[str]
    egress_subnet_cidr: str
    egress_region: str
    # The weights bucket and its list-only role (components/weights_bucket.py).
    bucket: pulumi.Input[str]
    list_role: pulumi.Input[str]
    # The name the stack's resources start with (the cluster's): the subnet and accounts carry it.
    name_prefix: str
    apis: Optional[ProjectApis] = None
    # model -> invoker members (auth: iam): one roles/run.invoker binding each.
    invokers: Mapping[str, Sequence[str]] = field(default_factory=dict[str, Sequence[str]])
    # model -> secret-backed env (the limit store's client certificate).
    secret_env: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict[str, Sequence[Mapping[str, Any]]])
    deletion_protection: bool = True
    # The limit store's Cloud Run access (its client certificate's secret): each service's account may read it.
    store_access: Optional[CloudRunAccess] = None


class CloudRunServices(pulumi.ComponentResource):
    subnet: gcp.compute.Subnetwork
    accounts: dict[str, gcp.serviceaccount.Account]
    services: dict[str, gcp.cloudrunv2.Service]

    def __init__(self, name: str, args: CloudRunServicesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:CloudRunServices", name, None, opts)
        self._opts, self._apis = opts, args.apis
        # Direct VPC egress: the instances take addresses from this subnet of the cluster's VPC.
        self.subnet = gcp.compute.Subnetwork(
            f"{name}-egress", name=f"{args.name_prefix}-run-egress", project=args.project, region=args.egress_region,
            network=args.network, ip_cidr_range=args.egress_subnet_cidr, private_ip_google_access=True,
            opts=self._api("compute.googleapis.com"))
        self.accounts, self.services = {}, {}
        for svc in args.services:
            self._service(name, args, svc)
        self.register_outputs({"services": {k: s.name for k, s in self.services.items()},
                               "egressSubnet": self.subnet.self_link})

    def _api(self, *apis: str, depends_on: Sequence[pulumi.Resource] = ()) -> pulumi.ResourceOptions:
        return child_opts(self, self._opts, depends_on=[*(self._apis.needs(*apis) if self._apis else []), *depends_on])

    def _service(self, name: str, args: CloudRunServicesArgs, svc: CloudRunService) -> None:
        model = svc.model.name
        account = gcp.serviceaccount.Account(
            f"{name}-{model}-sa", project=args.project, account_id=service_account_id(args.name_prefix, f"run-{model}"[:20]),
            display_name=f"vllm-gke Cloud Run server of {model}", opts=self._api("iam.googleapis.com"))
        member = account.email.apply(lambda e: f"serviceAccount:{e}")
        # It lists the bucket (gcsfuse mounts it so) and opens only its model's folders.
        reads = bucket_readers.grant_reads(f"{name}-{model}-reads", args.bucket, member, svc.reads, args.list_role,
                                           self._api("storage.googleapis.com"))
        # Managed Prometheus beside the server: vLLM's series and the guard's tenant meters (its /metrics).
        metrics = RunMetricsSidecar(f"{name}-{model}-metrics", RunMetricsSidecarArgs(
            args.project, service_name(svc.model), CONTAINER_NAME, member, apis=args.apis), opts=self._api())
        # Cloud Run resolves a secret env var when it deploys a revision: the grant first, or the revision fails.
        store = [cloud_run_reader(f"{name}-{model}-limits-tls", args.project, args.store_access, member, self._api())] \
            if args.store_access is not None else []
        service = gcp.cloudrunv2.Service(
            f"{name}-{model}", name=service_name(svc.model), project=args.project, location=svc.region,
            ingress=svc.ingress, invoker_iam_disabled=svc.invoker_iam_disabled,
            default_uri_disabled=svc.default_uri_disabled, launch_stage=svc.launch_stage,
            custom_audiences=list(svc.custom_audiences) or None,
            deletion_protection=args.deletion_protection, labels={"vllm-gke-model": model},
            template=cast(gcp.cloudrunv2.ServiceTemplateArgsDict, svc.template(
                args.bucket, account.email, self.subnet.id, [metrics.container], [metrics.volume],
                args.secret_env.get(model, ()))),
            # The first revision mounts the bucket and reads the sidecar's config: the grants first, or it fails to start.
            opts=self._api(RUN_API, depends_on=[*reads, account, *metrics.grants, *store]))
        for i, invoker in enumerate(args.invokers.get(model, ())):
            gcp.cloudrunv2.ServiceIamMember(
                f"{name}-{model}-invoker-{i}", project=args.project, location=svc.region, name=service.name,
                role="roles/run.invoker", member=invoker, opts=self._api(RUN_API))
        self.accounts[model], self.services[model] = account, service
