"""`envforge eval`: the evaluation harness's command (`register(app)` adds it to the root app)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .common import console, fail, print_json


def evaluate(
    env_dirs: Annotated[list[Path], typer.Argument(help="Env folders (each with tasks.jsonl).")],
    agent: Annotated[str, typer.Option(help="oracle | noop | random | a litellm model string.")],
    user: Annotated[str, typer.Option(help="scripted | a litellm model string.")] = "scripted",
    agent_api_base: Annotated[str | None, typer.Option(help="API base of the agent's model.")] = None,
    user_api_base: Annotated[str | None, typer.Option(help="API base of the user's model.")] = None,
    judge: Annotated[
        str | None, typer.Option(help="Model judging nl_assertions and user errors (default: none).")
    ] = None,
    judge_api_base: Annotated[str | None, typer.Option(help="API base of the judge's model.")] = None,
    llm_transport: Annotated[
        str,
        typer.Option(
            help="auto: OpenAI-compatible servers given an API base are called directly over HTTP, "
            "others through litellm | http | litellm (every model through litellm)."
        ),
    ] = "auto",
    trials: Annotated[int, typer.Option(min=1, help="Trials per task (k of pass^k).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Trials run at once.")] = 4,
    out: Annotated[Path, typer.Option(help="Run directory (manifest.json + trials.jsonl).")] = Path(
        "runs/eval"
    ),
    resume: Annotated[bool, typer.Option(help="Continue the run in --out: skip done trials.")] = False,
    tasks: Annotated[str | None, typer.Option(help="Comma-separated task ids to run.")] = None,
    server: Annotated[str | None, typer.Option(help="Base URL of a running `envforge serve`.")] = None,
    token: Annotated[
        str | None, typer.Option(envvar="ENVFORGE_TOKEN", help="Bearer token of that server's control plane.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Run seed (random agent, trial seeds).")] = 0,
    temperature: Annotated[float | None, typer.Option(help="Agent model temperature.")] = None,
    user_temperature: Annotated[float | None, typer.Option(help="User model temperature.")] = None,
    max_turns: Annotated[int, typer.Option(help="Most user/agent exchanges per trial.")] = 30,
    max_tool_errors: Annotated[int, typer.Option(help="Most failed tool calls per trial.")] = 10,
    timeout: Annotated[float, typer.Option(help="Wall-clock seconds per trial.")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="End with one JSON summary on stdout.")] = False,
    answers: Annotated[
        str,
        typer.Option(
            help="task: each task's own answer rule (exact for synthesized tasks, substring for τ² "
            "imports) | strict: the exact rule for every task (docs/scoring.md)."
        ),
    ] = "task",
) -> None:
    """Evaluate an agent on env tasks with a simulated user; prints pass^1..pass^k per env."""
    # Imported here: litellm takes seconds to import, and `serve` or `inspect` must not pay for it.
    from envforge.harness.llm import LLMConfig
    from envforge.harness.metrics import print_summary, summarize
    from envforge.harness.orchestrator import EvalConfig, Limits, RunExists, run_eval
    from envforge.harness.runs import RunConfigMismatch

    if answers not in ("task", "strict"):
        fail(f"--answers must be task or strict, not {answers!r}")
    if llm_transport not in ("auto", "http", "litellm"):
        fail(f"--llm-transport must be auto, http or litellm, not {llm_transport!r}")

    def llm(model: str, api_base: str | None, temperature: float | None = None) -> LLMConfig:
        try:
            cfg = LLMConfig(model=model, api_base=api_base, temperature=temperature, transport=llm_transport)
            cfg.uses_http()  # a forced `http` transport that cannot apply is an error now, not mid-run
        except ValueError as exc:
            fail(str(exc))
        return cfg

    config = EvalConfig(
        agent=agent,
        user=user,
        agent_llm=None if agent in ("oracle", "noop", "random") else llm(agent, agent_api_base, temperature),
        user_llm=llm(user, user_api_base, user_temperature) if user != "scripted" else None,
        judge_llm=llm(judge, judge_api_base) if judge else None,
        trials=trials,
        concurrency=concurrency,
        seed=seed,
        limits=Limits(max_turns=max_turns, max_tool_errors=max_tool_errors, trial_timeout_s=timeout),
        server=server,
        server_token=token,
        task_ids=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        answers=answers,  # type: ignore[arg-type]  # checked above
    )
    for d in env_dirs:
        if not (d / "tasks.jsonl").exists():
            fail(f"{d} has no tasks.jsonl")
    with Progress(
        TextColumn("[bold]eval[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=json_out,
    ) as progress:
        bar = progress.add_task(agent, total=None)

        def on_start(total: int, done: int) -> None:
            progress.update(bar, total=total, completed=done)

        def on_record(record: object) -> None:
            progress.advance(bar)

        try:
            manifest, records = anyio.run(
                lambda: run_eval(env_dirs, config, out, resume=resume, on_start=on_start, on_record=on_record)
            )
        except (RunExists, RunConfigMismatch, FileNotFoundError) as exc:
            fail(str(exc))
    summary = summarize(records, manifest.trials)
    print_summary(summary, console)
    console.print(f"run directory: {out}")
    if json_out:
        print_json(summary)


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)
