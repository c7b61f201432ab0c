"""ERPO against its learning-rate-0 control: one figure of both runs' held-out mean reward.

Each run folder is an `envforge train --tasks lookup --eval-every N` output (its `eval.jsonl`);
the control is the same command with `--lr 0`. Prints each run's held-out rewards by step and
the steps it trained; then, at every evaluation both runs made, the paired comparison: the same
seeded episodes, so each one ERPO solved and the control did not (or the reverse) is a discordant
pair, and an exact two-sided sign test on those pairs (McNemar's exact test) says how likely a
split at least that uneven is by chance. Writes the figure (PNG with matplotlib, else SVG):

    python benchmarks/erpo_vs_control.py RUNS/erpo RUNS/control docs/erpo_vs_control.svg
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from envforge.trainer import write_comparison


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial p-value of `wins` against `losses` under a fair coin."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(erpo: dict, control: dict) -> str:
    a, b = erpo.get("rewards"), control.get("rewards")
    if a is None or b is None or len(a) != len(b):
        return "no per-episode rewards to pair"
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    p = sign_test(wins, losses)
    return f"ERPO better on {wins}, control on {losses} of {len(a)} paired episodes, p = {p:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("erpo", type=Path)
    parser.add_argument("control", type=Path)
    parser.add_argument("figure", type=Path)
    args = parser.parse_args()
    runs = {"ERPO": args.erpo, "control (lr 0)": args.control}
    for label, run in runs.items():
        evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines() if line]
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
        curve = ", ".join(f"step {e['step']}: {e['reward_mean']:.3f} ({e['episodes']} ep)" for e in evals)
        train = [round(m["reward_mean"], 3) for m in steps]
        skipped = sum(m.get("update_skipped", False) for m in steps)
        print(f"{label}: held-out {curve}; {len(steps)} steps, train rewards {train}, {skipped} skipped")
    evals = {
        label: {e["step"]: e for e in map(json.loads, (run / "eval.jsonl").read_text().splitlines()) if e}
        for label, run in runs.items()
    }
    erpo, control = evals.values()
    for step in sorted(set(erpo) & set(control)):
        print(f"step {step}: {paired(erpo[step], control[step])}")
    print(f"wrote {write_comparison(runs, args.figure, title='held-out mean reward (lookup tasks)')}")


if __name__ == "__main__":
    main()
