"""RenderServer: the tokenizer a precise-prefix picker calls (vLLM's `vllm launch render`,
components/model/picker_prefix.py), apart from the picker.

Its own Deployment (two replicas on different system nodes) behind a ClusterIP Service, so a failed
weights mount, image pull or crash costs the picked requests their precise score and never keeps a
picker from starting. Its own ServiceAccount, with no Kubernetes API token mounted, whose Workload
Identity principal alone is granted the bucket folder of the model's revision (the picker's identity
gets no bucket grant); a NetworkPolicy admits the model's picker pods alone to its port, as every
body it renders is a client's prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .bucket_readers import BucketReads
from .k8s_meta import api_body, meta
from .model.picker_prefix import render_ingress, render_labels, render_name, render_service_spec
from .options import child_opts


@dataclass
class RenderServerArgs:
    model_name: str
    namespace: pulumi.Input[str]
    provider: k8s.Provider
    # picker_prefix.render_deployment_spec
    spec: Mapping[str, Any]
    # Where it reads the weights from a bucket: what its identity is granted there (the list role and
    # `weights_prefixes`, picker_prefix.render_weights_prefixes).
    weights_reads: Optional[BucketReads] = None
    weights_prefixes: Sequence[str] = ()


class RenderServer(pulumi.ComponentResource):
    deployment: k8s.apps.v1.Deployment

    def __init__(self, name: str, args: RenderServerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:RenderServer", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        render = render_name(args.model_name)

        def metadata() -> k8s.meta.v1.ObjectMetaArgsDict:
            return {**meta(render, labels=render_labels(args.model_name)), "namespace": args.namespace}

        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=metadata(), automount_service_account_token=False,
                                        opts=k8s_opts)
        # The mount fails without the reads: granted first.
        reads = args.weights_reads.grant(f"{name}-weights-reader", args.namespace, render, args.weights_prefixes,
                                         child_opts(self, opts)) if args.weights_reads else []
        k8s.networking.v1.NetworkPolicy(f"{name}-ingress", metadata=metadata(),
                                        spec=api_body(render_ingress(args.model_name)), opts=k8s_opts)
        k8s.core.v1.Service(f"{name}-svc", metadata=metadata(), spec=api_body(render_service_spec(args.model_name)),
                            opts=k8s_opts)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=metadata(), spec=api_body(dict(args.spec)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[sa, *reads]))
        self.register_outputs({"name": render})
