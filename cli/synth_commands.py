"""Commands for task synthesis: `graph`, `synth tasks`, `check` and `score`."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

import typer
from pydantic import ValidationError
from rich.table import Table

from envforge import check_tasks, score_calls, synthesize_tasks
from envforge.server import Environment
from envforge.synth import (
    ADVERSARIES,
    CHECKS,
    PHRASES_FILE,
    Call,
    EnvAssertionError,
    EnvRealism,
    PhraseError,
    Score,
    SynthConfig,
    Task,
    build_graph,
    diversity_line,
    graph_json,
    load_graph,
    load_phrases,
    load_tasks,
    measure_diversity,
    measure_realism,
    realism_table,
    roles_of,
    to_dot,
    to_mermaid,
    with_answers,
    write_graph,
    write_phrases,
    write_tasks_to,
)

from .common import ANSWERS_MODES, choice, console, fail, load_envs, print_json, quiet_tool_failures, results
from .envsynth_model import check_model, rewrite_model
from .local_roles import is_local
from .preflight import check_api_key

synth_app = typer.Typer(no_args_is_help=True, help="Synthesize verified tasks for an env.")


def graph_cmd(
    env_dir: Path = typer.Argument(..., help="The env folder."),
    format: str = typer.Option("json", "--format", help="json, mermaid or dot."),
) -> None:
    """Print the tool dependency graph (and write it to ENV_DIR/graph.json)."""
    quiet_tool_failures()
    if format not in ("json", "mermaid", "dot"):
        fail(f"unknown format {format!r} (json, mermaid or dot)")
    (env,) = load_envs([env_dir])
    graph = asyncio.run(build_graph(env))
    write_graph(graph, env_dir)
    text = {"json": graph_json, "mermaid": to_mermaid, "dot": to_dot}[format](graph)
    typer.echo(text, nl=False)


@synth_app.command("tasks")
def synth_tasks(
    env_dir: Path = typer.Argument(..., help="The env folder."),
    n: int = typer.Option(50, "--n", help="How many distinct verified tasks to keep (at least 1)."),
    seed: int = typer.Option(0, "--seed"),
    min_calls: int = typer.Option(2, "--min-calls"),
    max_calls: int = typer.Option(7, "--max-calls"),
    llm_model: str | None = typer.Option(
        None,
        "--llm",
        "--llm-model",
        help="Rewrite instructions with this model: a litellm model, or local / local/NAME (packaged).",
    ),
    steer: bool = typer.Option(
        True, "--steer/--no-steer", help="Weigh walks' choices by what worked in earlier attempts."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write the tasks here instead of ENV_DIR/tasks.jsonl."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing tasks file."),
    adversaries: bool = typer.Option(
        True,
        "--adversaries/--no-adversaries",
        help="Drop tasks an adversarial agent games (--no-adversaries: for measuring their cost only).",
    ),
) -> None:
    """Synthesize N distinct self-verified tasks into ENV_DIR/tasks.jsonl (same seed: same bytes)."""
    quiet_tool_failures()
    if n < 1:
        fail(f"--n must be at least 1 (got {n})")
    if min_calls < 1 or max_calls < min_calls:
        fail("need 1 <= --min-calls <= --max-calls")
    path = out if out is not None else env_dir / "tasks.jsonl"
    if path.exists() and not force:
        fail(f"{path} exists; pass --force to overwrite it (or --out to write elsewhere)")
    if path.is_dir():
        fail(f"{path} is a directory; --out takes the path of the tasks file")
    (env,) = load_envs([env_dir])
    try:
        load_phrases(env)  # a vocabulary the gate rejects stops the run before any walk
    except PhraseError as exc:
        fail(str(exc))
    if llm_model and not is_local(llm_model):
        check_model("--llm", llm_model)
        check_api_key("--llm", llm_model, None, None)
    cfg = SynthConfig(min_calls=min_calls, max_calls=max_calls, steer=steer)
    graph = asyncio.run(build_graph(env))
    write_graph(graph, env_dir)
    with rewrite_model(llm_model) as (rewriter, completion_kwargs):
        report = synthesize_tasks(
            env,
            n,
            seed=seed,
            config=cfg,
            graph=graph,
            llm_model=rewriter,
            adversaries=adversaries,
            completion_kwargs=completion_kwargs,
        )
    if report.tasks:
        write_tasks_to(report.tasks, path)
    console.print(
        f"{len(report.tasks)} tasks from {report.attempts} attempts in {report.seconds:.2f}s "
        f"({report.rate:.1f}/s) -> {path}"
    )
    console.print(f"  tool calls tried {report.calls_tried}, failed {report.calls_failed}")
    for reason, count in sorted(report.discarded.items()):
        console.print(f"  discarded {count:4d}  {reason}")
    if llm_model:
        why = ", ".join(f"{cls} {count}" for cls, count in sorted(report.rewrite_rejections.items()))
        console.print(
            f"  rewrites kept {report.rewrites_kept}, rejected {report.rewrites_rejected}"
            + (f" ({why}; those keep the templated wording)" if why else ""),
            highlight=False,
        )
    if not adversaries:
        console.print("  [yellow]adversarial checks off: tasks an adversary games may have shipped[/]")
    if not report.tasks:
        fail(f"no task of the {n} asked could be made and verified ({report.attempts} attempts)", code=1)
    if len(report.tasks) < n:
        why = (
            "attempts kept repeating shipped tasks or failing" if report.exhausted else "attempt budget spent"
        )
        console.print(
            f"{env.name} supports {len(report.tasks)} distinct tasks at this seed: "
            f"{len(report.tasks)} of the {n} asked ({why} after {report.attempts} attempts)"
        )


@synth_app.command("phrases")
def synth_phrases(
    env_dir: Path = typer.Argument(..., help="The env folder."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing phrases file."),
) -> None:
    """Write ENV_DIR/phrases.toml, the vocabulary scenarios are rendered in, derived from the tool
    names and the schema (what env synthesis writes for a new env; edit it by hand to refine)."""
    path = env_dir / PHRASES_FILE
    if path.exists() and not force:
        fail(f"{path} exists; pass --force to overwrite it")
    (env,) = load_envs([env_dir])
    write_phrases(env)
    try:
        phrases = load_phrases(env)
    except PhraseError as exc:
        fail(str(exc))
    console.print(f"{len(phrases.tools)} tool phrases, {len(phrases.entities)} entities -> {path}")


def _bucket(calls: int) -> str:
    return "1-2 calls" if calls <= 2 else "3-4 calls" if calls <= 4 else "5+ calls"


def check_cmd(
    env_dirs: list[Path] = typer.Argument(..., help="Env folders (e.g. envs/*), each with tasks.jsonl."),
    tasks_file: Path | None = typer.Option(
        None,
        "--tasks",
        help="Check this tasks file (what `synth tasks --out FILE` wrote) against the one ENV_DIR "
        "instead of ENV_DIR/tasks.jsonl.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Also print each env's results, realism included, as one JSON object on stdout."
    ),
    strict_realism: bool = typer.Option(
        False,
        "--strict-realism",
        help="Also fail an env whose instructions name tools or number steps, or that has dead reads, "
        "duplicate tasks, or tasks whose user's role may not ask for their writes.",
    ),
) -> None:
    """Run the self-checks and the adversarial agents on every task of each ENV_DIR/tasks.jsonl and
    measure how realistic the tasks are; exit 1 if any check fails or any adversary earns a task's
    full reward, in any env (with --strict-realism, also if a realism target is missed).

    Realism columns: proc = instructions naming a tool, copying its description or numbering
    steps; stiff = machine-like wording; dead = tasks with reads nothing uses / such reads; dup =
    repeated tasks; who = distinct principals (tasks with several); calls, writes, reason = per-task
    min/median/max mean.

    Diversity line: distinct intents (write tools asked for, reasoning kinds, the user's role) in
    all tasks and in the first 10, the fewest in any 10 in a row, the most common intent's share,
    and role mismatches: tasks whose user may not ask for one of their writes (a patient who
    restocks a drug), per the env's policy_rules.toml or its tools' parameters."""
    quiet_tool_failures()
    envs = load_envs(env_dirs)
    if tasks_file is not None:
        if len(env_dirs) != 1:
            fail("--tasks checks one tasks file against one ENV_DIR; give exactly one env folder")
        if not tasks_file.is_file():
            what = "is a directory" if tasks_file.is_dir() else "does not exist"
            fail(f"{tasks_file} {what}; --tasks takes the file `envforge synth tasks --out` wrote")
    for env_dir in env_dirs:
        if tasks_file is None and not (env_dir / "tasks.jsonl").exists():
            fail(f"{env_dir / 'tasks.jsonl'} does not exist (run `envforge synth tasks` first)")
    task_lists = [_read_tasks(env, env_dir, tasks_file) for env, env_dir in zip(envs, env_dirs, strict=True)]
    reports = [
        _check_env(env, env_dir, tasks, strict_realism, legend=len(env_dirs) == 1)
        for env, env_dir, tasks in zip(envs, env_dirs, task_lists, strict=True)
    ]
    failed = [r["env"] for r in reports if not r["passed"]]
    if len(env_dirs) > 1:
        console.print(realism_table([EnvRealism.model_validate(r["realism"]) for r in reports]))
        console.print(REALISM_LEGEND, highlight=False)
        console.print(f"[red]tasks fail in {', '.join(failed)}[/]" if failed else f"{len(envs)} envs pass")
    if as_json:
        print_json({"passed": not failed, "envs": reports})
    if failed:
        raise typer.Exit(1)


REALISM_LEGEND = (
    "proc: instructions naming a tool, copying its description or numbering steps\n"
    "stiff: instructions worded machine-like (a raw code word, 'on file', the user\n"
    "named in the third person, ...; envforge.synth.stiff_wording)\n"
    "dead: tasks with dead reads/dead reads; dup: repeated tasks; who: principals\n"
    "(tasks with several); calls, writes, reason: per task min/median/max mean"
)


class EnvCheck(TypedDict):
    """One env's `check` results, as `--json` prints them under `envs`."""

    env: str
    passed: bool
    tasks: int
    checks_failed: dict[str, int]
    failed_tasks: dict[str, list[str]]
    realism: dict[str, Any]
    """`EnvRealism` as JSON."""
    realism_missed: list[str]
    diversity: dict[str, Any]
    """`Diversity` as JSON: intents, the fewest in any 10 in a row, role mismatches."""


def _read_tasks(env: Environment, env_dir: Path, tasks_file: Path | None) -> list[Task]:
    """The tasks to check: ENV_DIR's own, or `--tasks`' file, which must hold this env's tasks."""
    try:
        tasks = load_tasks(env_dir, tasks_file)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        fail(str(exc))
    others = sorted({t.env for t in tasks} - {env.name})
    if others:
        where = tasks_file or env_dir / "tasks.jsonl"
        fail(f"{where} holds tasks of {', '.join(others)}, not only {env.name}")
    return tasks


def _check_env(
    env: Environment, env_dir: Path, tasks: list[Task], strict_realism: bool = False, *, legend: bool = True
) -> EnvCheck:
    """`check` on one env's `tasks`: print its tables (`legend`: the realism columns explained; a
    run over several envs explains them once, under their joint table); its results (`passed`:
    every task passed, and with `strict_realism` every realism target was met)."""
    graph = load_graph(env_dir) or asyncio.run(build_graph(env))
    verdicts = check_tasks(env, tasks, graph=graph)
    checks = [v.failed_checks for v in verdicts]
    rewards = [v.adversary_rewards for v in verdicts]
    results_by_task = [v.failures for v in verdicts]
    results = {v.task_id: v.golden_results for v in verdicts}
    by_check = Counter(c for r in checks for c in r)
    table = Table(title=f"{env.name}: {len(tasks)} tasks")
    table.add_column("check")
    table.add_column("passed", justify="right")
    table.add_column("failed", justify="right")
    for c in CHECKS:
        table.add_row(c, str(len(tasks) - by_check[c]), str(by_check[c]))
    console.print(table)
    console.print(adversary_table(env.name, rewards))
    buckets = Table(title="by difficulty")
    for col in ("bucket", "tasks", "with reasoning", "failed"):
        buckets.add_column(col, justify="right" if col != "bucket" else "left")
    for b in ("1-2 calls", "3-4 calls", "5+ calls"):
        idx = [i for i, t in enumerate(tasks) if _bucket(t.difficulty.calls) == b]
        buckets.add_row(
            b,
            str(len(idx)),
            str(sum(1 for i in idx if tasks[i].difficulty.reasoning)),
            str(sum(1 for i in idx if results_by_task[i])),
        )
    console.print(buckets)
    descriptions = {name: spec.description for name, spec in env.tools.items()}
    people = load_phrases(env).person_tables()
    realism = measure_realism(env.name, tasks, env.tools, results, descriptions, people)
    console.print(f"{env.name}: realism", highlight=False)
    console.print(realism_table([realism]), highlight=False, markup=False)
    if legend:
        console.print(REALISM_LEGEND, highlight=False, markup=False)
    diversity = measure_diversity(env.name, tasks, roles_of(env, graph))
    console.print(diversity_line(diversity), highlight=False, markup=False)
    missed = realism.strict_failures()
    if diversity.role_mismatches:
        missed.append(f"{diversity.role_mismatches} tasks whose user may not ask for their writes")
    if missed:
        colour = "red" if strict_realism else "yellow"
        console.print(f"[{colour}]realism targets missed:[/] {', '.join(missed)}", highlight=False)
    bad = [f"{t.id} ({', '.join(r)})" for t, r in zip(tasks, results_by_task, strict=True) if r]
    if bad:
        console.print(f"[red]{len(bad)} tasks fail:[/] " + ", ".join(bad[:20]))
    return {
        "env": env.name,
        "passed": not bad and not (strict_realism and missed),
        "tasks": len(tasks),
        "checks_failed": {c: by_check[c] for c in CHECKS},
        "failed_tasks": {t.id: r for t, r in zip(tasks, results_by_task, strict=True) if r},
        "realism": realism.model_dump(mode="json"),
        "realism_missed": missed,
        "diversity": diversity.model_dump(mode="json"),
    }


def adversary_table(env: str, rewards: list[dict[str, float | None]]) -> Table:
    """Per adversary: on how many tasks its run was judged, its best reward, and how many tasks it
    gamed (earned full reward on). A run that is the golden solution in disguise is not judged."""
    table = Table(title=f"{env}: adversarial agents")
    for col in ("adversary", "judged", "best reward", "full reward"):
        table.add_column(col, justify="left" if col == "adversary" else "right")
    for name in ADVERSARIES:
        got = [reward for r in rewards if (reward := r.get(name)) is not None]
        best = f"{max(got):.2f}" if got else "-"
        gamed = sum(1 for g in got if g >= 1.0)
        table.add_row(name, str(len(got)), best, f"[red]{gamed}[/]" if gamed else "0")
    return table


def score_cmd(
    env_dir: Path = typer.Argument(..., help="The env folder."),
    task_id: str = typer.Option(..., "--task", help="Task id from tasks.jsonl."),
    actions: Path = typer.Option(
        ...,
        "--actions",
        help='JSON list of {"name","arguments"} (or {"message"}); a user\'s call adds "requestor": "user".',
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the score as JSON."),
    answers: str = typer.Option(
        "task", help="task: the task's own answer rule | strict: the exact rule (docs/scoring.md)."
    ),
) -> None:
    """Replay ACTIONS in a fresh episode of the task and score the end state.

    In a dual-control env (τ² telecom) each call runs on its requestor's side, from the task's
    initial state, and the reward includes the task's env assertions."""
    quiet_tool_failures()
    answers_mode = choice("--answers", answers, ANSWERS_MODES)
    (env,) = load_envs([env_dir])
    task = next((t for t in load_tasks(env_dir) if t.id == task_id), None)
    if task is None:
        fail(f"no task {task_id!r} in {env_dir / 'tasks.jsonl'}")
    (task,) = with_answers([task], answers_mode)
    try:
        items = json.loads(actions.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"cannot read actions: {exc}")
    if not isinstance(items, list):
        fail("actions must be a JSON list")
    try:
        calls = [
            Call(
                name=a["name"], arguments=a.get("arguments") or {}, requestor=a.get("requestor", "assistant")
            )
            for a in items
            if "name" in a
        ]
    except (ValidationError, TypeError) as exc:
        fail(
            f"actions: each call is {{name, arguments, requestor: assistant|user}} ({exc.__class__.__name__})"
        )
    messages = [str(a.get("message", a.get("content", ""))) for a in items if "name" not in a]

    try:
        score = score_calls(env, task, calls, messages)
    except EnvAssertionError as exc:
        fail(str(exc))
    if as_json:
        print_json(score.model_dump(mode="json"))
    else:
        print_score(task_id, score)


def print_score(task_id: str, score: Score) -> None:
    """A score as a reader wants it on stdout: the reward, then each part and what it missed."""
    out = results
    out.print(f"{task_id}: reward {score.reward:.2f}", highlight=False)
    out.print(f"  state matches expected: {'yes' if score.state_match else 'no'}", highlight=False)
    out.print(
        f"  checkpoints: {score.checkpoints_passed} of {score.checkpoints_total} ({score.checkpoints:.0%})",
        highlight=False,
    )
    missing = f" (missing: {', '.join(score.outputs_missing)})" if score.outputs_missing else ""
    out.print(f"  required outputs found: {score.outputs:.0%}{missing}", markup=False, highlight=False)
    out.print(f"  reward from: {', '.join(str(p) for p in score.basis) or 'nothing'}", highlight=False)
    if score.not_judged:
        out.print(f"  not judged: {', '.join(str(p) for p in score.not_judged)}", highlight=False)
    if score.answer_rule is not None:
        out.print(f"  answers judged by: {score.answer_rule}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("graph")(graph_cmd)
    app.command("check")(check_cmd)
    app.command("score")(score_cmd)
    app.add_typer(synth_app, name="synth")
