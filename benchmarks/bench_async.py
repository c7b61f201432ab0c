"""Async collection against staleness 0, and Ray collection throughput per worker count.

Part 1 trains the same tiny model (hidden 256, 4 layers) on the bandit env with the same seeds once
per staleness, the arms alternating round by round so each sees the same machine, and prints steps
per hour (wall time of `train()`), the ratio to the first arm and the batch reward per step; `--svg`
draws each arm's mean reward curve. Async can only hide collection behind the update, so the best
it can do is (collect + update) / max(collect, update): the model is sized so the update is a real
cost, about twice a batch's collection on this machine.

Part 2 (`--ray 1,2,4`) collects the same groups on N Ray actors (one torch thread each) for each N,
in one run, and prints episodes per second.

Part 3 (`--real local/qwen2.5-coder-0.5b`) runs `envforge train` on the packaged model (lookup tasks
of four bundled envs, bf16) once per staleness arm, each a process of its own, sampling the
process's CPU time twice a second. Besides steps per hour it prints how many cores each phase kept
busy: overlap only adds what the synchronous run leaves idle, so with every core shared between
sampling and the update, `cores / cores in use at staleness 0` bounds what async can give.

    python benchmarks/bench_async.py --staleness 0,1 --real local/qwen2.5-coder-0.5b --steps 4 --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio


async def train_once(args: argparse.Namespace, model_dir: Path, tmp: Path, staleness: int) -> dict[str, Any]:
    """One training run from the same initial weights and seeds; returns its wall time and rewards."""
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.server import Fleet, load_env
    from envforge.trainer import (
        FleetRolloutEnv,
        HFBackend,
        Learner,
        LearnerConfig,
        RolloutConfig,
        TrainConfig,
        bandit_tasks,
        load_tokenizer,
        train,
        write_bandit_env,
    )

    fleet = Fleet([load_env(write_bandit_env(tmp))])
    env = FleetRolloutEnv(fleet, "bandit", await bandit_tasks(fleet, "bandit", n=4), use_mcp=args.mcp)
    tok = load_tokenizer(model_dir)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = HFBackend(model, eos_id=tok.eos_token_id, seed=args.seed)
    learner = Learner(
        model, LearnerConfig(lr=args.lr, gradient_checkpointing=False), pad_id=tok.pad_token_id or 0
    )
    config = TrainConfig(
        steps=args.steps,
        tasks_per_step=args.tasks,
        rollouts_per_task=args.group,
        staleness=staleness,
        collectors=args.collectors,
        seed=args.seed,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=args.completion_len),
    )
    started = time.time()
    try:
        metrics = await train([env], backend, learner, tok, config)
    finally:
        learner.close()
        await fleet.aclose()
    wall = time.time() - started
    update = sum(m.update_finished - m.update_started for m in metrics)
    return {
        "wall": wall,
        "steps_per_hour": len(metrics) / wall * 3600,
        "update_s": update / len(metrics),
        "rewards": [m.reward_mean for m in metrics],
        "dropped": metrics[-1].dropped_stale_total,
        "stale_mean": statistics.mean(s for m in metrics for s in m.staleness),
    }


def alternating(arms: list[int], rounds: int) -> Iterator[tuple[int, int]]:
    """(round, arm) for every run: the arms in order in even rounds, reversed in odd ones, so each
    arm goes first as often as last and a machine's drift is shared out."""
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            yield r, arm


async def part_async(args: argparse.Namespace, model_dir: Path, tmp: Path) -> None:
    """Every run in one event loop: a run's cancelled collectors may still have database work
    finishing in the fleet's threads, which needs a loop to report back to."""
    from envforge.trainer import svg_line_chart

    arms = [int(s) for s in args.staleness.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {s: [] for s in arms}
    for r, s in alternating(arms, args.rounds):
        load = os.getloadavg()[0]
        res = await train_once(args, model_dir, tmp / f"r{r}s{s}", s)
        runs[s].append(res)
        print(
            f"round {r} staleness {s}: {res['steps_per_hour']:.0f} steps/h "
            f"(wall {res['wall']:.1f}s, update {res['update_s']:.2f}s/step, "
            f"dropped {res['dropped']}, mean lag {res['stale_mean']:.2f}, load {load:.1f}) "
            f"rewards {' '.join(f'{x:.2f}' for x in res['rewards'])}",
            flush=True,
        )
    base = statistics.median(x["steps_per_hour"] for x in runs[arms[0]])
    series: dict[str, list[tuple[float, float]]] = {}
    for s in arms:
        sph = statistics.median(x["steps_per_hour"] for x in runs[s])
        curve = [statistics.mean(col) for col in zip(*(x["rewards"] for x in runs[s]), strict=True)]
        tail = curve[-max(1, len(curve) // 4) :]
        print(
            f"staleness {s}: median {sph:.0f} steps/h, ratio {sph / base:.2f}x vs staleness {arms[0]}; "
            f"reward first {curve[0]:.3f} last-quarter mean {statistics.mean(tail):.3f}"
        )
        series[f"staleness {s}"] = [(float(i), y) for i, y in enumerate(curve)]
        if s == 0:  # synchronous: a step is a batch's collection, then its update (and weight sync)
            step = statistics.median(x["wall"] / args.steps for x in runs[s])
            update = statistics.median(x["update_s"] for x in runs[s])
            print(
                f"  staleness 0 step {step:.2f}s = update {update:.2f}s + collection and sync "
                f"{step - update:.2f}s: overlap can give at most {step / max(update, step - update):.2f}x"
            )
    if args.svg:
        title = f"batch reward per step (mean of {args.rounds} runs per arm)"
        Path(args.svg).write_text(svg_line_chart(title, series) + "\n")
        print(f"wrote {args.svg}")
    await anyio.sleep(1)  # the last run's cancelled episodes finish their database work


async def collect_on_ray(args: argparse.Namespace, dirs: list[Path], model_dir: Path, n: int) -> list[float]:
    """Episodes per second of `n` actors collecting `--ray-groups` groups, `--rounds` times (after a
    warm-up round that also loads each actor's model)."""
    from envforge.server import Fleet, load_env
    from envforge.trainer import (
        BackendSpec,
        EnvSpec,
        RayWorkers,
        RolloutConfig,
        WorkerSpec,
        build_envs,
        collect,
    )

    spec = WorkerSpec(
        backend=BackendSpec(model=str(model_dir), seed=args.seed),
        env=EnvSpec(envs=[str(d) for d in dirs], env_kind="fleet", use_mcp=args.mcp),
    )
    fleet = Fleet([load_env(d) for d in dirs])
    envs = build_envs(fleet, dirs, args.mcp, env_kind="fleet")
    workers = await RayWorkers.start(spec, n, groups_per_worker=args.collectors)
    config = RolloutConfig(max_turns=1, max_new_tokens=args.completion_len)
    rates: list[float] = []
    try:
        for r in range(args.rounds + 1):
            started = time.time()
            trajs = await collect(
                envs,
                None,
                None,
                groups=args.ray_groups if r else 2 * n,
                rollouts_per_task=args.group,
                rollout_config=config,
                source=workers,
            )
            if r:
                rates.append(len(trajs) / (time.time() - started))
    finally:
        await workers.aclose()
        await fleet.aclose()
    return rates


def part_ray(args: argparse.Namespace, model_dir: Path, tmp: Path) -> None:
    import logging

    import ray

    from envforge.server import Fleet, load_env
    from envforge.trainer import bandit_tasks, write_bandit_env

    d = write_bandit_env(tmp / "ray", "bandit")

    async def write_tasks() -> None:
        fleet = Fleet([load_env(d)])
        tasks = await bandit_tasks(fleet, "bandit", n=4)
        (d / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
        await fleet.aclose()

    anyio.run(write_tasks)
    counts = [int(n) for n in args.ray.split(",")]
    ray.init(num_cpus=max(counts), include_dashboard=False, logging_level=logging.WARNING)
    one = 0.0
    try:
        for n in counts:
            load = os.getloadavg()[0]
            rates = anyio.run(collect_on_ray, args, [d], model_dir, n)
            eps = statistics.median(rates)
            one = one or eps
            print(
                f"ray workers {n}: {eps:.1f} episodes/s (median of {' '.join(f'{x:.1f}' for x in rates)}; "
                f"{eps / one:.2f}x one worker, load {load:.1f})",
                flush=True,
            )
    finally:
        ray.shutdown()


REAL_ENVS = ("car_rental", "library", "gym", "pharmacy")
ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def train_real(args: argparse.Namespace, out: Path, staleness: int) -> dict[str, Any]:
    """One `envforge train` process on the packaged model; its metrics and CPU-time samples."""
    import json
    import subprocess
    import sys
    import threading

    envs = [x for e in REAL_ENVS for x in ("--envs", str(ROOT / "envs" / e))]
    cmd = [
        sys.executable, "-m", "envforge.cli", "train", "--model", args.real, *envs, "--tasks", "lookup",
        "--steps", str(args.steps), "--tasks-per-step", "8", "--rollouts-per-task", "4",
        "--collectors", str(args.collectors), "--staleness", str(staleness), "--max-turns", "2",
        "--max-new-tokens", "48", "--temperature", "0.7", "--eval-every", "0", "--seed", str(args.seed),
        "--precision", "bfloat16", "--lr", str(args.real_lr), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, float]] = []

    def sample() -> None:
        while proc.poll() is None:
            try:
                samples.append((time.time(), cpu_seconds(proc.pid)))
            except (OSError, IndexError, ValueError):  # the process is just ending
                break
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"envforge train exited {proc.returncode}: {err.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows, "samples": samples}


def cores_between(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU-seconds the process used in [start, end], interpolated between samples."""

    def at(t: float) -> float:
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return samples[-1][1] if t > samples[-1][0] else samples[0][1]

    return at(end) - at(start)


def summarize_real(res: dict[str, Any]) -> dict[str, float]:
    """Steps per hour from the first group's start to the last update's end, and cores per phase."""
    rows, samples = res["rows"], res["samples"]
    spans = [r["collect_windows"] for r in rows]
    windows = [(min(a for a, _ in w), max(b for _, b in w)) for w in spans]
    updates = [(r["update_started"], r["update_finished"]) for r in rows]
    start, end = windows[0][0], updates[-1][1]
    busy = cores_between(samples, start, end)
    collect_s = sum(b - a for a, b in windows)
    update_s = sum(b - a for a, b in updates)
    return {
        "wall": end - start,
        "steps_per_hour": len(rows) / (end - start) * 3600,
        "cores": busy / (end - start),
        "collect_cores": sum(cores_between(samples, a, b) for a, b in windows) / collect_s,
        "update_cores": sum(cores_between(samples, a, b) for a, b in updates) / update_s,
        "cpu_per_step": busy / len(rows),
        "collect_s": collect_s / len(rows),
        "update_s": update_s / len(rows),
        "rewards": [r["reward_mean"] for r in rows],
    }


def part_real(args: argparse.Namespace, tmp: Path) -> None:
    arms = [int(s) for s in args.staleness.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {s: [] for s in arms}
    cores = os.cpu_count() or 1
    for r, s in alternating(arms, args.rounds):
        load = os.getloadavg()[0]
        res = summarize_real(train_real(args, tmp / f"real{r}s{s}", s))
        runs[s].append(res)
        print(
            f"round {r} staleness {s}: {res['steps_per_hour']:.0f} steps/h (wall {res['wall']:.0f}s; "
            f"collection {res['collect_s']:.1f}s/step at {res['collect_cores']:.2f} cores, update "
            f"{res['update_s']:.1f}s/step at {res['update_cores']:.2f} cores; {res['cores']:.2f} of "
            f"{cores} cores busy, {res['cpu_per_step']:.0f} CPU-s/step; load {load:.1f}) "
            f"rewards {' '.join(f'{x:.2f}' for x in res['rewards'])}",
            flush=True,
        )
    base = statistics.median(x["steps_per_hour"] for x in runs[arms[0]])
    for s in arms:
        sph = statistics.median(x["steps_per_hour"] for x in runs[s])
        busy = statistics.median(x["cores"] for x in runs[s])
        line = f"staleness {s}: median {sph:.0f} steps/h, ratio {sph / base:.2f}x vs staleness {arms[0]}"
        if s == 0:
            line += f"; {busy:.2f} of {cores} cores busy: overlap can give at most {cores / busy:.2f}x"
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--staleness", default="0,1", help="comma-separated arms; the first is the baseline")
    p.add_argument("--rounds", type=int, default=2, help="runs per arm, arms alternating")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--completion-len", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mcp", action=argparse.BooleanOptionalAction, default=True, help="tools over MCP (as `train`)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--svg", default="")
    p.add_argument("--ray", default="", help="Ray worker counts to measure, e.g. 1,2,4")
    p.add_argument("--ray-groups", type=int, default=48, help="groups per measurement")
    p.add_argument("--real", default="", help="a packaged model, e.g. local/qwen2.5-coder-0.5b (part 3)")
    p.add_argument(
        "--real-lr",
        type=float,
        default=1e-5,
        help="part 3's learning rate (0: every arm plays the same batches)",
    )
    args = p.parse_args()
    if args.real:
        with tempfile.TemporaryDirectory() as d:
            part_real(args, Path(d))
        return

    import torch

    from envforge.trainer import bandit_corpus, build_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"cores {os.cpu_count()}, torch threads {torch.get_num_threads()}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = build_tiny_model(
            tmp / "model",
            bandit_corpus(),
            hidden_size=args.hidden,
            layers=args.layers,
            heads=max(2, args.hidden // 64),
            base_corpus=False,
        )
        if args.staleness:
            anyio.run(part_async, args, model_dir, tmp)
        if args.ray:
            part_ray(args, model_dir, tmp)


if __name__ == "__main__":
    main()
