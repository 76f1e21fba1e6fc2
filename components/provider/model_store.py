"""ModelStore, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
import re
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..model.specs import ImageRef as ImageModel
from ..model.specs import ModelSpec as ModelModel
from ..model.specs import WeightsSpec as WeightsModel
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from ..model.weights_backends import backend_of
from ..model.weights_layout import reads_hub_token_from_secret_manager
from ..model_store import ModelStore as _ModelStore
from ..model_store import ModelStoreArgs
from .convert import Problems, kubernetes_provider
from .facade import LATER, Facade
from .types import ImageRef, ModelSpec, WeightsSpec


class ModelStoreInputs(TypedDict):
    """Inputs of ModelStore."""

    project: str
    """The GCP project."""
    zone: str
    """The zone of a zonal or basic Filestore tier."""
    region: str
    """The region of a REGIONAL Filestore tier."""
    network_name: pulumi.Input[str]
    """The VPC the share is reachable from (GpuCluster.networkName)."""
    workload_pool: pulumi.Input[str]
    """The cluster's Workload Identity pool (GpuCluster.workloadPool), so the loader's binding waits for it."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    models: list[ModelSpec]
    """The models to load onto the share, once each."""
    server_image: ImageRef
    """The server image; hf:// sources load with it."""
    weights: NotRequired[WeightsSpec]
    """Filestore tier, capacity, and where the Hugging Face token is."""
    consumer_namespaces: NotRequired[dict[str, pulumi.Input[str]]]
    """Namespaces that get a read-only claim onto the share, by a short key of your choice (a DNS label:
    it names the claim's volume)."""
    enable_apis: NotRequired[bool]
    """Enable the APIs it needs first (Filestore; Secret Manager where the Hugging Face token is there;
    default true)."""
    instance_name: NotRequired[str]
    """The Filestore instance's name (default <name>-weights)."""
    protect: NotRequired[bool]
    """Protect the share from deletion and replacement (default true)."""
    vllm_version: NotRequired[str]
    """The vLLM release that serves the weights: which weight files the loaders copy (default the newest supported)."""


class ModelStore(_ModelStore, Facade):
    """One Filestore share holding every model's weights: loaded once by a Job per model,
    mounted read-only by every serving namespace."""

    filestore_tier: str
    """The Filestore tier chosen."""
    capacity_gb: int
    """The share's capacity, GiB."""
    server_ip: pulumi.Output[str]
    """The share's NFS address."""
    claim_name: str
    """The read-only claim's name in each consumer namespace."""
    loader_jobs: list[str]
    """The models with a loader Job."""

    def __init__(self, name: str, args: ModelStoreInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("ModelStore")
        models = problems.specs(ModelModel, args.get("models"), "models")
        weights = problems.spec(WeightsModel, args.get("weights"), "weights")
        image = problems.spec(ImageModel, args.get("server_image"), "server_image")
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        if weights is not None and not backend_of(weights).one_claim_per_namespace:
            # Those backends give each pod its own volumes (a bucket mount, a claim per weight set),
            # which the provider's VllmService does not take: its pods would mount a claim that
            # does not exist and never start.
            problems.add("weights.backend", f"'{weights.backend}' is available from the Python components "
                         "(vllm_gke.components) only; through the provider use filestore")
        for key in args.get("consumer_namespaces") or {}:
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?", key) or key == "rw":
                problems.add(f"consumerNamespaces.{key}", "must be a short DNS label (lower-case letters, digits, "
                             "'-'), not 'rw' (the loaders' own volume): it names the claim's volume")
        problems.raise_any()
        self.inputs, self.args = args, ModelStoreArgs(
            project=args["project"], zone=args["zone"], region=args["region"], network_name=args["network_name"],
            workload_pool=args["workload_pool"], models=models, weights=weights, server_image=image, provider=LATER,
            consumer_namespaces=dict(args.get("consumer_namespaces") or {}),
            instance_name=args.get("instance_name"), protect=args.get("protect", True), vllm_release=RELEASES[version])
        super().__init__(name, self.args, opts)
        self.filestore_tier = self.tier
        # The library's Jobs by model, as the package's output: the models.
        self.loader_jobs = sorted(self.loader_jobs)

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
        needed = ["file.googleapis.com", "iam.googleapis.com"]
        needed += (["secretmanager.googleapis.com"]
                   if reads_hub_token_from_secret_manager(self.args.models, self.args.weights) else [])
        self.args.apis = self.project_apis(name, opts, self.inputs["project"], needed,
                                           self.inputs.get("enable_apis", True))
