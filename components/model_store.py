"""ModelStore: one copy of every model's weights, loaded once, mounted read-only.

Replicas never download weights: a loader Job per model writes them to
/models/<model>/<revision>-<digest of source and revision> and drops a completion marker, and servers wait for the marker before
starting. The copy lives on a Filestore share (every serving namespace gets a ReadOnlyMany PV/PVC
onto it), in a Cloud Storage bucket (mounted through Cloud Storage FUSE), or in that bucket and
on Hyperdisk ML disks GKE Volume Populator fills from it (HyperdiskWeights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from . import bucket_readers
from .hyperdisk_weights import HyperdiskWeights, HyperdiskWeightsArgs, usable_gib
from .k8s_meta import api_body, custom_resource, deny_all_ingress, meta
from .model import gcs_weights
from .model.catalog import populator_vcpus
from .model.gcp_names import bucket_name, service_account_id
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.specs import ImageRef, ModelSpec, WeightsSpec
from .model.vllm_versions import DEFAULT_VLLM_VERSION, VllmRelease, release
from .model.weights_layout import (
    CLAIM_NAME,
    HF_TOKEN_MOUNT,
    LOADER_ENV,
    LOADER_EXIT_UNLOADABLE,
    LOADER_MOUNT,
    LOADER_PROGRAM,
    LOADER_RUNTIME_ENV,
    LOADER_SA,
    LOADER_SCRATCH,
    LOADER_SCRATCH_GI,
    LOADER_UID,
    MOUNT_PATH,
    NOMINAL_VOLUME_SIZE,
    REGIONAL_TIERS,
    SERVER_SA,
    SERVER_UID,
    SHARE_NAME,
    adapter_copies,
    bucket_folder,
    capacity_range,
    loader_command,
    model_dir,
    plan_filestore,
    prune_command,
    reads,
    reads_hub,
    reads_hub_token_from_secret_manager,
    share_identity,
    share_instance_name,
    source_bucket,
    weight_copies,
)
from .model.weights_mount import WeightsMount, bucket_mount, claim_mount, claims_mount
from .options import child_opts
from .project_apis import ProjectApis
from .workload_identity import workload_principal


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
    """The pod the loader and prune Jobs share: the loader's identity, the writable weights volume,
    the program, the system pool, and the hardening (read-only root, no capabilities, seccomp)."""

    namespace: pulumi.Input[str]
    service_account: pulumi.Input[str]
    program_hash: str
    annotations: dict[str, str]
    volume: dict[str, Any]
    node_selector: dict[str, str]
    backend: str
    hub_image: ImageRef  # hf:// sources: the server image (huggingface_hub)
    bucket_image: ImageRef  # gs:// sources: the Cloud SDK image
    depends_on: list[pulumi.Resource]

    def pod(self, model: str, source: str, command: Sequence[pulumi.Input[str]],
            env: Sequence[dict[str, Any]] = (), mounts: Sequence[dict[str, Any]] = (),
            volumes: Sequence[dict[str, Any]] = (), cpu: tuple[str, str] = ("2", "4"),
            memory: tuple[str, str] = ("8Gi", "16Gi")) -> dict[str, Any]:
        """cpu and memory: (request, limit)."""
        image = self.hub_image if source.startswith("hf://") else self.bucket_image
        scratch = f"{LOADER_SCRATCH_GI * len(LOADER_SCRATCH)}Gi"
        return {
            "metadata": {"labels": {"vllm-gke.io/model": model},
                         # No mesh sidecar: it would keep the Job from completing.
                         "annotations": {"sidecar.istio.io/inject": "false",
                                         # In the pod template, so a changed program re-runs the (immutable) Jobs.
                                         "vllm-gke.io/loader-program": self.program_hash,
                                         **self.annotations}},
            "spec": {
                "serviceAccountName": self.service_account,
                "automountServiceAccountToken": False,
                # Never: a pod failure policy needs it; a failed pod is retried
                # as a new pod up to backoffLimit.
                "restartPolicy": "Never",
                "nodeSelector": dict(self.node_selector),
                "securityContext": {
                    "seccompProfile": {"type": "RuntimeDefault"},
                    **({} if self.backend == "filestore" else {
                        "runAsNonRoot": True, "runAsUser": LOADER_UID, "runAsGroup": LOADER_UID})},
                "containers": [{
                    "name": "loader",
                    "image": image.uri,
                    "command": list(command),
                    # The error (the key to raise) shows in the pod's and Job's status.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "resources": {"requests": {"cpu": cpu[0], "memory": memory[0], "ephemeral-storage": scratch},
                                  "limits": {"cpu": cpu[1], "memory": memory[1], "ephemeral-storage": scratch}},
                    "securityContext": dict(CONTAINER_SECURITY),
                    # The server image sets HF_HUB_OFFLINE=1 so replicas never download;
                    # the loader is the one place that must.
                    "env": [*LOADER_ENV, *LOADER_RUNTIME_ENV, *env,
                            # Through FUSE, downloads must write in order: gcsfuse streams
                            # sequential writes but stages out-of-order ones (hf_xet's
                            # parallel reconstruction) whole on the node's disk.
                            *([] if self.backend == "filestore" else
                              [{"name": "HF_HUB_DISABLE_XET", "value": "1"}])],
                    "volumeMounts": [{"name": "weights", "mountPath": MOUNT_PATH},
                                     {"name": "program", "mountPath": LOADER_MOUNT, "readOnly": True},
                                     *({"name": v, "mountPath": p} for v, p in LOADER_SCRATCH),
                                     *mounts],
                }],
                "volumes": [
                    self.volume,
                    *({"name": v, "emptyDir": {"sizeLimit": f"{LOADER_SCRATCH_GI}Gi"}}
                      for v, _ in LOADER_SCRATCH),
                    {"name": "program", "configMap": {"name": "weights-loader"}},
                    *volumes,
                ],
            },
        }


class ModelStore(pulumi.ComponentResource):
    instance: gcp.filestore.Instance
    server_ip: pulumi.Output[str]
    loader_jobs: dict[str, k8s.batch.v1.Job]
    # The read-only claim in each consumer namespace (Filestore: named by the share's identity).
    claim_name: str = CLAIM_NAME

    def __init__(self, name: str, args: ModelStoreArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:ModelStore", name, None, opts)
        self._opts = opts
        apis = args.apis

        def gcp_opts(*api_names: str) -> pulumi.ResourceOptions:
            return child_opts(self, opts, depends_on=apis.needs(*api_names) if apis else [])

        k8s_opts = child_opts(self, opts, provider=args.provider)
        self.backend = args.weights.backend
        self.instance_name = instance_name = args.instance_name or f"{name}-weights"
        # How a serving pod mounts the weights: the claim (Filestore) or the bucket (gcs).
        self.weights_volume: Optional[dict[str, Any]] = None
        self.pod_annotations: dict[str, str] = {}
        # gcs, hyperdisk-ml: what the bucket holds, GB (it has no capacity to provision).
        self.tier, self.capacity_gb = plan_filestore(args.models, args.weights) if self.backend == "filestore" \
            else (self.backend, math.ceil(sum(c.weights_gb for c in weight_copies(args.models))))
        self.hyperdisk: Optional[HyperdiskWeights] = None
        self.share_identity = ""
        self.server_ip: pulumi.Output[str] = pulumi.Output.from_input("")
        if self.backend == "filestore":
            self.location = args.region if self.tier in REGIONAL_TIERS else args.zone
            self.share_identity = share_identity(instance_name, self.tier, self.location,
                                                 capacity_range(self.tier, self.capacity_gb))
            self.claim_name = f"{CLAIM_NAME}-{self.share_identity}"
            self.instance = gcp.filestore.Instance(
                f"{name}-filestore", name=share_instance_name(instance_name, self.share_identity),
                project=args.project, location=self.location,
                tier=self.tier,
                file_shares={"name": SHARE_NAME, "capacity_gb": self.capacity_gb},
                networks=[{"network": args.network_name, "modes": ["MODE_IPV4"]}],
                # Losing the share means reloading every model: a tier or zone change re-creates it
                # (a new name, so the new share is made and loaded before the old one goes), so make
                # that an explicit decision (`pulumi state unprotect`), not a side effect.
                opts=child_opts(self, opts, protect=args.protect,
                                depends_on=apis.needs("file.googleapis.com") if apis else []))
            def share_ip(networks: Sequence[gcp.filestore.outputs.InstanceNetwork]) -> str:
                addresses = networks[0].ip_addresses
                assert addresses is not None  # Filestore assigns the share's address on creation
                return addresses[0]

            self.server_ip = self.instance.networks.apply(share_ip)
        else:
            self.location = args.region
            self.bucket = gcp.storage.Bucket(
                f"{name}-bucket", name=args.weights.bucket or bucket_name(args.project, instance_name),
                project=args.project, location=args.region.upper(), uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                # Cloud Storage FUSE lists and renames faster on a hierarchical namespace (GKE's guide).
                hierarchical_namespace={"enabled": True}, force_destroy=False,
                opts=child_opts(self, opts, protect=args.protect,
                                depends_on=apis.needs("storage.googleapis.com") if apis else []))
            if self.backend == "gcs":
                self.weights_volume = gcs_weights.weights_volume(self.bucket.name, read_only=True, uid=SERVER_UID)
                self.pod_annotations = dict(gcs_weights.MESHED_POD_ANNOTATIONS)

        # Loader identity: reads the HF token from Secret Manager and gs:// sources, nothing else.
        self.loader_gsa = gcp.serviceaccount.Account(
            f"{name}-loader-gsa", account_id=service_account_id(instance_name, "loader"), project=args.project,
            display_name="vllm-gke weights loader", opts=gcp_opts("iam.googleapis.com"))
        loader_member = self.loader_gsa.email.apply(lambda e: f"serviceAccount:{e}")
        # What the loader Jobs may only start after (their first run would fail without it).
        grants: list[pulumi.Resource] = []
        if reads_hub_token_from_secret_manager(args.models, args.weights):
            grants.append(gcp.secretmanager.SecretIamMember(
                f"{name}-loader-hf-token", project=args.project, secret_id=args.weights.secret_manager_secret,
                role="roles/secretmanager.secretAccessor", member=loader_member,
                opts=gcp_opts("secretmanager.googleapis.com")))
        # gs:// sources: read access on each source bucket, not on every bucket of the project.
        for bucket in sorted({source_bucket(c.source) for c in weight_copies(args.models) if c.source.startswith("gs://")}):
            grants.append(gcp.storage.BucketIAMMember(
                f"{name}-loader-source-{bucket}", bucket=bucket, role="roles/storage.objectViewer",
                member=loader_member, opts=gcp_opts("storage.googleapis.com")))
        # The project's number: the buckets' (gcs, hyperdisk-ml) Workload Identity principals name it.
        number: Optional[pulumi.Output[str]] = None
        if self.backend != "filestore":
            number = gcp.organizations.get_project_output(project_id=args.project).number
            # Writes the weights into the bucket, nothing else anywhere.
            grants.append(gcp.storage.BucketIAMMember(f"{name}-loader-bucket", bucket=self.bucket.name,
                                                      role="roles/storage.objectUser", member=loader_member,
                                                      opts=gcp_opts("storage.googleapis.com")))
        # Lists the bucket, reads nothing: what every bucket reader (servers, load tests) mounts it with.
        self.list_role: pulumi.Input[str] = ""
        if self.backend != "filestore":
            self.list_role = bucket_readers.role_name(bucket_readers.list_role(
                f"{name}-lister", args.project, instance_name, gcp_opts("iam.googleapis.com")), args.project)
        if self.backend == "gcs":
            assert number is not None
            # Readers: the vLLM servers of each consumer namespace (their own service account,
            # SERVER_SA - not the namespace's default, which the standby and anything else there
            # would share), by Workload Identity Federation principal, this bucket only: they list
            # it, and open only the folders of the models the namespace serves and their adapters.
            # The pool is the cluster's output: the bindings wait for the cluster that creates it.
            for key, ns in args.consumer_namespaces.items():
                served = [m for m in args.models
                          if args.consumer_models is None or m.name in args.consumer_models.get(key, ())]
                bucket_readers.grant_reads(
                    f"{name}-reader-{key}", self.bucket.name, workload_principal(number, args.workload_pool, ns, SERVER_SA),
                    gcs_weights.reader_prefixes(served), self.list_role, gcp_opts("storage.googleapis.com"))
        self.loader_binding = gcp.serviceaccount.IAMMember(
            f"{name}-loader-wi", service_account_id=self.loader_gsa.name,
            role="roles/iam.workloadIdentityUser",
            member=pulumi.Output.from_input(args.workload_pool).apply(
                lambda pool: f"serviceAccount:{pool}[{args.system_namespace}/{LOADER_SA}]"),
            opts=gcp_opts("iam.googleapis.com"))

        system_ns = k8s.core.v1.Namespace(f"{name}-system-ns", metadata=meta(args.system_namespace),
                                          opts=k8s_opts)
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
        token = self._token_source(name, args, ns_name, k8s_opts)

        self.claims: dict[str, k8s.core.v1.PersistentVolumeClaim] = {}
        if self.backend == "filestore":
            rw_claim = self._claim(name, "rw", ns_name, args, read_only=False)
            self.claims = {key: self._claim(name, key, ns, args, read_only=True)
                           for key, ns in args.consumer_namespaces.items()}
            loader_volume: dict[str, Any] = {"name": "weights", "persistentVolumeClaim": {"claimName": rw_claim.metadata.name}}
            loader_annotations: dict[str, str] = {}
        else:
            loader_volume = gcs_weights.weights_volume(self.bucket.name, read_only=False, uid=LOADER_UID)
            loader_annotations = dict(gcs_weights.POD_ANNOTATIONS)

        program = LOADER_PROGRAM.read_text()
        program_map = k8s.core.v1.ConfigMap(
            f"{name}-loader-program", metadata={**meta("weights-loader"), "namespace": ns_name},
            data={LOADER_PROGRAM.name: program}, opts=k8s_opts)
        program_hash = content_digest(program)

        self.loader_jobs = {}
        # What the prune Jobs (WeightsPrune, declared after the servers) share with the loaders.
        self.job_base = JobBase(ns_name, loader_sa.metadata.name, program_hash, loader_annotations, loader_volume,
                                dict(args.loader_node_selector), self.backend, args.server_image,
                                args.weights.gcs_loader_image, [program_map, self.loader_binding, *grants])
        for copy in weight_copies(args.models):
            key = copy.key
            self.loader_jobs[key] = k8s.batch.v1.Job(
                f"{name}-load-{key}",
                metadata={**meta(f"load-{key}", labels={"vllm-gke.io/model": copy.model},
                                 # A 140 GB download outlasts Pulumi's default 10 minute Job await.
                                 annotations={"pulumi.com/timeoutSeconds": "14400"}),
                          "namespace": ns_name},
                spec=api_body({
                    "backoffLimit": 4,
                    "activeDeadlineSeconds": 4 * 3600,
                    # What no retry mends (the files do not fit, nothing vLLM loads) fails the
                    # Job at once, so `pulumi up` stops with the loader's message.
                    "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                        "containerName": "loader", "operator": "In", "values": [LOADER_EXIT_UNLOADABLE]}}]},
                    "template": self.job_base.pod(
                        copy.model, copy.source, loader_command(
                            copy, args.vllm_release,
                            usable_gib(copy.weights_gb) if self.backend == "hyperdisk-ml" else None,
                            dest_uri=None if self.backend == "filestore" else pulumi.Output.concat(
                                "gs://", self.bucket.name, "/", bucket_folder(copy))),
                        token.env, token.mounts, token.volumes),
                }),
                opts=child_opts(self, opts, provider=args.provider,
                                depends_on=[*token.depends_on, *self.job_base.depends_on]))

        if self.backend == "hyperdisk-ml":
            assert number is not None
            wanted = args.consumer_models
            consumers = {
                key: (ns, [c for c in weight_copies(args.models) if wanted is None or c.model in wanted.get(key, ())])
                for key, ns in args.consumer_namespaces.items()}
            self.hyperdisk = HyperdiskWeights(f"{name}-hdml", HyperdiskWeightsArgs(
                zones=list(args.zones) or [args.zone], bucket=self.bucket.name,
                workload_pool=args.workload_pool, project_number=number, provider=args.provider,
                consumers=consumers, loaders=self.loader_jobs, mount_root=MOUNT_PATH,
                reads={c.key: reads(c, args.vllm_release) for c in weight_copies(args.models)},
                transfer_ready=list(args.transfer_ready),
                throughput_mib_s=args.weights.hyperdisk_throughput_mib_s,
                populator_vcpus=populator_vcpus(args.weights.populator_machine_type) or 44,
                apis=apis.needs("storage.googleapis.com") if apis else []),
                opts=child_opts(self, opts))

        self.register_outputs({
            "backend": self.backend,
            "filestoreTier": self.tier,
            "capacityGb": self.capacity_gb,
            "serverIp": self.server_ip,
            "loaderJobs": list(self.loader_jobs),
        })

    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        """How a pod in the consumer's namespace reads the model's weights (and its adapters')."""
        if self.hyperdisk is not None:
            return claims_mount(self.claims_for(consumer, model))
        if self.weights_volume is not None:
            return bucket_mount(self.weights_volume, model, self.pod_annotations)
        return claim_mount(self.claim_name)

    def claims_for(self, consumer: str, model: ModelSpec) -> dict[str, str]:
        """hyperdisk-ml: mount directory -> claim, for the model's weights and its adapters in the
        consumer's namespace; empty for the other backends (one volume at /models)."""
        if self.hyperdisk is None:
            return {}
        claims = self.hyperdisk.claims[consumer]
        return {d: claims[d] for d in (model_dir(model), *(a.directory for a in adapter_copies(model)))}

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

    def _claim(self, name: str, key: str, namespace: pulumi.Input[str], args: ModelStoreArgs,
               read_only: bool) -> k8s.core.v1.PersistentVolumeClaim:
        """A PV onto the share and the PVC bound to it; a PV binds one claim, so one pair per namespace."""
        mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
        # Named by the share's identity: a new share gets new volumes and claims, created beside
        # the old ones (a PV's source and a bound claim cannot change), so pods roll onto them.
        pv_name = f"{self.instance_name}-{self.share_identity}-{key}"
        opts = child_opts(self, self._opts, provider=args.provider)
        pv = k8s.core.v1.PersistentVolume(
            f"{name}-pv-{key}",
            metadata=meta(pv_name),
            spec=api_body({
                "capacity": {"storage": NOMINAL_VOLUME_SIZE},
                "accessModes": [mode],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "mountOptions": ["nconnect=8", "ro"] if read_only else ["nconnect=8"],
                "nfs": {"server": self.server_ip, "path": f"/{SHARE_NAME}", "readOnly": read_only},
            }),
            opts=opts)
        return k8s.core.v1.PersistentVolumeClaim(
            f"{name}-pvc-{key}",
            metadata={**meta(self.claim_name if read_only else f"{CLAIM_NAME}-rw-{self.share_identity}"),
                      "namespace": namespace},
            spec=api_body({
                "accessModes": [mode],
                "storageClassName": "",
                "volumeName": pv.metadata.name,
                "resources": {"requests": {"storage": NOMINAL_VOLUME_SIZE}},
            }),
            opts=opts)


class WeightsPrune(pulumi.ComponentResource):
    """Per model, a Job that removes the folders beside the model's kept ones (earlier revisions
    and sources, the old layout's) once every server and load test reading the model was updated
    onto the kept folders: it depends on them, so Pulumi creates (or, as its kept set changes,
    replaces) it only after they are, and a failed `up` (servers never rolled) prunes nothing.
    Not a child of the ModelStore: the servers wait for the store, this waits for the servers."""

    def __init__(self, name: str, store: ModelStore, models: Sequence[ModelSpec],
                 readers: Mapping[str, Sequence[pulumi.Resource]], provider: k8s.Provider,
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:WeightsPrune", name, None, opts)
        base, copies = store.job_base, weight_copies(models)
        self.jobs: dict[str, k8s.batch.v1.Job] = {}
        for model in models:
            self.jobs[model.name] = k8s.batch.v1.Job(
                f"{name}-{model.name}",
                metadata={**meta(f"prune-{model.name}", labels={"vllm-gke.io/model": model.name},
                                 annotations={"pulumi.com/timeoutSeconds": "1800"}),
                          "namespace": base.namespace},
                spec=api_body({"backoffLimit": 4, "activeDeadlineSeconds": 1500,
                               # Removing files takes little: room on the system pool beside the loaders.
                               "template": base.pod(model.name, model.source, prune_command(model.name, copies),
                                                    cpu=("250m", "1"), memory=("256Mi", "1Gi"))}),
                opts=child_opts(self, opts, provider=provider, depends_on=[
                    *base.depends_on, *(store.loader_jobs[c.key] for c in copies if c.model == model.name),
                    *readers.get(model.name, ())]))
        self.register_outputs({"pruneJobs": list(self.jobs)})
