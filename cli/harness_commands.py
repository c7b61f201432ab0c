"""`envforge eval` and `envforge rescore`: the evaluation harness's commands.

Exit codes of `eval`: 0 when the run finished with at most `--max-infra-failures` infra failures;
1 when it had more (their first reasons are printed on stderr, so a run that could not reach its
model or its env server never looks like a result), or when one of its `--procs` processes died
before finishing its trials (named on stderr; `--resume` runs them); 2 when nothing was run — bad input (an
unknown agent, task id or split), a run directory in use by another process, or a `--resume` whose
manifest is missing or does not match.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from envforge.harness import UserName

from .common import ANSWERS_MODES, choice, console, fail, load_envs, print_json, results
from .local_roles import is_local, local_roles
from .preflight import check_api_key, check_served_envs
from .progress import work_progress

if TYPE_CHECKING:
    from envforge import LLMTransport, Role
    from envforge.harness import TrialClock, TrialRecord


def evaluate(
    env_dirs: Annotated[list[Path], typer.Argument(help="Env folders (each with tasks.jsonl).")],
    agent: Annotated[
        str,
        typer.Option(
            help="oracle | noop | random | local or local/NAME (a packaged model) | a litellm model string."
        ),
    ],
    user: Annotated[
        str, typer.Option(help="scripted | local or local/NAME | a litellm model string.")
    ] = UserName.SCRIPTED,
    agent_api_base: Annotated[str | None, typer.Option(help="API base of the agent's model.")] = None,
    user_api_base: Annotated[str | None, typer.Option(help="API base of the user's model.")] = None,
    judge: Annotated[
        str | None,
        typer.Option(
            help="Model judging nl_assertions and user errors: local or local/NAME or a litellm model."
        ),
    ] = None,
    judge_api_base: Annotated[str | None, typer.Option(help="API base of the judge's model.")] = None,
    llm_transport: Annotated[
        str,
        typer.Option(
            help="auto: OpenAI-compatible servers given an API base are called directly over HTTP, "
            "others through litellm | http | litellm (every model through litellm)."
        ),
    ] = "auto",
    local_servers: Annotated[
        str,
        typer.Option(
            help="per-role: each local role its own server (its prompt cache kept) | shared: roles "
            "naming the same local model share one server."
        ),
    ] = "per-role",
    trials: Annotated[int, typer.Option(min=1, help="Trials per task (k of pass^k).")] = 1,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Trials run at once (in all, shared among --procs processes).")
    ] = 4,
    procs: Annotated[
        str,
        typer.Option(
            help="Processes to spread the trials over: N, or 0 / auto for one per core "
            "(the run log's order and records do not depend on it)."
        ),
    ] = "1",
    out: Annotated[Path, typer.Option(help="Run directory (manifest.json + trials.jsonl).")] = Path(
        "runs/eval"
    ),
    resume: Annotated[bool, typer.Option(help="Continue the run in --out: skip done trials.")] = False,
    tasks: Annotated[str | None, typer.Option(help="Comma-separated task ids to run.")] = None,
    split: Annotated[
        str | None, typer.Option(help="Only the tasks of this split (τ² imports: train | test | base).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Only the first N tasks of each env (after --tasks and --split).")
    ] = None,
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
    max_infra_failures: Annotated[
        int,
        typer.Option(
            min=0, help="Infra failures tolerated before eval exits 1 (they are re-run by --resume)."
        ),
    ] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="End with one JSON summary on stdout.")] = False,
    answers: Annotated[
        str,
        typer.Option(
            help="task: each task's own answer rule (exact for synthesized tasks, substring for τ² "
            "imports) | strict: the exact rule for every task (docs/scoring.md)."
        ),
    ] = "task",
    solo: Annotated[
        bool,
        typer.Option(
            help="τ²'s solo mode (dual-control envs): the agent gets the user's tools beside its own "
            "and the task as its ticket; the user is a dummy."
        ),
    ] = False,
) -> None:
    """Evaluate an agent on env tasks with a simulated user; prints pass^1..pass^k per env."""
    # Imported here: litellm takes seconds to import, and `serve` or `inspect` must not pay for it.
    import envforge
    from envforge.harness import (
        EvalConfig,
        Limits,
        ProcessDied,
        RunConfigMismatch,
        RunExists,
        RunLocked,
        TaskSelectionError,
        TrialClock,
        print_summary,
        write_report,
    )

    transports: tuple[LLMTransport, ...] = get_args(envforge.LLMTransport)
    answers_mode = choice("--answers", answers, ANSWERS_MODES)
    transport = choice("--llm-transport", llm_transport, transports)
    shared = choice("--local-servers", local_servers, LOCAL_SERVERS) == "shared"
    if limit is not None and limit < 1:
        fail(f"--limit must be at least 1, not {limit}")
    if split is not None and not split.strip():
        fail("--split must name a split (train, test, ...)")
    try:
        envforge.check_agent_name(agent)
    except ValueError as exc:
        fail(str(exc))
    envs = load_envs(env_dirs)
    for d in env_dirs:
        if not (d / "tasks.jsonl").exists():
            fail(f"{d} has no tasks.jsonl (make some with `envforge synth tasks {d}`)")
    config = EvalConfig(
        agent=agent,
        user=user,
        judge=judge,
        trials=trials,
        concurrency=concurrency,
        procs=process_count(procs),
        seed=seed,
        limits=Limits(max_turns=max_turns, max_tool_errors=max_tool_errors, trial_timeout_s=timeout),
        server=server,
        server_token=token,
        task_ids=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        split=split,
        limit=limit,
        answers=answers_mode,
        solo=solo,
    )
    api_bases: dict[Role, str | None] = {
        "agent": agent_api_base,
        "user": user_api_base,
        "judge": judge_api_base,
    }
    temperatures: dict[Role, float | None] = {"agent": temperature, "user": user_temperature}
    check_model_keys({role: (model, api_bases[role]) for role, model in envforge.model_roles(config).items()})
    if server:
        check_served_envs(server, token, {e.name: d for e, d in zip(envs, env_dirs, strict=True)}, "--server")
    roles: dict[Role, str | None] = {"agent": agent, "user": user, "judge": judge}
    with local_roles(roles, temperatures, shared=shared) as local:
        try:
            config = envforge.with_models(
                config,
                api_bases=api_bases,
                temperatures=temperatures,
                transport=transport,
                local=local,
            )
        except ValueError as exc:
            fail(str(exc))
        local_specs = [f"{role}={spec}" for role, spec in roles.items() if spec and is_local(spec)]
        clock = TrialClock(TrialClock.key_of(local_specs, max_turns), concurrency) if local_specs else None
        with eval_progress(agent, clock) as bar:
            try:
                evaluation = envforge.evaluate(
                    env_dirs,
                    config,
                    out=out,
                    resume=resume,
                    on_start=bar.on_start,
                    on_record=bar.on_record,
                    on_notice=bar.on_notice,
                )
            except (RunExists, RunConfigMismatch, RunLocked, TaskSelectionError, FileNotFoundError) as exc:
                fail(str(exc))
            except ProcessDied as exc:
                fail(str(exc), 1)
    with envforge.frozen_heap():  # the run's heap is done with: summarizing and reporting need no walks of it
        shown = console if json_out else results  # with --json, stdout holds the JSON alone
        print_summary(evaluation.summary, shown)
        shown.print(f"run directory: {out}")
        console.print(f"report: {write_report(out)}", highlight=False)
        if json_out:
            print_json(evaluation.summary)
        infra = evaluation.infra_failures
        if infra:
            console.print(
                f"[bold red]{len(infra)} of {len(evaluation.records)} trial(s) failed for infra reasons[/] "
                "(--resume runs them again):"
            )
            for r in infra[:INFRA_REASONS_SHOWN]:
                console.print(f"  {r.trial_key}: {r.error}", markup=False, highlight=False)
    if len(infra) > max_infra_failures:
        raise typer.Exit(1)


INFRA_REASONS_SHOWN = 3


def process_count(procs: str) -> int:
    """`--procs` as a number of processes: `0` or `auto` is one per core this process may use."""
    if procs.strip().lower() in ("0", "auto"):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not procs.strip().isdecimal():  # isdigit() also takes "²", which int() refuses
        fail(f"--procs must be a number of processes, 0 or auto, not {procs!r}")
    return int(procs)


LOCAL_SERVERS = ("per-role", "shared")


def check_model_keys(roles: Mapping[str, tuple[str | None, str | None]]) -> None:
    """Each role (-> its model and API base) played by a hosted model, not a packaged local one, has
    its API key set; a role without a model is skipped."""
    for role, (model, api_base) in roles.items():
        if model and not is_local(model):
            check_api_key(f"--{role}", model, api_base, f"--{role}-api-base")


@dataclass(frozen=True)
class EvalBar:
    """The run's progress hooks (`envforge.evaluate`'s), drawn as one bar on stderr."""

    progress: Progress
    bar: TaskID
    clock: TrialClock | None = None
    """With local models: the run's cost in time, said before it is paid."""

    def on_start(self, total: int, done: int) -> None:
        self.progress.update(self.bar, total=total, completed=done)
        said = self.clock.on_start(total, done) if self.clock is not None else None
        if said:
            self.progress.console.print(said, highlight=False)

    def on_record(self, record: TrialRecord) -> None:
        self.progress.advance(self.bar)
        said = self.clock.on_trial() if self.clock is not None else None
        if said:
            self.progress.console.print(said, highlight=False)

    def on_notice(self, message: str) -> None:
        console.print(f"[yellow]warning:[/] {message}")


@contextmanager
def eval_progress(agent: str, clock: TrialClock | None = None) -> Iterator[EvalBar]:
    """A bar for the run, gone when it ends: one left on stderr would sit beside an error line or
    the results (off a terminal, a line per few trials); `clock` remembers the seconds per trial."""
    columns = (TextColumn("[bold]eval[/] {task.description}"), BarColumn(), MofNCompleteColumn())
    bar = work_progress(*columns, TimeElapsedColumn(), console=console, label="eval", transient=True)
    with bar as progress:
        yield EvalBar(progress, progress.add_task(agent, total=None), clock)
    if clock is not None:
        clock.finish()


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)
