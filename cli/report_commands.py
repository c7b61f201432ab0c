"""`envforge report RUN_DIR` (the summary table or JSON, and the self-contained HTML report) and
`envforge rescore RUN_DIR` (the stored trajectories scored again against current tasks)."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer
from rich.console import Console

from envforge.harness import REPORT_FILE, RunReadError, print_summary, read_run, render_report, summarize
from envforge.server import EnvLoadError

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


def rescore(
    run_dir: Path = typer.Argument(..., help="A run directory written by `envforge eval`."),
    tasks_from: list[Path] = typer.Option(
        [],
        "--tasks-from",
        help="Env folder whose current tasks.jsonl replaces the run's tasks of that env (repeatable).",
    ),
    out: Path | None = typer.Option(
        None, help="Write a new run directory (manifest + trials.jsonl) instead of RUN_DIR/rescored.jsonl."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the new summary as JSON on stdout."),
) -> None:
    """Score the stored trajectories again against the current tasks; no model is called.

    Nothing recorded is rewritten: the new records go to RUN_DIR/rescored.jsonl, or to a new run
    directory with --out (which `envforge report` reads).
    """
    import anyio

    from envforge.harness import rescore as rescore_run

    if not (run_dir / "manifest.json").is_file():
        fail(f"{run_dir}: not a run directory (no manifest.json)")
    for d in tasks_from:
        if not (d / "tasks.jsonl").is_file():
            fail(f"--tasks-from {d}: no tasks.jsonl there")
    try:
        result = anyio.run(
            lambda: rescore_run(run_dir, tasks_from=tasks_from, write=out is None, out_dir=out)
        )
    except (FileNotFoundError, FileExistsError, EnvLoadError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    if result.read.skipped:
        console.print(f"[yellow]warning:[/] {result.read.describe_skipped(run_dir / 'trials.jsonl')}")
    if result.unscored:
        console.print(
            f"{len(result.unscored)} trial(s) kept their stored score (no final state or task gone)"
        )
    summary = summarize(result.records, result.manifest.trials)
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, Console())
    console.print(f"rescored: {result.written}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("rescore")(rescore)
