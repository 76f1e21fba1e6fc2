"""Small builders the Kubernetes-facing components share (the labels and bodies they use: model/k8s_objects.py)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .model.k8s_objects import BASE_LABELS


def api_body(body: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
    """A Kubernetes object's body (a spec, a role's rules or reference) as written here: in the API's
    own field names (camelCase), as the manifests the plan writes and checks against the API's
    schema (infra/manifests.py validates every one, strictly). pulumi_kubernetes sends such keys
    as they are, but its *ArgsDict TypedDicts name only snake_case keys, so a type checker cannot
    match the two: the body passes typed as Any, unchanged, and the schema check is its check."""
    return body


def meta(name: str, namespace: Optional[str] = None, labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None) -> k8s.meta.v1.ObjectMetaArgsDict:
    """ObjectMeta with an explicit name: manifests stay predictable and diffable across stacks."""
    out: k8s.meta.v1.ObjectMetaArgsDict = {"name": name, "labels": {**BASE_LABELS, **(labels or {})}}
    if namespace:
        out["namespace"] = namespace
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def custom_resource(resource_name: str, api_version: str, kind: str, metadata: k8s.meta.v1.ObjectMetaArgsDict,
                    spec: Any, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        resource_name, api_version=api_version, kind=kind, metadata=metadata, spec=spec, opts=opts
    )


def deny_all_ingress(resource_name: str, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions) -> None:
    """A NetworkPolicy refusing every connection to the namespace's pods: for namespaces outside the
    mesh whose pods serve nothing (loaders, checks). Enforced by GKE Dataplane V2."""
    k8s.networking.v1.NetworkPolicy(
        resource_name, metadata={**meta("deny-all-ingress"), "namespace": namespace},
        spec=api_body({"podSelector": {}, "policyTypes": ["Ingress"]}), opts=opts)
