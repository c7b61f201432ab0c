"""Task realism of every bundled env next to τ² retail's own tasks (train split), one table.

Usage: .venv/bin/python benchmarks/bench_realism.py [--tau2 DIR]

Measures each bundled env's `tasks.jsonl` and τ²'s train tasks the same way `envforge check`
does (`envforge.synth.measure_realism`, with the golden calls replayed for their results).
τ²'s tasks are read from `envs/tau2_retail` when it has been imported, else imported from
`../shared/tau2/retail` (read from there, never copied) into a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from envforge.server import Environment, Fleet, load_env
from envforge.synth import (
    EnvRealism,
    SynthContext,
    Task,
    ToolGraph,
    golden_results,
    import_tau2_env,
    load_graph,
    load_phrases,
    load_tasks,
    measure_realism,
    realism_table,
)

ROOT = Path(__file__).resolve().parents[1]
TAU2_SOURCE = ROOT.parent / "shared" / "tau2" / "retail"


async def measure(env: Environment, tasks: list[Task], name: str) -> tuple[EnvRealism, float, float]:
    """The env's realism, the seconds replaying its golden calls took, and the seconds measuring."""
    fleet = Fleet([env])
    try:
        # replaying golden calls needs no probed graph; the env's own is used when it has one
        graph = load_graph(env.root) or ToolGraph(env=env.name, tools=[], edges=[], state_edges=[])
        ctx = SynthContext.create(env, graph, fleet)
        started = time.perf_counter()
        results = {t.id: await golden_results(ctx, t) for t in tasks}
        replayed = time.perf_counter()
    finally:
        await fleet.aclose()
    descriptions = {tool: spec.description for tool, spec in env.tools.items()}
    # the tables whose rows are persons, as `envforge check` passes them (none for τ², derived)
    people = load_phrases(env).person_tables()
    realism = measure_realism(name, tasks, env.tools, results, descriptions, people)
    return realism, replayed - started, time.perf_counter() - replayed


def bundled() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "envs").iterdir()
        if (p / "tasks.jsonl").exists() and (p / "seed.json").exists() and p.name != "tau2_retail"
    )


def tau2_train(env_dir: Path) -> tuple[Environment, list[Task]]:
    env = load_env(env_dir)
    return env, [t for t in load_tasks(env_dir) if "train" in t.split]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tau2", type=Path, default=TAU2_SOURCE, help="τ²-bench's retail folder")
    args = parser.parse_args()
    started = time.perf_counter()
    measured = []
    for env_dir in bundled():
        env = load_env(env_dir)
        measured.append(asyncio.run(measure(env, load_tasks(env_dir), env.name)))
    imported = ROOT / "envs" / "tau2_retail"
    with tempfile.TemporaryDirectory() as tmp:
        if not (imported / "tasks.jsonl").exists():
            if not (args.tau2 / "tasks.json").exists():
                sys.exit(f"error: no τ² retail tasks at {args.tau2} (pass --tau2 DIR)")
            imported = Path(tmp) / "tau2_retail"
            import_tau2_env(args.tau2, imported)
        env, tasks = tau2_train(imported)
        measured.append(asyncio.run(measure(env, tasks, "tau2 (train)")))
    print(realism_table([r for r, _, _ in measured]))
    print()
    print("seconds per env: replaying the golden calls + measuring (what `check` adds)")
    for r, replay_s, measure_s in measured:
        print(f"  {r.env:<14} {replay_s:6.2f} + {measure_s:5.2f}  ({r.tasks} tasks)")
    print(f"all, imports included: {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
