"""envforge's harness against τ²-bench's own runner on one τ² domain, side by side in one run.

Usage:
    .venv/bin/python benchmarks/bench_tau2_side_by_side.py --domain airline \\
        --tau2-python /path/to/tau2-venv/bin/python --tau2-data /path/to/tau2-bench/data \\
        [--concurrency 1,32] [--rounds 3]

Both harnesses run the domain's train split, one trial per task, agent and user played by the same
instant fake LLM (no model cost): `../shared/bench/instant_llm.py` for retail, this folder's
`instant_llm_airline.py` and `instant_llm_telecom.py` for the others (the same script shape on
their tools; telecom's user also works its phone once). Each round runs
envforge (`envforge eval --split train`) and then τ² (`tau2 run --task-split-name train`) as
subprocesses. Three figures each, medians of the rounds, the ratio envforge over τ²: simulations
per CPU-second and per hour of wall time of the whole process, start-up included (user + system
time of the harness process and its children, the fake excluded), and simulations per hour inside
the run (first simulation's start to last one's end, from each harness's own records), the figure
the retail workload reports.

τ²-bench is not a dependency of envforge: install it into a venv of its own (it needs Python 3.12+,
`pip install <tau2-bench checkout>`) and point `--tau2-data` at a data folder holding
`tau2/domains/<domain>/` (the DB, tasks.json, split_tasks.json and the policy as τ² publishes them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ENVFORGE = str(Path(sys.executable).with_name("envforge"))
FAKES = {
    "retail": SHARED / "bench" / "instant_llm.py",
    "airline": ROOT / "benchmarks" / "instant_llm_airline.py",
    "telecom": ROOT / "benchmarks" / "instant_llm_telecom.py",
}


@dataclass(frozen=True)
class Run:
    simulations: int
    wall_s: float
    cpu_s: float
    in_run_s: float = 0.0
    """First simulation's start to last one's end: the run without process start-up."""

    @property
    def per_cpu_s(self) -> float:
        return self.simulations / self.cpu_s

    @property
    def per_hour(self) -> float:
        return self.simulations / self.wall_s * 3600

    @property
    def per_hour_in_run(self) -> float:
        return self.simulations / self.in_run_s * 3600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def timed(args: list[str], env: dict[str, str], simulations: int) -> Run:
    """Run `args` to the end and measure its wall time and the CPU time of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: {args[0]} exited {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(simulations, wall, cpu)


def import_env(domain: str, tmp: Path) -> Path:
    bundled = ROOT / "envs" / f"tau2_{domain}"
    if (bundled / "tasks.jsonl").exists():
        return bundled
    out = tmp / f"tau2_{domain}"
    subprocess.run(
        [ENVFORGE, "import", "tau2", str(SHARED / "tau2" / domain), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def train_count(domain: str) -> int:
    splits = json.loads((SHARED / "tau2" / domain / "split_tasks.json").read_text())
    return len(splits["train"])


def envforge_run(env: Path, base: str, concurrency: int, out: Path, simulations: int, trials: int) -> Run:
    args = [
        ENVFORGE, "eval", str(env), "--split", "train", "--trials", str(trials),
        "--agent", "openai/fake", "--agent-api-base", base, "--user", "openai/fake", "--user-api-base", base,
        "--concurrency", str(concurrency), "--out", str(out), "--json",
    ]  # fmt: skip
    run = timed(args, {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, simulations)
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    if len(records) != simulations or any(r["status"] != "completed" for r in records):
        raise SystemExit(
            f"error: envforge ran {len(records)} of {simulations} trials, or one did not complete"
        )
    start = min(r["started_at"] for r in records)
    end = max(r["started_at"] + r["duration_s"] for r in records)
    return replace(run, in_run_s=end - start)


def tau2_run(opts: argparse.Namespace, base: str, concurrency: int, out: Path, simulations: int) -> Run:
    trials = opts.trials
    llm_args = json.dumps({"api_base": base, "api_key": "fake", "temperature": 0.0})
    tau2 = str(Path(opts.tau2_python).with_name("tau2"))
    args = [
        tau2, "run", "--domain", opts.domain, "--task-split-name", "train", "--num-trials", str(trials),
        "--agent-llm", "openai/fake", "--agent-llm-args", llm_args,
        "--user-llm", "openai/fake", "--user-llm-args", llm_args,
        "--max-concurrency", str(concurrency), "--save-to", str(out), "--log-level", "ERROR",
    ]  # fmt: skip
    env = {**os.environ, "TAU2_DATA_DIR": str(opts.tau2_data), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    run = timed(args, env, simulations)
    sims = json.loads((out / "results.json").read_text())["simulations"]
    if len(sims) != simulations:
        raise SystemExit(f"error: τ² ran {len(sims)} of {simulations} simulations")
    start = min(datetime.fromisoformat(x["start_time"]) for x in sims)
    end = max(datetime.fromisoformat(x["end_time"]) for x in sims)
    return replace(run, in_run_s=(end - start).total_seconds())


def wait_ready(base: str) -> None:
    for _ in range(100):
        try:
            urllib.request.urlopen(base.removesuffix("/v1") + "/stats", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"error: the fake LLM at {base} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", choices=sorted(FAKES), default="airline")
    parser.add_argument("--tau2-python", required=True, help="python of a venv where τ²-bench is installed")
    parser.add_argument(
        "--tau2-data", type=Path, required=True, help="τ²'s data folder (holding tau2/domains/)"
    )
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=1, help="trials per task (more: start-up weighs less)")
    opts = parser.parse_args()
    if not (opts.tau2_data / "tau2" / "domains" / opts.domain / "tasks.json").exists():
        raise SystemExit(
            f"error: {opts.tau2_data}/tau2/domains/{opts.domain}/tasks.json not found (--tau2-data)"
        )
    port = free_port()
    fake = subprocess.Popen([sys.executable, str(FAKES[opts.domain]), str(port)])
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(base)
        simulations = train_count(opts.domain) * opts.trials
        with tempfile.TemporaryDirectory() as tmp:
            env = import_env(opts.domain, Path(tmp))
            what = f"{simulations} simulations (train × {opts.trials} trials)"
            print(f"τ² {opts.domain}: {what}, {opts.rounds} rounds, medians")
            print(f"{'conc':>4} {'sims/CPU-s':>22} {'ratio':>6}   {'sims/hour (wall)':>22} {'ratio':>6}   "
                  f"{'sims/hour (in run)':>22} {'ratio':>6}")  # fmt: skip
            print(f"{'':>4} {'envforge':>10} {'τ²':>11} {'':>6}   {'envforge':>10} {'τ²':>11} {'':>6}   "
                  f"{'envforge':>10} {'τ²':>11}")  # fmt: skip
            for c in (int(x) for x in opts.concurrency.split(",")):
                ours: list[Run] = []
                theirs: list[Run] = []
                for r in range(opts.rounds):
                    out = Path(tmp) / f"ef-{c}-{r}"
                    ours.append(envforge_run(env, base, c, out, simulations, opts.trials))
                    theirs.append(tau2_run(opts, base, c, Path(tmp) / f"tau2-{c}-{r}.json", simulations))
                e_cpu, t_cpu = (statistics.median(x.per_cpu_s for x in runs) for runs in (ours, theirs))
                e_hour, t_hour = (statistics.median(x.per_hour for x in runs) for runs in (ours, theirs))
                e_in, t_in = (statistics.median(x.per_hour_in_run for x in runs) for runs in (ours, theirs))
                print(
                    f"{c:>4} {e_cpu:>10.2f} {t_cpu:>11.2f} {e_cpu / t_cpu:>5.1f}×   "
                    f"{e_hour:>10,.0f} {t_hour:>11,.0f} {e_hour / t_hour:>5.1f}×   "
                    f"{e_in:>10,.0f} {t_in:>11,.0f} {e_in / t_in:>5.1f}×",
                    flush=True,
                )
        stats = json.loads(urllib.request.urlopen(base.removesuffix("/v1") + "/stats").read())
        print(f"fake LLM served: {stats}")
    finally:
        fake.terminate()


if __name__ == "__main__":
    main()
