"""Thousands of slow episodes in flight: τ² retail against a 1 s-latency fake model, per concurrency.

Usage: .venv/bin/python benchmarks/bench_inflight.py [--concurrency 64,256,1024,2048]

For each concurrency C, `envforge eval envs/tau2_retail --split train` runs with enough trials to
keep C simulations in flight (ceil(C / 74) trials of the 74 train tasks), once against
`../shared/bench/instant_llm.py` (answers at once) and once against `latency_llm.py` with 1 s per
answer, both read from `../shared/bench/` and each a process of its own, so the fake's CPU is not
the harness's. Printed per C and fake: simulations, errors, simulations per second inside the run
(first trial start to last trial end), the harness process's own CPU per simulation (its user +
system time from `wait4`, less the start-up and one simulation that a one-trial run costs), its
peak resident memory, and the 1 s run's throughput as a share of the instant one's (1.0: the
latency is fully hidden), and the event loop's lag while trials ran: the run sets
`ENVFORGE_LOOP_LAG`, so a task in it sleeps 10 ms over and over and notes how late it woke (p50,
p99 and max in ms: how long a ready trial waits for the one loop). Resident memory per concurrent
episode is the growth of the peak from the smallest C, per added episode, next to the database's
size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_tau2_workload import ENV, ENVFORGE, SHARED, env_dir, free_port, train_ids


def start_fake(script: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SHARED / "bench" / script), str(port), *args])
    base = f"http://127.0.0.1:{port}/v1"
    for _ in range(100):
        try:
            urllib.request.urlopen(base.removesuffix("/v1") + "/stats", timeout=1)
            return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{script} did not start")


def run_eval(env: Path, base: str, trials: int, concurrency: int, out: Path, limit: int = 0) -> dict:
    """One `envforge eval` process: its records' figures and its own CPU seconds and peak RSS."""
    args = [
        ENVFORGE, "eval", str(env), "--split", "train", "--trials", str(trials),
        "--agent", "openai/fake", "--agent-api-base", base, "--user", "openai/fake", "--user-api-base", base,
        "--concurrency", str(concurrency), "--out", str(out), "--json", "--timeout", "600",
    ]  # fmt: skip
    if limit:
        args += ["--limit", str(limit)]
    lag_file = out.with_name(out.name + "-lag.json")
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**ENV, "ENVFORGE_LOOP_LAG": str(lag_file)},
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(
            f"eval exited {status}: {proc.stderr.read().decode()[-400:] if proc.stderr else ''}"
        )
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines() if line]
    start = min(r["started_at"] for r in records)
    end = max(r["started_at"] + r["duration_s"] for r in records)
    return {
        "sims": len(records),
        "errors": sum(r["status"] != "completed" for r in records),
        "rate": len(records) / (end - start),
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
        "mean_trial_s": sum(r["duration_s"] for r in records) / len(records),
        "lag": json.loads(lag_file.read_text()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="64,256,1024,2048")
    parser.add_argument("--latency", type=float, default=1.0)
    opts = parser.parse_args()
    levels = [int(c) for c in opts.concurrency.split(",")]
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    instant, instant_base = start_fake("instant_llm.py")
    slow, slow_base = start_fake("latency_llm.py", str(opts.latency))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = env_dir(Path(tmp))
            tasks = len(train_ids(env))
            db_mb = (env / "seed.json").stat().st_size / 2**20
            fixed = run_eval(env, instant_base, 1, 1, Path(tmp) / "fixed", limit=1)
            print(
                f"{tasks} train tasks; seed.json {db_mb:.1f} MB; a one-simulation run costs "
                f"{fixed['cpu']:.2f} CPU-s (start-up), subtracted below"
            )
            print(
                f"{'C':>5} {'fake':>7} {'sims':>5} {'err':>4} {'sims/s':>7} {'trial s':>8}"
                f" {'CPU ms/sim':>11} {'peak RSS MB':>12} {'1 s / instant':>14}"
                f" {'loop lag ms p50/p99/max':>24}"
            )
            first_rss: tuple[int, float] | None = None
            for c in levels:
                trials = math.ceil(c / tasks)
                rows = {}
                for name, base in (("instant", instant_base), (f"{opts.latency:g} s", slow_base)):
                    rows[name] = run_eval(env, base, trials, c, Path(tmp) / f"run-{c}-{name.split()[0]}")
                for name, r in rows.items():
                    per_sim = 1000 * (r["cpu"] - fixed["cpu"]) / max(1, r["sims"] - 1)
                    ratio = r["rate"] / rows["instant"]["rate"]
                    lag = r["lag"]
                    lags = "/".join(
                        "–" if lag[k] is None else f"{lag[k]:.0f}" for k in ("p50_ms", "p99_ms", "max_ms")
                    )
                    print(
                        f"{c:>5} {name:>7} {r['sims']:>5} {r['errors']:>4} {r['rate']:>7.1f} "
                        f"{r['mean_trial_s']:>8.2f} {per_sim:>11.1f} {r['rss_mb']:>12.0f} {ratio:>14.2f}"
                        f" {lags:>24}",
                        flush=True,
                    )
                peak = rows[f"{opts.latency:g} s"]["rss_mb"]
                if first_rss is None:
                    first_rss = (c, peak)
                elif c > first_rss[0]:
                    per = (peak - first_rss[1]) / (c - first_rss[0])
                    print(f"      RSS per added concurrent episode: {per:.2f} MB (database {db_mb:.1f} MB)")
    finally:
        instant.terminate()
        slow.terminate()
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
