"""The serverless tier: models served on Cloud Run with a GPU (vllm-gke:cloudRun), scaled to zero
between bursts and billed by the second, beside the GKE node pools. Tenants call them as they call
GKE models (tenants[].models names them), through the same server image and tenant guard."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from .base import Hostname, Name, Revision, Spec, SubnetCidr, WeightsSource
from .models import CustomShape, ModelSpec, ServingPoolSpec

# The node pool name a Cloud Run model's ModelSpec carries (as_model): no GKE pool has it (names.py
# refuses it for nodePools), so nothing GKE-side ever places a replica there.
CLOUD_RUN_POOL = "cloud-run"


class CloudRunModelSpec(Spec):
    """One model on Cloud Run: a service of the project's server image (vLLM with the tenant guard)
    on one GPU an instance, its weights read from the stack's bucket through a Cloud Storage volume."""

    # Model name: the served model name and route /<name>/v1 (unique across models and cloudRun.models).
    name: Name
    # hf://org/repo or gs://bucket/prefix (the loader copies it into the stack's bucket once).
    source: WeightsSource
    # Git branch, tag or commit of the source.
    revision: Revision = "main"
    # Architecture from the catalog, or customShape; unset: read from the model's config.json as for models[].
    shape: Optional[str | CustomShape] = None
    # Weight dtype or quantisation.
    dtype: Literal["bfloat16", "float16", "fp8", "int8", "awq", "gptq"] = "bfloat16"
    # GiB the files vLLM reads take on disk (default: paramsBillion x dtype bytes).
    disk_gb: Optional[float] = Field(default=None, gt=0)
    # KV-cache dtype.
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # Longest context, in tokens.
    max_model_len: int = Field(default=8192, ge=256)
    # Share of the GPU vLLM may use.
    gpu_memory_utilization: float = Field(default=0.90, ge=0.5, le=0.98)
    # Reuse KV cache across requests with a common prefix.
    enable_prefix_caching: bool = True
    # Sequences one instance's vLLM batches at once (--max-num-seqs); the instance's request
    # concurrency is sized from it and the capacity model unless `concurrency` is set.
    max_num_seqs: int = Field(default=32, ge=1, le=1024)
    # More vLLM flags, checked against the release's parser as for models[].extraArgs.
    extra_args: list[str] = Field(default_factory=list)
    # The GPU each instance gets (one an instance): Cloud Run offers NVIDIA L4 (24 GB) and RTX PRO 6000
    # Blackwell (96 GB) in some regions only; the plan checks the region.
    gpu: Literal["nvidia-l4", "nvidia-rtx-pro-6000"] = "nvidia-l4"
    # Region of the service (default: the stack's region). A regional gateway class needs the stack's
    # own region: its serverless NEG must be in the load balancer's region.
    region: Optional[str] = None
    # Instances kept warm: 0 scales to zero between bursts (each burst's first request waits for a cold
    # start, which the plan estimates); 1 or more are billed all the time.
    min_instances: int = Field(default=0, ge=0, le=100)
    # Most instances at once (each is one GPU against the project's Cloud Run GPU quota).
    max_instances: int = Field(default=3, ge=1, le=100)
    # Requests one instance takes at once (default: from the capacity model); more queue at Cloud Run
    # or start another instance.
    concurrency: Optional[int] = Field(default=None, ge=1, le=1000)
    # Cloud Run's GPU zonal redundancy: capacity reserved in another zone for a zone's outage, at a
    # higher GPU price (the plan shows both). Off: cheaper, and a zone's outage waits for capacity.
    gpu_zonal_redundancy: bool = False
    # vCPUs and GiB of memory of the server container (vLLM and the guard). Each instance also runs the
    # metrics sidecar (1 vCPU, 0.5 GiB), billed too: an L4 instance holds at most 8 vCPUs and 32 GiB in all,
    # so the server takes at most 6 and 24 there (4 or 6 vCPUs, at most 4 GiB a vCPU). Cloud Run's least
    # with the GPU: 4 vCPUs and 16 GiB with an L4, 20 and 80 with an RTX PRO 6000; the plan checks them.
    cpu: int = Field(default=6, ge=4)
    memory_gib: int = Field(default=24, ge=16)
    # How a tenant's identity is verified before the guard sees a request; either way the service takes
    # traffic from the stack's load balancer alone. iam (the default: Cloud Run verifies the caller before
    # any instance starts, so a request without a good token never wakes a GPU): Cloud Run's invoker
    # check, one roles/run.invoker binding per tenant service account (tenants[].cloudRunInvokers), each
    # client's Google ID token minted for the model's audience (the plan's tenant URLs show it); the guard
    # maps the verified account to its tenant. jwt (tenants without Google service accounts): the tenant's
    # own JWT (tenants[].jwt), verified by the guard against its issuer's keys, Cloud Run's invoker check
    # off (a forged but well-formed token still starts an instance, billed until it idles out).
    auth: Literal["jwt", "iam"] = "iam"

    @field_validator("max_instances")
    @classmethod
    def _max_over_min(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_instances", 0)
        if low > v:
            raise ValueError(f"maxInstances ({v}) is below minInstances ({low}); raise maxInstances")
        return v

    def as_model(self) -> ModelSpec:
        """The model as the model layer's sizing, argv and weights code read a GKE model: one pool
        (`short`) of min..max instances, on the pseudo node pool CLOUD_RUN_POOL."""
        pool = ServingPoolSpec(min_replicas=self.min_instances, max_replicas=self.max_instances,
                               max_num_seqs=self.max_num_seqs)
        return ModelSpec(
            name=self.name, source=self.source, revision=self.revision, shape=self.shape, dtype=self.dtype,
            disk_gb=self.disk_gb, kv_cache_dtype=self.kv_cache_dtype, max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, enable_prefix_caching=self.enable_prefix_caching,
            node_pool=CLOUD_RUN_POOL, short=pool, extra_args=list(self.extra_args))


class CloudRunSpec(Spec):
    """Models on Cloud Run GPUs, and what they share: the load balancer in front of them, the VPC
    subnet their instances reach the limit store through."""

    # The models served on Cloud Run.
    models: list[CloudRunModelSpec] = Field(min_length=1)
    # The DNS name of the load balancer in front of the Cloud Run models (GKE's Gateway takes no
    # serverless backend, so they have a load balancer of the gateway's class beside it, with the same
    # URL scheme: /<model>/v1 and /<tenant>/<model>/v1). Required with an external gateway class (its
    # certificate is issued for it).
    hostname: Optional[Hostname] = None
    # The subnet Cloud Run's Direct VPC egress gives instances their addresses from (in the cluster's
    # VPC and region): the limit store admits it alone. Must not overlap the cluster's ranges.
    egress_subnet_cidr: SubnetCidr = "10.30.0.0/24"
