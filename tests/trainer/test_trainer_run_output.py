"""`envforge train` says what happened, off a terminal too. A two-step run once printed only
"reward 0.000 -> 0.000" while both updates had been skipped (every group's rollouts earned the same
reward: nothing to learn from), still wrote a full checkpoint of unchanged weights, showed no
per-step line with its output sent to a file, and `run.json` did not say what kind of episodes ran.
Here a greedy (temperature 0) run makes every group's rewards equal, so every update is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio

from envforge.server import Fleet, load_env
from envforge.trainer import bandit_corpus, bandit_tasks, build_tiny_model, write_bandit_env

from support.paths import REPO


async def _setup(tmp_path: Path) -> tuple[Path, Path]:
    env_dir = write_bandit_env(tmp_path)
    fleet = Fleet([load_env(env_dir)])
    tasks = await bandit_tasks(fleet, "bandit", n=3)
    (env_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    model = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    return env_dir, model


def train(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    env_dir, model = anyio.run(_setup, tmp_path)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "envforge.cli", "train", "--model", str(model), "--envs", str(env_dir)]
    command += ["--env-kind", "fleet", "--max-turns", "1", "--max-new-tokens", "1", "--steps", "2"]
    command += ["--tasks-per-step", "2", "--rollouts-per-task", "3", "--out", str(out), *args]
    done = subprocess.run(  # stdout and stderr are pipes: no terminal, as in a CI log or `> log`
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "300"},
    )
    return done, out


def test_a_run_with_only_skipped_updates_says_so_and_saves_nothing(tmp_path: Path) -> None:
    done, out = train(tmp_path, "--temperature", "0")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    steps = [line for line in err.splitlines() if line.startswith("train ")]
    assert any(line.startswith("train 1/2 ") for line in steps), err  # a line per step, off a terminal
    assert any(line.startswith("train 2/2 ") for line in steps), err
    assert "2 update(s) skipped (zero variance)" in steps[-1]
    assert "0 of 2 updates applied, 2 skipped (zero reward variance in every group)" in err
    assert "warning: every group had zero reward variance" in err and "weights are unchanged" in err
    assert "note: peak memory" in err and "GiB resident" in err
    assert "step reward moves by chance" in err and "no held-out figure" in err
    assert not (out / "checkpoints").exists()  # nothing was learned, nothing is saved
    ran = json.loads((out / "run.json").read_text())["ran"]
    assert ran["env_kind"] == "fleet" and "single-turn" in ran["env_kind_why"]
    assert ran["updates_applied"] == 0 and ran["updates_skipped"] == 2 and ran["checkpoints"] == []
    assert ran["peak_memory_mib"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["update_skipped"] and r["tokens_per_s"] == 0.0 for r in rows)  # no rate of nothing


def test_a_run_that_updates_saves_its_last_step_once(tmp_path: Path) -> None:
    done, out = train(tmp_path, "--temperature", "1", "--lr", "0.01")
    assert done.returncode == 0, done.stderr
    ran = json.loads((out / "run.json").read_text())["ran"]
    if ran["updates_applied"] == 0:  # a seed at which every group tied: the other test's case
        assert not (out / "checkpoints").exists()
        return
    assert ran["checkpoints"] == ["checkpoints/step_2"]
    assert (out / "checkpoints" / "step_2" / "config.json").exists()
    assert f"{ran['updates_applied']} of 2 updates applied" in done.stderr
