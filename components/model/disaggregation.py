"""Prefill/decode disaggregation, the model side (models[].disaggregation): the vLLM flags and
environment of both pools' pods, the transport NIXL moves the KV cache over, and the capacity model
that sizes the two pools and says when splitting them pays against the same model aggregated.

How a request runs (llm-d-router v0.10.0 docs/disaggregation.md): the endpoint picker picks a
decode pod and, when the prefix-based-pd-decider finds at least `minPromptTokens` uncached prompt
tokens, a prefill pod; the decode pod's routing sidecar sends the prompt to the prefill pod with
max_tokens 1, gets back `kv_transfer_params` (engine id, block ids, host and side-channel port) and
hands them to its own vLLM, whose NixlConnector handshakes with the prefill engine over the side
channel (ZMQ) and reads the blocks over UCX. The cluster side (the pods' roles, the sidecar, the
picker's P/D profile, the network paths) is disaggregation_cluster.py's and components/prefill_pool.py's.

The sizing (PdSizing) is the roofline's (throughput.py) at the same load both ways: prefill is
compute-bound (prompt tokens/s per replica), decode memory-bound (output tokens/s at the decode
pool's batch). Aggregated, one replica time-shares both, so it needs ceil(P/p + O/d) replicas and
every decode step also carries its share of the prefills: the time between output tokens stretches
by 1/(1 - P/(p N)) with N the replicas it runs (derived at pd_sizing). Split, the pools need
ceil(P/p) + ceil(O/d) (never fewer: the split only costs rounding and the transfer), and the decode
pool's steps carry no prefill, but each request's KV cache crosses the network before its first
token: prompt x KV bytes per token at the link's rate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

from . import capacity  # a cycle (capacity -> kv_offload -> vllm_server -> here): read at call time
from .catalog import MachineType
from .machine_prices import MACHINE_PRICES
from .specs import DisaggregationSpec, ModelSpec, NodePoolSpec, ServingPoolSpec
from .throughput import GB, NET_EFFICIENCY

if TYPE_CHECKING:
    from .capacity import PoolCapacity
    from .stack_config import StackConfig

Role = Literal["prefill", "decode"]
Transport = Literal["rdma", "tcp"]

# The pod label llm-d-router v0.10.0's prefill-filter and decode-filter select on
# (docs/disaggregation.md "Labeling Convention Flexibility").
ROLE_LABEL = "llm-d.ai/role"
# The port each engine's NIXL handshake listener binds (VLLM_NIXL_SIDE_CHANNEL_PORT, + the data-parallel
# rank: vllm 0.34.0 nixl/base_scheduler.py:76-79); its host, the pod's IP. vLLM's own default.
NIXL_SIDE_CHANNEL_PORT = 5600
# vLLM's connector and the routing sidecar's name for the same protocol (its --kv-connector).
CONNECTOR = "NixlConnector"
SIDECAR_KV_CONNECTOR = "nixlv2"
# The NIXL role of each pool's engine: 0.34 deprecates kv_both for NixlConnector and asks for these
# (nixl/connector.py:112-119). A decode (consumer) engine still prefills, locally, the prompts the
# decider keeps off the prefill pool: it reads remote blocks only for a request whose params say so.
KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
# UCX transports per transport: TCP copies the blocks through host memory (cuda_copy) onto sockets
# (no cuda_ipc: the pods share no IPC namespace); RDMA reads them GPU to GPU over the RDMA NICs.
UCX_TLS: dict[Transport, str] = {"tcp": "cuda_copy,tcp", "rdma": "rc,cuda_copy,gdr_copy"}
# The fabric a machine's RDMA NICs carry (catalog.MachineType.gpudirect). GPUDirect-TCPX(O) is not
# RDMA: UCX cannot use it, only NCCL's plugin can.
RDMA_FABRIC = "GPUDirect-RDMA"
# The disaggregated pays when an aggregated replica's prefills stretch the time between its output
# tokens by at least this (a third more), and the KV transfer adds at most this share to the prefill.
PAYS_ITL_STRETCH = 1.33
PAYS_TRANSFER_SHARE = 0.25
# ...and costs at most this much more per output token than the aggregated pool (the split's rounding:
# at most one more replica, a large share of a load that fits a few).
PAYS_COST_SHARE = 0.10
# NIXL's UCX backend runs num_threads + 1 UCX workers per agent (an agent a tensor-parallel rank), each
# listening on its own TCP port drawn from UCX_TCP_PORT_RANGE; vLLM 0.34 passes num_threads from
# kv_connector_extra_config, default 4 (nixl/base_worker.py:783-799), so a TP 4 pod wants 20 ports, and
# agents that find none free spin at startup for ever (reproduced with nixl-cu12 1.5.1). 0: one worker an
# agent, which the agent's own progress thread drives (NIXL's own default); the threads only split one
# rank's transfer across workers, and over TCP a rank's stream is bounded by UCX's rate (UCX_TCP_BYTES_S).
NIXL_NUM_THREADS = 0


class PrefillServingPool(ServingPoolSpec):
    """The prefill pool as a serving pool (what vllm_args, pool_capacity and the workload read); its
    class tells vllm_args which NIXL role the engine takes."""


def prefill_pool(model: ModelSpec) -> PrefillServingPool:
    """The model's prefill pool from models[].disaggregation.prefill; its sequences as long as the
    decode pool's (the prompts it prefills are theirs)."""
    spec = _spec(model)
    p = spec.prefill
    return PrefillServingPool(min_replicas=p.min_replicas, max_replicas=p.max_replicas, max_num_seqs=p.max_num_seqs,
                              max_num_batched_tokens=p.max_num_batched_tokens, max_model_len=model.short.max_model_len,
                              context_tokens=model.short.context_tokens)


def prefill_node_pool(model: ModelSpec) -> str:
    """The node pool the prefill replicas run on: the prefill pool's own, else the model's."""
    return _spec(model).prefill.node_pool or model.node_pool


def role_of(pool: ServingPoolSpec) -> Role:
    return "prefill" if isinstance(pool, PrefillServingPool) else "decode"


def kv_transfer_config(model: ModelSpec, role: Role) -> dict[str, Any]:
    """vLLM's KVTransferConfig (vllm 0.34.0 config/kv_transfer.py:84-130) for a pool's engine."""
    _spec(model)
    return {
        "kv_connector": CONNECTOR,
        "kv_role": KV_ROLES[role],
        # Blocks registered in GPU memory, read by the decode engine (NIXL's pull mode, the default).
        "kv_buffer_device": "cuda",
        # A transfer that fails (a prefill pod gone mid-read) recomputes the blocks on the decode
        # pod instead of failing the request (0.34's default: fail).
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"backends": ["UCX"], "num_threads": NIXL_NUM_THREADS},
    }


def kv_transfer_args(model: ModelSpec, role: Role) -> list[str]:
    """The --kv-transfer-config flag of a pool's engine; none for a model without disaggregation."""
    if model.disaggregation is None:
        return []
    return ["--kv-transfer-config", json.dumps(kv_transfer_config(model, role), separators=(",", ":"), sort_keys=True)]


def pool_kv_args(model: ModelSpec, pool: ServingPoolSpec) -> list[str]:
    """vllm_args' hook: the flag for the pool's role (a PrefillServingPool prefills, the rest decode)."""
    return kv_transfer_args(model, role_of(pool))


def rdma_ready(node_pool: NodePoolSpec) -> bool:
    """Whether pods on the node pool reach an RDMA NIC. None do today: no catalog machine carries
    GPUDirect-RDMA and vllm-gke attaches no extra node networks (infra/contracts/gpu_network.py)."""
    return node_pool.machine.gpudirect == RDMA_FABRIC


def transport(model: ModelSpec, node_pool: NodePoolSpec, peer: Optional[NodePoolSpec] = None) -> Transport:
    """What UCX moves the blocks over between the pod's node pool and the other pool's (`peer`):
    `auto` takes RDMA only where both have it, so with the peer unknown, TCP (both sides must agree).
    `rdma` where one lacks it is refused by the config rules (config_rules/disaggregation.py)."""
    wanted = _spec(model).transport
    if wanted != "auto":
        return wanted
    return "rdma" if peer is not None and rdma_ready(node_pool) and rdma_ready(peer) else "tcp"


def kv_transfer_env(model: ModelSpec, node_pool: NodePoolSpec, peer: Optional[NodePoolSpec] = None) -> list[dict[str, Any]]:
    """The environment NIXL reads on either pool's pods (vllm 0.34.0 envs.py:1820-1827; llm-d-router
    v0.10.0 test/sidecar/config/nixl/*-pod.yaml sets the same): the side channel on the pod's IP,
    so the decode pod's handshake reaches it, and UCX's transports (`peer`: the other pool's node pool;
    pass it, or both sides get TCP)."""
    return [
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        {"name": "UCX_TLS", "value": UCX_TLS[transport(model, node_pool, peer)]},
    ]


def ucx_listeners(ranks: int, num_threads: int = NIXL_NUM_THREADS) -> int:
    """TCP ports UCX listens on in a pod of `ranks` NIXL agents: num_threads + 1 workers each (per interface)."""
    return ranks * (num_threads + 1)


def _spec(model: ModelSpec) -> DisaggregationSpec:
    if model.disaggregation is None:
        raise ValueError(f"model '{model.name}' has no disaggregation")
    return model.disaggregation


# What one NIXL agent reaches over UCX's TCP transport: 0.59 GB/s, one nixlbench pair (READ, staged
# through host memory) between two A3 hosts (openucx/ucx#10854; NCCL over the same machines'
# GPUDirect-TCPX: 40+ GB/s). A replica runs one agent a rank, each reading its own shard of the blocks
# in parallel: assumed to add up to the NIC's share, not measured at TP > 1. (vllm-project/vllm#52607's
# 0.5 GB/s is another thing: a same-node cuda_ipc fallback, which 0.34's push mode fixes.)
UCX_TCP_BYTES_S = 0.59 * GB
# Over RDMA each GPU reads through its own NIC (GPUDirect-RDMA machines carry one 400 Gbps NIC a GPU);
# NIXL over UCX reached 85% of such a NIC's line rate (ai-dynamo/nixl#1647: 341 of 400 Gb/s).
RDMA_BYTES_S_PER_GPU = 400 / 8 * GB * 0.85


def link_bytes_s(machine: MachineType, how: Transport, devices: int) -> float:
    """Bytes a second a replica's KV transfer reaches, one stream a rank: over TCP, UCX's measured rate
    a rank, bounded by the replica's share of the node's NIC at what sockets reach of it
    (throughput.NET_EFFICIENCY); over RDMA, each of its GPUs' NIC. 0 where the machine states no NIC."""
    if how == "rdma":
        return devices * RDMA_BYTES_S_PER_GPU
    nic_share = machine.nic_gbps / 8 * GB * NET_EFFICIENCY * min(1.0, devices / max(1, machine.gpus))
    return min(devices * UCX_TCP_BYTES_S, nic_share)


@dataclass(frozen=True)
class PdSizing:
    """The two pools sized for a load, beside the same model aggregated on the decode pool's machines."""

    model: str
    prompt_tokens_s: float
    output_tokens_s: float
    prompt_tokens: int  # a typical request's prompt (the decode pool's contextTokens split by the load's ratio)
    prefill_rate: float  # prompt tokens/s of one prefill replica
    decode_rate: float  # output tokens/s of one decode replica at its batch
    aggregated_prefill_rate: float  # the same, on the decode pool's machines (where aggregated runs)
    prefill_replicas: int
    decode_replicas: int
    aggregated_replicas: int
    devices: int  # GPUs per replica (each pool's replica is the model's)
    prefill_usd_hour: float  # one replica's share of its machine
    decode_usd_hour: float
    transport: Transport
    transfer_s: float  # a typical prompt's KV cache over the transport
    rdma_transfer_s: float  # the same over RDMA (what machines with RDMA NICs would take)
    prefill_s: float  # its prefill on a prefill replica (TTFT's compute part)
    itl_stretch: float  # an aggregated replica's time between output tokens over a decode replica's
    decode_itl_s: float  # a decode replica's time between a sequence's output tokens, at its batch
    min_prompt_tokens: int  # the decider's threshold: shorter uncached prompts stay on the decode pod
    sized_for_load: bool  # load given; else the pools' own minReplicas stand in for it (a synthetic verdict)
    configured_prefill: int  # maxReplicas of the prefill and decode pools as configured
    configured_decode: int

    @property
    def gpus(self) -> int:
        return (self.prefill_replicas + self.decode_replicas) * self.devices

    @property
    def aggregated_gpus(self) -> int:
        return self.aggregated_replicas * self.devices

    def usd_per_million(self, disaggregated: bool) -> float:
        """Dollars per million output tokens at this load (prompt tokens ride along)."""
        hour = (self.prefill_replicas * self.prefill_usd_hour + self.decode_replicas * self.decode_usd_hour
                if disaggregated else self.aggregated_replicas * self.decode_usd_hour)
        return hour / (self.output_tokens_s * 3600) * 1e6

    @property
    def aggregated_ttft_s(self) -> float:
        """A typical prompt's prefill on an aggregated replica (queueing aside)."""
        return self.prompt_tokens / self.aggregated_prefill_rate

    @property
    def ttft_s(self) -> float:
        """Its prefill on a prefill replica, then its KV cache across to the decode pod."""
        return self.prefill_s + self.transfer_s

    @property
    def pays(self) -> bool:
        return not self.reasons_against

    @property
    def reasons_against(self) -> list[str]:
        """Why splitting the pools does not pay at this load (empty: it does)."""
        out: list[str] = []
        if self.prompt_tokens < self.min_prompt_tokens:
            out.append(f"a typical prompt (~{self.prompt_tokens:,} tokens) is under minPromptTokens "
                       f"({self.min_prompt_tokens:,}): the decider prefills it on the decode pod, and the prefill pool idles")
        if self.itl_stretch < PAYS_ITL_STRETCH:
            out.append(f"prefill stretches an aggregated replica's inter-token time only {self.itl_stretch:.2f}x "
                       f"(under {PAYS_ITL_STRETCH:g}x): little decode latency to win")
        if self.transfer_s > PAYS_TRANSFER_SHARE * self.prefill_s:
            out.append(f"the KV transfer over {self.transport} ({self.transfer_s * 1e3:.0f} ms) adds over "
                       f"{PAYS_TRANSFER_SHARE:.0%} to the prefill ({self.prefill_s * 1e3:.0f} ms) before the first token")
        split, together = self.usd_per_million(True), self.usd_per_million(False)
        if split > (1 + PAYS_COST_SHARE) * together:
            out.append(f"the pools' rounding takes {self.gpus - self.aggregated_gpus:+d} GPUs: ${split:.2f} per million "
                       f"output tokens against ${together:.2f} aggregated (+{split / together - 1:.0%}; the load fits "
                       "too few replicas for a whole extra one to vanish)")
        return out


def pd_sizing(model: ModelSpec, decode_pool: NodePoolSpec, prefill_np: NodePoolSpec) -> PdSizing:
    """Size both pools for models[].disaggregation.load (unset: what the decode pool's minReplicas
    generate, with prompts in the ratio the prefill pool's minReplicas prefill)."""
    spec, prefill = _spec(model), prefill_pool(model)
    decode_row = capacity.pool_capacity(model, "short", model.short, decode_pool)
    prefill_row = capacity.pool_capacity(model, "prefill", prefill, prefill_np)
    p_rate, d_rate = prefill_row.prefill_tokens_s, decode_row.decode_tokens_s
    if spec.load is not None:
        prompt_s, output_s = spec.load.prompt_tokens_per_second, spec.load.output_tokens_per_second
    else:
        prompt_s, output_s = prefill.min_replicas * p_rate, max(1, model.short.min_replicas) * d_rate
    prompt = int(decode_row.context_tokens * prompt_s / (prompt_s + output_s))
    how = transport(model, prefill_np, decode_pool)
    devices = model.devices_per_replica
    link = min(link_bytes_s(prefill_np.machine, how, devices), link_bytes_s(decode_pool.machine, how, devices))
    kv_bytes = prompt * model.kv_bytes_per_token
    agg_p = decode_row.prefill_tokens_s
    aggregated = math.ceil(prompt_s / agg_p + output_s / d_rate)
    # Aggregated, N replicas share the load: each prefills P/N prompt tokens a second, which keeps it
    # busy a share f = P/(p N) of the time, and decodes in the rest, so a sequence's next token waits
    # 1/(1 - f) times a decode replica's step: the stretch 1/(1 - P/(p N)). N >= P/p + O/d > P/p keeps
    # f under 1; at exactly N = P/p + O/d it is 1 + (P/p)/(O/d), rounding N up lowers it.
    return PdSizing(
        model=model.name, prompt_tokens_s=prompt_s, output_tokens_s=output_s, prompt_tokens=prompt,
        prefill_rate=p_rate, decode_rate=d_rate, aggregated_prefill_rate=agg_p,
        prefill_replicas=math.ceil(prompt_s / p_rate), decode_replicas=math.ceil(output_s / d_rate),
        aggregated_replicas=aggregated, devices=model.devices_per_replica,
        prefill_usd_hour=replica_usd_hour(model, prefill_np), decode_usd_hour=replica_usd_hour(model, decode_pool),
        transport=how, transfer_s=kv_bytes / link if link > 0 else math.inf,
        rdma_transfer_s=kv_bytes / (devices * RDMA_BYTES_S_PER_GPU),
        prefill_s=prompt / p_rate,
        itl_stretch=1 / (1 - prompt_s / (agg_p * aggregated)),
        decode_itl_s=min(decode_row.max_num_seqs, max(1, decode_row.seqs_fit)) / d_rate,
        min_prompt_tokens=spec.min_prompt_tokens, sized_for_load=spec.load is not None,
        configured_prefill=prefill.max_replicas,
        configured_decode=model.short.max_replicas)


def prefill_capacity(cfg: "StackConfig") -> list["PoolCapacity"]:
    """One capacity row per prefill pool (pool "prefill") on its node pool: the cost report's prefill replicas."""
    return [capacity.pool_capacity(m, "prefill", prefill_pool(m), cfg.pool(name))
            for m, name in capacity.prefill_placements(cfg)]


def replica_usd_hour(model: ModelSpec, node_pool: NodePoolSpec) -> float:
    """One replica's share of its node pool's machines (spot where spot), at list price."""
    price = MACHINE_PRICES[node_pool.machine_type]
    hour = price.spot_hour if node_pool.spot else price.on_demand_hour
    return hour * model.devices_per_replica / node_pool.slices_per_node
