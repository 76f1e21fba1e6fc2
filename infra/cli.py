"""`vllm-gke`: the offline front door. Runs the real stack program under Pulumi mocks.

Exit codes: 0 plan is clean, 1 the plan is unsafe (invalid manifest or a mandatory policy
violation), 2 bad config or input.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..components.model.vllm_argv import check_argv, load_snapshot
from ..components.model.vllm_versions import TPU_RELEASES, release
from ..policies.rules import POLICIES, resolve_levels
from .config import ConfigError, StackConfig
from .contracts import CONTRACTS
from .contracts import problems as contract_problems
from .crd_validation import CRD_DIR_ENV, DEFAULT_CRD_DIR
from .manifests import (
    catalog_or_none,
    describe,
    is_builtin,
    pod_templates,
    validate,
    validate_alert_policy,
    validate_dashboard,
    validate_slo,
)
from .plan import Plan, default_stacks_dir, run_plan
from .plan_output import write_plan
from .plan_pictures import pictures
from .pricing import PRICE_REGION
from .report import Verdicts, load_policy_config, verdicts
from .usage_report import period_problem, prometheus, read_metrics_file, usage_report

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan vllm-gke stacks offline: resources, manifests, dashboards, verdicts.")
console = Console(width=140)


def vllm_argv_problems(plan: Plan) -> list[tuple[str, str]]:
    """Every vLLM server's argv (a Deployment's, a LeaderWorkerSet's leader and workers) against its
    release's real parser (images/vllm-versions): the TPU build's on TPU nodes."""
    cfg = plan.config
    out = []
    for doc in plan.manifests():
        if doc.get("kind") not in ("Deployment", "LeaderWorkerSet"):
            continue
        for _role, template in pod_templates(doc):
            selector = template["spec"].get("nodeSelector") or {}
            rel = (TPU_RELEASES[cfg.tpu_vllm_version] if "cloud.google.com/gke-tpu-accelerator" in selector
                   else release(cfg.vllm_version))
            for c in template["spec"].get("containers", []):
                if "/opt/vllm-gke/serve.py" in c.get("command", []):
                    out += [(describe(doc), err) for err in check_argv(c.get("args", []), load_snapshot(rel.snapshot))]
    return out


def resource_table(plan: Plan, detail: bool) -> Table:
    table = Table(title=f"stack {plan.stack}: {sum(r.custom for r in plan.resources)} resources")
    if detail:
        for col in ("component", "type", "name"):
            table.add_column(col)
        for r in plan.resources:
            if r.custom:
                table.add_row(plan.component_of(r), r.type, r.name)
        return table
    table.add_column("type")
    table.add_column("count", justify="right")
    for type_, n in sorted(Counter(r.type for r in plan.resources if r.custom).items()):
        table.add_row(type_, str(n))
    return table


def policy_table(v: Verdicts) -> Table:
    table = Table(title="policies")
    for col in ("policy", "level", "verdict"):
        table.add_column(col)
    for p in POLICIES:
        hits = [x for x in v.violations if x.policy == p.name]
        level = v.levels[p.name]
        verdict = "[dim]skipped[/]" if level == "disabled" else (
            f"[red]{len(hits)} violation(s)[/]" if hits else "[green]pass[/]")
        table.add_row(p.name, level, verdict)
    return table


def capacity_table(v: Verdicts) -> Table:
    table = Table(title="capacity per serving pool (GB per device: GPU, MIG slice or TPU chip; tokens/s "
                        "per replica, the roofline's)")
    for col in ("model", "pool", "node pool", "GB", "devices x hosts", "weights", "LoRA",
                "KV budget", "KV tokens", "context", "seqs fit", "maxNumSeqs", "tokens/s", "fits", "to serve"):
        table.add_column(col, justify="right" if col not in ("model", "pool", "node pool") else "left")
    for r in v.capacity:
        label = r.model + (f" ({r.tenant})" if r.tenant else "") + (f" canary {r.revision[:7]}" if r.canary else "")
        table.add_row(label, r.pool, r.node_pool,
                      f"{r.gpu_memory_gb:g}", f"{r.devices} x {r.hosts}", f"{r.weights_per_gpu_gb:.1f}",
                      f"{r.lora_per_gpu_gb:.2f}" if r.lora_per_gpu_gb else "-", f"{r.kv_budget_gb:.1f}",
                      f"{r.tokens_fit:,}", f"{r.context_tokens:,}", str(r.seqs_fit),
                      str(r.max_num_seqs), f"{r.decode_tokens_s:,.0f}", "[green]yes[/]" if r.fits else "[red]no[/]",
                      f"{r.cold_start_s / 60:.1f} min")
    return table


def options_table(cfg: StackConfig, v: Verdicts) -> Table:
    """Each model's GPU and TPU options side by side (infra/accelerator_options.py)."""
    table = Table(title="accelerator options per model (per accelerator, the replica of whole GPUs or TPU chips "
                        "that holds its short pool at the lowest $ a token; roofline tokens/s, on-demand list prices)")
    for col in ("model", "accelerator", "machine", "TP x PP", "hosts", "batch", "tokens/s", "$/h",
                "$/M tokens", "this stack"):
        table.add_column(col, justify="left" if col in ("model", "accelerator", "machine", "this stack") else "right")
    util = cfg.cost.target_utilization
    for model in cfg.models:
        chosen = cfg.pool(model.node_pool).machine.accelerator
        for o in (o for o in v.options if o.model == model.name):
            here = "[green]chosen[/]" if chosen is not None and chosen.gke_type == o.accelerator else ""
            machine = o.machine_type + (f" {o.topology}" if o.topology else "")
            table.add_row(model.name, o.accelerator, machine, f"{o.tensor_parallel} x {o.pipeline_parallel}",
                          str(o.hosts), str(o.batch), f"{o.tokens_per_second:,.0f}", f"{o.usd_per_hour:.2f}",
                          f"{o.usd_per_million_tokens(util):.2f}", here)
    return table


def url_table(v: Verdicts) -> Table:
    table = Table(title="tenant URLs (OpenAI base URL per tenant and model)")
    for col in ("tenant", "model", "base URL", "via", "header to send"):
        table.add_column(col)
    for u in v.urls:
        table.add_row(u.tenant, u.model, u.url, u.via, u.header or "-")
    return table


def cost_table(v: Verdicts) -> Table:
    c = v.cost
    table = Table(title=f"monthly cost, USD ({PRICE_REGION} list prices as of {c.prices_as_of}, "
                        f"{c.hours_per_month:g} h/month)")
    for col in ("item", "machine", "nodes (baseline-peak)", "$/h per node", "baseline", "peak"):
        table.add_column(col, justify="left" if col in ("item", "machine") else "right")
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
                     f"{c.utilization:.0%} utilisation = ${c.usd_per_million_tokens:.2f} per million tokens. At their "
                     "rate limits, a month of each tenant at most: " + "; ".join(
                         f"{t.tenant} {t.tokens_month / 1e6:,.0f}M tokens, ${t.dollars_month:,.0f} "
                         f"({t.capacity_share:.0%} of baseline capacity)" for t in v.ceilings)
                     + ". What each did use and cost: vllm-gke report.")
    return table


def planned(stack: str, stacks_dir: Optional[Path]) -> Plan:
    """The stack's program run under mocks; a bad config is exit 2 with its key, never a traceback."""
    try:
        return run_plan(stack, stacks_dir)
    except ConfigError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None


@app.command()
def plan(
    stack: str = typer.Option("dev", "--stack", "-s", help="stack name: stacks/Pulumi.<stack>.yaml"),
    out: Path = typer.Option(Path("plan-out"), "--out", "-o", help="folder for manifests and JSON"),
    stacks_dir: Optional[Path] = typer.Option(
        None, "--stacks-dir", help="folder holding Pulumi.<stack>.yaml (default ./stacks, else this checkout's)"),
    detail: bool = typer.Option(False, "--detail", help="list every resource, not counts per type"),
    write: bool = typer.Option(True, "--write/--no-write", help="write files under --out"),
    policy_config: Optional[Path] = typer.Option(
        None, "--policy-config", help="enforcement levels, as for `pulumi preview --policy-pack-config`"),
    crds: Optional[Path] = typer.Option(
        None, "--crds", help=f"folder of upstream CRDs to validate custom resources against "
        f"(default ${CRD_DIR_ENV} or ../shared/upstream-crds)"),
    output: str = typer.Option("text", "--output", help="text (tables for people) or json (one document for "
                               "machines, on standard output)"),
) -> None:
    """Run the stack program under mocks and report what `pulumi up` would create."""
    if output not in ("text", "json"):
        console.print(f"[bold red]error:[/] --output {escape(output)}: use text or json", highlight=False)
        raise typer.Exit(2)
    try:
        levels = load_policy_config(policy_config)
        resolve_levels(levels)
    except (OSError, ValueError) as exc:
        console.print(f"[bold red]error:[/] --policy-config {escape(str(policy_config))}: {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    if crds is not None and not crds.is_dir():
        console.print(f"[bold red]error:[/] --crds {crds}: not a folder; point it at a folder of CRD YAML files",
                      highlight=False)
        raise typer.Exit(2)
    result = planned(stack, stacks_dir)
    report = verdicts(result, levels)
    docs = result.manifests()
    catalog = catalog_or_none(crds)
    problems = [(describe(doc), errs) for doc in docs if (errs := validate(doc, catalog))]
    broken = contract_problems(result)
    argv_errors = vllm_argv_problems(result)
    assert result.platform.observability is not None
    dashboard_errors = validate_dashboard(result.platform.observability.dashboard_definition)
    if (tenant_board := result.platform.observability.tenant_dashboard_definition) is not None:
        dashboard_errors += validate_dashboard(tenant_board)
    dashboard_errors += [e for p in result.platform.observability.alert_definitions for e in validate_alert_policy(p)]
    if (levels_ := result.platform.observability.service_levels) is not None:
        dashboard_errors += [e for s in levels_.slo_definitions for e in validate_slo(s)]
        dashboard_errors += [e for p in levels_.alert_definitions for e in validate_alert_policy(p)]
    files = write_plan(result, out, report.to_json(), pictures(result.config, report.cost)) if write else []

    if output == "json":
        sys.stdout.write(json.dumps({
            **report.to_json(),
            "checks": {"manifests": [{"resource": str(w), "errors": [str(e) for e in errs]} for w, errs in problems],
                       "contracts": [{"component": c.component, "source": c.source, "problem": p} for c, p in broken],
                       "vllmArgs": [{"resource": str(w), "error": str(e)} for w, e in argv_errors],
                       "monitoring": [str(e) for e in dashboard_errors],
                       "customResourcesChecked": catalog is not None},
            "written": [str(f) for f in files]}, indent=2, default=str) + "\n")
    else:
        # What a person decides on first: what it holds, what it costs, what to watch, where tenants call.
        console.print(capacity_table(report))
        console.print(cost_table(report))
        console.print(options_table(result.config, report))
        for warning in report.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        console.print(url_table(report))
        console.print(policy_table(report))
        for v in report.violations:
            colour = "red" if v.level == "mandatory" else "yellow"
            console.print(f"  [{colour}]{v.level}[/] {v.policy}: {escape(v.message)}", highlight=False)
        n_docs = len(docs)
        if problems:
            console.print(f"[bold red]{len(problems)} of {n_docs} manifests fail schema validation:[/]")
            for what, errs in problems:
                for err in errs:
                    console.print(f"  - {escape(str(what))}: {escape(str(err))}", highlight=False)
        else:
            console.print(f"[green]all {n_docs} Kubernetes manifests pass schema validation[/]")
        if catalog is None:
            custom = sum(not is_builtin(d) for d in docs)
            console.print(f"[yellow]{custom} custom resources not checked: no upstream CRDs at "
                          f"{crds or DEFAULT_CRD_DIR} (pass --crds DIR or set {CRD_DIR_ENV})[/]", highlight=False)
        for contract, problem in broken:
            console.print(f"[bold red]breaks the {contract.component} {contract.version} contract[/] "
                          f"({escape(contract.source)}): {escape(problem)}", highlight=False)
        if not broken:
            console.print(f"[green]all {len(CONTRACTS)} component contracts hold (docs/contracts.md)[/]")
        for what, err in argv_errors:
            console.print(f"[bold red]vLLM {result.config.vllm_version} would refuse[/] {escape(str(what))}: "
                          f"{escape(str(err))}", highlight=False)
        if not argv_errors:
            tpu = f" and vLLM TPU {result.config.tpu_vllm_version}'s" if result.config.has_tpu_models else ""
            console.print(f"[green]every vLLM command line parses with vLLM {result.config.vllm_version}'s{tpu} "
                          "parser (snapshot)[/]")
        for err in dashboard_errors:
            console.print(f"[bold red]rejected by the Cloud Monitoring API's schema:[/] {escape(str(err))}",
                          highlight=False)
        if not dashboard_errors:
            console.print("[green]dashboard and alert policies parse as Cloud Monitoring API messages[/]")
        # The resource counts last: what `pulumi up` creates, for those who read that far.
        console.print(resource_table(result, detail))
        if write:
            console.print(f"wrote {len(files)} files under {out / stack}/ (manifests/, dashboard.json, "
                          "alert-policies.json, resources.json, verdicts.json, node-pools.mmd, routes.mmd)")
    if problems or dashboard_errors or argv_errors or broken or report.mandatory:
        raise typer.Exit(1)


@app.command("schema")
def schema(out: Optional[Path] = typer.Option(None, "--out", "-o", help="file to write (default: standard output)")) -> None:
    """The component package's Pulumi schema, as `pulumi package get-schema` would give it, without the
    Pulumi CLI: for SDK generation and review."""
    import subprocess

    # In a process of its own: the provider's protos and google-cloud-monitoring's (which the plan's
    # checks load) both define google.rpc.Status, and one process cannot hold both.
    code = ("import json\nfrom vllm_gke.components.provider.host import package_schema\n"
            "print(json.dumps(package_schema(), indent=2, sort_keys=True))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        console.print(f"error: the component package's schema could not be built:\n{result.stderr[-2000:]}")
        raise typer.Exit(1)
    text = result.stdout
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        console.print(f"wrote {out}")


@app.command("docs")
def docs(check: bool = typer.Option(False, "--check", help="write nothing; exit 1 if a generated page is stale")) -> None:
    """Write the docs generated from the code (docs/reference/: config, policies, components; the code's
    layers and the copied blocks of README.md and docs/), then check every link of README.md and docs/."""
    from . import docs as generated

    if check:
        stale = generated.stale()
        for path in stale:
            console.print(f"stale: {path}; run: vllm-gke docs")
        if stale:
            raise typer.Exit(1)
    else:
        for path in generated.write():
            console.print(f"wrote {path}")
    broken = generated.broken_links(generated.doc_files())
    for problem in broken:
        console.print(f"broken link: {escape(problem)}")
    if broken:
        raise typer.Exit(1)
    console.print("[green]the docs are current and every link resolves[/]")


@app.command("report")
def usage(
    stack: str = typer.Option("dev", "--stack", "-s", help="stack name: stacks/Pulumi.<stack>.yaml"),
    period: str = typer.Option("30d", "--period", help="how far back from now (a PromQL duration: 7d, 30d, 12h)"),
    prometheus_url: Optional[str] = typer.Option(
        None, "--prometheus", help="a Prometheus query API holding the stack's metrics: Managed Prometheus's "
        "https://monitoring.googleapis.com/v1/projects/PROJECT/location/global/prometheus, or a frontend"),
    token_file: Optional[Path] = typer.Option(
        None, "--token-file", help="a file holding the bearer token for --prometheus (gcloud auth print-access-token)"),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="recorded answers (a file --save wrote) "
                                           "instead of --prometheus"),
    save: Optional[Path] = typer.Option(None, "--save", help="write the queries' answers here, for --metrics"),
    prompt_weight: float = typer.Option(0.25, "--prompt-weight", help="what a prompt token weighs against a "
                                        "generated one when a model's cost is split among tenants"),
    stacks_dir: Optional[Path] = typer.Option(None, "--stacks-dir"),
    output: str = typer.Option("text", "--output", help="text or json"),
) -> None:
    """Each tenant's tokens, requests, GPU-hours, TPU chip-hours and dollars over a period, from the stack's metrics and
    the price table (infra/usage_report.py says how the cost is split)."""
    period_wrong = period_problem(period)
    problems = ([period_wrong] if period_wrong else []) + \
        ([] if (prometheus_url is None) != (metrics is None) else ["give one of --prometheus URL or --metrics FILE"]) + \
        ([] if output in ("text", "json") else [f"--output {output}: use text or json"]) + \
        ([] if prompt_weight >= 0 else ["--prompt-weight: use 0 or more"])
    if problems:
        for p in problems:
            console.print(f"[bold red]error:[/] {escape(p)}", highlight=False)
        raise typer.Exit(2)
    result = planned(stack, stacks_dir)
    try:
        token = token_file.read_text().strip() if token_file else None
        ask = read_metrics_file(str(metrics)) if metrics else prometheus(str(prometheus_url), token)
    except (OSError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    answers: dict[str, Any] = {}

    def recorded(promql: str) -> list[dict[str, Any]]:
        answers[promql] = ask(promql)
        return answers[promql]
    try:
        report = usage_report(result, recorded, period, prompt_weight)
    except (OSError, ValueError) as exc:
        console.print(f"[bold red]error:[/] the metrics could not be read: {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    if save:
        save.write_text(json.dumps(answers, indent=1, sort_keys=True))
    if output == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
        return
    table = Table(title=f"stack {stack}: usage over the last {period} ({PRICE_REGION} list prices)")
    for col in ("tenant", "requests ok/refused/error/shed", "prompt tokens", "generated tokens",
                "GPU-hours", "TPU chip-hours", "dollars", "share"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for name, t in report.tenants.items():
        reqs = "/".join(f"{t.requests.get(o, 0):,.0f}" for o in ("ok", "refused", "error", "shed"))
        table.add_row(name, reqs, f"{t.prompt_tokens:,.0f}", f"{t.generation_tokens:,.0f}", f"{t.gpu_hours:,.1f}",
                      f"{t.tpu_chip_hours:,.1f}", f"{t.dollars:,.2f}",
                      f"{t.dollars / report.dollars:.1%}" if report.dollars else "-")
    console.print(table)
    for pod in report.unknown_pods:
        console.print(f"[yellow]note:[/] pod {escape(pod)} is no vLLM Deployment or group leader of this stack: "
                      "not priced")


@app.command("stacks")
def list_stacks(stacks_dir: Optional[Path] = typer.Option(None, "--stacks-dir")) -> None:
    """List the stacks that can be planned here."""
    for path in sorted((stacks_dir or default_stacks_dir()).glob("Pulumi.*.yaml")):
        console.print(path.name.split(".")[1])


def main(argv: Optional[list[str]] = None) -> None:
    app(argv)


if __name__ == "__main__":
    main()
