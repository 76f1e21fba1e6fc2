"""IdentityExtension, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..identity_extension import IdentityExtension as _IdentityExtension
from ..identity_extension import IdentityExtensionArgs
from ..mesh_namespace import TrustedSources
from ..model.gateway_routes import GATEWAY_NAME
from ..model.identity_extension import (
    NAME,
    conditions_problem,
    config_json,
    identity_image,
    tenants_identity_config,
)
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import ImageRef as ImageModel
from ..model.specs import ModelSpec as ModelModel
from ..model.specs import TenantSpec as TenantModel
from ..model.specs import item_key
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from .convert import Problems, kubernetes_provider, named_inputs
from .facade import LATER, Facade
from .types import ClusterSpec, ImageRef, ModelSpec, TenantSpec


class IdentityExtensionInputs(TypedDict):
    """Inputs of IdentityExtension."""

    namespace: pulumi.Input[str]
    """The Gateway's namespace (an extension attaches to a Gateway of its own namespace)."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    tenants: list[TenantSpec]
    """The tenants calling the models: their tokens are verified, each gets its own objective and cache_salt."""
    models: list[ModelSpec]
    """The models behind the endpoint picker (routing: inference-gateway), as given to their InferencePools."""
    cluster: ClusterSpec
    """The cluster's settings: only the load balancer's proxy-only subnet and health checks may call the extension."""
    gateway_name: NotRequired[str]
    """The Gateway it runs in front of (Gateway.gatewayName; default vllm)."""
    image: NotRequired[ImageRef]
    """The extension's image (images/vllm_gke_identity); default vllm-gke-identity beside serverImage."""
    server_image: NotRequired[ImageRef]
    """The server image (VllmService.image): the extension's image is built into its repository's folder."""
    vllm_version: NotRequired[str]
    """The vLLM release of the models' image (default the newest): the routes whose bodies take the tenant's
    cache_salt."""


def image_uri(problems: Problems, args: IdentityExtensionInputs) -> str:
    """The extension's image, or Platform's default beside the server image."""
    if args.get("image"):
        image = problems.spec(ImageModel, args.get("image"), "image")
        return image.uri if image is not None else ""
    if args.get("server_image"):
        server = problems.spec(ImageModel, args.get("server_image"), "server_image")
        return identity_image(server).uri if server is not None else ""
    problems.add("image", "required but not set: give the extension's image, or serverImage to take "
                 "vllm-gke-identity beside it")
    return ""


class IdentityExtension(_IdentityExtension, Facade):
    """The tenant identity extension in front of the endpoint pickers: a GCPRoutingExtension on the
    Gateway (failing closed) whose server verifies each request's tenant token and sets the picker's
    objective, fairness id and tenant headers, removing any copy a client sent, and sets the tenant's
    cache_salt in the picker's request bodies. Routes to an InferencePool need it: give it to the
    Gateway's dependsOn."""

    extension_name: str
    """The GCPRoutingExtension's name (also its Deployment's, Service's and ConfigMap's)."""

    def __init__(self, name: str, args: IdentityExtensionInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("IdentityExtension")
        tenants = problems.specs(TenantModel, args.get("tenants"), "tenants")
        models = problems.specs(ModelModel, args.get("models"), "models")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        image = image_uri(problems, args)
        if not args.get("models"):
            problems.add("models", "none given: the extension serves the models behind an endpoint picker")
        for i, model in enumerate(models):
            if model.routing != "inference-gateway":
                problems.add(f"{item_key('models', models, i)}.routing", f"is '{model.routing}'; give only the "
                             "models with routing: inference-gateway (nothing else reads what the extension sets)")
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        problems.raise_any()
        config = tenants_identity_config(tenants, models, {m.name: RELEASES[version] for m in models})
        if not config["prefixes"]:
            problems.add("tenants", "none calls one of models (a tenant's models names them): the extension "
                         "would admit no request")
        if problem := conditions_problem(config):
            problems.add("tenants", problem)
        problems.raise_any()
        sources = TrustedSources.for_cluster(cluster.proxy_only_cidr, cluster.pods_cidr, cluster.subnet_cidr)
        self.inputs, self.args = args, IdentityExtensionArgs(
            args["namespace"], args.get("gateway_name") or GATEWAY_NAME, image, config_json(config), LATER,
            sources.health_checks)
        with named_inputs("IdentityExtension"):
            super().__init__(name, self.args, opts)
        self.extension_name = NAME

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
