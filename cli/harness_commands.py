"""`envforge eval` and `envforge rescore`: the evaluation harness's commands.

Exit codes of `eval`: 0 when the run finished with at most `--max-infra-failures` infra failures;
1 when it had more (their first reasons are printed on stderr, so a run that could not reach its
model or its env server never looks like a result); 2 when nothing was run — bad input (an
unknown agent, task id or split), a run directory in use by another process, or a `--resume` whose
manifest is missing or does not match.
"""

from __future__ import annotations

import difflib
import gc
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envforge.harness import UserName

from .common import console, fail, load_envs, print_json, results
from .local_roles import is_local, local_roles
from .preflight import check_api_key, check_served_envs


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
    concurrency: Annotated[int, typer.Option(min=1, help="Trials run at once.")] = 4,
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
) -> None:
    """Evaluate an agent on env tasks with a simulated user; prints pass^1..pass^k per env."""
    # Imported here: litellm takes seconds to import, and `serve` or `inspect` must not pay for it.
    from envforge.harness import (
        BUILTIN_AGENTS,
        EvalConfig,
        Limits,
        LLMConfig,
        RunConfigMismatch,
        RunExists,
        RunLocked,
        TaskSelectionError,
        print_summary,
        run_eval,
        summarize,
        write_report,
    )

    if answers not in ("task", "strict"):
        fail(f"--answers must be task or strict, not {answers!r}")
    if local_servers not in ("per-role", "shared"):
        fail(f"--local-servers must be per-role or shared, not {local_servers!r}")
    if llm_transport not in ("auto", "http", "litellm"):
        fail(f"--llm-transport must be auto, http or litellm, not {llm_transport!r}")
    if limit is not None and limit < 1:
        fail(f"--limit must be at least 1, not {limit}")
    if split is not None and not split.strip():
        fail("--split must name a split (train, test, ...)")
    check_agent_name(agent, BUILTIN_AGENTS)

    def llm(model: str, api_base: str | None, temperature: float | None = None) -> LLMConfig:
        try:
            cfg = LLMConfig(model=model, api_base=api_base, temperature=temperature, transport=llm_transport)
            cfg.uses_http()  # a forced `http` transport that cannot apply is an error now, not mid-run
        except ValueError as exc:
            fail(str(exc))
        return cfg

    envs = load_envs(env_dirs)
    for d in env_dirs:
        if not (d / "tasks.jsonl").exists():
            fail(f"{d} has no tasks.jsonl (make some with `envforge synth tasks {d}`)")
    check_model_keys(
        {"agent": (agent, agent_api_base), "user": (user, user_api_base), "judge": (judge, judge_api_base)},
        not_models={*BUILTIN_AGENTS, UserName.SCRIPTED},
    )
    if server:
        check_served_envs(server, token, {e.name: d for e, d in zip(envs, env_dirs, strict=True)}, "--server")
    roles = {"agent": agent, "user": user, "judge": judge}
    with local_roles(
        roles, {"agent": temperature, "user": user_temperature}, shared=local_servers == "shared"
    ) as local:
        config = EvalConfig(
            agent=agent,
            user=user,
            agent_llm=local.get("agent")
            or (None if agent in BUILTIN_AGENTS else llm(agent, agent_api_base, temperature)),
            user_llm=local.get("user")
            or (llm(user, user_api_base, user_temperature) if user != UserName.SCRIPTED else None),
            judge_llm=local.get("judge") or (llm(judge, judge_api_base) if judge else None),
            judge=judge,
            trials=trials,
            concurrency=concurrency,
            seed=seed,
            limits=Limits(max_turns=max_turns, max_tool_errors=max_tool_errors, trial_timeout_s=timeout),
            server=server,
            server_token=token,
            task_ids=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
            split=split,
            limit=limit,
            answers=answers,
        )
        with Progress(
            TextColumn("[bold]eval[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,  # a bar left on stderr would sit beside an error line or the results
        ) as progress:
            bar = progress.add_task(agent, total=None)

            def on_start(total: int, done: int) -> None:
                progress.update(bar, total=total, completed=done)

            def on_record(record: object) -> None:
                progress.advance(bar)

            def on_notice(message: str) -> None:
                console.print(f"[yellow]warning:[/] {message}")

            try:
                manifest, records = anyio.run(
                    lambda: run_eval(
                        env_dirs,
                        config,
                        out,
                        resume=resume,
                        on_start=on_start,
                        on_record=on_record,
                        on_notice=on_notice,
                    )
                )
            except (RunExists, RunConfigMismatch, RunLocked, TaskSelectionError, FileNotFoundError) as exc:
                fail(str(exc))
    # What is left is to summarize, report and exit: the collector need not walk the run's heap
    # (its records, the envs) again for the little garbage that makes (~1 ms a trial at 2,048).
    # Undone on the way out, so a caller that runs the command in its own process leaks nothing
    # (and left alone in a process that froze objects itself).
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        summary = summarize(records, manifest.trials)
        shown = console if json_out else results  # with --json, stdout holds the JSON alone
        print_summary(summary, shown)
        shown.print(f"run directory: {out}")
        console.print(f"report: {write_report(out)}", highlight=False)
        if json_out:
            print_json(summary)
        infra = [r for r in records if r.fault == "infra"]
        if infra:
            console.print(
                f"[bold red]{len(infra)} of {len(records)} trial(s) failed for infra reasons[/] "
                "(--resume runs them again):"
            )
            for r in infra[:INFRA_REASONS_SHOWN]:
                console.print(f"  {r.trial_key}: {r.error}", markup=False, highlight=False)
        if len(infra) > max_infra_failures:
            raise typer.Exit(1)
    finally:
        if freeze:
            gc.unfreeze()


INFRA_REASONS_SHOWN = 3


def check_model_keys(roles: dict[str, tuple[str | None, str | None]], not_models: set[str]) -> None:
    """Each role played by a hosted model (not built in, not local) has its API key set."""
    for role, (model, api_base) in roles.items():
        if model and model not in not_models and not is_local(model):
            check_api_key(f"--{role}", model, api_base, f"--{role}-api-base")


def check_agent_name(agent: str, builtins: tuple[str, ...]) -> None:
    """Fail fast on an `--agent` that is neither a built-in, a local model nor a model string litellm
    can route: a typo like `oracl` would otherwise turn every trial into an infra failure."""
    if is_local(agent):
        from envforge.harness import LocalModelError, model_for_spec

        try:
            model_for_spec(agent)
        except LocalModelError as exc:
            fail(str(exc))
        return
    if agent in builtins or "/" in agent:
        return
    from envforge.harness import routable_model

    if routable_model(agent):
        return
    close = difflib.get_close_matches(agent, builtins, n=1)
    hint = f" (did you mean {str(close[0])!r}?)" if close else ""
    fail(
        f"unknown agent {agent!r}{hint}: not a built-in ({', '.join(builtins)}) "
        "and not a model string (use provider/model, e.g. openai/gpt-4o)"
    )


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)
