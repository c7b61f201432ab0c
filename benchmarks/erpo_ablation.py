"""Does ERPO help? Every arm of the ablation over several seeds, one flag apart, with a user that errs.

Arms (each an `envforge train` command; the rest of the config is shared):

- `grpo`: `--advantage grpo --no-mask-user-errors` (group-level std, trained on every episode);
- `erpo-nomask`: `--advantage erpo --no-mask-user-errors` (env-level std, no MEU mask);
- `erpo`: `--advantage erpo --mask-user-errors` (env-level std and the mask);
- `control`: `erpo` at `--lr 0` (what the held-out reward does when nothing is learned).

Every run plays the single-read lookups of four bundled env folders (`--tasks lookup`, 4 envs,
the set the packaged model has learned on), or with `--tasks lookup+steps` also each folder's
tasks of 2-3 calls with one write, each set an env of its own for ERPO: eight envs whose reward
spreads differ (the table's last line gives each one's at step 0). `--tasks told` (or
`lookup+told`) plays instead 2-3-call tasks with one write synthesized at the run's seed whose user
states its facts in the request, and `--tasks pair` (or `lookup+pair`) those cut to one read then
the write; the packaged model starts at 0 on each (docs/benchmarks/erpo-ablation.md), so `--model`
takes a checkpoint to start from (a lookup run's, the curriculum of that page). The
training episodes' scripted user errs in `--user-error-rate` of them
(`harness/user_error_inject.py`), the held-out evaluations' never does. Runs go to
`OUT/<arm>/seed<k>/`; a run whose `run.json` exists is not run again, so a stopped table resumes.

Writes `OUT/ablation.png` (held-out mean reward per arm by step: the mean over seeds, a band from
the lowest to the highest seed) and `OUT/ablation.md`: per arm the final held-out reward (mean and
each seed), the step-to-step variance of the training reward (half the mean squared change from
one step to the next, which a steady trend barely moves and a jumpy run does), the share of
episodes the detector flagged and the share masked, and the mask's precision and recall against
the injected errors; then, as `erpo_vs_control.py` does, a paired sign test of ERPO against every
other arm on the final held-out episodes, paired by seed and episode (the same seeded episodes in
every arm of a seed).

    python benchmarks/erpo_ablation.py RUNS/ablation                  # the full table (CPU: ~4-4.5 h)
    python benchmarks/erpo_ablation.py RUNS/ablation-smoke --smoke    # a tiny model, minutes
    python benchmarks/erpo_ablation.py RUNS/ablation --report-only    # tables and figure again
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from erpo_vs_control import sign_test  # the same exact test as the ERPO-vs-control figure

REPO = Path(__file__).resolve().parents[1]
ARMS: dict[str, list[str]] = {
    "grpo": ["--advantage", "grpo", "--no-mask-user-errors"],
    "erpo-nomask": ["--advantage", "erpo", "--no-mask-user-errors"],
    "erpo": ["--advantage", "erpo", "--mask-user-errors"],
    "control": ["--advantage", "erpo", "--mask-user-errors"],  # and --lr 0
}
FULL_ENVS = ["car_rental", "library", "gym", "pharmacy"]
FULL = {
    "model": "local/qwen2.5-coder-0.5b",
    "steps": 6,
    "eval_every": 3,
    "rollouts_per_task": 4,
    "max_turns": 3,
    "max_new_tokens": 48,
    "lr": "1e-5",
}
"""The full table's budget (`--tasks lookup`): 12 runs (4 arms x 3 seeds) of 6 steps of 8 groups
x 4 episodes, held-out evaluations of 60 episodes at steps 0, 3 and 6: ~370 episodes a run, ~20
minutes of the 2 cores, ~4-4.5 hours for the table (docs/benchmarks/erpo-ablation.md: measured)."""
WITH_STEPS = {"rollouts_per_task": 2, "max_turns": 6, "max_new_tokens": 64}
"""`--tasks lookup+steps`, `lookup+told` or `lookup+pair`: 16 groups of 2 a step (8 envs), turns
enough for a read, a question and a write; `told` or `pair` alone: 8 groups of 2 (4 envs). The
budget of each is in docs/benchmarks/erpo-ablation.md."""
SMOKE_ENVS = ["car_rental", "pharmacy"]
SMOKE = {
    "steps": 2,
    "eval_every": 1,
    "rollouts_per_task": 2,
    "max_turns": 3,
    "max_new_tokens": 8,
    "lr": "1e-3",
}
"""A tiny random model (`build_tiny_model`), 2 steps of 16 episodes on 2 folders' lookups and step
tasks, 2 seeds: the whole pipeline (injection, masking, evaluation, table, figure) in minutes. Its
rewards say nothing about ERPO."""


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_command(
    model: str, envs: list[str], out: Path, arm: str, seed: int, cfg: dict[str, Any], rate: float
) -> list[str]:
    cmd = [sys.executable, "-m", "envforge.cli", "train", "--model", model, "--tasks", cfg["tasks"]]
    for env in envs:
        cmd += ["--envs", str(REPO / "envs" / env)]
    cmd += ["--steps", str(cfg["steps"]), "--tasks-per-step", str(cfg["tasks_per_step"])]
    cmd += ["--rollouts-per-task", str(cfg["rollouts_per_task"]), "--max-turns", str(cfg["max_turns"])]
    cmd += ["--max-new-tokens", str(cfg["max_new_tokens"]), "--eval-every", str(cfg["eval_every"])]
    cmd += ["--eval-samples", "1", "--temperature", "0.7", "--staleness", "1"]
    if cfg["device"].startswith("cuda"):  # every episode in flight decodes as one batch
        cmd += ["--device", cfg["device"], "--collectors", "8", "--max-batch", "64"]
    else:
        cmd += ["--collectors", "2"]
    lr = "0" if arm == "control" else str(cfg["lr"])
    cmd += ["--precision", "bfloat16", "--seed", str(seed), "--lr", lr]
    cmd += ["--user-error-rate", str(rate), *ARMS[arm], "--out", str(out)]
    return cmd


def run_all(args: argparse.Namespace, model: str, envs: list[str], cfg: dict[str, Any]) -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MALLOC_ARENA_MAX": "2"}
    env.setdefault("OMP_NUM_THREADS", "2")
    for seed in args.seeds:
        for arm in args.arms:
            out = args.out / arm / f"seed{seed}"
            if (out / "run.json").is_file():
                print(f"{arm} seed {seed}: done before, kept", flush=True)
                continue
            cmd = train_command(model, envs, out, arm, seed, cfg, args.user_error_rate)
            started = time.time()
            print(f"{arm} seed {seed}: {' '.join(cmd[1:])}", flush=True)
            log = args.out / arm / f"seed{seed}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("w") as f:
                done = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                sys.exit(f"{arm} seed {seed} failed (exit {done.returncode}): see {log}")
            print(f"{arm} seed {seed}: {time.time() - started:.0f} s", flush=True)


@dataclass
class Run:
    arm: str
    seed: int
    evals: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    ran: dict[str, Any]

    @property
    def final(self) -> dict[str, Any]:
        return self.evals[-1]

    def step_variance(self) -> float:
        """Half the mean squared change of the training reward from one step to the next."""
        r = [m["reward_mean_all"] for m in self.steps]
        if len(r) < 2:
            return 0.0
        return sum((b - a) ** 2 for a, b in itertools.pairwise(r)) / (2 * (len(r) - 1))

    def episodes(self) -> int:
        return sum(len(m["staleness"]) for m in self.steps)


def load_runs(out: Path, arms: list[str], seeds: list[int]) -> list[Run]:
    runs = []
    for arm in arms:
        for seed in seeds:
            d = out / arm / f"seed{seed}"
            if not (d / "run.json").is_file():
                continue
            ran = json.loads((d / "run.json").read_text())["ran"]
            runs.append(Run(arm, seed, _rows(d / "eval.jsonl"), _rows(d / "metrics.jsonl"), ran))
    return runs


def _mean_sd(xs: list[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def _share(part: int, whole: int) -> str:
    return "-" if not whole else f"{part / whole:.3f}"


def table(runs: list[Run], arms: list[str], rate: float, label: str) -> str:
    lines = [
        f"# ERPO ablation ({label})",
        "",
        f"User-error rate {rate}; {len({r.seed for r in runs})} seed(s). Final held-out reward: mean ± sd",
        "over seeds (each seed's in brackets); step-to-step variance: half the mean squared change of",
        "the training reward between consecutive steps, mean over seeds; flagged/masked: shares of",
        "training episodes; precision/recall: the detector's flags against the injected errors.",
        "",
        "| arm | final held-out reward | step-to-step variance | flagged | masked | injected "
        "| mask precision | mask recall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        rs = [r for r in runs if r.arm == arm and r.evals]
        if not rs:
            continue
        finals = [r.final["reward_mean"] for r in rs]
        each = ", ".join(f"{x:.3f}" for x in finals)
        episodes = sum(r.episodes() for r in rs)
        masked = round(sum(m["masked_fraction"] * len(m["staleness"]) for r in rs for m in r.steps))
        errs = [r.ran.get("user_errors", {}) for r in rs]
        flagged = sum(e.get("flagged", 0) for e in errs)
        injected = sum(e.get("injected", 0) for e in errs)
        caught = sum(e.get("caught", 0) for e in errs)
        variance = statistics.mean(r.step_variance() for r in rs)
        lines.append(
            f"| {arm} | {_mean_sd(finals)} ({each}) | {variance:.4f} | {_share(flagged, episodes)} | "
            f"{_share(masked, episodes)} | {_share(injected, episodes)} | {_share(caught, flagged)} | "
            f"{_share(caught, injected)} |"
        )
    lines += [
        "",
        "Paired sign test, ERPO against each arm, final held-out episodes paired by seed and episode:",
        "",
    ]
    lines += [f"- {line}" for line in paired_lines(runs, arms)]
    lines += ["", *env_scale_lines(runs)]
    return "\n".join(lines) + "\n"


def paired_lines(runs: list[Run], arms: list[str]) -> list[str]:
    by = {(r.arm, r.seed): r for r in runs if r.evals}
    out = []
    for other in arms:
        if other == "erpo":
            continue
        wins = losses = pairs = 0
        unpaired: list[str] = []
        for (arm, seed), run in by.items():
            if arm != "erpo" or (other, seed) not in by:
                continue
            a, b = run.final.get("rewards", []), by[(other, seed)].final.get("rewards", [])
            if len(a) != len(b) or run.final["step"] != by[(other, seed)].final["step"]:
                # not the same episodes (another task set, or a run stopped early): no pairs
                unpaired.append(f"seed {seed} ({len(a)} against {len(b)} episodes)")
                continue
            pairs += len(a)
            wins += sum(x > y for x, y in zip(a, b, strict=True))
            losses += sum(x < y for x, y in zip(a, b, strict=True))
        skipped = f"; left out, held-out sets differ: {', '.join(unpaired)}" if unpaired else ""
        if pairs:
            p = sign_test(wins, losses)
            out.append(
                f"ERPO better on {wins}, {other} on {losses} of {pairs} paired episodes, p = {p:.2g}{skipped}"
            )
        else:
            out.append(f"ERPO against {other}: no paired episodes{skipped}")
    return out


def env_scale_lines(runs: list[Run]) -> list[str]:
    """Each env's training reward spread at step 0 (mean over runs): the heterogeneity env-level
    normalisation is for."""
    stats: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if not r.steps:
            continue
        for env, s in r.steps[0]["per_env"].items():
            stats.setdefault(env, []).append((s["reward_mean"], s["reward_std"]))
    if not stats:
        return []
    cells = ", ".join(
        f"{env} mean {statistics.mean(m for m, _ in v):.3f} / std {statistics.mean(s for _, s in v):.3f}"
        for env, v in sorted(stats.items())
    )
    return [f"Step-0 training reward by env (kept episodes, mean over runs): {cells}."]


def figure(runs: list[Run], arms: list[str], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in arms:
        curves = [{e["step"]: e["reward_mean"] for e in r.evals} for r in runs if r.arm == arm and r.evals]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        ys = [[c[s] for c in curves] for s in steps]
        ax.plot(
            steps,
            [statistics.mean(y) for y in ys],
            marker="o",
            label=f"{arm} ({len(curves)} seed{'s' * (len(curves) != 1)})",
        )
        ax.fill_between(steps, [min(y) for y in ys], [max(y) for y in ys], alpha=0.2)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out mean reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tiny_model(out: Path, envs: list[str]) -> str:
    from envforge.trainer import build_tiny_model

    model = out / "tiny_model"
    if not (model / "config.json").is_file():
        words = ["The answer is", "Let me check that for you.", *envs, "get", "id"]
        build_tiny_model(model, words, hidden_size=32, layers=1, seed=0)
    return str(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 2 steps, 2 seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--user-error-rate", type=float, default=0.2)
    parser.add_argument(
        "--model", default=None, help="default: local/qwen2.5-coder-0.5b (smoke: a tiny model)"
    )
    parser.add_argument("--envs", nargs="+", default=None, help="bundled env names")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cuda on a lent GPU (8 collectors, batches of 64)")
    parser.add_argument(
        "--tasks",
        choices=["lookup", "steps", "lookup+steps", "told", "lookup+told", "pair", "lookup+pair"],
        default=None,
        help="default: lookup (smoke: lookup+steps, so both sets run); told: synthesized 2-3-call "
        "writes whose user states its facts; pair: those cut to one read then the write",
    )
    parser.add_argument("--report-only", action="store_true", help="only the table and figure of runs made")
    args = parser.parse_args()
    if not 0.0 <= args.user_error_rate <= 1.0:
        parser.error("--user-error-rate must be between 0 and 1")
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.steps:
        cfg["steps"] = args.steps
    envs = args.envs or (SMOKE_ENVS if args.smoke else FULL_ENVS)
    args.tasks = args.tasks or ("lookup+steps" if args.smoke else "lookup")
    cfg["tasks"] = args.tasks
    if args.tasks != "lookup" and not args.smoke:
        cfg.update(WITH_STEPS)
    cfg["device"] = args.device
    cfg["tasks_per_step"] = 2 * len(envs) * len(args.tasks.split("+"))  # two task groups per env
    for name in envs:
        if not (REPO / "envs" / name).is_dir():
            parser.error(f"no bundled env {name!r} under envs/")
    args.seeds = args.seeds or ([0, 1] if args.smoke else [0, 1, 2])
    args.out.mkdir(parents=True, exist_ok=True)
    label = "SMOKE RUN: a tiny random model, not a result" if args.smoke else "Qwen2.5-Coder-0.5B, CPU"
    if not args.report_only:
        model = args.model or (tiny_model(args.out, envs) if args.smoke else str(FULL["model"]))
        run_all(args, model, envs, cfg)
    runs = load_runs(args.out, args.arms, args.seeds)
    if not runs:
        sys.exit(f"no finished runs under {args.out}")
    md = table(runs, args.arms, args.user_error_rate, label)
    (args.out / "ablation.md").write_text(md)
    try:
        png = figure(runs, args.arms, args.out / "ablation.png", f"held-out reward by arm ({label})")
    except ImportError:
        print(md)
        sys.exit(f"wrote {args.out / 'ablation.md'}; the figure needs matplotlib: pip install -e '.[plots]'")
    print(md)
    print(f"wrote {args.out / 'ablation.md'} and {png}")


if __name__ == "__main__":
    main()
