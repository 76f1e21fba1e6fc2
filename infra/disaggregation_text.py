"""The plan's prefill/decode table (models[].disaggregation): each disaggregated model's two pools
sized for its load beside the same model aggregated on the decode pool's machines - GPUs, $ an hour
and per million output tokens, the time between output tokens, the first token's time with the KV
transfer over the transport - and whether splitting pays (components/model/disaggregation.py)."""

from __future__ import annotations

from typing import Optional

from rich.markup import escape
from rich.table import Table

from ..components.model.disaggregation import UCX_TCP_BYTES_S, PdSizing, pd_sizing, prefill_node_pool
from ..components.model.stack_config import StackConfig

GUIDE = "docs/guides/disaggregation.md"


def pd_sizings(cfg: StackConfig) -> list[PdSizing]:
    pools = {p.name: p for p in cfg.node_pools}
    return [pd_sizing(m, pools[m.node_pool], pools[prefill_node_pool(m)]) for m in cfg.models if m.disaggregation]


def pd_table(cfg: StackConfig) -> Optional[Table]:
    sizings = pd_sizings(cfg)
    if not sizings:
        return None
    table = Table(title="prefill/decode disaggregation against the same model aggregated, at the load it is sized for "
                        "(the roofline's rates; TTFT without queueing)")
    for col in ("model", "layout", "replicas", "GPUs", "$/h", "$/M output", "inter-token", "TTFT", "pays"):
        # Folded where the terminal is narrow, never cut (as plan_text.column).
        table.add_column(col, justify="left" if col in ("model", "layout", "pays") else "right", overflow="fold")
    for s in sizings:
        agg_hour = s.aggregated_replicas * s.decode_usd_hour
        pd_hour = s.prefill_replicas * s.prefill_usd_hour + s.decode_replicas * s.decode_usd_hour
        table.add_row(s.model, "aggregated", str(s.aggregated_replicas), str(s.aggregated_gpus), f"{agg_hour:,.2f}",
                      f"{s.usd_per_million(False):.2f}", f"{s.decode_itl_s * s.itl_stretch * 1e3:.0f} ms",
                      f"{s.aggregated_ttft_s * 1e3:.0f} ms", "")
        table.add_row("", f"P/D over {s.transport}", f"{s.prefill_replicas} P + {s.decode_replicas} D", str(s.gpus),
                      f"{pd_hour:,.2f}", f"{s.usd_per_million(True):.2f}", f"{s.decode_itl_s * 1e3:.0f} ms",
                      f"{s.prefill_s * 1e3:.0f} + {s.transfer_s * 1e3:.0f} ms", "[green]yes[/]" if s.pays else "[red]no[/]")
    table.caption = escape("\n".join(line for s in sizings for line in [*pd_lines(s), unencrypted_line(s)]))
    table.caption_justify = "left"
    return table


def pd_lines(s: PdSizing) -> list[str]:
    """The load, the transfer's cost, the verdict's reasons and a pool configured below its load."""
    lines = [f"{s.model}: {s.prompt_tokens_s:,.0f} prompt + {s.output_tokens_s:,.0f} output tokens/s, prompts of "
             f"~{s.prompt_tokens:,} tokens; a replica prefills {s.prefill_rate:,.0f} tokens/s and decodes "
             f"{s.decode_rate:,.0f}; each prompt's KV cache crosses {s.transport} in {s.transfer_s * 1e3:.0f} ms "
             f"({s.transfer_s / s.prefill_s:.0%} of its prefill); aggregated, prefills stretch the inter-token time "
             f"{s.itl_stretch:.2f}x."]
    if not s.sized_for_load:
        lines.append(f"{s.model}: no disaggregation.load: the load above is what the pools' minReplicas make, so the "
                     "verdict is synthetic; set load to the traffic you expect.")
    if s.transport == "tcp":
        lines.append(f"{s.model}: over TCP one NIXL agent reaches ~{UCX_TCP_BYTES_S / 1e9:.2g} GB/s (one nixlbench pair, "
                     f"UCX staging the blocks through host memory); the {s.devices} ranks' agents are assumed to add up "
                     "to the NIC's share, which is not measured; machines with GPUDirect-RDMA NICs, which vllm-gke does "
                     f"not provision, would move them in {s.rdma_transfer_s * 1e3:.0f} ms.")
    if s.pays:
        lines.append(f"{s.model}: disaggregation pays: {s.itl_stretch:.2f}x faster output for "
                     f"{s.gpus - s.aggregated_gpus:+d} GPUs ({GUIDE}).")
    else:
        lines.append(f"{s.model}: disaggregation does not pay at this load: {'; '.join(s.reasons_against)}; serve it "
                     f"aggregated ({GUIDE}).")
    if s.prefill_replicas > s.configured_prefill or s.decode_replicas > s.configured_decode:
        lines.append(f"{s.model}: the load needs {s.prefill_replicas} prefill and {s.decode_replicas} decode replicas, "
                     f"more than maxReplicas ({s.configured_prefill} and {s.configured_decode}): raise "
                     "disaggregation.prefill.maxReplicas or short.maxReplicas.")
    return lines


def unencrypted_line(s: PdSizing) -> str:
    """What it costs besides GPUs (the issue asks): the mesh encrypts neither transfer between the pools
    (components/model/disaggregation_cluster.prefill_service_spec says why)."""
    return (f"{s.model}: the prefill leg (the tenant's token and prompt) and its KV cache cross the node network "
            "unencrypted inside the VPC: the routing sidecar sends the prompt to a prefill pod's IP, which the mesh "
            f"passes through without mTLS, and NIXL's ports bypass the mesh ({GUIDE}).")
