"""Synthesized-and-verified tasks per second per bundled env, on one core (one event loop).

Usage: .venv/bin/python benchmarks/bench_synth.py [N] [RUNS] [--adversaries on|off|both]
       (defaults: N=100 tasks, RUNS=3, adversaries on)

The graph is built once per env first and not timed: it is a per-env cost, not a per-task one.
Each run synthesizes N tasks with seed 12345 afresh (a new context: nothing carries over), once
steered (the default: walks weigh their choices by what worked in earlier attempts, `outcomes.py`)
and once unsteered (`SynthConfig(steer=False)`), the baseline, alternating, so that both see the
same machine. The rate is per CPU second of this process (`process_time`), which is what to
compare on a shared machine where other jobs stretch the wall clock; as they also slow the CPU
itself (a shared host steals cycles, and its speed swings from minute to minute), rounds go
through the envs in turn (a slow minute then falls on all of them, not on whichever env was
running), the best of RUNS is printed with the median, and the steered/unsteered ratio is the
median of each round's ratio (the two runs of a round are adjacent in time).

Each round also times a fixed reference workload (JSON and SQLite work of the kind synthesis
does, nothing of envforge's): how long it took, against the fastest of the run, shows how fast the
host was while that round ran.

`--adversaries both` adds a third mode, steered with the adversarial checks off
(`synthesize(..., adversaries=False)`), run in the same rounds, so that what the checks cost is
read off one run: "steered ÷ no-adversaries" is printed like the steering ratio. `off` runs the
two modes without the checks. Per mode, besides shipped tasks per CPU-second, "checked" counts
per CPU-second the tasks that passed the self-checks and were judged by the adversaries (shipped
or dropped by them): the rate the checks leave when a scorer the adversaries game drops tasks.

Besides speed, per mode: tool calls tried and failed per verified task, and how the shipped
tasks' successful write calls spread over the env's write tools (how many tools, and the entropy
of the spread in bits): steering must not buy its speed by narrowing the tasks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sqlite3
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from envforge.server import Environment, EnvLoadError, load_env
from envforge.synth import SynthConfig, SynthReport, ToolGraph, build_graph, synthesize

ENVS = ("retail_orders", "flight_booking", "it_tickets")
MODES = {"steered": (SynthConfig(), True), "unsteered": (SynthConfig(steer=False), True)}
NO_ADVERSARIES = "no-adversaries"


def modes_for(adversaries: str) -> dict[str, tuple[SynthConfig, bool]]:
    """The modes a run compares: steered and unsteered, with the adversarial checks as asked."""
    if adversaries == "off":
        return {name: (cfg, False) for name, (cfg, _) in MODES.items()}
    if adversaries == "both":
        return {**MODES, NO_ADVERSARIES: (SynthConfig(), False)}
    return dict(MODES)


def judged(report: SynthReport) -> int:
    """Tasks that passed the self-checks: shipped, or dropped by an adversary."""
    return len(report.tasks) + sum(c for r, c in report.discarded.items() if r.startswith("adversary:"))


def write_spread(env: Environment, report: SynthReport) -> tuple[int, float]:
    """(write tools used, entropy in bits) of the successful write calls in the report's tasks."""
    counts = Counter(
        n.call.name
        for t in report.tasks
        for n in t.dag.nodes
        if n.kind == "call" and n.write and n.executed and not n.expect_error
    )
    total = sum(counts.values())
    return len(counts), -sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0


def reference_workload() -> float:
    """CPU seconds of a fixed mix of JSON and SQLite work (about 30 ms on a quiet core)."""
    started = time.process_time()
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, owner TEXT, amount REAL, status TEXT)")
    rows = [(f"R-{i}", f"M-{i % 37}", i * 1.25, ("open", "closed")[i % 2]) for i in range(200)]
    conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    for i in range(400):
        found = conn.execute("SELECT * FROM t WHERE owner = ? ORDER BY id", (f"M-{i % 37}",)).fetchall()
        text = json.dumps([dict(zip(("id", "owner", "amount", "status"), r, strict=True)) for r in found])
        json.loads(text)
    conn.close()
    return time.process_time() - started


async def main(n: int, runs: int, adversaries: str = "on") -> None:
    modes = modes_for(adversaries)
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)
    root = Path(__file__).resolve().parents[1] / "envs"
    envs: dict[str, tuple[Environment, ToolGraph, float]] = {}
    for name in ENVS:
        try:
            env = load_env(root / name)
        except EnvLoadError as exc:
            print(f"{name:16s} not loadable: {exc.problems[0]}")
            continue
        t0 = time.perf_counter()
        graph = await build_graph(env)
        envs[name] = (env, graph, time.perf_counter() - t0)
    rates = {name: {mode: [] for mode in modes} for name in envs}
    checked = {name: {mode: [] for mode in modes} for name in envs}
    reports: dict[str, dict[str, SynthReport]] = {name: {} for name in envs}
    reference: list[float] = []
    for r in range(runs):
        reference.append(reference_workload())
        for name, (env, graph, _) in envs.items():
            order = list(modes) if r % 2 == 0 else list(reversed(modes))  # none always goes first
            for mode in order:
                cfg, adv = modes[mode]
                cpu0 = time.process_time()
                report = await synthesize(env, n, 12345, cfg, graph=graph, adversaries=adv)
                cpu = time.process_time() - cpu0
                rates[name][mode].append(len(report.tasks) / cpu if cpu else 0.0)
                checked[name][mode].append(judged(report) / cpu if cpu else 0.0)
                reports[name][mode] = report
    fastest = min(reference)
    print(
        f"host: reference workload {1000 * fastest:.1f} ms at its fastest; per round, x slower: "
        + ", ".join(f"{ref / fastest:.2f}" for ref in reference)
    )
    for name, (env, _, graph_s) in envs.items():
        print(f"{name} (graph {graph_s:.2f}s)")
        for mode in modes:
            report = reports[name][mode]
            done = max(1, len(report.tasks))
            tools, bits = write_spread(env, report)
            print(
                f"  {mode:9s} {len(report.tasks):4d} tasks / {report.attempts:4d} attempts"
                f"  best {max(rates[name][mode]):6.1f}  median {statistics.median(rates[name][mode]):6.1f}"
                f"  verified tasks per CPU-s (checked: median {statistics.median(checked[name][mode]):6.1f});"
                f"  dropped by adversaries {judged(report) - len(report.tasks)},"
                f" duplicates {report.discarded['duplicate']};  calls tried {report.calls_tried / done:5.1f},"
                f" failed {report.calls_failed / done:5.1f} per task;"
                f"  writes over {tools} tools, {bits:.2f} bits"
            )
        # Each round's two runs are adjacent in time: their ratio is what the host's swings
        # disturb least.
        pairs = zip(rates[name]["steered"], rates[name]["unsteered"], strict=True)
        ratios = [a / b for a, b in pairs if b]
        print(f"  steered / unsteered, median of the {runs} rounds' ratios: {statistics.median(ratios):.2f}x")
        if NO_ADVERSARIES in modes:
            for label, series in (("shipped", rates), ("checked", checked)):
                pairs = zip(series[name]["steered"], rates[name][NO_ADVERSARIES], strict=True)
                ratios = [a / b for a, b in pairs if b]
                print(
                    f"  steered with adversaries ({label}) / {NO_ADVERSARIES}, median of the rounds' ratios:"
                    f" {statistics.median(ratios):.2f}x"
                )


if __name__ == "__main__":
    argv = sys.argv[1:]
    adversaries = "on"
    if "--adversaries" in argv:
        at = argv.index("--adversaries")
        adversaries = argv[at + 1] if at + 1 < len(argv) else ""
        del argv[at : at + 2]
    if adversaries not in ("on", "off", "both"):
        sys.exit("--adversaries takes on, off or both")
    args = [int(a) for a in argv[:2]]
    asyncio.run(main(args[0] if args else 100, args[1] if len(args) > 1 else 3, adversaries))
