"""`envforge demo`: the main job on the bundled envs, in-process and offline.

Serves every bundled env with tasks in one in-process fleet, evaluates three built-in agents
(`oracle`: the golden calls, the ceiling; `random`: schema-valid random calls; `noop`: no tools,
the floor) against the scripted user on a handful of tasks per env and, when the `local` extra is
installed, a real model (`local`: the packaged Qwen2.5-Coder-0.5B behind its local server) on a
few of them; prints the pass^k table of each, and writes each run (and its HTML report, with the
model's conversations) to `runs/demo-<agent>/`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from envforge.harness import AgentName, TrialClock, UserName
from envforge.synth import load_tasks

from .local_roles import local_roles
from .progress import work_progress

if TYPE_CHECKING:
    from envforge.harness import LLMConfig

REPO = Path(__file__).resolve().parents[1]
AGENTS = (AgentName.ORACLE, AgentName.RANDOM, AgentName.NOOP)
TASKS_PER_ENV = 5
LOCAL_AGENT = "local"
LOCAL_TASKS = {"retail_orders": 1}
"""env -> how many of its first tasks the local model plays: on two busy CPU cores each env's
first prompt (policy and tools) takes a minute to process, so a warm demo stays within minutes."""
LOCAL_MAX_TURNS = 3


def demo_env_dirs() -> list[Path]:
    """Bundled envs that ship tasks (tau2_retail needs an import first, so it is left out)."""
    return sorted(
        p for p in (REPO / "envs").iterdir() if (p / "env.toml").exists() and (p / "tasks.jsonl").exists()
    )


def local_model_ready() -> bool:
    from envforge.harness import local_model_ready as ready

    return ready(LOCAL_AGENT)


async def _run(
    console: Console, runs_root: Path, agent: str, dirs: list[Path], config_extra: dict[str, Any]
) -> float:
    """Evaluate `agent`, print its table and report; its wall seconds per trial."""
    from envforge.harness import (  # litellm: imported only when needed
        EvalConfig,
        print_summary,
        run_eval,
        summarize,
    )

    out = runs_root / f"demo-{agent}"
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    config = EvalConfig(agent=agent, user=UserName.SCRIPTED, trials=1, **config_extra)
    with work_progress(
        TextColumn("[bold]demo[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        label="demo",
        transient=True,
    ) as progress:
        bar = progress.add_task(agent, total=None)
        manifest, records = await run_eval(
            dirs,
            config,
            out,
            on_start=lambda total, done: progress.update(bar, total=total, completed=done),
            on_record=lambda record: progress.advance(bar),
        )
    took = time.perf_counter() - started
    console.rule(f"agent [bold]{agent}[/] ({took:.1f} s)")
    print_summary(summarize(records, manifest.trials), console)
    try:
        from envforge.harness import write_report
    except ImportError:
        console.print(f"run: {out}")
    else:
        console.print(f"run: {out}  report: {write_report(out)}")
    return took / max(len(records), 1)


async def _demo(console: Console, runs_root: Path, tasks_per_env: int, local: LLMConfig | None) -> None:
    from envforge.harness import Limits

    dirs = demo_env_dirs()
    chosen = {d.name: [t.id for t in load_tasks(d)[:tasks_per_env]] for d in dirs}
    task_ids = [i for ids in chosen.values() for i in ids]
    console.print(f"[bold]envforge demo[/]: {describe_selection(chosen)}")
    for agent in AGENTS:
        await _run(console, runs_root, agent, dirs, {"concurrency": 4, "task_ids": task_ids})
    per_trial: float | None = None
    if local is not None:
        local_dirs = [d for d in dirs if d.name in LOCAL_TASKS]
        local_ids = [t.id for d in local_dirs for t in load_tasks(d)[: LOCAL_TASKS[d.name]]]
        per_trial = await _run(
            console,
            runs_root,
            LOCAL_AGENT,
            local_dirs,
            {
                "agent_llm": local,
                "concurrency": 1,  # one server, one prompt cache: trials in turn keep their prefix warm
                "task_ids": local_ids,
                "limits": Limits(max_turns=LOCAL_MAX_TURNS),
            },
        )
        # the eval the closing advice suggests (same model, same turns) then estimates before it starts
        TrialClock.remember(TrialClock.key_of([f"agent={LOCAL_AGENT}"], LOCAL_MAX_TURNS), per_trial)
    else:
        console.print("\nThe local model is not installed (pip install -e '.[local]'; make setup does).")
    print_next_steps(console, dirs, per_trial, sum(len(ids) for ids in chosen.values()))


def describe_selection(chosen: dict[str, list[str]]) -> str:
    """What the demo plays, as it is: `a, b, c: 5 tasks each`, or each env's count where they differ
    (some envs ship fewer tasks than the demo takes)."""
    counts = {env: len(ids) for env, ids in chosen.items()}
    if len(set(counts.values())) == 1:
        (n,) = set(counts.values())
        return f"{', '.join(counts)}: {n} task{'s' if n != 1 else ''} each"
    per_env = ", ".join(f"{env} ({n})" for env, n in counts.items())
    return f"{sum(counts.values())} tasks: {per_env}"


ADVICE_MINUTES = 10
"""The local-model command the demo suggests is sized to fit this many minutes on this machine."""


def local_advice(per_trial: float | None, all_trials: int) -> str:
    """The local-model eval to try next, sized from the demo's own trial time so that it takes
    minutes, with what it and the whole demo set would cost; unmeasured, a small one and a warning."""
    if per_trial is None:
        return (
            f"  envforge eval envs/retail_orders --agent local --user scripted --limit 2 --max-turns "
            f"{LOCAL_MAX_TURNS} --out runs/local   # a local trial takes minutes on a CPU"
        )
    n = max(1, min(TASKS_PER_ENV, int(ADVICE_MINUTES * 60 // max(per_trial, 1.0))))
    cost = TrialClock.estimate(n, per_trial, measured="measured here just now")
    return (
        f"  envforge eval envs/retail_orders --agent local --user scripted --limit {n} --max-turns "
        f"{LOCAL_MAX_TURNS} --out runs/local\n"
        f"    # {cost}; all {all_trials} demo tasks would take about "
        f"{TrialClock.duration(all_trials * per_trial)}"
    )


def print_next_steps(
    console: Console, dirs: list[Path], per_trial: float | None = None, all_trials: int = 0
) -> None:
    env_args = " ".join(str(d.relative_to(REPO)) for d in dirs)
    console.print(
        "\nEvaluate a real model instead (local\\[/<name>]: a packaged model run offline; or any litellm "
        "model string, vLLM: hosted_vllm/<model> with --agent-api-base):\n"
        f"{local_advice(per_trial, all_trials)}\n"
        f"  envforge eval {env_args} --agent openai/gpt-4o-mini --user openai/gpt-4o-mini "
        "--trials 4 --concurrency 8 --out runs/gpt-4o-mini",
        highlight=False,
        soft_wrap=True,  # commands to copy: never broken at the console's width (80 off a terminal)
    )


def demo() -> None:
    """Evaluate the built-in agents (oracle, random, noop) and, when installed, the local model on
    the bundled envs, in-process and offline."""
    console = Console()
    roles: dict[str, str | None] = {"agent": LOCAL_AGENT} if local_model_ready() else {}
    with local_roles(roles, {"agent": 0.0}) as local:
        anyio.run(_demo, console, Path("runs"), TASKS_PER_ENV, local.get("agent"))
