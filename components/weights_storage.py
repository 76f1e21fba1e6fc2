"""The resource side of a weights backend: what ModelStore asks of the storage it composes.

ModelStore declares what every backend shares (the loader's identity and namespace, the program,
a loader Job per weight copy) and hands the rest to its backend's storage: where the weights live,
the loaders' writable mount and argv, and what a pod in each consumer namespace mounts
(weights_filestore.py, weights_bucket.py, hyperdisk_weights.py). What others ask of a backend
without its resources is the model layer's (components/model/weights_backends.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

import pulumi

from .bucket_readers import BucketReads
from .model.specs import ModelSpec
from .model.vllm_versions import VllmRelease
from .model.weights_layout import CLAIM_NAME, WeightCopy
from .model.weights_mount import WeightsMount
from .options import child_opts

if TYPE_CHECKING:
    from .model_store import ModelStoreArgs
    from .project_apis import ProjectApis


def api_opts(parent: pulumi.Resource, opts: Optional[pulumi.ResourceOptions], apis: Optional["ProjectApis"],
             *api_names: str, **extra: Any) -> pulumi.ResourceOptions:
    """A child of `parent` that waits for these APIs (where the stack enables them)."""
    return child_opts(parent, opts, depends_on=apis.needs(*api_names) if apis else [], **extra)


@dataclass(frozen=True)
class StoreSite:
    """Where a backend declares its storage: under the store, with its names and arguments, beside
    the loader's identity and namespace."""

    store: pulumi.Resource
    opts: Optional[pulumi.ResourceOptions]
    # The store's resource name (every child's prefix) and the instance name its cloud names derive from.
    name: str
    instance_name: str
    args: "ModelStoreArgs"
    # The loader's Google service account as an IAM member.
    loader_member: pulumi.Output[str]
    # The loaders' namespace (an output: what is declared in it waits for it).
    system_namespace: pulumi.Output[str]

    def gcp_opts(self, *api_names: str, **extra: Any) -> pulumi.ResourceOptions:
        """A child of the store that waits for these APIs."""
        return api_opts(self.store, self.opts, self.args.apis, *api_names, **extra)

    def k8s_opts(self) -> pulumi.ResourceOptions:
        return child_opts(self.store, self.opts, provider=self.args.provider)

    def served(self, consumer: str) -> list[ModelSpec]:
        """The models the consumer namespace's pods serve (default: all)."""
        wanted = self.args.consumer_models
        return [m for m in self.args.models if wanted is None or m.name in wanted.get(consumer, ())]


@dataclass(frozen=True)
class ReaderWeights:
    """How a reader with its own identity (a load test) reads a model's files: the mount, and where
    the mount does not grant the reads itself (a bucket), what its identity must be granted."""

    mount: WeightsMount
    bucket_reads: Optional[BucketReads] = None


class WeightsStorage(ABC):
    """One backend's storage in a ModelStore."""

    site: StoreSite
    # The Filestore tier (a bucket backend: its name) and the GiB the weights take (a share: its capacity).
    tier: str
    capacity_gb: int
    location: str
    # The share's NFS address; "" without a share.
    server_ip: pulumi.Output[str]
    # The read-only claim in each consumer namespace (Filestore: named by the share's identity).
    claim_name: str = CLAIM_NAME
    share_identity: str = ""
    # The loaders' writable mount, and what their Jobs wait for beyond the loader's identity.
    loader_mount: WeightsMount
    loader_grants: list[pulumi.Resource]

    @abstractmethod
    def loader_command(self, copy: WeightCopy, release: VllmRelease) -> list[Any]:
        """The loader's argv for one copy (weights_layout.loader_command with the backend's part)."""

    @abstractmethod
    def mount_for(self, consumer: str, model: ModelSpec) -> WeightsMount:
        """How a pod in the consumer's namespace reads the model's weights (and its adapters')."""

    def after_loaders(self, loaders: Mapping[str, pulumi.Resource]) -> None:
        """What is declared once the loader Jobs are (weight set key -> Job): nothing by default."""
        return None

    def claims_for(self, consumer: str, model: ModelSpec) -> dict[str, str]:
        """Mount directory -> claim, where the model has a claim per weight set; else empty."""
        return {}

    def reader_for(self, consumer: str, model: ModelSpec) -> ReaderWeights:
        """What a load test in the consumer's namespace mounts for the model's tokenizer."""
        return ReaderWeights(self.mount_for(consumer, model))

    def outputs(self) -> Mapping[str, Any]:
        return {"filestoreTier": self.tier, "capacityGb": self.capacity_gb, "serverIp": self.server_ip}
