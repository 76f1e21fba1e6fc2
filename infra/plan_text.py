"""The plan as tables and lines for people (`vllm-gke plan`'s text output), from the PlanReport that
the JSON output reads too: decisions first (capacity, cost, options, warnings, tenant URLs,
policies), then the checks, the resource counts last."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..components.model.picker_wake import picker_wakes
from ..components.model.sleep_mode import swap_lines
from ..policies.rules import POLICIES
from .cloud_run_plan import cloud_run_lines
from .config import StackConfig
from .contracts import CONTRACTS
from .disaggregation_text import pd_table
from .kv_offload_text import offload_lines
from .plan import Plan
from .plan_report import PlanReport, ResourceChecks
from .pricing import PRICE_REGION
from .provider_schema import sdk_version
from .report import TenantCeiling, Verdicts
from .speculative_plan import speculative_lines


def column(table: Table, header: str, right: bool = False) -> None:
    """A column whose values wrap where the terminal is narrow, never cut: a model name, a node
    pool or a tenant's URL is copied from here, and `llama-…` cannot be."""
    table.add_column(header, justify="right" if right else "left", overflow="fold")


# Columns whose values are names a user copies or searches for: kept whole wherever the width allows.
NAMES = frozenset({"model", "pool", "node pool", "accelerator", "machine", "tenant", "item", "policy", "type",
                   "component", "name", "base URL"})


def _longest(col: Any) -> int:
    """The column's longest value, or its header's longest word (rich never breaks a header word)."""
    words = max((len(w) for w in str(col.header).split()), default=0)
    # Column keeps its cells in _cells (rich has no public accessor).
    return max([words, *(Text.from_markup(str(c)).cell_len for c in col._cells)])


def fitted(table: Table, width: int) -> RenderableType:
    """The table at the terminal's width: every value (and header) on one line where they all fit;
    else every value whole; else the names whole and the other columns sharing what is left, folded;
    else every value folded; and where the columns cannot all have room for a value, one block per
    row (`header: value` lines). Nothing is cut."""
    # Fixed widths throughout: rich crops a table whose columns' minimum widths outgrow the console.
    need = [max(1, _longest(c)) for c in table.columns]
    full = [max(n, Text.from_markup(str(c.header)).cell_len) for n, c in zip(need, table.columns)]
    avail = width - 3 * len(need) - 1
    for widths in (full, need):
        if sum(widths) <= avail:
            for col, n in zip(table.columns, widths):
                col.width = n
            return table
    names = [i for i, c in enumerate(table.columns) if str(c.header) in NAMES]
    rest = [i for i in range(len(need)) if i not in names]
    spare = avail - sum(need[i] for i in names)
    if rest and spare >= 4 * len(rest):
        # Each other column 4 wide, and what is left shared out as each lacks: never above `spare`.
        extra = {i: max(0, need[i] - 4) for i in rest}
        left, lacking = spare - 4 * len(rest), sum(extra.values()) or 1
        for i, col in enumerate(table.columns):
            col.width = need[i] if i in names else 4 + min(extra[i], left * extra[i] // lacking)
        return table
    if avail >= 4 * len(need):
        return table  # rich shares the width out and folds every value
    return _records(table)


def _records(table: Table) -> RenderableType:
    """A table too wide for the terminal as one block per row: its title, `header: value` lines, its caption."""
    rows = list(zip(*(c._cells for c in table.columns)))  # rich has no public accessor for the cells
    lines: list[RenderableType] = [Text.from_markup(f"[bold]{table.title}[/]")] if table.title else []
    for row in rows:
        lines += [Text.from_markup(f"{c.header}: {v}") for c, v in zip(table.columns, row)] + [Text("")]
    return Group(*lines, *([Text.from_markup(str(table.caption))] if table.caption else []))


def render_text(report: PlanReport, console: Console, detail: bool) -> None:
    """Everything the report holds, in the order a person decides on it."""
    _decisions(report, console)
    _checks(report, console)
    # The resource counts last: what `pulumi up` creates, for those who read that far.
    console.print(fitted(resource_table(report.plan, detail), console.width))
    if report.written_under is not None:
        console.print(f"wrote {len(report.written)} files under {report.written_under}/ (manifests/, dashboard.json, "
                      "alert-policies.json, resources.json, verdicts.json, node-pools.mmd, routes.mmd)")


def _decisions(report: PlanReport, console: Console) -> None:
    # What a person decides on first: what it holds, what it costs, what to watch, where tenants call.
    v = report.verdicts
    capacity = capacity_table(v, frozenset(m.name for m in report.plan.config.models if m.speculative))
    # Pools at zero behind a picker: the wake against the queue's time-to-live (a warning where it is longer).
    # With models[].kvOffload, what its host tier holds and costs (infra/kv_offload_text.py).
    capacity.caption = escape("\n".join([*(w.line() for w in picker_wakes(report.plan.config)),
                                         *offload_lines(report.plan.config, v)])) or None
    capacity.caption_justify = "left"
    console.print(fitted(capacity, console.width))
    console.print(fitted(cost_table(v), console.width))
    console.print(fitted(options_table(report.plan.config, v), console.width))
    if (pd := pd_table(report.plan.config)) is not None:  # models[].disaggregation against aggregated
        console.print(fitted(pd, console.width))
    for line in swap_lines(report.plan.config):  # models[].sleepMode: memory, wake against cold start, trade-off
        console.print(escape(line), highlight=False)
    for line in speculative_lines(report.plan.config):  # models[].speculative: the gain's ceiling, where it ends
        console.print(escape(line), highlight=False)
    for line in cloud_run_lines(report.plan.config):  # cloudRun.models: cold start, price, break-even against GKE
        console.print(escape(line), highlight=False)
    if v.rollouts:
        console.print(whole_or_records(rollouts_table(v), console.width))
    for warning in v.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    for line in url_lines(v):
        # One line each, never broken by rich: the terminal wraps a long URL and it copies whole.
        console.print(line, soft_wrap=True, highlight=False)
    console.print(fitted(policy_table(v), console.width))
    for violation in v.violations:
        colour = "red" if violation.level == "mandatory" else "yellow"
        console.print(f"  [{colour}]{violation.level}[/] {violation.policy}: {escape(violation.message)}",
                      highlight=False)


def _checks(report: PlanReport, console: Console) -> None:
    _manifest_checks(report, console)
    provider_lines(console, report.provider_resources, report.provider_problems)
    for contract, problem in report.broken_contracts:
        console.print(f"[bold red]breaks the {contract.component} {contract.version} contract[/] "
                      f"({escape(contract.source)}): {escape(problem)}", highlight=False)
    if not report.broken_contracts:
        console.print(f"[green]all {len(CONTRACTS)} component contracts hold (docs/contracts.md)[/]")
    cfg = report.plan.config
    for what, err in report.vllm_args:
        console.print(f"[bold red]vLLM {cfg.vllm_version} would refuse[/] {escape(str(what))}: "
                      f"{escape(str(err))}", highlight=False)
    if not report.vllm_args:
        tpu = f" and vLLM TPU {cfg.tpu_vllm_version}'s" if cfg.has_tpu_models else ""
        console.print(f"[green]every vLLM command line parses with vLLM {cfg.vllm_version}'s{tpu} "
                      "parser (snapshot)[/]")
    for err in report.monitoring:
        console.print(f"[bold red]rejected by the Cloud Monitoring API's schema:[/] {escape(str(err))}",
                      highlight=False)
    if not report.monitoring:
        console.print("[green]dashboard and alert policies parse as Cloud Monitoring API messages[/]")


def _manifest_checks(report: PlanReport, console: Console) -> None:
    if report.manifest_problems:
        console.print(f"[bold red]{len(report.manifest_problems)} of {report.manifests} manifests fail schema "
                      "validation:[/]")
        for what, errs in report.manifest_problems:
            for err in errs:
                console.print(f"  - {escape(str(what))}: {escape(str(err))}", highlight=False)
    else:
        console.print(f"[green]all {report.manifests} Kubernetes manifests pass schema validation[/]")
    crd_line(console, report.custom_resources, report.custom_resources_checked, report.crd_origin)
    for what, why in report.unchecked:
        console.print(f"[yellow]not schema-checked: {escape(what)}: {escape(why)}[/]", highlight=False, soft_wrap=True)


def provider_lines(console: Console, count: int, problems: list[tuple[str, list[str]]]) -> None:
    """The Google Cloud resources against pulumi_gcp's input types (infra/provider_schema.py)."""
    for what, errs in problems:
        for err in errs:
            console.print(f"[bold red]not in its provider's schema:[/] {escape(what)}: {escape(err)}", highlight=False)
    if not problems:
        console.print(f"[green]all {count} Google Cloud resources, providers and Helm releases match their provider's "
                      f"input types (pulumi_gcp {sdk_version()}'s: keys, required keys, types, enums; no cross-field rules)[/]")


def crd_line(console: Console, count: int, checked: bool, origin: str) -> None:
    """Where the custom resources were checked from, or why not; one line the terminal wraps, so a
    URL in it copies whole."""
    if checked:
        console.print(f"{count} custom resources checked against the upstream CRDs at {escape(origin)}",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"[yellow]{count} custom resources not checked: {escape(origin)}[/]", highlight=False,
                      soft_wrap=True)


def resource_table(plan: Plan, detail: bool) -> Table:
    table = Table(title=f"stack {plan.stack}: {sum(r.custom for r in plan.resources)} resources")
    if detail:
        for col in ("component", "type", "name"):
            column(table, col)
        # Sorted: the order resources register in is the program's (and its outputs' resolution), not news.
        for row in sorted((plan.component_of(r), r.type, r.name) for r in plan.resources if r.custom):
            table.add_row(*row)
        return table
    column(table, "type")
    column(table, "count", right=True)
    for type_, n in sorted(Counter(r.type for r in plan.resources if r.custom).items()):
        table.add_row(type_, str(n))
    return table


def policy_table(v: Verdicts) -> Table:
    table = Table(title="policies")
    for col in ("policy", "level", "verdict"):
        column(table, col)
    for p in POLICIES:
        hits = [x for x in v.violations if x.policy == p.name]
        level = v.levels[p.name]
        verdict = "[dim]skipped[/]" if level == "disabled" else (
            f"[red]{len(hits)} violation(s)[/]" if hits else "[green]pass[/]")
        table.add_row(p.name, level, verdict)
    return table


def capacity_table(v: Verdicts, ceilings: frozenset[str] = frozenset()) -> Table:
    """`ceilings`: the models whose tokens/s is speculative decoding's ceiling (marked ≤), not a rate."""
    table = Table(title="capacity per serving pool (GB per device: GPU, MIG slice or TPU chip; tokens/s "
                        "per replica, the roofline's; ≤: speculative decoding's ceiling)")
    for col in ("model", "pool", "node pool", "GB", "devices x hosts", "weights", "LoRA",
                "KV budget", "KV tokens", "host KV tokens", "context", "seqs fit", "maxNumSeqs", "tokens/s", "fits",
                "to serve"):
        column(table, col, right=col not in ("model", "pool", "node pool"))
    for r in v.capacity:
        label = r.model + (f" ({r.tenant})" if r.tenant else "") + (f" canary {r.revision[:7]}" if r.canary else "")
        table.add_row(label, r.pool, r.node_pool,
                      f"{r.gpu_memory_gb:g}", f"{r.devices} x {r.hosts}", f"{r.weights_per_gpu_gb:.1f}",
                      f"{r.lora_per_gpu_gb:.2f}" if r.lora_per_gpu_gb else "-", f"{r.kv_budget_gb:.1f}",
                      f"{r.tokens_fit:,}", f"{r.host_kv_tokens:,}" if r.host_kv_tokens else "-",
                      f"{r.context_tokens:,}", str(r.seqs_fit),
                      str(r.max_num_seqs), ("≤" if r.model in ceilings else "") + f"{r.decode_tokens_s:,.0f}",
                      "[green]yes[/]" if r.fits else "[red]no[/]",
                      f"{r.cold_start_s / 60:.1f} min")
    return table


def options_table(cfg: StackConfig, v: Verdicts) -> Table:
    """Each model's GPU and TPU options side by side (infra/accelerator_options.py), with the replica
    the stack configures priced as the cost report prices it."""
    table = Table(title="accelerator options per model (per accelerator, the smallest machine whose whole GPUs or "
                        "TPU chips hold the short pool at the lowest $ a token, on-demand list prices; 'this stack': "
                        "the replica as configured, as the cost report prices it; ≤ and ≥: speculative decoding's "
                        "ceiling and the price at it; Cloud Run: one instance billed by the second, at the same "
                        "utilisation)")
    for col in ("model", "accelerator", "machine", "TP x PP", "hosts", "batch", "tokens/s", "$/h",
                "$/M tokens", "this stack"):
        column(table, col, right=col not in ("model", "accelerator", "machine", "this stack"))
    util = cfg.cost.target_utilization
    for model in [*cfg.models, *(m.as_model() for m in cfg.cloud_run_models)]:
        rows = sorted((o for o in v.options if o.model == model.name), key=lambda o: o.usd_per_million_tokens(util))
        at_most, at_least = ("≤", "≥") if model.speculative else ("", "")
        for o in rows:
            here = ("[green]this stack[/]" + (" (spot)" if o.spot else "")) if o.this_stack else ""
            here += " (Cloud Run)" if o.cloud_run else ""
            machine = o.machine_type + (f" {o.topology}" if o.topology else "")
            table.add_row(model.name, o.accelerator, machine, f"{o.tensor_parallel} x {o.pipeline_parallel}",
                          str(o.hosts), str(o.batch), f"{at_most}{o.tokens_per_second:,.0f}", f"{o.usd_per_hour:.2f}",
                          f"{at_least}{o.usd_per_million_tokens(util):.2f}", here)
    return table


def rollouts_table(v: Verdicts) -> Table:
    """How a change reaches each serving pool: a Flagger canary (its ceiling, largest share, analysis
    and what one rollout of it costs at most) or in place; why, or what the canary gave up to fit,
    under the table (a sentence each: in a column it would fold to a word a line)."""
    table = Table(title="rollouts per serving pool (a change rolls out as a Flagger canary held to the SLOs, or "
                        "in place; the canary's ceiling in replicas and in devices: GPUs, MIG slices or TPU chips; "
                        "$ a rollout, at most: the canary at its ceiling from its node and load to promotion, at a replica's "
                        "price above the floor as the cost report prices the peak)")
    for col in ("model", "pool", "rollout", "canary replicas", "devices", "max weight", "analysis",
                "$/h a replica", "$ a rollout"):
        column(table, col, right=col not in ("model", "pool", "rollout"))
    notes: list[str] = []
    for r in v.rollouts:
        label = r.model + (f" ({r.tenant})" if r.tenant else "")
        if r.note:
            notes.append(f"{label} {r.pool}: {r.note}")
        if r.mode != "canary":
            table.add_row(label, r.pool, "[yellow]in place[/]", "-", "-", "-", "-", "-", "-")
            continue
        table.add_row(label, r.pool, "canary", str(r.canary_replicas), str(r.devices), f"{r.max_weight}%",
                      f"{r.analysis_seconds / 60:g} min", f"{r.replica_usd_per_hour:,.2f}", f"{r.usd_per_rollout:,.2f}")
    table.caption = escape("\n".join(notes)) if notes else None
    table.caption_justify = "left"
    return table


def whole_or_records(table: Table, width: int) -> RenderableType:
    """A table of figures whose every value fits on one line (fitted()), else one block per row: a
    figure folded to four characters a line reads as two."""
    need = sum(max(1, _longest(c)) for c in table.columns) + 3 * len(table.columns) + 1
    return fitted(table, width) if need <= width else _records(table)


def ceiling_words(v: Verdicts) -> str:
    """What the rate limits let each tenant use in a month, in words that read as a bound, not a bill."""
    def one(t: TenantCeiling) -> str:
        if t.bound_by == "capacity":
            return (f"{t.tenant} {t.limit_tokens_month / 1e6:,.0f}M tokens, more than the replicas it calls make at "
                    f"peak ({t.tokens_month / 1e6:,.0f}M), so capacity bounds it: at most ${t.dollars_month:,.0f}")
        return (f"{t.tenant} up to {t.tokens_month / 1e6:,.0f}M tokens ({t.capacity_share:.0%} of what the replicas it "
                f"calls make at peak), at most ${t.dollars_month:,.0f}")
    return ("Ceilings, not forecasts: what each tenant's rate limit allows in a month: "
            + "; ".join(one(t) for t in v.ceilings) + ". What each did use and cost: vllm-gke report.") if v.ceilings else ""


def url_lines(v: Verdicts) -> list[str]:
    """Each tenant's OpenAI base URL per model, on a line of its own (how it gets there, and the
    header to send where one is needed)."""
    lines = ["[bold]tenant URLs[/] (OpenAI base URL per tenant and model; tenant, model: URL, via):"]
    for u in v.urls:
        header = f", send header {escape(u.header)}" if u.header else ""
        header += f", Google ID token for audience {escape(u.audience)}" if u.audience else ""
        lines.append(f"  {escape(u.tenant)}, {escape(u.model)}: {escape(u.url)} ({escape(u.via)}{header})")
    return lines


def cost_table(v: Verdicts) -> Table:
    c = v.cost
    table = Table(title=f"monthly cost, USD ({PRICE_REGION} list prices as of {c.prices_as_of}, "
                        f"{c.hours_per_month:g} h/month)")
    for col in ("item", "machine", "nodes (baseline-peak)", "$/h per node", "baseline", "peak"):
        column(table, col, right=col not in ("item", "machine"))
    for p in c.pools:
        price = f"{p.hour_price:.2f}" + (f" (burst {p.peak_hour_price:.2f} on-demand)"
                                          if p.peak_hour_price and p.peak_hour_price != p.hour_price else "")
        nodes = f"{p.baseline_nodes}-{p.peak_nodes}" + (f" (capped: {p.wanted_peak_nodes} wanted, {p.reach_nodes} at most)"
                                                         if p.capped else "")
        table.add_row(p.pool + (" (spot)" if p.spot else ""), p.machine_type, nodes, price,
                      f"{p.baseline_month:,.0f}", f"{p.peak_month:,.0f}")
    for item, month in c.fixed_month.items():
        table.add_row(item, "", "", "", f"{month:,.0f}", f"{month:,.0f}")
    table.add_row("[bold]total[/]", "", "", "", f"[bold]{c.baseline_month:,.0f}[/]", f"[bold]{c.peak_month:,.0f}[/]")
    how = ("the roofline's estimate per pool" if c.throughput_source == "roofline"
           else "cost.tokensPerSecondPerGpu per device")
    table.caption = (f"{c.baseline_tokens_per_second:,.0f} output tokens/s at baseline ({how}) x "
                     f"{c.utilization:.0%} utilisation: ${c.usd_per_million_tokens:.2f} per million tokens for the "
                     "whole stack (every baseline node and fixed cost; a replica alone: the options table's "
                     "'this stack' rows). " + ceiling_words(v))
    return table


def render_resource_checks(checks: ResourceChecks, console: Console, platforms: int) -> None:
    """Resources outside any Platform: schema and policy verdicts (no capacity or cost: those come
    from a Platform's settings)."""
    where = "beside the Platform" + ("s" if platforms > 1 else "") if platforms else "(no Platform in the program)"
    console.print(f"[bold]{checks.resources} resources {where}[/]: checked against their schemas and the policies; "
                  "capacity, cost and tenant URLs are a Platform's, so none here")
    for what, errs in checks.manifest_problems:
        for err in errs:
            console.print(f"  [red]invalid[/] {escape(str(what))}: {escape(str(err))}", highlight=False)
    if not checks.manifest_problems:
        console.print(f"[green]all {checks.manifests} Kubernetes manifests pass schema validation[/]")
    provider_lines(console, checks.provider_resources, checks.provider_problems)
    crd_line(console, checks.custom_resources, checks.custom_resources_checked, checks.crd_origin)
    for v in checks.violations:
        colour = "red" if v.level == "mandatory" else "yellow"
        console.print(f"  [{colour}]{v.level}[/] {v.policy}: {escape(v.message)}", highlight=False)
    if not checks.violations:
        console.print("[green]every policy passes[/]")
