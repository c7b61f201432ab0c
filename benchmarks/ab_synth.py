"""Task synthesis speed of the working tree against a git revision, paired in one process.

Usage: .venv/bin/python benchmarks/ab_synth.py REV [N] [ROUNDS] [ENV,ENV,...]
       (defaults: N=100 tasks, ROUNDS=10, the three hand-written envs)

This host's speed swings by up to 1.7x from minute to minute, and separate processes differ by
more than most changes gain: comparing two benchmark runs, or even two processes run in turn,
cannot tell a 10 % change from noise. Here both versions run in the same process, a round's two
runs back to back (in alternating order), so each pair sees the same machine: the median of the
per-round ratios is the figure to read, with its quartiles.

REV's code and envs are exported with `git archive` into a temporary folder, where `envforge` is
renamed `envforge_rev` in every Python file, so that both versions can be imported side by side.
Both synthesize N tasks with seed 12345, steered (the default config), per env.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "synth", "harness", "trainer", "cli")
ENVS = ("retail_orders", "flight_booking", "it_tickets")


def export_revision(rev: str, into: Path) -> Path:
    """`rev`'s packages as `envforge_rev.*` and its envs, under `into`; returns the envs folder."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *PACKAGES, "envs"], cwd=REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / "export", filter="data")
    package = into / "envforge_rev"
    package.mkdir()
    for name in PACKAGES:
        (into / "export" / name).rename(package / name)
    renamed = re.compile(r"\benvforge\.(" + "|".join(PACKAGES) + r")\b")
    for path in [*package.rglob("*.py"), *(into / "export" / "envs").rglob("*.py")]:
        path.write_text(renamed.sub(r"envforge_rev.\1", path.read_text(encoding="utf-8")), encoding="utf-8")
    return into / "export" / "envs"


def modules(package: str) -> tuple[Any, Any]:
    """`package`'s (envforge or envforge_rev) server and synth, by their public surfaces: the names
    used here are on both surfaces whatever modules a revision lays them out in."""
    return importlib.import_module(f"{package}.server"), importlib.import_module(f"{package}.synth")


async def main(rev: str, n: int, rounds: int, envs: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rev_envs = export_revision(rev, Path(tmp))
        sys.path.insert(0, tmp)
        for package in ("envforge", "envforge_rev"):
            logging.getLogger(f"{package}.server.runtime").setLevel(logging.CRITICAL)
        arms = {"rev": (modules("envforge_rev"), rev_envs), "tree": (modules("envforge"), REPO / "envs")}
        print(f"{rev} against the working tree: N={n}, {rounds} paired rounds, tasks per CPU-s")
        for name in envs:
            loaded = {}
            for arm, ((server, synth), root) in arms.items():
                env = server.load_env(root / name)
                loaded[arm] = (env, await synth.build_graph(env), synth)
            rates: dict[str, list[float]] = {"rev": [], "tree": []}
            for r in range(rounds):
                for arm in ("rev", "tree") if r % 2 == 0 else ("tree", "rev"):
                    env, g, synth = loaded[arm]
                    cpu0 = time.process_time()
                    report = await synth.synthesize(env, n, 12345, synth.SynthConfig(), graph=g)
                    rates[arm].append(len(report.tasks) / (time.process_time() - cpu0))
            ratios = [b / a for a, b in zip(rates["rev"], rates["tree"], strict=True)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            print(
                f"  {name:15s} rev median {statistics.median(rates['rev']):6.1f}"
                f"  tree median {statistics.median(rates['tree']):6.1f}"
                f"  tree/rev: median {statistics.median(ratios):.3f} (quartiles {q1:.2f}-{q3:.2f})"
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    asyncio.run(
        main(
            sys.argv[1],
            int(sys.argv[2]) if len(sys.argv) > 2 else 100,
            int(sys.argv[3]) if len(sys.argv) > 3 else 10,
            sys.argv[4].split(",") if len(sys.argv) > 4 else list(ENVS),
        )
    )
