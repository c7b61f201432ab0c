"""The shared τ² retail harness workload: simulations per hour against an instant fake LLM.

Usage: .venv/bin/python benchmarks/bench_tau2_workload.py [--concurrency 1,8,32] [--rounds 3] [--judge]

Starts `../shared/bench/instant_llm.py` (read from there, never copied), imports τ² retail into a
temp dir if `envs/tau2_retail` has no tasks, then runs `envforge eval --split train` (the 74 train tasks), one
trial each, with agent and user `openai/fake` at each concurrency. Each setting runs with both LLM
routes: the direct HTTP one (default) and litellm (`--llm-transport litellm`), the in-run
baseline. Rate = trials / (last trial end - first trial start), so process start-up is excluded;
the median of the rounds is printed with its ratio to τ²-bench 1.0.1's own runner on this machine
kind (the figures in ../shared/bench/README.md) and to the litellm route.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ENVFORGE = str(Path(sys.executable).with_name("envforge"))
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
TAU2_REFERENCE = {1: 7771, 8: 5931, 32: 5173}
"""Simulations/hour of τ²-bench 1.0.1's runner on the same workload, from ../shared/bench/README.md."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_dir(tmp: Path) -> Path:
    bundled = ROOT / "envs" / "tau2_retail"
    if (bundled / "tasks.jsonl").exists():
        return bundled
    out = tmp / "tau2_retail"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "import",
            "tau2",
            str(SHARED / "tau2" / "retail"),
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
        env=ENV,
    )
    return out


def train_ids(env: Path) -> list[str]:
    rows = [json.loads(line) for line in (env / "tasks.jsonl").read_text().splitlines() if line.strip()]
    return [r["id"] for r in rows if "train" in r.get("split", [])]


def run_once(env: Path, ids: list[str], base: str, concurrency: int, transport: str, out: Path) -> float:
    args = [
        ENVFORGE, "eval", str(env), "--split", "train", "--trials", "1",
        "--agent", "openai/fake", "--agent-api-base", base, "--user", "openai/fake", "--user-api-base", base,
        "--concurrency", str(concurrency), "--llm-transport", transport, "--out", str(out), "--json",
    ]  # fmt: skip
    subprocess.run(
        args, check=True, capture_output=True, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    )
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(records) == len(ids) and all(r["status"] == "completed" for r in records), "a trial failed"
    start = min(r["started_at"] for r in records)
    end = max(r["started_at"] + r["duration_s"] for r in records)
    return len(records) / (end - start) * 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    port = free_port()
    fake = subprocess.Popen([sys.executable, str(SHARED / "bench" / "instant_llm.py"), str(port)])
    base = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(base.removesuffix("/v1") + "/stats", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            env = env_dir(Path(tmp))
            ids = train_ids(env)
            print(f"{len(ids)} train tasks, {opts.rounds} rounds each, median sims/hour")
            print(f"{'conc':>4} {'http':>9} {'litellm':>9} {'τ² ref':>7} {'http/τ²':>8} {'http/litellm':>13}")
            for c in (int(x) for x in opts.concurrency.split(",")):
                rates: dict[str, list[float]] = {"http": [], "litellm": []}
                for r in range(opts.rounds):
                    for transport in rates:
                        out = Path(tmp) / f"run-{c}-{transport}-{r}"
                        rates[transport].append(run_once(env, ids, base, c, transport, out))
                http, lite = (statistics.median(rates[t]) for t in ("http", "litellm"))
                ref = TAU2_REFERENCE.get(c)
                vs_ref = f"{http / ref:7.1f}×" if ref else "      –"
                print(f"{c:>4} {http:>9,.0f} {lite:>9,.0f} {ref or '–':>7} {vs_ref} {http / lite:12.1f}×")
        stats = json.loads(urllib.request.urlopen(base.removesuffix("/v1") + "/stats").read())
        print(f"fake LLM served: {stats}")
    finally:
        fake.terminate()


if __name__ == "__main__":
    main()
