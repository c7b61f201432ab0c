"""`envforge report RUN_DIR`: the run's summary table (or JSON) and its self-contained HTML report."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer
from rich.console import Console

from envforge.harness.metrics import RunReadError, print_summary, read_run, summarize
from envforge.harness.report import REPORT_FILE, render_report

from .common import console, fail, print_json


def report(
    run_dir: Path = typer.Argument(..., help="A run directory written by `envforge eval`."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the summary as JSON on stdout instead of the table."
    ),
) -> None:
    """Summarize a run (pass^k, reward with 95% CIs, errors, cost) and write RUN_DIR/report.html."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            manifest, records = read_run(run_dir)
        except RunReadError as exc:
            fail(str(exc))
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    if not records:
        fail(f"{run_dir}: no trials recorded yet (trials.jsonl is missing or empty)")
    summary = summarize(records, manifest.trials)
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, Console())
    path = run_dir / REPORT_FILE
    path.write_text(render_report(manifest, records, summary), encoding="utf-8")
    # With --json stdout carries only the JSON, so the path goes to stderr.
    if as_json:
        console.print(f"report: {path}")
    else:
        typer.echo(f"report: {path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
