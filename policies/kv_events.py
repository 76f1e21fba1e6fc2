"""vLLM's KV-cache events carry every tenant's prompt tokens and cache_salt in plain text over ZMQ
with no authentication (vLLM 0.34 vllm/distributed/kv_events.py:437-458): only the endpoint
picker may read them. The mesh cannot say so (the picker has no mesh identity), so a NetworkPolicy
must, on a cluster that enforces NetworkPolicies (GKE Dataplane V2)."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Mapping, Optional, Sequence

from .base import Finding, Resource, kube, namespace_of, template_labels, vllm_servers, where

# The picker's pods (components/model/picker.py picker_labels): the one peer the events' ports admit,
# and of those the pool's own picker, <model>-epp (picker_name), the model being the topic's last
# segment (kv@<pod>@<model>, picker_prefix.kv_events_config): another model's picker has no business there.
PICKER_NAME_LABEL = ("app.kubernetes.io/name", "vllm-gke-epp")
PICKER_POOL_LABEL = "inferencepool"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_PORT = re.compile(r"tcp://[^:]+:(\d+)$")


def events_config(args: Sequence[Any]) -> dict[str, Any]:
    """A server's --kv-events-config, or {} without one."""
    items = [str(a) for a in args]
    for i, arg in enumerate(items):
        name, _, inline = arg.partition("=")
        if name.replace("_", "-") == "--kv-events-config":
            return json.loads(inline or (items[i + 1] if i + 1 < len(items) else "{}"))
    return {}


def events_ports(args: Sequence[Any]) -> list[int]:
    """The TCP ports a server's --kv-events-config binds (its endpoint and replay endpoint)."""
    config = events_config(args)
    if not config.get("enable_kv_cache_events"):
        return []
    endpoints = [config.get("endpoint", "tcp://*:5557"), config.get("replay_endpoint") or ""]
    return [int(m.group(1)) for e in endpoints if (m := _PORT.match(e))]


def events_picker(args: Sequence[Any]) -> str:
    """The picker that may read a server's events: <model>-epp, the model the topic's last segment."""
    return f"{str(events_config(args).get('topic', '')).rsplit('@', 1)[-1]}-epp"


def events_readers(policies: Sequence[Mapping[str, Any]], labels: Mapping[str, Any],
                   ports: Sequence[int], picker: str) -> Optional[list[str]]:
    """Who other than the pods of the picker `picker` the NetworkPolicy specs let reach `ports` on a
    pod with `labels`: None where none selects the pod (then every pod may), else each other peer."""
    selecting = [p for p in policies if _selects(p.get("podSelector") or {}, labels)
                 and "Ingress" in (p.get("policyTypes") or ["Ingress"])]
    if not selecting:
        return None
    others: list[str] = []
    for policy in selecting:
        for rule in policy.get("ingress") or []:
            if not _opens(rule.get("ports"), ports):
                continue
            peers = rule.get("from")
            if not peers:
                others.append("every source")
            others += [json.dumps(p, sort_keys=True) for p in peers or [] if not _is_picker(p, picker)]
    return others


def _selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    match = selector.get("matchLabels") or {}
    return not selector.get("matchExpressions") and all(labels.get(k) == v for k, v in match.items())


def _opens(rule_ports: Optional[Sequence[Mapping[str, Any]]], ports: Sequence[int]) -> bool:
    if not rule_ports:
        return True  # a rule without ports opens them all
    for p in rule_ports:
        port, end = p.get("port"), p.get("endPort")
        # A plan's numbers arrive as floats (Pulumi's wire form): 5557.0 is port 5557.
        if isinstance(port, bool) or not isinstance(port, (int, float)):
            return True  # every port, or a named one this check does not resolve
        if any(port <= q <= (end or port) for q in ports):
            return True
    return False


def _is_picker(peer: Mapping[str, Any], picker: str) -> bool:
    """The pods of the picker `picker`, in its pod's own namespace or one namespace named."""
    pods = (peer.get("podSelector") or {}).get("matchLabels") or {}
    namespaces = peer.get("namespaceSelector")
    one_namespace = namespaces is None or NAMESPACE_NAME_LABEL in (namespaces.get("matchLabels") or {})
    return (not peer.get("ipBlock") and one_namespace and pods.get(PICKER_NAME_LABEL[0]) == PICKER_NAME_LABEL[1]
            and pods.get(PICKER_POOL_LABEL) == picker)


def _enforced(resources: Sequence[Resource]) -> bool:
    clusters = [r for r in resources if r.type == "gcp:container/cluster:Cluster"]
    return all(c.props.get("datapathProvider") == "ADVANCED_DATAPATH" for c in clusters)


def kv_events_private(resources: Sequence[Resource]) -> Iterator[Finding]:
    policies = kube(resources, "NetworkPolicy")
    for workload, _, container in vllm_servers(resources):
        ports = events_ports(container.get("args") or [])
        if not ports:
            continue
        specs = [p.props.get("spec") or {} for p in policies if namespace_of(p) == namespace_of(workload)]
        readers = events_readers(specs, template_labels(workload), ports, events_picker(container.get("args") or []))
        if readers is None:
            yield workload, (f"{where(workload)}: publishes KV-cache events (every tenant's prompt tokens) on "
                             f"{', '.join(map(str, ports))} and no NetworkPolicy selects its pods: every pod may read "
                             "them; admit the endpoint picker's pods alone (picker_prefix.events_ingress)")
        elif readers:
            yield workload, (f"{where(workload)}: its KV-cache events' ports {', '.join(map(str, ports))} admit more "
                             f"than its pool's endpoint picker's pods ({PICKER_POOL_LABEL}="
                             f"{events_picker(container.get('args') or [])}): {'; '.join(readers)}")
        if not _enforced(resources):
            yield workload, (f"{where(workload)}: publishes KV-cache events on a cluster without Dataplane V2, which "
                             "enforces no NetworkPolicy: every pod may read them; set cluster.dataplaneV2 or "
                             "picker.prefixCache: approximate")
