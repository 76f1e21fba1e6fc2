"""vLLM's NIXL connector, which moves a prompt's KV cache from a prefill pod to a decode pod
(models[].disaggregation, components/model/disaggregation.py): the role each engine takes, the side
channel the decode engine handshakes on, and the options that would replace the connector."""

from __future__ import annotations

import json
from typing import Any, Iterator

from ...components.model.disaggregation import CONNECTOR, KV_ROLES, NIXL_SIDE_CHANNEL_PORT, ROLE_LABEL, ucx_listeners
from ..plan import Plan
from .base import Contract, _docs, _flag

VLLM = "vllm-project/vllm@v0.34.0:vllm"
NIXL = f"{VLLM}/distributed/kv_transfer/kv_connector/v1/nixl"


def _nixl_containers(plan: Plan) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(workload, its pods' P/D role label, the vLLM container, its --kv-transfer-config) for every vLLM
    container that has a KV transfer config or sits in a pod labelled with a P/D role."""
    for kind in ("Deployment", "LeaderWorkerSet"):
        for d in _docs(plan, kind):
            if kind == "Deployment":
                templates = [d["spec"]["template"]]
            else:
                lw = d["spec"]["leaderWorkerTemplate"]
                templates = [t for t in (lw.get("leaderTemplate"), lw.get("workerTemplate")) if t]
            for t in templates:
                role = ((t.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "")
                for c in t["spec"]["containers"]:
                    raw = _flag(c.get("args") or [], "--kv-transfer-config")
                    if c["name"] == "vllm" and (raw or role in KV_ROLES):
                        yield f"{d['metadata'].get('namespace', '')}/{d['metadata']['name']}", role, c, json.loads(raw or "{}")


def nixl_role_per_pod(plan: Plan) -> list[str]:
    """A prefill pod's engine produces KV blocks, a decode pod's consumes them: NixlConnector in the
    role the pod's label gives it, never the deprecated kv_both, and loads that fail recomputed."""
    out: list[str] = []
    roles: dict[str, str] = {**KV_ROLES}
    for name, role, _c, cfg in _nixl_containers(plan):
        want = roles.get(role)
        if cfg.get("kv_connector") != CONNECTOR or want is None or cfg.get("kv_role") != want:
            out.append(f"{name}: {ROLE_LABEL}={role or '(none)'} runs {cfg.get('kv_connector')} as "
                       f"{cfg.get('kv_role')}, not {CONNECTOR} as {want}: kv_both is deprecated for NIXL, and a pod "
                       "without its role is never picked for it")
        elif cfg.get("kv_load_failure_policy") != "recompute":
            out.append(f"{name}: kv_load_failure_policy {cfg.get('kv_load_failure_policy', 'fail')}: a prefill pod "
                       "gone mid-transfer fails the request instead of recomputing its blocks")
    return out


def nixl_side_channel_on_the_pod_ip(plan: Plan) -> list[str]:
    """The prefill engine hands the decode engine its side channel's host and port in the request's
    kv_transfer_params; vLLM's default host is localhost, which no other pod reaches, and the port is
    the base plus the data-parallel rank (one rank here: the one port the network paths open)."""
    out = []
    for name, _role, c, _cfg in _nixl_containers(plan):
        env = {e["name"]: e for e in c.get("env") or []}
        host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", {})
        if (host.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
            out.append(f"{name}: VLLM_NIXL_SIDE_CHANNEL_HOST is not the pod's IP (default localhost): the decode "
                       "pod's handshake cannot reach the prefill engine")
        if env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", {}).get("value") != str(NIXL_SIDE_CHANNEL_PORT):
            out.append(f"{name}: VLLM_NIXL_SIDE_CHANNEL_PORT is not {NIXL_SIDE_CHANNEL_PORT}, the port the pools' "
                       "network paths open")
        if (_flag(c.get("args") or [], "--data-parallel-size") or "1") != "1":
            out.append(f"{name}: data parallel: each rank listens on the port plus its rank, which no path opens")
    return out


def nixl_connector_not_replaced(plan: Plan) -> list[str]:
    """--kv-offloading-size sets the KV connector to vLLM's OffloadingConnector over whatever
    --kv-transfer-config named: the decode engine would never read the prefill pod's blocks."""
    return [f"{name}: --kv-offloading-size replaces {CONNECTOR} with the OffloadingConnector"
            for name, _role, c, _cfg in _nixl_containers(plan) if _flag(c.get("args") or [], "--kv-offloading-size")]


# vLLM 0.34's num_threads where kv_connector_extra_config names none (nixl/base_worker.py:789-791).
VLLM_NUM_THREADS = 4


def _port_count(span: str) -> int:
    """Ports in a UCX_TCP_PORT_RANGE value ("first-last"); 0 where unset or not a range."""
    first, _, last = span.partition("-")
    return int(last) - int(first) + 1 if first.isdigit() and last.isdigit() and int(last) >= int(first) else 0


def nixl_ucx_ports_cover_the_agents(plan: Plan) -> list[str]:
    """Each rank's NIXL agent runs num_threads + 1 UCX workers, each listening on a TCP port of
    UCX_TCP_PORT_RANGE: a pod's range must hold TP x PP x (num_threads + 1) of them, or the agents
    that find none spin at startup for ever."""
    out: list[str] = []
    for name, _role, c, cfg in _nixl_containers(plan):
        args = c.get("args") or []
        ranks = int(_flag(args, "--tensor-parallel-size") or 1) * int(_flag(args, "--pipeline-parallel-size") or 1)
        threads = int((cfg.get("kv_connector_extra_config") or {}).get("num_threads", VLLM_NUM_THREADS))
        span = {e["name"]: e.get("value", "") for e in c.get("env") or []}.get("UCX_TCP_PORT_RANGE", "")  # the last wins
        need, have = ucx_listeners(ranks, threads), _port_count(span)
        if have < need:
            out.append(f"{name}: UCX_TCP_PORT_RANGE '{span or '(unset)'}' holds {have} ports, but {ranks} NIXL agents x "
                       f"({threads} threads + 1) UCX workers listen on {need}: the agents without a port never start")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("vLLM NIXL connector", "0.34.0",
             "--kv-transfer-config's JSON is a KVTransferConfig (kv_connector, kv_role, kv_buffer_device, "
             "kv_load_failure_policy, kv_connector_extra_config); NixlConnector resolves to NixlPullConnector "
             "(transfer_mode pull by default: the decode engine reads the blocks); kv_both is deprecated for NIXL, "
             "kv_producer for prefill and kv_consumer for decode instead; a load that fails fails the request unless "
             "the policy is recompute",
             f"{VLLM}/config/kv_transfer.py:84-130, {VLLM}/distributed/kv_transfer/kv_connector/factory.py:126-131, "
             f"{NIXL}/connector.py:112-119, {NIXL}/base_worker.py:683-685",
             "components/model/disaggregation.py: kv_producer on the prefill pool (llm-d.ai/role: prefill), "
             "kv_consumer on the decode pool, backends UCX, recompute; tests/test_disaggregation.py builds it in "
             "vLLM 0.34's own config", nixl_role_per_pod),
    Contract("vLLM NIXL connector", "0.34.0",
             "each engine's handshake listener binds VLLM_NIXL_SIDE_CHANNEL_HOST (default localhost) at "
             "VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600) + its data-parallel rank; the prefill engine returns that "
             "host and port as remote_host/remote_port in kv_transfer_params, and the decode engine connects there "
             "over ZMQ TCP",
             f"{VLLM}/envs.py:1820-1827, {NIXL}/base_scheduler.py:76-79, {NIXL}/base_scheduler.py:343-357, "
             f"{NIXL}/pull_scheduler.py:281-289, {NIXL}/base_worker.py:1215-1222",
             "both pools' pods set the host from status.podIP and the port to disaggregation.NIXL_SIDE_CHANNEL_PORT "
             "(the port their network paths open), one data-parallel rank", nixl_side_channel_on_the_pod_ip),
    Contract("vLLM NIXL connector", "0.34.0",
             "with --kv-offloading-size the engine sets kv_transfer_config's connector to its OffloadingConnector "
             "(native backend) or LMCacheMPConnector and kv_role to kv_both, whatever --kv-transfer-config named",
             f"{VLLM}/config/vllm.py:1072-1106",
             "config_rules/disaggregation.py refuses kvOffload and connector flags in extraArgs on a disaggregated "
             "model", nixl_connector_not_replaced),
    Contract("vLLM NIXL connector", "0.34.0",
             "each rank's NIXL agent is made with kv_connector_extra_config's num_threads (default 4); NIXL's UCX "
             "backend runs num_threads + 1 UCX workers an agent, each listening on its own TCP port from "
             "UCX_TCP_PORT_RANGE, and an agent that finds no free port in the range spins at startup (reproduced with "
             "nixl-cu12 1.5.1: TP 4 at the default wants 20 ports)",
             f"{NIXL}/base_worker.py:783-799",
             "components/model/disaggregation.py sets num_threads 0 (one listener a rank); the pods' UCX_TCP_PORT_RANGE "
             "(disaggregation_cluster.UCX_PORTS) must hold TP x PP x (num_threads + 1)", nixl_ucx_ports_cover_the_agents),
)
