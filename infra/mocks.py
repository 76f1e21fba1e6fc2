"""Pulumi mock runtime for the offline plan: records every resource the real program registers.

Providers are never called; each resource's state is its inputs plus the few outputs the
program reads back (cluster endpoint, Filestore IP, service-account email), given
documentation-range values so nothing in a plan can be mistaken for a live address.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor


@dataclass
class PlannedResource:
    """One resource as the engine would see it: type token, logical name, input properties."""

    type: str
    name: str
    urn: str
    parent: Optional[str]
    custom: bool
    props: dict[str, Any] = field(default_factory=dict)
    # Property paths Pulumi would store encrypted, e.g. ("kubeconfig",).
    secret_paths: list[tuple[Any, ...]] = field(default_factory=list)
    # URNs the engine waits for before creating this one: depends_on, the resources whose
    # outputs feed its inputs, and its provider.
    dependencies: frozenset[str] = frozenset()
    # Resource options that decide what an update does: properties whose changes Pulumi ignores
    # (for Kubernetes objects under server-side apply, left to their other field managers), and
    # whether a replacement deletes the old resource first.
    ignore_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    # The parents of its aliases (a URN, or "" for none): where the engine looks for it under an
    # older URN; alias_urns: aliases the SDK resolved to whole URNs.
    alias_parents: tuple[str, ...] = ()
    alias_urns: tuple[str, ...] = ()


def unwrap_secrets(value: Any, path: tuple[Any, ...] = (),
                   found: Optional[list[tuple[Any, ...]]] = None) -> tuple[Any, list[tuple[Any, ...]]]:
    """Replace the wire format's secret envelopes with their values, noting where they were."""
    found = [] if found is None else found
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            found.append(path)
            return unwrap_secrets(value.get("value"), path, found)[0], found
        return {k: unwrap_secrets(v, path + (k,), found)[0] for k, v in value.items()}, found
    if isinstance(value, list):
        return [unwrap_secrets(v, path + (i,), found)[0] for i, v in enumerate(value)], found
    return value, found


def _outputs(type_: str, name: str, inputs: dict[str, Any], project: str) -> tuple[str, dict[str, Any]]:
    state = dict(inputs)
    rid = f"{name}-id"
    if type_ == "gcp:container/cluster:Cluster":
        rid = f"projects/{project}/locations/{inputs.get('location')}/clusters/{inputs.get('name')}"
        state["endpoint"] = "203.0.113.10"
        state["masterAuth"] = {"clusterCaCertificate": base64.b64encode(b"mock-ca").decode()}
    elif type_ == "gcp:filestore/instance:Instance":
        state["networks"] = [{**n, "ipAddresses": ["198.51.100.2"]} for n in inputs.get("networks", [])]
    elif type_ == "gcp:serviceaccount/account:Account":
        email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
        state.update(email=email, name=f"projects/{project}/serviceAccounts/{email}")
    elif type_ == "gcp:monitoring/slo:Slo":
        state["name"] = f"projects/{project}/services/{inputs.get('service')}/serviceLevelObjectives/{inputs.get('sloId')}"
    elif type_ == "gcp:monitoring/notificationChannel:NotificationChannel":
        # A number from the name, the same in every run (hash() of a str differs per process).
        number = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 10**12
        state["name"] = f"projects/{project}/notificationChannels/{number}"
    return rid, state


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, project: str):
        self.project = project
        self.by_name: dict[tuple[str, str], dict[str, Any]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[Optional[str], dict]:
        self.by_name[(args.typ, args.name)] = args.inputs
        return _outputs(args.typ, args.name, args.inputs, self.project)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, Optional[list[tuple[str, str]]]]:
        if args.token == "gcp:organizations/getProject:getProject":
            project = args.args.get("projectId") or self.project
            return {"projectId": project, "number": MOCK_PROJECT_NUMBER, "name": project}, []
        return {}, []


# What the mock answers for a project's number (a real project's is 12 digits).
MOCK_PROJECT_NUMBER = "123456789012"


class RecordingMonitor(MockMonitor):
    """Keeps each registration's URN and parent, which MockResourceArgs does not carry."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.recorded: list[PlannedResource] = []
        self._mocks = mocks

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            props, secrets = unwrap_secrets(self._mocks.by_name.get((request.type, request.name), {}))
            deps = set(request.dependencies)
            for prop in request.propertyDependencies.values():
                deps.update(prop.urns)
            if request.provider:
                deps.add(request.provider.rsplit("::", 1)[0])  # a provider reference is "<urn>::<id>"
            self.recorded.append(PlannedResource(
                type=request.type, name=request.name, urn=response.urn,
                parent=request.parent or None, custom=bool(request.custom),
                props=props, secret_paths=secrets, dependencies=frozenset(deps),
                ignore_changes=tuple(request.ignoreChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
                alias_parents=tuple("" if a.spec.noParent else a.spec.parentUrn for a in request.aliases
                                    if a.WhichOneof("alias") == "spec"),
                alias_urns=tuple(request.aliasURNs) + tuple(a.urn for a in request.aliases
                                                            if a.WhichOneof("alias") == "urn")))
        return response
