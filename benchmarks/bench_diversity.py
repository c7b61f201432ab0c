"""How varied each bundled env's tasks are, and whether any casts its user in the wrong role
(`envforge.synth.measure_diversity`, what `envforge check` prints), before and after:

- the shipped `tasks.jsonl` as committed at REV (before) and as it is now (after);
- fresh runs of `synth tasks --n 10` for seeds 0-9 on the current code: the fewest and the mean
  distinct intents in the 10 tasks of a seed, and every seed's role mismatches, with intent
  steering off (`SynthConfig(vary=False)`, the walks as they were chosen before it) and on.

    python benchmarks/bench_diversity.py [REV]    # REV: the revision to compare with (default HEAD)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envforge import synthesize_tasks
from envforge.server import load_env
from envforge.synth import SynthConfig, Task, load_graph, measure_diversity, roles_of

ROOT = Path(__file__).resolve().parents[1]
SEEDS = range(10)


def bundled() -> list[Path]:
    """The env folders whose tasks.jsonl the repository tracks (τ² imports are not tracked)."""
    listed = subprocess.run(
        ["git", "ls-files", "envs/*/tasks.jsonl"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / Path(p).parent for p in sorted(listed)]


def tasks_at(env_dir: Path, rev: str | None) -> list[Task]:
    if rev is None:
        text = (env_dir / "tasks.jsonl").read_text(encoding="utf-8")
    else:
        path = f"{env_dir.relative_to(ROOT)}/tasks.jsonl"
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    return [Task.model_validate_json(line) for line in text.splitlines() if line.strip()]


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    print(f"shipped tasks.jsonl (seed 0): {rev} -> working tree")
    print("intents: all / first 10; window: fewest / mean distinct in any 10 in a row;")
    print("top share: the most common intent's")
    print("| env | tasks | intents | window min | window mean | top share | role mismatches |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    live: list[str] = []
    for env_dir in bundled():
        env = load_env(env_dir)
        roles = roles_of(env, load_graph(env_dir))
        old, new = (measure_diversity(env.name, tasks_at(env_dir, r), roles) for r in (rev, None))
        print(
            f"| {env.name} | {old.tasks} -> {new.tasks} | {old.intents}/{old.first_window} -> "
            f"{new.intents}/{new.first_window} | {old.window_min} -> {new.window_min} | "
            f"{old.window_mean:.1f} -> {new.window_mean:.1f} | {100 * old.top_share:.0f}% -> "
            f"{100 * new.top_share:.0f}% | {old.role_mismatches} -> {new.role_mismatches} |"
        )
        cells = []
        for vary in (False, True):
            runs = [
                measure_diversity(
                    env.name,
                    synthesize_tasks(env_dir, 10, seed=s, config=SynthConfig(vary=vary)).tasks,
                    roles,
                )
                for s in SEEDS
            ]
            fewest = min(r.first_window for r in runs)
            mean = sum(r.first_window for r in runs) / len(runs)
            worst = max(r.top_share for r in runs)
            bad = sum(r.role_mismatches for r in runs)
            cells.append(f"{fewest} / {mean:.1f} / {100 * worst:.0f}% / {bad}")
        live.append(f"| {env.name} | {cells[0]} | {cells[1]} |")
    print()
    print(f"synth tasks --n 10, seeds {SEEDS.start}-{SEEDS.stop - 1}, current code: distinct intents")
    print("fewest / mean over seeds, worst top share, role mismatches in all 100 tasks")
    print("| env | steering off | steering on |")
    print("|---|---|---|")
    print("\n".join(live))


if __name__ == "__main__":
    main()
