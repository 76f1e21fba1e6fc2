"""Standby: what answers for a serving pool scaled to zero, and wakes it.

A small CPU pod carrying the pool's labels, so the pool's Service (and the load balancer's NEG,
and an InferencePool whose picker does not queue) selects it too - but ready only while the pool
has no ready replica: its
readiness asks a headless Service of the pool's vLLM pods, which resolves only while one is
ready. So at zero the load balancer sends it the requests, it answers 503 with Retry-After in
OpenAI's error format and counts them; KEDA reads the count from Managed Prometheus and starts
the pool; once a replica is ready the standby turns unready and leaves rotation.

Why 503 rather than holding the request: a cold start is minutes (a GPU node, then the weights),
longer than clients and the load balancer's backend timeout wait, and a held connection ties up
both; a prompt 503 with Retry-After lets a client back off and come back.

It runs in the mesh like the replicas: only a request with a valid tenant JWT reaches it (the
model's AuthorizationPolicies select it by the model label), so only tenants can wake GPUs.

A pool behind an endpoint picker that queues (flow control) has none: the picker holds its
requests at zero and KEDA wakes it on that queue (components/model/picker_wake.py says where a
standby stays and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from .k8s_meta import api_body, meta
from .model.pods.standby import (
    StandbyPod,
    ready_service_name,
    ready_service_spec,
    standby_deployment_spec,
    standby_labels,
    standby_name,
)
from .model.specs import ImageRef
from .options import child_opts

PROGRAM = Path(__file__).with_name("scripts") / "standby.py"
DEFAULT_IMAGE = ImageRef(repository="mirror.gcr.io/library/python", tag="3.12.8-slim")


@dataclass
class StandbyArgs:
    # The pool's Service name (the standby is <service>-standby).
    service_name: str
    model: str
    namespace: pulumi.Input[str]
    # The pool's Service selector: the standby carries these labels so the Service selects it.
    pool_selector: Mapping[str, str]
    # Labels only the vLLM pods carry, added to the selector of the headless readiness Service.
    vllm_only_labels: Mapping[str, str]
    provider: k8s.Provider
    # More labels the pool's pods carry that its mesh policies select on (a dedicated pool's tenant).
    policy_labels: Mapping[str, str] = field(default_factory=dict[str, str])
    port: int = 8000
    expected_seconds: int = 600
    image: ImageRef = field(default_factory=lambda: DEFAULT_IMAGE)
    # Its own identity, not the namespace's default (which is the mesh identity other grants
    # might name); "" keeps the default.
    service_account: str = ""


class Standby(pulumi.ComponentResource):
    deployment: k8s.apps.v1.Deployment
    ready_service: str

    def __init__(self, name: str, args: StandbyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:Standby", name, None, opts)
        k8s_opts = child_opts(self, opts, provider=args.provider)
        standby = standby_name(args.service_name)
        self.ready_service = ready_service_name(args.service_name)
        ns = args.namespace
        # Resolves only while a vLLM replica of the pool is ready (headless, ready addresses only).
        k8s.core.v1.Service(
            f"{name}-ready", metadata={**meta(self.ready_service), "namespace": ns},
            spec=api_body(ready_service_spec(args.pool_selector, args.vllm_only_labels, args.port)), opts=k8s_opts)
        source = PROGRAM.read_text()
        program = k8s.core.v1.ConfigMap(f"{name}-program", metadata={**meta(standby), "namespace": ns},
                                        data={PROGRAM.name: source}, opts=k8s_opts)
        pod = StandbyPod(
            name=standby, model=args.model, pool_selector=args.pool_selector, image_uri=args.image.uri,
            program_name=PROGRAM.name, program_source=source,
            # Fully qualified (trailing dot): one query, no search-list expansion whose extra lookups
            # could fail on their own.
            ready_host=pulumi.Output.concat(self.ready_service, ".", ns, ".svc.cluster.local."),
            policy_labels=args.policy_labels, port=args.port, expected_seconds=args.expected_seconds,
            service_account=args.service_account)
        self.deployment = k8s.apps.v1.Deployment(
            # Ready only while the pool is not: neither Pulumi nor a rollout may wait for it to be
            # ready. Pulumi waits for the new pod to exist; the old one goes first.
            f"{name}-deploy", metadata={**meta(standby, labels=standby_labels(args.pool_selector, args.policy_labels),
                                               annotations={"pulumi.com/waitFor": "jsonpath={.status.updatedReplicas}=1"}),
                                        "namespace": ns},
            spec=api_body(standby_deployment_spec(pod)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[program]))
        self.register_outputs({"deployment": standby, "readyService": self.ready_service})
