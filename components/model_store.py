"""ModelStore: one copy of every model's weights, loaded once, mounted read-only.

Replicas never download weights: a loader Job per model writes them to
/models/<model>/<revision>-<digest of source and revision> and drops a completion marker, and servers wait for the marker before
starting. The copy lives on a Filestore share (every serving namespace gets a ReadOnlyMany PV/PVC
onto it: weights_filestore.py), in a Cloud Storage bucket (mounted through Cloud Storage FUSE:
weights_bucket.py), or in that bucket and on Hyperdisk ML disks GKE Volume Populator fills from it
(hyperdisk_weights.py). The store declares what every backend shares (the loader's identity and
namespace, the loader Jobs) and composes its backend's storage (weights_storage.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from .hyperdisk_weights import HyperdiskStorage
from .k8s_meta import api_body, custom_resource, deny_all_ingress, meta
from .model.gcp_names import service_account_id
from .model.k8s_objects import content_digest
from .model.pods.loader import PROGRAM_CONFIG_MAP, LoaderPod, LoaderRun, loader_pod
from .model.specs import ImageRef, ModelSpec, WeightsSpec
from .model.vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .model.weights_backends import FILESTORE, GCS, HYPERDISK_ML
from .model.weights_layout import (
    HF_TOKEN_MOUNT,
    LOADER_EXIT_UNLOADABLE,
    LOADER_PROGRAM,
    LOADER_SA,
    WeightCopy,
    prune_command,
    reads_hub,
    reads_hub_token_from_secret_manager,
    source_bucket,
    weight_copies,
)
from .model.weights_mount import WeightsMount
from .options import child_opts
from .project_apis import ProjectApis
from .weights_bucket import GcsWeights
from .weights_filestore import FilestoreWeights
from .weights_storage import ReaderWeights, StoreSite, WeightsStorage, api_opts


@dataclass
class TokenSource:
    env: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    mounts: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    volumes: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    depends_on: list[pulumi.Resource] = field(default_factory=list[pulumi.Resource])


@dataclass
class ModelStoreArgs:
    project: str
    # Zonal and basic tiers live in `zone`, REGIONAL in `region`.
    zone: str
    region: str
    network_name: pulumi.Input[str]
    # The cluster's Workload Identity pool (GpuCluster.workload_pool): an output, so the loader's
    # binding waits for the cluster that creates the pool.
    workload_pool: pulumi.Input[str]
    models: Sequence[ModelSpec]
    weights: WeightsSpec
    server_image: ImageRef
    provider: k8s.Provider
    # plain name -> namespace (an Output, so claims wait for the namespace to exist)
    consumer_namespaces: Mapping[str, pulumi.Input[str]] = field(default_factory=dict[str, pulumi.Input[str]])
    # plain name -> the models its pods serve (gcs: the folders its servers may read; hyperdisk-ml:
    # the disks it needs); default: all.
    consumer_models: Optional[Mapping[str, Sequence[str]]] = None
    # The cluster's zones (hyperdisk-ml: a disk in each).
    zones: Sequence[str] = ()
    # hyperdisk-ml: the transfer nodes and their compute class (GpuCluster.transfer_ready).
    transfer_ready: Sequence[pulumi.Resource] = ()
    system_namespace: str = "vllm-gke-system"
    # Filestore instance name, unique per project and zone; defaults to "<name>-weights".
    instance_name: Optional[str] = None
    loader_node_selector: Mapping[str, str] = field(
        default_factory=lambda: {"vllm-gke.io/role": "system"})
    apis: Optional[ProjectApis] = None
    # Protect the Filestore instance from deletion and replacement.
    protect: bool = True
    # The vLLM release that reads the weights: which weight files the loaders copy.
    vllm_release: VllmRelease = field(default_factory=lambda: release(DEFAULT_VLLM_VERSION))


@dataclass
class JobBase:
    """What the prune Jobs (WeightsPrune, declared after the servers) share with the loaders: the
    loaders' namespace, their pod, and what their first run would fail without."""

    namespace: pulumi.Input[str]
    pod: LoaderPod
    depends_on: list[pulumi.Resource]


# Each backend's storage (the facts others ask of it: components/model/weights_backends.py).
STORAGE: dict[str, Callable[[StoreSite], WeightsStorage]] = {
    FILESTORE.name: FilestoreWeights, GCS.name: GcsWeights, HYPERDISK_ML.name: HyperdiskStorage}


class ModelStore(pulumi.ComponentResource):
    storage: WeightsStorage
    loader_jobs: dict[str, k8s.batch.v1.Job]

    def __init__(self, name: str, args: ModelStoreArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:ModelStore", name, None, opts)
        self._opts = opts
        self.backend = args.weights.backend
        self.instance_name = args.instance_name or f"{name}-weights"
        grants = self._loader_identity(name, args)
        namespace, loader_sa = self._loader_namespace(name, args)
        self.storage = STORAGE[self.backend](
            StoreSite(self, opts, name, self.instance_name, args, self.loader_member, namespace))
        program = LOADER_PROGRAM.read_text()
        program_map = k8s.core.v1.ConfigMap(
            f"{name}-loader-program", metadata={**meta(PROGRAM_CONFIG_MAP), "namespace": namespace},
            data={LOADER_PROGRAM.name: program}, opts=child_opts(self, opts, provider=args.provider))
        self.job_base = JobBase(namespace, LoaderPod(
            loader_sa.metadata.name, content_digest(program), self.storage.loader_mount,
            dict(args.loader_node_selector), args.server_image, args.weights.gcs_loader_image),
            [program_map, self.loader_binding, *grants, *self.storage.loader_grants])
        token = self._token_source(name, args, namespace, child_opts(self, opts, provider=args.provider))
        self.loader_jobs = {c.key: self._loader_job(name, args, c, token) for c in weight_copies(args.models)}
        self.storage.after_loaders(self.loader_jobs)
        self.register_outputs({"backend": self.backend, **self.storage.outputs(), "loaderJobs": list(self.loader_jobs)})

    # What the plan, the provider and the reports read of the backend's storage.
    @property
    def tier(self) -> str:
        return self.storage.tier

    @property
    def capacity_gb(self) -> int:
        return self.storage.capacity_gb

    @property
    def location(self) -> str:
        return self.storage.location

    @property
    def server_ip(self) -> pulumi.Output[str]:
        return self.storage.server_ip

    @property
    def claim_name(self) -> str:
        return self.storage.claim_name

    @property
    def share_identity(self) -> str:
        return self.storage.share_identity

    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        """How a pod in the consumer's namespace reads the model's weights (and its adapters')."""
        return self.storage.mount_for(consumer, model)

    def claims_for(self, consumer: str, model: ModelSpec) -> dict[str, str]:
        """hyperdisk-ml: mount directory -> claim, for the model's weights and its adapters in the
        consumer's namespace; empty for the other backends (one volume at /models)."""
        return self.storage.claims_for(consumer, model)

    def reader_for(self, consumer: str, model: ModelSpec) -> ReaderWeights:
        """How a load test in the consumer's namespace reads the model's tokenizer: as the servers
        do, or where they read disks that attach to GPU machines only, from the bucket."""
        return self.storage.reader_for(consumer, model)

    def _loader_identity(self, name: str, args: ModelStoreArgs) -> list[pulumi.Resource]:
        """The loader's Google service account and what it may read: the HF token from Secret
        Manager and gs:// sources, nothing else (the backend grants the writes). Returns what the
        loader Jobs may only start after (their first run would fail without it)."""
        def gcp_opts(*api_names: str) -> pulumi.ResourceOptions:
            return api_opts(self, self._opts, args.apis, *api_names)

        self.loader_gsa = gcp.serviceaccount.Account(
            f"{name}-loader-gsa", account_id=service_account_id(self.instance_name, "loader"), project=args.project,
            display_name="vllm-gke weights loader", opts=gcp_opts("iam.googleapis.com"))
        self.loader_member = self.loader_gsa.email.apply(lambda e: f"serviceAccount:{e}")
        grants: list[pulumi.Resource] = []
        if reads_hub_token_from_secret_manager(args.models, args.weights):
            grants.append(gcp.secretmanager.SecretIamMember(
                f"{name}-loader-hf-token", project=args.project, secret_id=args.weights.secret_manager_secret,
                role="roles/secretmanager.secretAccessor", member=self.loader_member,
                opts=gcp_opts("secretmanager.googleapis.com")))
        # gs:// sources: read access on each source bucket, not on every bucket of the project.
        for bucket in sorted({source_bucket(c.source) for c in weight_copies(args.models) if c.source.startswith("gs://")}):
            grants.append(gcp.storage.BucketIAMMember(
                f"{name}-loader-source-{bucket}", bucket=bucket, role="roles/storage.objectViewer",
                member=self.loader_member, opts=gcp_opts("storage.googleapis.com")))
        self.loader_binding = gcp.serviceaccount.IAMMember(
            f"{name}-loader-wi", service_account_id=self.loader_gsa.name,
            role="roles/iam.workloadIdentityUser",
            member=pulumi.Output.from_input(args.workload_pool).apply(
                lambda pool: f"serviceAccount:{pool}[{args.system_namespace}/{LOADER_SA}]"),
            opts=gcp_opts("iam.googleapis.com"))
        return grants

    def _loader_namespace(self, name: str, args: ModelStoreArgs) -> tuple[pulumi.Output[str], k8s.core.v1.ServiceAccount]:
        """The loaders' namespace and their Kubernetes service account (the loader's identity
        through Workload Identity)."""
        k8s_opts = child_opts(self, self._opts, provider=args.provider)
        system_ns = k8s.core.v1.Namespace(f"{name}-system-ns", metadata=meta(args.system_namespace), opts=k8s_opts)
        ns_name = system_ns.metadata.name
        # The loaders serve nothing and sit outside the mesh: nothing may connect to them.
        deny_all_ingress(f"{name}-system-deny-ingress", ns_name, k8s_opts)
        loader_sa = k8s.core.v1.ServiceAccount(
            f"{name}-loader-ksa",
            metadata={**meta(LOADER_SA), "namespace": ns_name,
                      "annotations": {"iam.gke.io/gcp-service-account": self.loader_gsa.email}},
            # Workload Identity goes through the GKE metadata server, not a mounted token.
            automount_service_account_token=False,
            opts=k8s_opts)
        return ns_name, loader_sa

    def _loader_job(self, name: str, args: ModelStoreArgs, copy: WeightCopy, token: TokenSource) -> k8s.batch.v1.Job:
        base = self.job_base
        run = LoaderRun(copy.model, copy.source, self.storage.loader_command(copy, args.vllm_release),
                        token.env, token.mounts, token.volumes)
        return k8s.batch.v1.Job(
            f"{name}-load-{copy.key}",
            metadata={**meta(f"load-{copy.key}", labels={"vllm-gke.io/model": copy.model},
                             # A 140 GB download outlasts Pulumi's default 10 minute Job await.
                             annotations={"pulumi.com/timeoutSeconds": "14400"}),
                      "namespace": base.namespace},
            spec=api_body({
                "backoffLimit": 4,
                "activeDeadlineSeconds": 4 * 3600,
                # What no retry mends (the files do not fit, nothing vLLM loads) fails the
                # Job at once, so `pulumi up` stops with the loader's message.
                "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                    "containerName": "loader", "operator": "In", "values": [LOADER_EXIT_UNLOADABLE]}}]},
                "template": loader_pod(base.pod, run),
            }),
            opts=child_opts(self, self._opts, provider=args.provider, depends_on=[*token.depends_on, *base.depends_on]))

    def _token_source(self, name: str, args: ModelStoreArgs, namespace: pulumi.Input[str],
                      opts: pulumi.ResourceOptions) -> "TokenSource":
        """Where the loader finds the HF token: a Kubernetes Secret reference, or Secret Manager
        mounted through the GKE CSI add-on. Either way only a reference is in the plan."""
        ref = args.weights.hf_token_kubernetes_secret
        if not reads_hub(args.models):
            return TokenSource()  # bucket sources only: no token to read
        if ref is not None:
            return TokenSource(env=[{"name": "HF_TOKEN", "valueFrom": {
                "secretKeyRef": {"name": ref.name, "key": ref.key}}}])
        provider_class = custom_resource(
            f"{name}-hf-token-class", "secrets-store.csi.x-k8s.io/v1", "SecretProviderClass",
            {**meta("hf-token"), "namespace": namespace},
            {"provider": "gke", "parameters": {"secrets": (
                f'- resourceName: "projects/{args.project}/secrets/'
                f'{args.weights.secret_manager_secret}/versions/latest"\n  path: "token"\n')}},
            opts)
        return TokenSource(
            mounts=[{"name": "hf-token", "mountPath": HF_TOKEN_MOUNT, "readOnly": True}],
            volumes=[{"name": "hf-token", "csi": {"driver": "secrets-store-gke.csi.k8s.io", "readOnly": True,
                                                  "volumeAttributes": {"secretProviderClass": "hf-token"}}}],
            depends_on=[provider_class])


class WeightsPrune(pulumi.ComponentResource):
    """Per model, a Job that removes the folders beside the model's kept ones (earlier revisions
    and sources, the old layout's) once every server and load test reading the model was updated
    onto the kept folders: it depends on them, so Pulumi creates (or, as its kept set changes,
    replaces) it only after they are, and a failed `up` (servers never rolled) prunes nothing.
    Not a child of the ModelStore: the servers wait for the store, this waits for the servers.
    `unpruned`: models some pool of which Flagger rolls out: their primary keeps reading the revision
    it serves until a canary is promoted (for good after a rollback), which no config names, so their
    earlier folders stay (docs/guides/rollouts.md)."""

    def __init__(self, name: str, store: ModelStore, models: Sequence[ModelSpec],
                 readers: Mapping[str, Sequence[pulumi.Resource]], provider: k8s.Provider,
                 opts: Optional[pulumi.ResourceOptions] = None, unpruned: Sequence[str] = ()):
        super().__init__("vllm-gke:index:WeightsPrune", name, None, opts)
        base, copies = store.job_base, weight_copies(models)
        self.jobs: dict[str, k8s.batch.v1.Job] = {}
        for model in (m for m in models if m.name not in unpruned):
            self.jobs[model.name] = k8s.batch.v1.Job(
                f"{name}-{model.name}",
                metadata={**meta(f"prune-{model.name}", labels={"vllm-gke.io/model": model.name},
                                 annotations={"pulumi.com/timeoutSeconds": "1800"}),
                          "namespace": base.namespace},
                spec=api_body({"backoffLimit": 4, "activeDeadlineSeconds": 1500,
                               # Removing files takes little: room on the system pool beside the loaders.
                               "template": loader_pod(base.pod, LoaderRun(
                                   model.name, model.source, prune_command(model.name, copies),
                                   cpu=("250m", "1"), memory=("256Mi", "1Gi")))}),
                opts=child_opts(self, opts, provider=provider, depends_on=[
                    *base.depends_on, *(store.loader_jobs[c.key] for c in copies if c.model == model.name),
                    *readers.get(model.name, ())]))
        self.register_outputs({"pruneJobs": list(self.jobs)})
