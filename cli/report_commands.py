"""`envforge report RUN_DIR [RUN_DIR...]` (the summary table or JSON, and the self-contained HTML
report; several runs compared on one page) and
`envforge rescore RUN_DIR` (the stored trajectories scored again against current tasks)."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from envforge.harness import (
    COMPARE_FILE,
    REPORT_FILE,
    ComparedRun,
    RunManifest,
    RunReadError,
    TrialRecord,
    load_run_tasks,
    print_summary,
    read_run,
    read_runs,
    render_comparison,
    render_report,
    summarize,
)
from envforge.server import EnvLoadError

from .common import console, fail, print_json


def report(
    run_dirs: list[Path] = typer.Argument(
        ..., help="Run directories written by `envforge eval`; two or more are compared on one page."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the summary as JSON on stdout instead of the table."
    ),
    out: Path | None = typer.Option(
        None,
        help=f"Where to write the HTML page (default: RUN/{REPORT_FILE} for one run, "
        f"./{COMPARE_FILE} for several).",
    ),
) -> None:
    """Summarize a run (pass^k, reward with 95% CIs, errors, cost) and write RUN/report.html; given
    several runs, compare them: pass^k per env side by side, in a table and plots, on one page."""
    if len(run_dirs) > 1:
        compare(run_dirs, as_json, out)
        return
    run_dir = run_dirs[0]
    manifest, records = _read(run_dir)
    summary = summarize(records, manifest.trials)
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, Console())
    path = out or run_dir / REPORT_FILE
    tasks = load_run_tasks(manifest)
    for env, why in tasks.missing.items():
        console.print(f"[yellow]warning:[/] {env}: {why}", highlight=False)
    _write(path, render_report(manifest, records, summary, tasks))
    _say_where(path, as_json)


def compare(run_dirs: list[Path], as_json: bool, out: Path | None) -> None:
    """Several runs on one page (`envforge report A B ...`), and their pass^k per env on stdout."""
    for d in run_dirs:
        _read(d)  # each unreadable run is named, with its warnings, before anything is written
    runs = read_runs(run_dirs)
    if as_json:
        print_json(
            {
                "runs": [
                    {"label": r.label, "dir": r.path, "run_id": r.manifest.run_id, **r.summary} for r in runs
                ]
            }
        )
    else:
        print_comparison(runs)
    path = out or Path(COMPARE_FILE)
    _write(path, render_comparison(runs))
    _say_where(path, as_json)


def print_comparison(runs: list[ComparedRun]) -> None:
    """pass^1 and pass^k per env, one column per run (lettered as on the page)."""
    table = Table(title="pass^k per env", box=None, pad_edge=False)
    table.add_column("env", overflow="fold")
    k_max = max(r.manifest.trials for r in runs)
    ks = [1] if k_max == 1 else [1, k_max]
    for k in ks:
        for r in runs:
            table.add_column(f"{r.label} ^{k}", justify="right")
    for env in [*sorted({e for r in runs for e in r.summary["envs"]}), "overall"]:
        cells = []
        for k in ks:
            for r in runs:
                part = r.part(env)
                values = part["pass_hat_k"] if part else []
                value = values[k - 1] if k <= len(values) else None
                cells.append("–" if value is None else f"{value:.3f}")
        table.add_row(env, *cells)
    stdout = Console()
    stdout.print(table)
    for r in runs:
        stdout.print(
            f"{r.label}: {r.path} (agent {r.manifest.agent}, user {r.manifest.user})", highlight=False
        )


def _read(run_dir: Path) -> tuple[RunManifest, list[TrialRecord]]:
    """The run, or a one-line error naming it; skipped lines are warned about on stderr."""
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
    return manifest, records


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write the report to {path}: {exc.strerror or exc}")


def _say_where(path: Path, as_json: bool) -> None:
    # With --json stdout carries only the JSON, so the path goes to stderr.
    if as_json:
        console.print(f"report: {path}", highlight=False)
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
    for key, why in result.mismatched.items():
        console.print(f"[red]error:[/] {key}: {why}; it kept its stored score")
    summary = summarize(result.records, result.manifest.trials)
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, Console())
    console.print(f"rescored: {result.written}")
    if result.mismatched:
        fail(f"{len(result.mismatched)} trial(s) failed the final-state hash check (listed above)", code=1)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("rescore")(rescore)
