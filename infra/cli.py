"""`vllm-gke`: the offline front door. Runs the real stack program under Pulumi mocks.

Exit codes: 0 plan is clean, 1 the plan is unsafe (invalid manifest or a mandatory policy
violation), 2 bad config or input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..components.model.config_errors import in_program_words
from ..policies.rules import resolve_levels
from . import docs as generated
from .config import ConfigError
from .crd_cache import OFFLINE_ENV, CrdFolder, crd_folder
from .crd_validation import CRD_DIR_ENV
from .plan import Plan, default_stacks_dir, run_plan
from .plan_report import plan_report, render_json, render_program_json, resource_checks
from .plan_text import column, render_resource_checks, render_text
from .preview import Program, choose_stack, outside_platforms, platform_plans, program_config, read_project, run_user_program
from .pricing import PRICE_REGION
from .report import load_policy_config
from .usage_report import UsageReport, period_problem, prometheus, read_metrics_file, usage_report

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan vllm-gke stacks offline: resources, manifests, dashboards, verdicts.")
def console() -> Console:
    """A console at the terminal's width as it is now (rich reads the terminal, else $COLUMNS, else
    80): one made at import would keep the width of that moment. Tables fold long values onto more
    lines instead of cutting them."""
    return Console()


def fail(*messages: str) -> NoReturn:
    """Bad input: each message on its own line, exit 2, never a traceback."""
    for message in messages:
        console().print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(2) from None


def planned(stack: str, stacks_dir: Optional[Path]) -> Plan:
    """The stack's program run under mocks; a bad config is exit 2 with its key, never a traceback."""
    try:
        return run_plan(stack, stacks_dir)
    except ConfigError as exc:
        fail(str(exc))


CRDS_HELP = (f"folder of upstream CRDs to validate custom resources against (default ${CRD_DIR_ENV}, "
             "../shared/upstream-crds, else the pinned release files fetched once into the user cache)")
OFFLINE_HELP = f"never fetch the upstream CRDs (also {OFFLINE_ENV}=1): a cache already filled is still used"


def report_options(output: str, policy_config: Optional[Path], crds: Optional[Path]) -> Mapping[str, Any]:
    """plan's and preview's shared options checked before anything runs (exit 2); the policy levels."""
    if output not in ("text", "json"):
        fail(f"--output {output}: use text or json")
    levels = policy_levels(policy_config)
    if crds is not None and not crds.is_dir():
        fail(f"--crds {crds}: not a folder; point it at a folder of CRD YAML files")
    return levels


def crd_source(crds: Optional[Path], offline: bool) -> CrdFolder:
    """Where custom resources are validated from: the first plan without a folder fetches the pinned
    files once into the user cache (the report says so)."""
    return crd_folder(crds, fetch=not offline)


def policy_levels(policy_config: Optional[Path]) -> Mapping[str, Any]:
    """--policy-config's enforcement levels, each policy known; exit 2 otherwise."""
    try:
        levels = load_policy_config(policy_config)
        resolve_levels(levels)
    except (OSError, ValueError) as exc:
        fail(f"--policy-config {policy_config}: {exc}")
    return levels


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
    crds: Optional[Path] = typer.Option(None, "--crds", help=CRDS_HELP),
    offline: bool = typer.Option(False, "--offline", help=OFFLINE_HELP),
    output: str = typer.Option("text", "--output", help="text (tables for people) or json (one document for "
                               "machines, on standard output)"),
) -> None:
    """Run the stack program under mocks and report what `pulumi up` would create."""
    levels = report_options(output, policy_config, crds)
    result = planned(stack, stacks_dir)  # a bad stack is exit 2 before anything is fetched
    report = plan_report(result, levels, crd_source(crds, offline), out if write else None)
    if output == "json":
        sys.stdout.write(render_json(report))
    else:
        render_text(report, console(), detail)
    if report.unsafe:
        raise typer.Exit(1)


@app.command()
def preview(
    program_dir: Path = typer.Argument(..., help="your Pulumi project's folder (where Pulumi.yaml is)"),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="the stack whose Pulumi.<stack>.yaml config "
                                        "to use (default: the project's only stack)"),
    config: list[str] = typer.Option([], "--config", "-c", help="KEY=VALUE, as `pulumi config set` (repeatable; "
                                     "a key without a namespace is the project's)"),
    out: Path = typer.Option(Path("plan-out"), "--out", "-o", help="folder for manifests and JSON"),
    detail: bool = typer.Option(False, "--detail", help="list every resource, not counts per type"),
    write: bool = typer.Option(True, "--write/--no-write", help="write files under --out"),
    policy_config: Optional[Path] = typer.Option(
        None, "--policy-config", help="enforcement levels, as for `pulumi preview --policy-pack-config`"),
    crds: Optional[Path] = typer.Option(None, "--crds", help=CRDS_HELP),
    offline: bool = typer.Option(False, "--offline", help=OFFLINE_HELP),
    output: str = typer.Option("text", "--output", help="text or json"),
) -> None:
    """Run your own Pulumi Python program under the plan's mocks and report each Platform it declares as
    `plan` reports a stack (capacity, cost, tenant URLs, checks, policies); resources beside them are checked
    for schema and policies."""
    levels = report_options(output, policy_config, crds)
    program = previewed(program_dir, stack, config)
    try:
        plans = platform_plans(program)
    except ConfigError as exc:  # the system pool's check across every Platform's pods
        fail(str(ConfigError(in_program_words(exc.issues), exc.source)))
    folder = crd_source(crds, offline)
    reports = [plan_report(p, levels, folder, out if write else None) for p in plans]
    others = outside_platforms(program, plans)
    checks = resource_checks(others, levels, folder) if others or not plans else None
    if output == "json":
        sys.stdout.write(render_program_json(reports, checks))
    else:
        for report in reports:
            if len(reports) > 1:
                console().rule(f"Platform {report.plan.stack.rsplit('/', 1)[-1]}")
            render_text(report, console(), detail)
        if checks is not None:
            render_resource_checks(checks, console(), len(plans))
    if any(r.unsafe for r in reports) or (checks is not None and checks.unsafe):
        raise typer.Exit(1)


def previewed(program_dir: Path, stack: Optional[str], config: list[str]) -> Program:
    """The user's program run under mocks; bad input (theirs or the program's settings) is exit 2."""
    pairs = [c.partition("=") for c in config]
    if bad := [c for c, (_, eq, _) in zip(config, pairs) if not eq]:
        fail(*(f"--config {c}: give KEY=VALUE (e.g. --config gcp:project=my-project)" for c in bad))
    try:
        project = read_project(program_dir)
        name = choose_stack(project, stack)
        values = program_config(project, name, {k: v for k, _, v in pairs})
        return run_user_program(project, name, values)
    except ConfigError as exc:
        fail(str(exc))


@app.command("schema")
def schema(out: Optional[Path] = typer.Option(None, "--out", "-o", help="file to write (default: standard output)")) -> None:
    """The component package's Pulumi schema, as `pulumi package get-schema` would give it, without the
    Pulumi CLI: for SDK generation and review."""
    # In a process of its own: the provider's protos and google-cloud-monitoring's (which the plan's
    # checks load) both define google.rpc.Status, and one process cannot hold both.
    code = ("import json\nfrom vllm_gke.components.provider.host import package_schema\n"
            "print(json.dumps(package_schema(), indent=2, sort_keys=True))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        console().print(f"error: the component package's schema could not be built:\n{result.stderr[-2000:]}")
        raise typer.Exit(1)
    text = result.stdout
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        console().print(f"wrote {out}")


@app.command("docs")
def docs(check: bool = typer.Option(False, "--check", help="write nothing; exit 1 if a generated page is stale")) -> None:
    """Write the docs generated from the code (docs/reference/: config, policies, components; the code's
    layers and the copied blocks of README.md and docs/), then check every link of README.md and docs/."""
    if check:
        stale = generated.stale()
        for path in stale:
            console().print(f"stale: {path}; run: vllm-gke docs")
        if stale:
            raise typer.Exit(1)
    else:
        for path in generated.write():
            console().print(f"wrote {path}")
    broken = generated.broken_links(generated.doc_files())
    for problem in broken:
        console().print(f"broken link: {escape(problem)}")
    if broken:
        raise typer.Exit(1)
    console().print("[green]the docs are current and every link resolves[/]")


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
    if problems := usage_problems(period, prometheus_url, metrics, output, prompt_weight):
        fail(*problems)
    result = planned(stack, stacks_dir)
    try:
        token = token_file.read_text().strip() if token_file else None
        ask = read_metrics_file(str(metrics)) if metrics else prometheus(str(prometheus_url), token)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    answers: dict[str, Any] = {}

    def recorded(promql: str) -> list[dict[str, Any]]:
        answers[promql] = ask(promql)
        return answers[promql]
    try:
        report = usage_report(result, recorded, period, prompt_weight)
    except (OSError, ValueError) as exc:
        fail(f"the metrics could not be read: {exc}")
    if save:
        save.write_text(json.dumps(answers, indent=1, sort_keys=True))
    if output == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
        return
    console().print(usage_table(stack, report))
    for pod in report.unknown_pods:
        console().print(f"[yellow]note:[/] pod {escape(pod)} is no vLLM Deployment or group leader of this stack: "
                      "not priced")


def usage_problems(period: str, prometheus_url: Optional[str], metrics: Optional[Path], output: str,
                   prompt_weight: float) -> list[str]:
    """What is wrong with `vllm-gke report`'s options, before anything is planned or read."""
    period_wrong = period_problem(period)
    return (([period_wrong] if period_wrong else []) +
            ([] if (prometheus_url is None) != (metrics is None) else ["give one of --prometheus URL or --metrics FILE"]) +
            ([] if output in ("text", "json") else [f"--output {output}: use text or json"]) +
            ([] if prompt_weight >= 0 else ["--prompt-weight: use 0 or more"]))


def usage_table(stack: str, report: UsageReport) -> Table:
    table = Table(title=f"stack {stack}: usage over the last {report.period} ({PRICE_REGION} list prices)")
    for col in ("tenant", "requests ok/refused/error/shed", "prompt tokens", "generated tokens",
                "GPU-hours", "TPU chip-hours", "dollars", "share"):
        column(table, col, right=col != "tenant")
    for name, t in report.tenants.items():
        reqs = "/".join(f"{t.requests.get(o, 0):,.0f}" for o in ("ok", "refused", "error", "shed"))
        table.add_row(name, reqs, f"{t.prompt_tokens:,.0f}", f"{t.generation_tokens:,.0f}", f"{t.gpu_hours:,.1f}",
                      f"{t.tpu_chip_hours:,.1f}", f"{t.dollars:,.2f}",
                      f"{t.dollars / report.dollars:.1%}" if report.dollars else "-")
    return table


@app.command("stacks")
def list_stacks(stacks_dir: Optional[Path] = typer.Option(None, "--stacks-dir")) -> None:
    """List the stacks that can be planned here."""
    for path in sorted((stacks_dir or default_stacks_dir()).glob("Pulumi.*.yaml")):
        console().print(path.name.split(".")[1])


def main(argv: Optional[list[str]] = None) -> None:
    app(argv)


if __name__ == "__main__":
    main()
