"""Replicas across hosts (LeaderWorkerSet groups): only the leader serves, behind the guard and the
mesh like any replica; the workers serve nothing and are reachable by their own group alone."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from .base import LWS_NAME_LABEL, Finding, Resource, is_group_worker, kube, meta, namespace_of, pod_templates, where


def _admits_only_group(policy: Mapping[str, Any], group: str) -> bool:
    """A NetworkPolicy on the group's pods whose every rule open on all ports admits its own pods only."""
    spec = policy.get("spec") or {}
    if ((spec.get("podSelector") or {}).get("matchLabels") or {}).get(LWS_NAME_LABEL) != group:
        return False
    if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
        return False
    for rule in spec.get("ingress") or []:
        if rule.get("ports"):
            continue
        peers = rule.get("from") or []
        if not peers or any(((p.get("podSelector") or {}).get("matchLabels") or {}).get(LWS_NAME_LABEL) != group
                            or p.get("ipBlock") or p.get("namespaceSelector") for p in peers):
            return False
    return True


def group_workers_closed(resources: Sequence[Resource]) -> Iterator[Finding]:
    policies = kube(resources, "NetworkPolicy")
    for lws in kube(resources, "LeaderWorkerSet"):
        ns, name = namespace_of(lws), meta(lws).get("name")
        templates = pod_templates(lws)
        workers = templates[1:] if len(templates) > 1 else []
        for template in workers:
            for c in (template.get("spec") or {}).get("containers") or []:
                if not is_group_worker(c):
                    yield lws, (f"{where(lws)}: worker container '{c.get('name')}' is not a group worker (vLLM "
                                "--headless, or joining the leader's Ray cluster): it could serve without the guard")
                if c.get("ports"):
                    yield lws, f"{where(lws)}: worker container '{c.get('name')}' declares ports; workers serve nothing"
        if not any(namespace_of(p) == ns and _admits_only_group(p.props, str(name)) for p in policies):
            yield lws, (f"{where(lws)}: no NetworkPolicy limits its pods' unmeshed ports (torch.distributed, NCCL, "
                        "Ray) to the group's own pods")
