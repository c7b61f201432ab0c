"""Re-score the trajectories a training run saved under the reward rules as they are now.

A run's `trajectories.jsonl` (`envforge train --save-trajectories`) keeps each episode's messages
and the reward it was trained on. When the rules change (the exact answer rule, what counts as
shown), this says whether a reported run still stands: each trajectory's outputs part is judged
again from its own messages (what the agent said; what it was shown: the user's messages and the
results of the task's own calls, `shown_results`), times the parts that did not change. Lookup-task runs
only (`--tasks lookup`), whose tasks are rebuilt from the envs:

    python benchmarks/rescore_trajectories.py RUNS/erpo RUNS/control
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from envforge.harness import parse_tool_calls
from envforge.server import Fleet, load_env
from envforge.synth import Task, shown_results, task_outputs_missing
from envforge.trainer import lookup_tasks

REPO = Path(__file__).resolve().parents[1]


async def _tasks(envs: set[str]) -> dict[str, Task]:
    out: dict[str, Task] = {}
    for name in sorted(envs):
        async with Fleet([load_env(REPO / "envs" / name)]) as fleet:
            out |= {t.id: t for t in await lookup_tasks(fleet, name)}
    return out


def _said_and_shown(task: Task, messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The agent's messages to the user, and what it was shown (as every scorer passes it)."""
    said: list[str] = []
    results: list[tuple[str, dict[str, Any], str]] = []
    name, arguments = "", {}
    for i, m in enumerate(messages):
        text = m.get("content") or ""
        if m["role"] == "assistant":
            if i + 1 < len(messages) and messages[i + 1]["role"] == "tool":
                _, calls = parse_tool_calls(text)
                name, arguments = (calls[0].name, calls[0].arguments) if calls else ("", {})
            else:
                said.append(text)
        elif m["role"] == "tool":
            results.append((name, arguments, text))
    opening = [m["content"] for m in messages if m["role"] == "user"]
    return said, [*opening, *shown_results(task, results)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders holding trajectories.jsonl")
    args = parser.parse_args()
    runs = {run: [json.loads(line) for line in (run / "trajectories.jsonl").open()] for run in args.runs}
    tasks = anyio.run(_tasks, {t["env"] for trajs in runs.values() for t in trajs})
    for run, trajs in runs.items():
        moved: Counter[tuple[float, float]] = Counter()
        for t in trajs:
            task = tasks[t["task_id"]]
            said, shown = _said_and_shown(task, t["messages"])
            outputs = 0.0 if task_outputs_missing(task, said, shown) else 1.0
            others = [v for part, v in t["parts"].items() if part != "outputs"]
            now = outputs * (min(others) if others else 1.0)
            if now != t["reward"]:
                moved[(t["reward"], now)] += 1
        kept = len(trajs) - sum(moved.values())
        print(f"{run}: {len(trajs)} trajectories, {kept} keep their reward; changed: {dict(moved) or 'none'}")


if __name__ == "__main__":
    main()
