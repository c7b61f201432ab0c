"""Synthesized-and-verified tasks per second per bundled env, on one core (one event loop).

Usage: .venv/bin/python benchmarks/bench_synth.py [N]   (default N=100 tasks per env)
The graph is built once per env first and not timed: it is a per-env cost, not a per-task one.
Besides the wall-clock rate it prints the rate per CPU second of this process (`process_time`),
which is what to compare on a shared machine where other jobs stretch the wall clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from envforge.server import EnvLoadError, load_env
from envforge.synth.graph import build_graph
from envforge.synth.pipeline import synthesize

ENVS = ("retail_orders", "flight_booking", "it_tickets")


async def main(n: int) -> None:
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)
    root = Path(__file__).resolve().parents[1] / "envs"
    for name in ENVS:
        try:
            env = load_env(root / name)
        except EnvLoadError as exc:
            print(f"{name:16s} not loadable: {exc.problems[0]}")
            continue
        t0 = time.perf_counter()
        graph = await build_graph(env)
        graph_s = time.perf_counter() - t0
        cpu0 = time.process_time()
        report = await synthesize(env, n, 12345, graph=graph)
        cpu = time.process_time() - cpu0
        print(
            f"{name:16s} {len(report.tasks):4d} tasks / {report.attempts:4d} attempts"
            f" in {report.seconds:6.2f}s"
            f"  -> {report.rate:7.1f} verified tasks/s"
            f"  ({len(report.tasks) / cpu if cpu else 0.0:7.1f} per CPU-s)  (graph {graph_s:.2f}s)"
        )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
