"""`vllm-gke`: the offline front door. Runs the real stack program under Pulumi mocks.

Exit codes: 0 plan is clean, 1 the plan is unsafe (invalid manifest), 2 bad config or input.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from infra.config import ConfigError
from infra.manifests import describe, validate
from infra.plan import STACKS_DIR, Plan, run_plan
from infra.plan_output import write_plan

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan vllm-gke stacks offline: resources, manifests, dashboards, verdicts.")
console = Console(width=140)


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


@app.command()
def plan(
    stack: str = typer.Option("dev", "--stack", "-s", help="stack name: stacks/Pulumi.<stack>.yaml"),
    out: Path = typer.Option(Path("plan-out"), "--out", "-o", help="folder for manifests and JSON"),
    stacks_dir: Path = typer.Option(STACKS_DIR, "--stacks-dir", help="folder holding Pulumi.<stack>.yaml"),
    detail: bool = typer.Option(False, "--detail", help="list every resource, not counts per type"),
    write: bool = typer.Option(True, "--write/--no-write", help="write files under --out"),
) -> None:
    """Run the stack program under mocks and report what `pulumi up` would create."""
    try:
        result = run_plan(stack, stacks_dir)
    except ConfigError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(resource_table(result, detail))

    problems = [(describe(doc), errs) for doc in result.manifests() if (errs := validate(doc))]
    n_docs = len(result.manifests())
    if problems:
        console.print(f"[bold red]{len(problems)} of {n_docs} manifests fail schema validation:[/]")
        for what, errs in problems:
            for err in errs:
                console.print(f"  - {what}: {err}", highlight=False)
    else:
        console.print(f"[green]all {n_docs} Kubernetes manifests pass schema validation[/]")

    if write:
        files = write_plan(result, out)
        console.print(f"wrote {len(files)} files under {out / stack}/ "
                      "(manifests/, dashboard.json, alert-policies.json, resources.json)")
    if problems:
        raise typer.Exit(1)


@app.command("stacks")
def list_stacks(stacks_dir: Path = typer.Option(STACKS_DIR, "--stacks-dir")) -> None:
    """List the stacks this checkout can plan."""
    for path in sorted(stacks_dir.glob("Pulumi.*.yaml")):
        console.print(path.name.split(".")[1])


def main(argv: Optional[list[str]] = None) -> None:
    app(argv)


if __name__ == "__main__":
    main()
