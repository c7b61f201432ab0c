"""ERPO against its learning-rate-0 control: one figure of both runs' held-out mean reward.

Each run folder is an `envforge train --tasks lookup --eval-every N` output (its `eval.jsonl`);
the control is the same command with `--lr 0`. Prints each run's held-out rewards by step and
the steps it trained, and writes the figure (PNG with matplotlib, else SVG):

    python benchmarks/erpo_vs_control.py RUNS/erpo RUNS/control docs/erpo_vs_control.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envforge.trainer import write_comparison


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
    print(f"wrote {write_comparison(runs, args.figure, title='held-out mean reward (lookup tasks)')}")


if __name__ == "__main__":
    main()
