"""InferencePool, as the component package exposes it to every Pulumi language."""

# The analyzer reads these annotations at runtime: no `from __future__ import annotations`.
from typing import Optional, TypedDict

import pulumi
from typing_extensions import NotRequired

from ..inference_pool import InferencePool as _InferencePool
from ..inference_pool import InferencePoolArgs
from ..mesh_namespace import TrustedSources
from ..model.config_rules import check_inference_gateway_version
from ..model.k8s_objects import MODEL_LABEL, POOL_LABEL
from ..model.serving_api import objective_name
from ..model.specs import ClusterSpec as ClusterModel
from ..model.specs import ModelSpec as ModelModel
from ..model.specs import TenantSpec as TenantModel
from ..model.vllm_versions import DEFAULT_VLLM_VERSION, RELEASES
from ..options import inherited_depends_on
from .convert import Problems, kubernetes_provider
from .facade import LATER, Facade
from .types import ClusterSpec, ModelSpec, TenantSpec

NETWORK_SERVICES = "networkservices.googleapis.com"


class InferencePoolInputs(TypedDict):
    """Inputs of InferencePool."""

    project: str
    """The project (the Network Services API is enabled there)."""
    model: ModelSpec
    """The model (routing: inference-gateway) whose one pool (VllmService with poolName short) the picker serves."""
    namespace: pulumi.Input[str]
    """The namespace of that pool's replicas."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (GpuCluster.kubeconfig)."""
    tenants: list[TenantSpec]
    """The tenants calling it: each gets an InferenceObjective <tenant>.<model> with its priority."""
    cluster: ClusterSpec
    """The cluster's settings: the load balancer's proxy-only subnet may call the picker, the nodes scrape it."""
    enable_apis: NotRequired[bool]
    """Enable the Network Services API the load balancer calls the picker through (default true)."""
    request_timeout_seconds: NotRequired[int]
    """The load balancer's timeout for one request, seconds (default 600)."""
    vllm_version: NotRequired[str]
    """The vLLM release of the pool's image (default the newest); the picker reads its built-in vllm metric names."""


class InferencePool(_InferencePool, Facade):
    """GKE Inference Gateway's endpoint picker for one model's pool: an InferencePool, the picker
    (llm-d-router v0.10.0) that chooses the replica by queue depth, KV-cache use and prefix affinity, and an
    InferenceObjective per tenant carrying its priority. Give it an InferenceObjectiveCrd (declared
    once per cluster) in dependsOn; route to it with a Gateway target's inferencePool and tenant."""

    pool_name: str
    """The InferencePool's name (a Gateway target's inferencePool)."""

    def __init__(self, name: str, args: InferencePoolInputs, opts: Optional[pulumi.ResourceOptions] = None):
        problems = Problems("InferencePool")
        model = problems.spec(ModelModel, args.get("model"), "model")
        tenants = problems.specs(TenantModel, args.get("tenants"), "tenants")
        cluster = problems.spec(ClusterModel, args.get("cluster"), "cluster")
        # The inputs the library's args do not hold: the model's routing, its callers, the cluster's version.
        if model is not None and model.routing != "inference-gateway":
            problems.add("model.routing", f"is '{model.routing}'; an InferencePool serves a model with routing: "
                         "inference-gateway (its one pool behind the picker)")
        if not args.get("tenants"):
            problems.add("tenants", "none given: no tenant would have an objective, so no route could reach the pool")
        if cluster is not None:
            check_inference_gateway_version(problems.add, "cluster.minMasterVersion", cluster.min_master_version,
                                            "an InferencePool needs it")
        version = args.get("vllm_version") or DEFAULT_VLLM_VERSION
        if version not in RELEASES:
            problems.add("vllmVersion", f"vLLM {version} is not supported; use one of {', '.join(RELEASES)}")
        problems.raise_any()
        sources = TrustedSources.for_cluster(cluster.proxy_only_cidr, cluster.pods_cidr, cluster.subnet_cidr)
        self.inputs, self.args = args, InferencePoolArgs(
            pool_name=model.name, namespace=args["namespace"], provider=LATER,
            selector={MODEL_LABEL: model.name, POOL_LABEL: "short"},
            objectives={objective_name(t.name, model.name): t.priority for t in tenants},
            request_timeout_seconds=int(args.get("request_timeout_seconds") or 600),
            load_balancer_sources=sources.health_checks,
            metrics_sources=[cluster.subnet_cidr])
        # A copy: prepare adds the API to what the children wait for.
        super().__init__(name, self.args, pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions()))

    def prepare(self, name: str, opts: Optional[pulumi.ResourceOptions]) -> None:
        self.args.provider = kubernetes_provider(name, self.inputs["kubeconfig"], self)
        # "Deploy GKE Inference Gateway": the load balancer calls the picker through Service Extensions.
        apis = self.project_apis(name, opts, self.inputs["project"], [NETWORK_SERVICES],
                                 self.inputs.get("enable_apis", True))
        if apis is not None and opts is not None:
            # What the component waits for its children wait for (child_opts); the API is its own child.
            opts.depends_on = [*inherited_depends_on(opts), *apis.needs(NETWORK_SERVICES)]
