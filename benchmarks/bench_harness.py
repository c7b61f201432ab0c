"""Harness speed with the LLM cost removed: episodes/s and harness overhead per turn.

The `oracle` agent answers instantly (it replays the golden calls) and the scripted user needs no
model, so what remains is the harness itself: episode creation, MCP sessions, the conversation loop,
scoring, and the fsynced run log. Overhead per turn = (trial time - raw tool-call time) / turns,
where the raw cost is the same calls made directly on the runtime (`Fleet.call`) in this run.
Targets: < 1 ms of overhead per turn; 256 concurrent episodes on 2 cores without errors.
`--procs 1,2` runs each level over that many processes too (`envforge eval --procs`): CPU per
episode counts the children's CPU as well (this process's and its waited-for children's rusage).

usage: python benchmarks/bench_harness.py [--trials K] [--concurrency 1,32,256] [--procs 1,2]
"""

from __future__ import annotations

import argparse
import logging
import resource
import tempfile
import time
from pathlib import Path

import anyio
from _util import REPO
from rich.console import Console
from rich.table import Table

from envforge.harness import EvalConfig, run_eval
from envforge.server import Fleet, load_env
from envforge.synth import load_tasks

ENVS = [REPO / "envs" / n for n in ("retail_orders", "flight_booking", "it_tickets")]


async def raw_call_seconds(env_dirs: list[Path]) -> tuple[float, int]:
    """Seconds to make every task's golden calls directly on the runtime, and how many calls."""
    total, calls = 0.0, 0
    for env_dir in env_dirs:
        env = load_env(env_dir)
        fleet = Fleet([env])
        for task in load_tasks(env_dir):
            episode = await fleet.create_episode(env.name)
            t0 = time.perf_counter()
            for call in task.golden_calls:
                await fleet.call(episode.id, call.name, call.arguments)
            total += time.perf_counter() - t0
            calls += len(task.golden_calls)
            await fleet.close_episode(episode.id)
        await fleet.aclose()
    return total, calls


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (the --procs children)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def main(trials: int, levels: list[int], procs: list[int]) -> None:
    logging.getLogger("envforge").setLevel(logging.CRITICAL)
    console = Console()
    raw_s, raw_calls = await raw_call_seconds(ENVS)
    n_tasks = sum(len(load_tasks(d)) for d in ENVS)
    console.print(
        f"raw runtime cost: {raw_calls} golden calls in {raw_s * 1e3:.0f} ms "
        f"({raw_s / raw_calls * 1e6:.0f} us per call)"
    )
    table = Table(title=f"oracle agent + scripted user, {n_tasks} tasks x {trials} trials")
    columns = ("concurrency", "procs", "episodes/s", "CPU ms/episode", "turns", "ms/episode (wall)")
    for col in (*columns, "overhead/turn", "errors"):
        table.add_column(col, justify="right")
    for level in levels:
        for n in procs:
            with tempfile.TemporaryDirectory() as tmp:
                config = EvalConfig(agent="oracle", trials=trials, concurrency=level, procs=n)
                t0, cpu0 = time.perf_counter(), cpu_seconds()
                _, records = await run_eval(ENVS, config, Path(tmp) / "run")
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            turns = sum(len(r.messages) for r in records)
            cpu_busy = sum(r.duration_s for r in records)
            overhead = (cpu_busy - raw_s * trials) / turns if level == 1 and n == 1 else None
            errors = sum(r.status != "completed" or r.reward < 1.0 for r in records)
            table.add_row(
                str(level),
                str(n),
                f"{len(records) / wall:.1f}",
                f"{cpu / len(records) * 1e3:.2f}",
                str(turns),
                f"{wall / len(records) * 1e3:.2f}",
                f"{overhead * 1e3:.3f} ms" if overhead is not None else "-",
                str(errors),
            )
    console.print(table)
    console.print(
        "overhead/turn is measured at concurrency 1 (per-trial durations overlap above that); "
        "a turn is one message of the trajectory."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--concurrency", default="1,32,256")
    parser.add_argument("--procs", default="1", help="comma-separated process counts (envforge eval --procs)")
    args = parser.parse_args()
    levels, procs = ([int(x) for x in arg.split(",")] for arg in (args.concurrency, args.procs))
    anyio.run(main, args.trials, levels, procs)
