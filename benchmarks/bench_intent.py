"""How many bundled instructions read as procedure: a tool name, a numbered step, "in this order"
or a refusal hint (the target is 0), and how long the instruction is, per env.

    python benchmarks/bench_intent.py [REV]   # REV: read the task files as committed at a git revision
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from envforge.server import load_env

ROOT = Path(__file__).resolve().parents[1]
NUMBERED = re.compile(r"^\s*\d+[.)]", re.MULTILINE)
HINTS = ("in this order", "expected to be refused", "result of step")


def task_lines(env: str, rev: str | None) -> list[str]:
    if rev is None:
        return (ROOT / "envs" / env / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    shown = subprocess.run(
        ["git", "show", f"{rev}:envs/{env}/tasks.jsonl"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return shown.stdout.splitlines()


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else None
    print("| env | tasks | tool name | numbered step | order/refusal hint | mean words |")
    print("|---|---:|---:|---:|---:|---:|")
    for env_dir in sorted(p for p in (ROOT / "envs").iterdir() if (p / "tasks.jsonl").exists()):
        tools = sorted(load_env(env_dir).tools)
        texts = [json.loads(line)["scenario"]["instruction"] for line in task_lines(env_dir.name, rev)]
        named = sum(any(t in x for t in tools) for x in texts)
        numbered = sum(bool(NUMBERED.search(x)) for x in texts)
        hinted = sum(any(h in x.lower() for h in HINTS) for x in texts)
        words = sum(len(x.split()) for x in texts) / max(len(texts), 1)
        print(f"| {env_dir.name} | {len(texts)} | {named} | {numbered} | {hinted} | {words:.0f} |")


if __name__ == "__main__":
    main()
