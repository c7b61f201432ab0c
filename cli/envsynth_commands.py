"""Commands for env synthesis from tool documents: `envforge synth env` (one) and `synth envs` (many).

`register(app)` adds both to the existing `synth` sub-app of `synth_commands`, so they sit beside
`envforge synth tasks`. `--replay` answers from recorded responses instead of a model: that is how
the bundled synthesized envs are rebuilt offline and byte-for-byte.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from envforge.synth.envsynth import (
    GATES,
    DocsError,
    ReplayResponder,
    Responder,
    ResumingResponder,
    SynthesisReport,
    SynthSettings,
    ToolDoc,
    introspect_mcp,
    load_docs,
    load_recordings,
    rejected_dir,
    synthesize_env,
)

from .common import console, fail, quiet_tool_failures
from .envsynth_model import check_model, synth_model
from .local_roles import is_local
from .preflight import check_api_key
from .progress import PlainProgress, work_progress
from .synth_commands import synth_app

JSON_SCHEMA_HELP = (
    "Constrain the probe agents' JSON answers to their schema: auto (on for local models), "
    "llama.cpp, openai (vLLM and hosted), off."
)


@contextmanager
def _responder(
    model: str | None,
    api_base: str | None,
    replay: Path | None,
    json_schema: str = "auto",
    resume: Path | None = None,
) -> Iterator[Responder]:
    """Recorded responses with `--replay`, else the `--model` (whose key is checked now; a local
    one is served for the block), answering from `--resume`'s recording where it can."""
    if replay:
        if resume:
            fail("--resume continues a run with --model; --replay runs a recording alone")
        yield ReplayResponder.from_path(replay)
        return
    recorded: dict[str, str] = {}
    if resume:
        try:
            recorded = load_recordings(resume)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            fail(f"cannot read --resume {resume}: {exc}")
    if not model:
        fail("give --model MODEL (a litellm model, e.g. openai/gpt-4o, or local) or --replay responses.json")
    check_model("--model", model)
    if not is_local(model):
        check_api_key("--model", model, api_base, "--api-base")
    with synth_model(model, api_base, json_schema) as responder:
        yield ResumingResponder(recorded, responder) if resume else responder


async def _read_docs(source: str) -> list[ToolDoc]:
    if re.match(r"^https?://", source):
        return await introspect_mcp(source)
    return load_docs(source)


def _env_name(out: Path, name: str | None) -> str:
    name = name or out.resolve().name
    if not re.match(r"^[a-z][a-z0-9_]{0,63}$", name):
        fail(f"env name {name!r} must match [a-z][a-z0-9_]* (pass --name)")
    return name


def _row(report: SynthesisReport) -> list[str]:
    rates = report.final_gates()
    cells = ["-" if rates[g] is None else f"{rates[g]:.0%}" for g in GATES]
    status = "[green]accepted[/]" if report.status == "accepted" else "[red]rejected[/]"
    return [report.env, status, str(len(report.rounds)), *cells, str(report.tasks), f"{report.seconds:.1f}s"]


def _gate_account(report: SynthesisReport) -> list[str]:
    """One line per gate of the last round: passed, failed with its first problem, or not reached
    (the gates run in order and stop at the first that fails); a model call that failed before
    any gate ran is the one line it said."""
    if not report.rounds:
        return [f"no gate ran: {report.reasons[0]}" if report.reasons else "no gate ran"]
    ran = {g.name: g for g in report.rounds[-1].gates}
    lines = []
    for name in GATES:
        gate = ran.get(name)
        if gate is None:
            lines.append(f"{name}: not reached")
        elif gate.passed:
            lines.append(f"{name}: passed ({gate.passed_checks}/{gate.checks} checks)")
        else:
            first = gate.problems[0] if gate.problems else "failed"
            more = f" (+{len(gate.problems) - 1} more)" if len(gate.problems) > 1 else ""
            lines.append(f"{name}: FAILED {gate.passed_checks}/{gate.checks} checks: {first}{more}")
    return lines


def _table(title: str) -> Table:
    table = Table(title=title)
    for col in ("env", "status", "rounds", *GATES, "verified", "time"):
        table.add_column(col, justify="left" if col in ("env", "status") else "right")
    return table


def synth_env(
    docs: str = typer.Argument(..., help="Tool docs: a file, a folder of files, or an MCP server URL."),
    out: Path = typer.Option(..., "-o", "--out", help="The env folder to write, e.g. envs/library."),
    model: str | None = typer.Option(
        None, "--model", help="litellm model (e.g. openai/gpt-4o), or local / local/NAME (packaged)."
    ),
    api_base: str | None = typer.Option(None, "--api-base", help="OpenAI-compatible endpoint."),
    json_schema: str = typer.Option("auto", "--json-schema", help=JSON_SCHEMA_HELP),
    name: str | None = typer.Option(None, "--name", help="Env name (default: the folder's name)."),
    max_rounds: int = typer.Option(3, "--max-rounds", help="Repair rounds after the first attempt."),
    min_tasks: int = typer.Option(3, "--min-tasks", help="Verified tasks the tasks gate requires."),
    replay: Path | None = typer.Option(None, "--replay", help="Recorded responses (responses.json)."),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="An earlier run's responses.json: its answers are reused, the model asked only past "
        "them (e.g. a rejected run continued with a higher --max-rounds).",
    ),
) -> None:
    """Synthesize one env from tool documents; writes it and synthesis.json if every gate passes."""
    env_name = _env_name(out, name)
    quiet_tool_failures()  # a candidate's crashes reach the gate account, not the terminal
    try:
        tool_docs = asyncio.run(_read_docs(docs))
    except (DocsError, OSError, ValueError) as exc:
        fail(f"cannot read docs: {exc}")
    settings = SynthSettings(name=env_name, max_rounds=max_rounds, min_tasks=min_tasks, api_base=api_base)
    columns = (TextColumn("[bold]synth env[/] {task.description}"), TimeElapsedColumn())
    with (
        _responder(model, api_base, replay, json_schema, resume) as responder,
        work_progress(*columns, console=console, label="synth env", transient=True) as progress,
    ):
        stage = progress.add_task(f"{env_name}: {len(tool_docs)} documented tools", total=None)

        def say(message: str) -> None:
            if not isinstance(progress, PlainProgress):
                progress.console.print(message, highlight=False)  # each stage stays above the bar
            progress.update(stage, description=message)  # off a terminal: a line each, then heartbeats

        report = asyncio.run(synthesize_env(tool_docs, out, responder, settings, progress=say))
    table = _table(f"{env_name}: {len(tool_docs)} documented tools")
    table.add_row(*_row(report))
    console.print(table)
    if report.status != "accepted":
        for line in _gate_account(report):
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        why = report.reasons[0] if report.reasons else "a gate failed"
        console.print(
            f"[red]error:[/] {env_name} rejected ({why}); nothing written to {out}; report and last "
            f"candidate in {rejected_dir(out)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


def synth_envs(
    docs_dir: Path = typer.Argument(..., help="One doc set per child: a file or a folder (or folder/docs)."),
    out: Path = typer.Option(Path("envs"), "--out", help="Parent folder of the env folders."),
    model: str | None = typer.Option(
        None, "--model", help="litellm model (e.g. openai/gpt-4o), or local / local/NAME (packaged)."
    ),
    api_base: str | None = typer.Option(None, "--api-base"),
    json_schema: str = typer.Option("auto", "--json-schema", help=JSON_SCHEMA_HELP),
    concurrency: int = typer.Option(4, "--concurrency", min=1),
    max_rounds: int = typer.Option(3, "--max-rounds"),
    min_tasks: int = typer.Option(3, "--min-tasks"),
    replay_dir: Path | None = typer.Option(None, "--replay-dir", help="DIR/<env>/responses.json per env."),
    force: bool = typer.Option(False, "--force", help="Redo envs already accepted."),
) -> None:
    """Synthesize an env per doc set, N at a time; resumable: envs already accepted are skipped."""
    import envforge

    quiet_tool_failures()
    try:
        sets = envforge.doc_sets(docs_dir)
    except NotADirectoryError as exc:
        fail(str(exc))
    if not sets:
        fail(f"no doc sets under {docs_dir}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with ExitStack() as stack:
        # one model (a local one: one server) for every env; recordings are per env
        shared = None if replay_dir else stack.enter_context(_responder(model, api_base, None, json_schema))

        def responder(name: str) -> Responder:
            return shared or ReplayResponder.from_path(replay_dir / name if replay_dir else Path(name))

        progress = stack.enter_context(work_progress(*columns, console=console, label="synth envs"))
        bar = progress.add_task("synthesizing", total=None)

        def on_done(name: str, report: SynthesisReport | str) -> None:
            if isinstance(report, str):
                console.print(f"[red]{name}: cannot start: {report}[/]")
            else:
                progress.update(bar, description=f"{name}: {report.status}")
            progress.advance(bar)

        batch = envforge.synthesize_envs(
            docs_dir,
            out,
            responder,
            settings=lambda name: SynthSettings(
                name=name, max_rounds=max_rounds, min_tasks=min_tasks, api_base=api_base
            ),
            concurrency=concurrency,
            force=force,
            on_start=lambda todo: progress.update(bar, total=todo),
            on_done=on_done,
        )
    table = _table(f"{len(batch.sets)} doc sets ({len(batch.skipped)} already accepted, skipped)")
    for name, _ in batch.sets:
        if name in batch.reports:
            table.add_row(*_row(batch.reports[name]))
    console.print(table)
    if batch.rejected:
        kept = ", ".join(str(rejected_dir(out / name)) for name in batch.rejected)
        console.print(f"rejected envs are not written; reports in {kept}", highlight=False, soft_wrap=True)
    if not batch.all_accepted:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `synth env` and `synth envs` to the `synth` sub-app (`app` is the root, kept for symmetry)."""
    synth_app.command("env")(synth_env)
    synth_app.command("envs")(synth_envs)
