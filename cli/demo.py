"""`envforge demo`: the main job on the bundled envs, in-process and offline.

Serves every bundled env with tasks in one in-process fleet, evaluates three built-in agents
(`oracle`: the golden calls, the ceiling; `random`: schema-valid random calls; `noop`: no tools,
the floor) against the scripted user on a handful of tasks per env, prints the pass^k table, and
writes each run (and its HTML report, when the report module is present) to `runs/demo-<agent>/`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import anyio
from rich.console import Console

from envforge.harness import AgentName, UserName
from envforge.synth import load_tasks

REPO = Path(__file__).resolve().parents[1]
AGENTS = (AgentName.ORACLE, AgentName.RANDOM, AgentName.NOOP)
TASKS_PER_ENV = 5


def demo_env_dirs() -> list[Path]:
    """Env folders under envs/ that hold tasks (envs/tau2_retail too, once `import tau2` wrote it)."""
    return sorted(
        p for p in (REPO / "envs").iterdir() if (p / "env.toml").exists() and (p / "tasks.jsonl").exists()
    )


async def _demo(console: Console, runs_root: Path, tasks_per_env: int) -> None:
    from envforge.harness import (  # litellm: imported only when needed
        EvalConfig,
        print_summary,
        run_eval,
        summarize,
    )

    dirs = demo_env_dirs()
    task_ids = [t.id for d in dirs for t in load_tasks(d)[:tasks_per_env]]
    console.print(f"[bold]envforge demo[/]: {', '.join(d.name for d in dirs)}, {tasks_per_env} tasks each")
    for agent in AGENTS:
        out = runs_root / f"demo-{agent}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        config = EvalConfig(agent=agent, user=UserName.SCRIPTED, trials=1, concurrency=4, task_ids=task_ids)
        manifest, records = await run_eval(dirs, config, out)
        console.rule(f"agent [bold]{agent}[/] ({time.perf_counter() - started:.1f} s)")
        print_summary(summarize(records, manifest.trials), console)
        try:
            from envforge.harness import write_report
        except ImportError:
            console.print(f"run: {out}")
        else:
            console.print(f"run: {out}  report: {write_report(out)}")
    env_args = " ".join(str(d.relative_to(REPO)) for d in dirs)
    console.print(
        "\nEvaluate a real model instead (any litellm model string; vLLM: hosted_vllm/<model> "
        "with --agent-api-base):\n"
        f"  envforge eval {env_args} --agent openai/gpt-4o-mini --user openai/gpt-4o-mini "
        "--trials 4 --concurrency 8 --out runs/gpt-4o-mini"
    )


def demo() -> None:
    """Evaluate the built-in agents (oracle, random, noop) on the bundled envs, in-process and offline."""
    anyio.run(_demo, Console(), Path("runs"), TASKS_PER_ENV)
